package mux

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoHello: nothing answered the hello in time (no helper serves the
// other end, or it is stuck).
var ErrNoHello = errors.New("mux: no answer to hello")

// lineBreak starts every hello: a byte no frame ends with, then a
// delimiter. A frame torn off by a host that left ends at the delimiter
// and fails its CRC, even one that lacked only its own delimiter (the
// extra byte changes it).
var lineBreak = []byte{1, 0}

// helloEvery is how often Dial resends its hello while it waits.
const helloEvery = 250 * time.Millisecond

// Client is the host side of one connection. Safe for concurrent use:
// any number of calls share the connection.
//
// mu guards pending, next and err.
type Client struct {
	c   io.ReadWriteCloser
	snd *sender

	mu      sync.Mutex
	pending map[uint32]*pendingCall
	next    uint32
	err     error
	done    chan struct{} // closed when the connection has failed or closed

	nonce []byte
	hello chan []byte // the guest's hello, once

	opt   Options
	heard atomic.Uint64 // frames heard from the guest
}

// ErrNeedHello: the guest's helper has had no hello on this connection
// (it restarted behind the port): the call did not run, and the
// connection is given up.
var ErrNeedHello = errors.New("mux: the helper has had no hello on this connection (it restarted); the call did not run")

// ErrSilent: the guest sent nothing for Options.SilenceLimit while it owed
// an answer (the error says how long, and what it owed).
var ErrSilent = errors.New("mux: the guest sent nothing")

type pendingCall struct {
	buf  []byte
	done chan struct{}
	rep  Reply
	err  error
	sent time.Time // when Call sent it (Options' clock)
	what string    // callName of its arguments
}

// Dial starts a connection on c: it writes lineBreak (ending whatever was
// left half-written on the line) and a hello, resent every helloEvery,
// and returns once the guest answered with its hello (the JSON the
// helper's Server.Hello gave). On failure c is closed. ErrNoHello when
// ctx ends first. The connection's liveness check has the default
// Options.
func Dial(ctx context.Context, c io.ReadWriteCloser) (*Client, []byte, error) {
	return DialWith(ctx, c, Options{})
}

// DialWith is Dial with the liveness check's Options.
func DialWith(ctx context.Context, c io.ReadWriteCloser, o Options) (*Client, []byte, error) {
	cl := &Client{c: c, pending: map[uint32]*pendingCall{}, done: make(chan struct{}),
		nonce: make([]byte, nonceBytes), hello: make(chan []byte, 1), opt: o.withDefaults()}
	_, _ = rand.Read(cl.nonce)
	var start [4]byte
	_, _ = rand.Read(start[:])
	cl.next = binary.BigEndian.Uint32(start[:]) | 1
	cl.snd = newSender(c)
	go cl.read()
	hello := func() error {
		enc, _ := appendFrame(append([]byte{}, lineBreak...), nil, kindHello, 0, 0, cl.nonce)
		return cl.snd.control(enc)
	}
	if err := hello(); err != nil {
		cl.Close()
		return nil, nil, err
	}
	t := time.NewTicker(helloEvery)
	defer t.Stop()
	for {
		select {
		case h := <-cl.hello:
			go cl.keepalive()
			return cl, h, nil
		case <-cl.done:
			cl.Close()
			return nil, nil, fmt.Errorf("mux: hello: %w", cl.Err())
		case <-ctx.Done():
			cl.Close()
			return nil, nil, fmt.Errorf("%w: %w", ErrNoHello, ctx.Err())
		case <-t.C:
			if err := hello(); err != nil {
				cl.Close()
				return nil, nil, err
			}
		}
	}
}

// keepalive pings every PingEvery and fails the connection once the
// guest has owed an answer and sent nothing for SilenceLimit (silence).
func (cl *Client) keepalive() {
	tick, stop := cl.opt.clk.ticker(cl.opt.PingEvery)
	defer stop()
	var s silence
	var n uint32
	for {
		var now time.Time
		select {
		case <-cl.done:
			return
		case now = <-tick:
		}
		if err := s.tick(now, cl.heard.Load(), cl.owed(), cl.opt.PingEvery, cl.opt.SilenceLimit); err != nil {
			cl.fail(err)
			return
		}
		n++
		enc, _ := appendFrame(nil, nil, kindPing, 0, n, nil)
		if cl.snd.control(enc) != nil {
			return
		}
		s.pinged(now)
	}
}

// owed counts the calls in flight and names the oldest.
func (cl *Client) owed() owed {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	o := owed{calls: len(cl.pending)}
	for _, p := range cl.pending {
		if o.oldestSent.IsZero() || p.sent.Before(o.oldestSent) {
			o.oldestSent, o.oldestWhat = p.sent, p.what
		}
	}
	return o
}

// Done is closed once the connection has failed or been closed.
func (cl *Client) Done() <-chan struct{} { return cl.done }

// Err says why the connection ended (nil while it works).
func (cl *Client) Err() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.err
}

