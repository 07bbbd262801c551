package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// Defaults of MonitorOptions.
const (
	DefaultCommandTimeout = 10 * time.Second
	DefaultMaxReply       = 16 << 20
	DefaultEventBuffer    = 64
)

// Sentinel errors of the QMP transport.
var (
	// ErrNotConnected: the monitor has no live connection (never connected,
	// disconnected, or the connection broke; the cause is wrapped too).
	ErrNotConnected = errors.New("qmp: not connected")
	// ErrAlreadyConnected: Connect was called on a connected monitor.
	ErrAlreadyConnected = errors.New("qmp: already connected")
	// ErrReplyTooLarge: a reply was larger than MonitorOptions.MaxReply.
	ErrReplyTooLarge = errors.New("qmp: reply too large")
	// ErrBadCommand: the command given to Run is not a QMP command object.
	ErrBadCommand = errors.New("qmp: bad command")
)

// QMPError is an error reply from QEMU: {"error": {"class": ..., "desc": ...}}.
type QMPError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *QMPError) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// ProtocolError is a violation of the QMP protocol by the server: a
// malformed greeting, a line that is not JSON, a handshake refused.
type ProtocolError struct {
	Op   string // "greeting", "qmp_capabilities", "read"
	Msg  string
	Line []byte // the offending line, truncated to 256 bytes
}

func (e *ProtocolError) Error() string {
	if len(e.Line) == 0 {
		return fmt.Sprintf("qmp: %s: %s", e.Op, e.Msg)
	}
	return fmt.Sprintf("qmp: %s: %s: %q", e.Op, e.Msg, e.Line)
}

func newProtocolError(op, msg string, line []byte) *ProtocolError {
	if len(line) > 256 {
		line = line[:256]
	}
	return &ProtocolError{Op: op, Msg: msg, Line: bytes.Clone(line)}
}

// Greeting is what QEMU announces when a client connects.
type Greeting struct {
	Version      qmp.Version `json:"version"`
	Capabilities []string    `json:"capabilities"`
}

// MonitorOptions configures a Monitor. The zero value uses the defaults.
type MonitorOptions struct {
	// Timeout bounds Connect and every Run (RunContext takes its deadline
	// from its context instead). Default DefaultCommandTimeout.
	Timeout time.Duration
	// MaxReply is the largest reply line accepted, in bytes. A larger reply
	// fails its command with ErrReplyTooLarge; the connection stays usable.
	// Default DefaultMaxReply (16 MiB).
	MaxReply int
	// EventBuffer is the capacity of each Events subscription. When a
	// subscriber's buffer is full further events are dropped for it and
	// counted (DroppedEvents). Default DefaultEventBuffer.
	EventBuffer int
	// Dial opens the connection; when nil the monitor dials network/address.
	Dial func(ctx context.Context) (net.Conn, error)
	// Logger receives debug and warning records; nil means slog.Default().
	Logger *slog.Logger
}

// Monitor is a QMP client implementing go-qemu's qmp.Monitor with deadlines,
// replies matched by id, large replies and non-blocking event delivery, so
// go-qemu's raw.NewMonitor(m) typed calls work over it.
//
// One reader goroutine per connection reads every line; commands from any
// number of goroutines are written with a unique "id" and wait for the reply
// carrying it. A Monitor is safe for concurrent use.
type Monitor struct {
	opts MonitorOptions
	log  *slog.Logger

	dropped atomic.Uint64 // events dropped because a subscriber was full
	strays  atomic.Uint64 // replies with an id nobody waits for

	// connMu serialises Connect and Disconnect.
	connMu sync.Mutex

	// mu guards sess.
	mu   sync.Mutex
	sess *session
}

var _ qmp.Monitor = (*Monitor)(nil)

// NewMonitor returns a Monitor for the QMP socket at network/address
// ("unix", "/run/vm/qmp.sock"). It does not connect.
func NewMonitor(network, address string, opts MonitorOptions) *Monitor {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultCommandTimeout
	}
	if opts.MaxReply <= 0 {
		opts.MaxReply = DefaultMaxReply
	}
	if opts.EventBuffer <= 0 {
		opts.EventBuffer = DefaultEventBuffer
	}
	if opts.Dial == nil {
		opts.Dial = func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, address)
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Monitor{opts: opts, log: log.With("component", "qmp", "address", address)}
}

// session is one connection and its reader.
type session struct {
	conn     net.Conn
	greeting Greeting
	done     chan struct{} // closed when the reader has exited

	// wmu serialises writes (and their write deadlines) on conn.
	wmu sync.Mutex

	// mu guards everything below.
	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*call // by id; timed-out calls stay until answered
	subs    map[*subscriber]struct{}
	err     error // set once the reader has stopped: why
}

