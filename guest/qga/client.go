package qga

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Defaults of a Client; see the options to change them.
const (
	// DefaultCallTimeout bounds a call whose context has no deadline.
	DefaultCallTimeout = 30 * time.Second
	// MaxReplyBytes bounds one reply line. qemu-ga returns at most 16 MiB per
	// output stream of guest-exec-status, base64-encoded: about 45 MB in all.
	MaxReplyBytes = 64 << 20
)

// delimiter is the byte guest-sync-delimited puts before its reply; sent by
// the client it makes the agent drop any partial request it was parsing.
const delimiter = 0xFF

// Option configures a Client.
type Option func(*Client)

// WithCallTimeout sets the deadline of calls whose context has none.
func WithCallTimeout(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.callTimeout = d
		}
	}
}

// WithLogger sets the logger (debug-level reconnect and resync messages).
func WithLogger(l *slog.Logger) Option {
	return func(c *Client) {
		if l != nil {
			c.log = l
		}
	}
}

// WithDialer replaces dialling the unix socket, for transports that reach
// the agent another way (an inherited chardev fd, a test pipe).
func WithDialer(dial func(ctx context.Context) (net.Conn, error)) Option {
	return func(c *Client) {
		if dial != nil {
			c.dial = dial
		}
	}
}

// Client talks to one guest agent over a stream socket. It is safe for
// concurrent use; calls are serialised, since the agent serves one request
// at a time and replies carry no id. After any transport error the
// connection is dropped and the next call reconnects and resynchronises.
type Client struct {
	path        string
	callTimeout time.Duration
	log         *slog.Logger
	dial        func(ctx context.Context) (net.Conn, error)
	newID       func() int64 // sync ids; replaced by golden tests

	mu   sync.Mutex    // mu serialises calls and guards conn and rd.
	conn net.Conn      // nil: not connected
	rd   *bufio.Reader // reads conn

	liveMu sync.Mutex // liveMu guards live and closed, so Close need not wait for mu.
	live   net.Conn
	closed bool
}

var (
	_ Caller        = (*Client)(nil)
	_ NoReplyCaller = (*Client)(nil)
)

// New returns a Client for the agent socket at path. It does not connect:
// the first call does.
func New(path string, opts ...Option) *Client {
	c := &Client{
		path:        path,
		callTimeout: DefaultCallTimeout,
		log:         slog.Default(),
		newID:       func() int64 { return rand.Int64N(1<<52) + 1 },
	}
	c.dial = c.dialUnix
	for _, o := range opts {
		o(c)
	}
	return c
}

// Close closes the connection and makes every later call fail with
// ErrClosed. A call in progress is interrupted. Close is idempotent.
func (c *Client) Close() error {
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	c.closed = true
	if c.live != nil {
		c.live.Close()
		c.live = nil
	}
	return nil
}

func (c *Client) isClosed() bool {
	c.liveMu.Lock()
	defer c.liveMu.Unlock()
	return c.closed
}

// Call implements Caller.
func (c *Client) Call(ctx context.Context, command string, args, result any) error {
	return c.roundTrip(ctx, command, args, result, false, 0)
}

// CallNoReply implements NoReplyCaller. It synchronises with the agent
// using ctx, sends command, then waits at most wait: an error reply is
// returned; silence, end of stream or a reset connection mean the command
// was taken (the agent is going down). The connection is dropped afterwards.
func (c *Client) CallNoReply(ctx context.Context, command string, args any, wait time.Duration) error {
	return c.roundTrip(ctx, command, args, nil, true, wait)
}