// Close ends the connection; calls in flight fail.
func (cl *Client) Close() error {
	cl.fail(errClosed)
	return nil
}

// fail ends the connection once with err and fails every pending call.
func (cl *Client) fail(err error) {
	cl.mu.Lock()
	if cl.err != nil {
		cl.mu.Unlock()
		return
	}
	cl.err = err
	pending := cl.pending
	cl.pending = map[uint32]*pendingCall{}
	close(cl.done)
	cl.mu.Unlock()
	cl.snd.close(err)
	cl.c.Close()
	for _, p := range pending {
		p.err = err
		close(p.done)
	}
}

// Call sends req and waits for its reply. When ctx ends first, the guest
// is told to cancel the call (its handler's context ends) and Call
// returns ctx's error. A reply over MaxMessageBytes fails the call.
func (cl *Client) Call(ctx context.Context, req Request) (Reply, error) {
	msg, err := encodeMessage(req, req.Stdin)
	if err != nil {
		return Reply{}, fmt.Errorf("mux: %w", err)
	}
	if len(msg) > MaxMessageBytes {
		return Reply{}, fmt.Errorf("mux: request of %d bytes, at most %d", len(msg), MaxMessageBytes)
	}
	p := &pendingCall{done: make(chan struct{}), sent: cl.opt.clk.now(), what: callName(req.Args)}
	cl.mu.Lock()
	if cl.err != nil {
		err := cl.err
		cl.mu.Unlock()
		return Reply{}, err
	}
	id := cl.next
	cl.next++
	cl.pending[id] = p
	cl.mu.Unlock()
	if err := cl.snd.send(kindRequest, id, msg, 0); err != nil {
		cl.forget(id)
		return Reply{}, err
	}
	select {
	case <-p.done:
		return p.rep, p.err
	case <-ctx.Done():
		cl.forget(id)
		cl.snd.drop(id)
		enc, _ := appendFrame(nil, nil, kindCancel, 0, id, nil)
		_ = cl.snd.control(enc)
		return Reply{}, ctx.Err()
	}
}

func (cl *Client) forget(id uint32) {
	cl.mu.Lock()
	delete(cl.pending, id)
	cl.mu.Unlock()
}

// read dispatches the guest's frames until the connection fails.
func (cl *Client) read() {
	var dec decoder
	buf := make([]byte, 64<<10)
	for {
		n, err := cl.c.Read(buf)
		if n > 0 {
			if ferr := dec.feed(buf[:n], cl.frame); ferr != nil {
				cl.fail(ferr)
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			cl.fail(fmt.Errorf("mux: connection: %w", err))
			return
		}
	}
}

// frame handles one frame from the guest. Frames before the answer to
// this connection's hello are stale and dropped.
func (cl *Client) frame(f frame) error {
	cl.heard.Add(1)
	if f.kind == kindHelloAck {
		if len(f.payload) >= nonceBytes && bytes.Equal(f.payload[:nonceBytes], cl.nonce) {
			select {
			case cl.hello <- bytes.Clone(f.payload[nonceBytes:]):
			default: // an answer to a resent hello
			}
		}
		return nil
	}
	if f.kind == kindNoHello {
		cl.mu.Lock()
		p, ok := cl.pending[f.id]
		delete(cl.pending, f.id)
		cl.mu.Unlock()
		if ok { // the connection is given up before the call learns why
			cl.fail(ErrNeedHello)
			p.err = ErrNeedHello
			close(p.done)
		}
		return nil
	}
	if f.kind != kindReply && f.kind != kindReject {
		return nil
	}
	cl.mu.Lock()
	p, ok := cl.pending[f.id]
	if !ok {
		cl.mu.Unlock()
		return nil
	}
	if f.kind == kindReject {
		delete(cl.pending, f.id)
		cl.mu.Unlock()
		p.err = fmt.Errorf("%w: %s", ErrRejected, f.payload)
		close(p.done)
		return nil
	}
	if len(p.buf)+len(f.payload) > MaxMessageBytes {
		delete(cl.pending, f.id)
		cl.mu.Unlock()
		p.err = fmt.Errorf("mux: reply larger than %d bytes", MaxMessageBytes)
		close(p.done)
		return nil
	}
	p.buf = append(p.buf, f.payload...)
	if f.flags&flagFin == 0 {
		cl.mu.Unlock()
		return nil
	}
	delete(cl.pending, f.id)
	cl.mu.Unlock()
	body, err := decodeMessage(p.buf, &p.rep)
	p.rep.Stdout, p.err = body, err
	close(p.done)
	return nil
}