// call is one command waiting for its reply.
type call struct {
	id    uint64
	reply chan result // buffered 1, so the reader never blocks on it
}

type result struct {
	line []byte
	err  error
}

type subscriber struct {
	ch chan qmp.Event
}

// Connect dials, reads the greeting and negotiates capabilities, bounded by
// MonitorOptions.Timeout.
func (m *Monitor) Connect() error {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.Timeout)
	defer cancel()
	return m.ConnectContext(ctx)
}

// ConnectContext is Connect bounded by ctx.
func (m *Monitor) ConnectContext(ctx context.Context) error {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	m.mu.Lock()
	s := m.sess
	m.mu.Unlock()
	if s != nil && s.alive() {
		return ErrAlreadyConnected
	}
	conn, err := m.opts.Dial(ctx)
	if err != nil {
		return fmt.Errorf("qmp: connect: %w", err)
	}
	s, err = m.handshake(ctx, conn)
	if err != nil {
		conn.Close()
		return err
	}
	m.mu.Lock()
	m.sess = s
	m.mu.Unlock()
	return nil
}

// maxEventsBeforeGreeting bounds the events readGreeting skips.
const maxEventsBeforeGreeting = 64

// readGreeting reads up to and including the QMP greeting. Events may come
// first on a connection that follows another client's: QEMU sends events to
// a monitor whose client negotiated capabilities (monitor/monitor.c,
// monitor_qapi_event_emit) and resets that only when the next client
// connects (monitor/qmp.c, monitor_qmp_event, CHR_EVENT_OPENED), so an event
// emitted in between is queued in the monitor's output and flushed to the
// next client ahead of its greeting. They are skipped (nobody can be
// subscribed yet); anything else is a *ProtocolError. Read errors are
// returned as they are.
func readGreeting(r *bufio.Reader, maxReply int) (*Greeting, error) {
	for range maxEventsBeforeGreeting + 1 {
		line, err := readLine(r, maxReply)
		if err != nil {
			return nil, err
		}
		var g struct {
			QMP   *Greeting `json:"QMP"`
			Event string    `json:"event"`
		}
		if err := json.Unmarshal(line, &g); err != nil || (g.QMP == nil && g.Event == "") {
			return nil, newProtocolError("greeting", "not a QMP greeting", line)
		}
		if g.QMP != nil {
			return g.QMP, nil
		}
	}
	return nil, newProtocolError("greeting", fmt.Sprintf("more than %d events before the greeting", maxEventsBeforeGreeting), nil)
}

// handshake reads the greeting, sends qmp_capabilities and starts the reader.
func (m *Monitor) handshake(ctx context.Context, conn net.Conn) (*session, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	wrapCtx := func(op string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("qmp: %s: %w", op, ctx.Err())
		}
		return fmt.Errorf("qmp: %s: %w", op, err)
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	greeting, err := readGreeting(r, m.opts.MaxReply)
	var pe *ProtocolError
	switch {
	case errors.As(err, &pe):
		return nil, err
	case err != nil:
		return nil, wrapCtx("greeting", err)
	}
	if _, err := conn.Write([]byte(`{"execute":"qmp_capabilities","id":0}` + "\n")); err != nil {
		return nil, wrapCtx("qmp_capabilities", err)
	}
	// Events may precede the reply; skip them (nobody can be subscribed yet).
	for {
		line, err := readLine(r, m.opts.MaxReply)
		if err != nil {
			return nil, wrapCtx("qmp_capabilities", err)
		}
		var env envelope
		if err := json.Unmarshal(line, &env); err != nil {
			return nil, newProtocolError("qmp_capabilities", "reply is not JSON", line)
		}
		if env.Event != "" {
			continue
		}
		if env.Error != nil {
			return nil, fmt.Errorf("qmp: qmp_capabilities: %w", env.Error)
		}
		if env.Return == nil {
			return nil, newProtocolError("qmp_capabilities", "reply has no return", line)
		}
		break
	}
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("qmp: qmp_capabilities: %w", err)
	}
	if !stop() {
		// The deadline fired between the read and stop: the conn has a past deadline.
		return nil, fmt.Errorf("qmp: qmp_capabilities: %w", context.DeadlineExceeded)
	}
	conn.SetDeadline(time.Time{})
	s := &session{
		conn:     conn,
		greeting: *greeting,
		done:     make(chan struct{}),
		nextID:   1,
		pending:  make(map[uint64]*call),
		subs:     make(map[*subscriber]struct{}),
	}
	go m.readLoop(s, r)
	return s, nil
}

