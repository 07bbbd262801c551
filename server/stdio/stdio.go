// Package stdio is vmgate's stdio transport: one MCP client over
// newline-delimited JSON-RPC on the process's standard input and output,
// as one grant. Every message goes through the gate (server.Handle); calls
// run concurrently on a crew of goroutines (crew.go) and their answers
// share write(2) calls (writer.go). The client is an mcp-go session, so
// server notifications and elicitation requests reach it (elicit.go).
//
// Only cmd/vmgate imports it.
package stdio

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/jsonrpc"
)

// maxConcurrentCalls bounds the messages one stdio connection serves at once.
const maxConcurrentCalls = 64

// notificationQueue bounds the notifications waiting for the client: one
// that does not fit is dropped (and counted by the server), so a client
// that reads slowly never holds up a call.
const notificationQueue = 64

// session is the one client of a stdio connection, as mcp-go sees it.
type session struct {
	id            string
	notifications chan mcp.JSONRPCNotification
	send          func([]byte) error // writes one message to the client
	requests      clientRequests     // requests sent to the client (elicit.go)
	mu            sync.Mutex         // guards initialized, clientInfo, clientCaps and level
	initialized   bool
	clientInfo    mcp.Implementation
	clientCaps    mcp.ClientCapabilities
	level         mcp.LoggingLevel // logging/setLevel's; "" until set: DefaultLogLevel
}

// DefaultLogLevel is the level of a session that has not set one
// (logging/setLevel): only errors and worse are logged to it. It is
// mcp-go's for its HTTP sessions too.
const DefaultLogLevel = mcp.LoggingLevelError

func (s *session) SessionID() string { return s.id }
func (s *session) NotificationChannel() chan<- mcp.JSONRPCNotification {
	return s.notifications
}
func (s *session) Initialize() {
	s.mu.Lock()
	s.initialized = true
	s.mu.Unlock()
}
func (s *session) Initialized() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.initialized
}

// SetLogLevel is logging/setLevel's (mcp-go checked level).
func (s *session) SetLogLevel(level mcp.LoggingLevel) {
	s.mu.Lock()
	s.level = level
	s.mu.Unlock()
}

// GetLogLevel is the least level a notifications/message to the client
// has.
func (s *session) GetLogLevel() mcp.LoggingLevel {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.level == "" {
		return DefaultLogLevel
	}
	return s.level
}

var (
	_ mcpserver.ClientSession      = (*session)(nil)
	_ mcpserver.SessionWithLogging = (*session)(nil)
)

// Serve serves one MCP client over newline-delimited JSON-RPC on in and
// out, as grant. It returns when in ends or ctx is done, after the calls in
// flight finished (or were cancelled the server's shutdown grace later).
func Serve(ctx context.Context, s *server.Server, grant string, in io.Reader, out io.Writer) error {
	g, ok := s.Grant(grant)
	if !ok {
		return fmt.Errorf("server: stdio: %w %q", server.ErrUnknownGrant, grant)
	}
	sess := &session{id: "stdio-" + grant + "-" + rand.Text(), notifications: make(chan mcp.JSONRPCNotification, notificationQueue)}
	c := &server.Conn{Grant: g, Transport: "stdio", Session: sess.id}
	m := s.MCP()
	if err := m.RegisterSession(ctx, sess); err != nil {
		return fmt.Errorf("server: stdio: register session: %w", err)
	}
	defer m.UnregisterSession(context.Background(), sess.id)
	defer s.AttachSession(grant, sess.id)() // the server's notifications for the grant reach it

	// Calls run on callCtx, which outlives ctx by the grace period.
	callCtx, cancelCalls := context.WithCancel(m.WithContext(context.WithoutCancel(ctx), sess))
	defer cancelCalls()

	lw := newLineWriter(out, s.Logger()) // concurrent answers share write(2) calls
	sess.send = lw.send
	notifyDone := make(chan struct{})
	go forwardNotifications(callCtx, sess, lw.write, notifyDone)

	// The calls run on the crew's members (crew.go): the member that reads
	// a call runs it, after passing the reading on.
	r := &router{ctx: ctx, sess: sess, write: lw.write, lines: newLineReader(in, 4*s.MaxMessageBytes())}
	crew := newStdioCrew(maxConcurrentCalls, r.next, func(line []byte) {
		defer r.calls.Done()
		if resp := s.Handle(callCtx, c, line); resp != nil {
			lw.write(resp)
		}
	})
	crew.start()

	var err error
	select {
	case <-ctx.Done():
	case err = <-crew.ended():
	}
	crew.stop()
	r.close()
	sess.requests.close() // requests to the client get no answer now
	drain(s, &r.calls, cancelCalls)
	cancelCalls()
	<-notifyDone
	if errors.Is(err, io.EOF) || errors.Is(err, errStdioClosed) {
		err = nil
	}
	return err
}