// DecodeReply decodes one reply line of command: its "return" into result
// (nil: discarded), or its "error" as a *Error or *DisabledError. Callers
// that get raw replies another way (libvirt) use it too.
func DecodeReply(command string, line []byte, result any) error {
	var r struct {
		Return json.RawMessage `json:"return"`
		Error  *Error          `json:"error"`
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return fmt.Errorf("qga: %s: %w: malformed reply: %w", command, ErrProtocol, err)
	}
	if r.Error != nil {
		return fmt.Errorf("qga: %s: %w", command, replyError(command, r.Error))
	}
	if r.Return == nil {
		return fmt.Errorf("qga: %s: %w: reply has neither return nor error", command, ErrProtocol)
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(r.Return, result); err != nil {
		return fmt.Errorf("qga: %s: %w: unexpected return value: %w", command, ErrProtocol, err)
	}
	return nil
}

type request struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

// roundTrip sends command and decodes its reply into result. With noReply
// it waits at most wait for a reply and returns nil when none came.
func (c *Client) roundTrip(ctx context.Context, command string, args, result any, noReply bool, wait time.Duration) error {
	if command == "" {
		return fmt.Errorf("qga: call: %w: empty command", ErrInvalidArgument)
	}
	msg, err := json.Marshal(request{Execute: command, Arguments: args})
	if err != nil {
		return fmt.Errorf("qga: %s: %w: arguments: %w", command, ErrInvalidArgument, err)
	}
	msg = append(msg, '\n')
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.callTimeout)
		defer cancel()
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosed() {
		return fmt.Errorf("qga: %s: %w", command, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return c.fail(ctx, command, err)
	}
	if c.conn == nil {
		if err := c.connectLocked(ctx); err != nil {
			return fmt.Errorf("qga: %s: %w", command, err)
		}
	}
	conn := c.conn
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	if _, err := conn.Write(msg); err != nil {
		c.dropLocked()
		return c.fail(ctx, command, err)
	}
	if noReply {
		// The agent answers only on failure; do not keep the stream.
		defer c.dropLocked()
		if d := time.Now().Add(wait); d.Before(deadline) {
			conn.SetReadDeadline(d)
		}
		line, err := c.readReplyLocked()
		if err != nil {
			if isTimeout(err) && !errors.Is(ctx.Err(), context.Canceled) || isGone(err) {
				return nil
			}
			return c.fail(ctx, command, err)
		}
		return DecodeReply(command, line, nil)
	}
	line, err := c.readReplyLocked()
	if err != nil {
		c.dropLocked()
		return c.fail(ctx, command, err)
	}
	err = DecodeReply(command, line, result)
	if errors.Is(err, ErrProtocol) {
		c.dropLocked() // the stream is suspect: resync before the next call
	}
	return err
}

// readReplyLocked reads the next non-empty line.
func (c *Client) readReplyLocked() ([]byte, error) {
	for {
		line, err := c.readLineLocked()
		if err != nil {
			return nil, err
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			return line, nil
		}
	}
}

var errReplyTooLarge = fmt.Errorf("%w: reply larger than %d bytes", ErrProtocol, MaxReplyBytes)

// readLineLocked reads up to and including '\n', at most MaxReplyBytes.
func (c *Client) readLineLocked() ([]byte, error) {
	var buf []byte
	for {
		frag, err := c.rd.ReadSlice('\n')
		if len(buf)+len(frag) > MaxReplyBytes {
			return nil, errReplyTooLarge
		}
		buf = append(buf, frag...)
		if err == nil {
			return buf, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

// fail classifies a transport error of command.
func (c *Client) fail(ctx context.Context, command string, err error) error {
	switch {
	case c.isClosed():
		return fmt.Errorf("qga: %s: %w", command, ErrClosed)
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("qga: %s: %w", command, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return fmt.Errorf("qga: %s: %w", command, ErrTimeout)
	case errors.Is(err, ErrProtocol):
		return fmt.Errorf("qga: %s: %w", command, err)
	default:
		return fmt.Errorf("qga: %s: %w: %w", command, ErrConnLost, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func isGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// dropLocked closes the connection; the next call reconnects.
func (c *Client) dropLocked() {
	if c.conn == nil {
		return
	}
	c.conn.Close()
	c.conn, c.rd = nil, nil
	c.liveMu.Lock()
	c.live = nil
	c.liveMu.Unlock()
}

// connectLocked dials and synchronises.
func (c *Client) connectLocked(ctx context.Context) error {
	conn, err := c.dial(ctx)
	if err != nil {
		if errors.Is(err, ErrNoAgent) || ctx.Err() == nil {
			return err
		}
		return fmt.Errorf("connect: %w", ErrTimeout)
	}
	c.liveMu.Lock()
	if c.closed {
		c.liveMu.Unlock()
		conn.Close()
		return ErrClosed
	}
	c.live = conn
	c.liveMu.Unlock()
	c.conn, c.rd = conn, bufio.NewReaderSize(conn, 64<<10)
	if err := c.syncLocked(ctx); err != nil {
		c.dropLocked()
		if c.isClosed() {
			return ErrClosed
		}
		return err
	}
	return nil
}

func (c *Client) dialUnix(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.path)
	if err == nil {
		return conn, nil
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("connect %s: %w", c.path, ErrTimeout)
	}
	fi, serr := os.Stat(c.path)
	switch {
	case errors.Is(serr, fs.ErrNotExist):
		return nil, fmt.Errorf("connect %s: %w: no such socket (is the VM running with a guest agent channel?)", c.path, ErrNoAgent)
	case serr == nil && fi.Mode()&fs.ModeSocket == 0:
		return nil, fmt.Errorf("connect %s: %w: not a socket (%s)", c.path, ErrNoAgent, fi.Mode().Type())
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, fmt.Errorf("connect %s: %w: connection refused (nothing listening)", c.path, ErrNoAgent)
	}
	return nil, fmt.Errorf("connect %s: %w: %w", c.path, ErrNoAgent, err)
}

// Sync retry intervals: the first attempt waits syncFirstWait for its reply,
// each resend doubles it up to syncMaxWait.
const (
	syncFirstWait = 100 * time.Millisecond
	syncMaxWait   = 2 * time.Second
)

// syncLocked resynchronises a fresh connection: it sends 0xFF and
// guest-sync-delimited with a new random id, discards everything up to the
// agent's 0xFF, then skips every reply but the one carrying the latest id
// (an error reply for our own 0xFF, stale replies of an earlier connection,
// replies to earlier syncs). It resends with a new id, backing off, until
// ctx's deadline, because an agent that is still booting answers late.
func (c *Client) syncLocked(ctx context.Context) error {
	deadline, _ := ctx.Deadline()
	conn := c.conn // the AfterFunc must not read c.conn, which mu guards
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.conn.SetWriteDeadline(deadline)
	wait := syncFirstWait
	seenDelim := false
	for attempt := 1; ; attempt++ {
		id := c.newID()
		msg, _ := json.Marshal(request{Execute: "guest-sync-delimited", Arguments: struct {
			ID int64 `json:"id"`
		}{id}})
		msg = append(append([]byte{delimiter}, msg...), '\n')
		if _, err := c.conn.Write(msg); err != nil {
			return c.syncErr(ctx, err)
		}
		attemptEnd := time.Now().Add(wait)
		if attemptEnd.After(deadline) {
			attemptEnd = deadline
		}
		c.conn.SetReadDeadline(attemptEnd)
		err := c.awaitSyncLocked(id, &seenDelim)
		if err == nil {
			c.conn.SetDeadline(time.Time{})
			if attempt > 1 {
				c.log.Debug("qga: synced", "path", c.path, "attempts", attempt)
			}
			return nil
		}
		if !isTimeout(err) || ctx.Err() != nil || !time.Now().Before(deadline) {
			return c.syncErr(ctx, err)
		}
		c.log.Debug("qga: sync unanswered, resending", "path", c.path, "attempt", attempt, "waited", wait)
		wait = min(wait*2, syncMaxWait)
	}
}

func (c *Client) syncErr(ctx context.Context, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("sync: %w", ctx.Err())
	case isTimeout(err) || ctx.Err() != nil:
		return fmt.Errorf("sync: agent did not answer guest-sync-delimited: %w", ErrTimeout)
	case errors.Is(err, ErrProtocol):
		return fmt.Errorf("sync: %w", err)
	}
	return fmt.Errorf("sync: %w: %w", ErrConnLost, err)
}

// awaitSyncLocked reads until the reply {"return": id}. seenDelim carries
// across attempts: once the agent's 0xFF was seen, the stream is line-framed.
func (c *Client) awaitSyncLocked(id int64, seenDelim *bool) error {
	for {
		if !*seenDelim {
			if _, err := c.rd.ReadSlice(delimiter); err != nil {
				if errors.Is(err, bufio.ErrBufferFull) {
					continue // discard stale bytes
				}
				return err
			}
			*seenDelim = true
		}
		line, err := c.readLineLocked()
		if err != nil {
			return err
		}
		if i := bytes.LastIndexByte(line, delimiter); i >= 0 {
			line = line[i+1:] // a later sync's delimiter
		}
		var r struct {
			Return *int64 `json:"return"`
		}
		if json.Unmarshal(bytes.TrimSpace(line), &r) == nil && r.Return != nil && *r.Return == id {
			return nil
		}
		// Anything else is stale: skip it.
	}
}
