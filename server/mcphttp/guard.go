package mcphttp

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vmgate/vmgate/internal/hostguard"
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

// originAllowed reports whether r's Origin lets it reach the MCP endpoint
// (the Host and the token are checked apart). A browser sends Origin with
// every cross-origin request and with every POST; other clients send none,
// and pass. Of browser requests, these pass:
//
//   - one whose Origin is listed in allowed (http.allowed_origins), exactly;
//   - one whose Origin is on loopback (http or https, localhost, 127.0.0.1
//     or [::1], any port) and that came in on a loopback address of this
//     machine: the page that sent it was served by this machine to a
//     browser on this machine (a local web app, the MCP Inspector's page),
//     the case the MCP specification asks servers to accept. A request that
//     came in on another address (vmgate listening on a LAN address, or on
//     every address and reached through one of them) comes from a browser
//     elsewhere, whose "localhost" is not this machine: it passes only if
//     listed.
//
// Everything else is refused (403): a page of another site, a DNS
// rebinding page (its Origin names the attacker's site), "null", two Origin
// headers. The bearer token is required either way: a browser does not
// send it by itself, so a page can only use a token it was given.
func originAllowed(r *http.Request, allowed []string) bool {
	o := r.Header.Values("Origin")
	switch {
	case len(o) == 0:
		return true
	case len(o) > 1:
		return false
	case slices.Contains(allowed, o[0]):
		return true
	}
	return hostguard.LoopbackOrigin(o[0]) && arrivedOnLoopback(r)
}

// arrivedOnLoopback reports whether r came in on a loopback address.
func arrivedOnLoopback(r *http.Request) bool {
	a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	ap, err := netip.ParseAddrPort(a.String())
	return err == nil && ap.Addr().Unmap().IsLoopback()
}