// Greeting returns the greeting of the current connection, false when not connected.
func (m *Monitor) Greeting() (Greeting, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sess == nil {
		return Greeting{}, false
	}
	return m.sess.greeting, true
}

// Disconnect closes the connection, waits for the reader to exit, fails the
// commands still waiting and closes every Events channel. Disconnecting a
// monitor that is not connected is not an error.
func (m *Monitor) Disconnect() error {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	m.mu.Lock()
	s := m.sess
	m.sess = nil
	m.mu.Unlock()
	if s == nil {
		return nil
	}
	err := s.conn.Close()
	<-s.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("qmp: disconnect: %w", err)
	}
	return nil
}

// Alive reports whether the monitor has a working connection.
func (m *Monitor) Alive() bool {
	m.mu.Lock()
	s := m.sess
	m.mu.Unlock()
	return s != nil && s.alive()
}

func (s *session) alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err == nil
}

// DroppedEvents is how many events were dropped because a subscriber's buffer was full.
func (m *Monitor) DroppedEvents() uint64 { return m.dropped.Load() }

// StrayReplies is how many replies arrived with an id no command waits for.
func (m *Monitor) StrayReplies() uint64 { return m.strays.Load() }

// Run runs command (a QMP command object, without "id") with the default
// timeout and returns the whole reply line. An error reply is a *QMPError.
func (m *Monitor) Run(command []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.Timeout)
	defer cancel()
	return m.RunContext(ctx, command)
}

// RunContext runs command, waiting for its reply until ctx ends. The command
// gets an "id" (a command that already has one is refused); the reply is the
// line QEMU sent, "id" included.
func (m *Monitor) RunContext(ctx context.Context, command []byte) ([]byte, error) {
	return m.run(ctx, command, (*session).write)
}

// run is RunContext with the command line written by write.
func (m *Monitor) run(ctx context.Context, command []byte, write func(s *session, ctx context.Context, msg []byte) error) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(command, &obj); err != nil || obj == nil {
		return nil, fmt.Errorf("%w: not a JSON object", ErrBadCommand)
	}
	var name string
	if err := json.Unmarshal(obj["execute"], &name); err != nil || name == "" {
		return nil, fmt.Errorf("%w: no \"execute\" string", ErrBadCommand)
	}
	if _, ok := obj["id"]; ok {
		return nil, fmt.Errorf("qmp: %s: %w: the monitor sets \"id\" itself", name, ErrBadCommand)
	}
	m.mu.Lock()
	s := m.sess
	m.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("qmp: %s: %w", name, ErrNotConnected)
	}
	c, err := s.register()
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", name, err)
	}
	obj["id"] = json.RawMessage(strconv.FormatUint(c.id, 10))
	msg, err := json.Marshal(obj)
	if err != nil {
		s.forget(c)
		return nil, fmt.Errorf("qmp: %s: %w", name, err)
	}
	if err := write(s, ctx, append(msg, '\n')); err != nil {
		// A failed or partial write leaves the stream unusable: drop the
		// connection (the reader exits and fails every pending call).
		s.forget(c)
		s.conn.Close()
		return nil, fmt.Errorf("qmp: %s: %w: %w", name, ErrNotConnected, err)
	}
	select {
	case res := <-c.reply:
		if res.err != nil {
			return nil, fmt.Errorf("qmp: %s: %w", name, res.err)
		}
		return res.line, nil
	case <-ctx.Done():
		// The call stays pending: its late reply must not be mistaken for
		// another command's, and the reader drops it into the buffer.
		// The reply may have raced in; prefer it.
		select {
		case res := <-c.reply:
			if res.err != nil {
				return nil, fmt.Errorf("qmp: %s: %w", name, res.err)
			}
			return res.line, nil
		default:
		}
		return nil, fmt.Errorf("qmp: %s: %w", name, ctx.Err())
	}
}

func (s *session) register() (*call, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotConnected, s.err)
	}
	c := &call{id: s.nextID, reply: make(chan result, 1)}
	s.nextID++
	s.pending[c.id] = c
	return c, nil
}

// forget removes a call that was never (fully) sent.
func (s *session) forget(c *call) {
	s.mu.Lock()
	delete(s.pending, c.id)
	s.mu.Unlock()
}