// router reads the client's lines for the crew: a call goes to the member
// that read it; answers to our own requests and lines over the limit are
// dealt with by the reader itself. mu and closed keep the reader from
// writing or admitting anything once Serve is on its way out; calls counts
// the calls admitted, which drain waits for.
type router struct {
	ctx   context.Context
	sess  *session
	write func([]byte)
	lines *lineReader // read by the crew member holding the lead only
	calls sync.WaitGroup

	mu     sync.Mutex
	closed bool
}

// next returns the next line that is a call to run.
func (r *router) next() ([]byte, error) {
	for {
		line, err := r.lines.next()
		if err != nil {
			return nil, err
		}
		call, err := r.admit(line)
		if err != nil {
			return nil, err
		}
		if call {
			return line, nil
		}
	}
}

// admit reports whether line is a call to run (counted in calls), after
// dealing with one that is not.
func (r *router) admit(line []byte) (call bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.ctx.Err() != nil {
		return false, errStdioClosed
	}
	switch {
	case line == nil: // a line over the limit
		r.write(jsonrpc.ErrorReply(nil, mcp.PARSE_ERROR, "message too large"))
		return false, nil
	case r.sess.requests.deliver(line): // the answer to a request of ours
		return false, nil
	}
	r.calls.Add(1)
	return true, nil
}

// close admits nothing more.
func (r *router) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
}

// forwardNotifications writes sess's notifications with write until ctx
// is done, then closes done.
func forwardNotifications(ctx context.Context, sess *session, write func([]byte), done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case n := <-sess.notifications:
			if b, err := json.Marshal(n); err == nil {
				write(b)
			}
		case <-ctx.Done():
			return
		}
	}
}

// drain waits for the calls in flight (wg), cancelling them the server's
// shutdown grace later.
func drain(s *server.Server, wg *sync.WaitGroup, cancel context.CancelFunc) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.ShutdownGrace()):
		s.Logger().Warn("server: stdio: cancelling calls still running after the grace period")
		cancel()
		<-done
	}
}

// lineReader reads newline-delimited messages.
type lineReader struct {
	r   *bufio.Reader
	max int
}

func newLineReader(in io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(in, 64<<10), max: max}
}

// next returns the next non-empty line, trimmed, or nil for a line longer
// than max (after discarding it); io.EOF when the input ends.
func (l *lineReader) next() ([]byte, error) {
	for {
		var line []byte
		tooLong := false
		for {
			frag, err := l.r.ReadSlice('\n')
			if !tooLong {
				if len(line)+len(frag) > l.max {
					tooLong, line = true, nil
				} else {
					line = append(line, frag...)
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil && (len(line) == 0 && !tooLong || err != io.EOF) {
				return nil, err
			}
			break
		}
		if tooLong {
			return nil, nil
		}
		if msg := bytes.TrimSpace(line); len(msg) > 0 {
			return msg, nil
		}
	}
}
