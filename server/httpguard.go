package server

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// DefaultBodyTimeout is how long a client has to send a request body, when
// the config says nothing.
const DefaultBodyTimeout = 10 * time.Second

// LimitBodyTime cuts off a request whose body is not received within d:
// the connection's read deadline is set when the request arrives and
// cleared once the body has been read to its end, so a slow sender is cut
// off (a handler's read fails with os.ErrDeadlineExceeded, and net/http
// closes the connection) while a long-running response (an SSE stream, a
// long command) is not. Requests without a body are passed on as they
// are. Every handler of vmgate's HTTP listener is behind it; Handler
// applies it to the MCP endpoint itself.
func LimitBodyTime(next http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		d = DefaultBodyTimeout
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
			// A writer without deadlines (a test recorder): nothing to cut.
			next.ServeHTTP(w, r)
			return
		}
		r.Body = &deadlineBody{ReadCloser: r.Body, clear: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody clears the read deadline once the body has been read to
// its end.
type deadlineBody struct {
	io.ReadCloser
	once  sync.Once
	clear func()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.once.Do(b.clear)
	}
	return n, err
}

// bodyTimedOut reports whether err is a body read cut off by LimitBodyTime.
func bodyTimedOut(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}