func (s *session) write(ctx context.Context, msg []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		s.conn.SetWriteDeadline(dl)
		defer s.conn.SetWriteDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { s.conn.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	_, err := s.conn.Write(msg)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// envelope is enough of a line to route it.
type envelope struct {
	Event  string          `json:"event"`
	ID     json.RawMessage `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *QMPError       `json:"error"`
}

// readLoop is the session's one reader: it routes replies to their callers
// and events to subscribers, never blocking on either.
func (m *Monitor) readLoop(s *session, r *bufio.Reader) {
	defer close(s.done)
	var err error
	for {
		var line []byte
		line, err = readLine(r, m.opts.MaxReply)
		if errors.Is(err, ErrReplyTooLarge) {
			m.log.Warn("qmp line above the maximum", "max", m.opts.MaxReply)
			s.failOldest(fmt.Errorf("%w: above %d bytes", ErrReplyTooLarge, m.opts.MaxReply))
			continue
		}
		if err != nil {
			break
		}
		m.route(s, line)
	}
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("connection closed by QEMU: %w", err)
	}
	s.mu.Lock()
	s.err = err
	pending := s.pending
	s.pending = nil
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	for _, c := range pending {
		c.reply <- result{err: fmt.Errorf("%w: %w", ErrNotConnected, err)}
	}
	for sub := range subs {
		close(sub.ch)
	}
	s.conn.Close()
}

func (m *Monitor) route(s *session, line []byte) {
	var env envelope
	if err := json.Unmarshal(line, &env); err != nil {
		m.log.Warn("qmp line is not JSON; ignored", "err", err, "line", string(truncate(line, 256)))
		return
	}
	if env.Event != "" {
		var ev qmp.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			m.log.Warn("malformed qmp event; ignored", "err", err)
			return
		}
		s.mu.Lock()
		for sub := range s.subs {
			select {
			case sub.ch <- ev:
			default:
				m.dropped.Add(1)
			}
		}
		s.mu.Unlock()
		return
	}
	if env.Return == nil && env.Error == nil {
		m.log.Warn("qmp line is neither reply nor event; ignored", "line", string(truncate(line, 256)))
		return
	}
	res := result{line: line}
	if env.Error != nil {
		res = result{err: env.Error}
	}
	if env.ID == nil {
		// QEMU answers without an id only when it could not parse the
		// command; replies come in command order, so it is the oldest's.
		s.deliverOldest(res)
		return
	}
	id, err := strconv.ParseUint(string(env.ID), 10, 64)
	s.mu.Lock()
	c, ok := s.pending[id]
	if ok {
		delete(s.pending, id)
	}
	s.mu.Unlock()
	if err != nil || !ok {
		m.strays.Add(1)
		m.log.Warn("qmp reply with an unknown id; ignored", "id", string(env.ID))
		return
	}
	c.reply <- res // buffered; a timed-out call's reply is dropped with the call
}

// failOldest fails the oldest pending call: QMP replies come in command order.
func (s *session) failOldest(err error) { s.deliverOldest(result{err: err}) }

func (s *session) deliverOldest(res result) {
	s.mu.Lock()
	var oldest *call
	for _, c := range s.pending {
		if oldest == nil || c.id < oldest.id {
			oldest = c
		}
	}
	if oldest != nil {
		delete(s.pending, oldest.id)
	}
	s.mu.Unlock()
	if oldest != nil {
		oldest.reply <- res
	}
}

// Events subscribes to QMP events until ctx ends or the connection closes;
// then the channel is closed. Delivery never blocks the reader: when the
// channel's buffer is full, events are dropped and counted (DroppedEvents).
func (m *Monitor) Events(ctx context.Context) (<-chan qmp.Event, error) {
	m.mu.Lock()
	s := m.sess
	m.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("qmp: events: %w", ErrNotConnected)
	}
	sub := &subscriber{ch: make(chan qmp.Event, m.opts.EventBuffer)}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("qmp: events: %w: %w", ErrNotConnected, s.err)
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.subs[sub]; ok {
			delete(s.subs, sub)
			close(sub.ch)
		}
	})
	return sub.ch, nil
}

// readLine reads one newline-terminated line of at most max bytes (without
// the line ending). A longer line is consumed up to its newline and reported
// as ErrReplyTooLarge, leaving the reader at the next line.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var buf []byte
	tooLarge := false
	for {
		chunk, err := r.ReadSlice('\n')
		if !tooLarge {
			if len(buf)+len(chunk) > max+2 { // +2: the "\r\n" is not counted
				tooLarge = true
				buf = nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case err == nil:
			if tooLarge {
				return nil, ErrReplyTooLarge
			}
			line := bytes.TrimRight(buf, "\r\n")
			if len(bytes.TrimSpace(line)) == 0 {
				buf = buf[:0]
				continue
			}
			if len(line) > max {
				return nil, ErrReplyTooLarge
			}
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && (len(buf) > 0 || tooLarge):
			return nil, fmt.Errorf("connection closed mid-line: %w", io.ErrUnexpectedEOF)
		default:
			return nil, err
		}
	}
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
