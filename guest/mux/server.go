package mux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// Server serves helper commands on byte streams (the guest side). Its
// fields are read-only once it serves.
type Server struct {
	// Handler runs one request and returns its reply. ctx ends when the
	// host cancels the stream, when a ServeConn connection ends, or when
	// the serve's own ctx ends.
	Handler func(ctx context.Context, req Request) Reply
	// Hello is the JSON the helper answers a hello with.
	Hello func() []byte
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
}

// streamKey names a stream within the epoch that opened it.
type streamKey struct {
	epoch uint64
	id    uint32
}

// inMsg is a request being received.
type inMsg struct {
	buf      []byte
	rejected bool
}

// serverConn is one stream's state. mu guards epoch, in and running; the
// reading goroutine is the only one that changes epoch and in.
type serverConn struct {
	s   *Server
	ctx context.Context
	snd *sender
	log *slog.Logger

	mu      sync.Mutex
	epoch   uint64
	helloed bool // the current epoch began with a hello
	in      map[uint32]*inMsg
	running map[streamKey]context.CancelFunc
	wg      sync.WaitGroup
}

func (s *Server) newConn(ctx context.Context, w io.Writer) *serverConn {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &serverConn{s: s, ctx: ctx, snd: newSender(w), log: log, in: map[uint32]*inMsg{}, running: map[streamKey]context.CancelFunc{}}
}

// ServeConn serves one connection (the helper's unix socket) until its
// peer closes it or ctx ends; then it cancels the calls still running and
// waits for them.
func (s *Server) ServeConn(ctx context.Context, c io.ReadWriteCloser) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	sc := s.newConn(ctx, c)
	var dec decoder
	buf := make([]byte, 64<<10)
	var err error
	for {
		var n int
		n, err = c.Read(buf)
		if n > 0 {
			if ferr := dec.feed(buf[:n], sc.frame); ferr != nil {
				err = ferr
				break
			}
		}
		if err != nil {
			break
		}
	}
	cancel()
	sc.wg.Wait()
	sc.snd.close(errClosed)
	<-sc.snd.stopped
	c.Close()
	if errors.Is(err, io.EOF) || ctx.Err() != nil {
		return nil
	}
	return err
}

// ServePort serves a port whose peer comes and goes (a virtio-serial
// port, where a read of nothing means the host's end is closed). While
// the host is away it polls, backing off from 5 ms to pollMax; each time
// the host goes it starts a new epoch (replies still owed are dropped,
// the commands run on). It returns a read error other than that, or nil
// when ctx ends.
func (s *Server) ServePort(ctx context.Context, port io.ReadWriter) error {
	sc := s.newConn(ctx, port)
	defer func() {
		sc.snd.close(errClosed)
		sc.wg.Wait()
	}()
	var dec decoder
	buf := make([]byte, 64<<10)
	idle := time.Duration(0)
	for ctx.Err() == nil {
		n, err := port.Read(buf)
		if n > 0 {
			idle = 0
			if ferr := dec.feed(buf[:n], sc.frame); ferr != nil {
				return ferr
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("mux: reading the port: %w", err)
		}
		if idle == 0 {
			// The host's end closed: whatever it was sending is torn.
			dec.reset()
			sc.hostGone()
			idle = 5 * time.Millisecond
		} else {
			idle = min(idle*2, pollMax)
		}
		select {
		case <-ctx.Done():
		case <-time.After(idle):
		}
	}
	return nil
}

// pollMax bounds the wait between reads of a port whose host end is closed
// (a host that connects waits at most this long for its hello's answer).
const pollMax = 100 * time.Millisecond

// hostGone starts a new epoch without a hello: partial requests are
// dropped, and so are the replies owed to the host that left.
func (sc *serverConn) hostGone() {
	sc.mu.Lock()
	sc.epoch++
	sc.helloed = false
	sc.in = map[uint32]*inMsg{}
	sc.mu.Unlock()
	sc.snd.newEpoch(sc.currentEpoch())
}

func (sc *serverConn) currentEpoch() uint64 {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.epoch
}

// frame handles one frame from the host.
func (sc *serverConn) frame(f frame) error {
	switch f.kind {
	case kindHello:
		if len(f.payload) != nonceBytes {
			return nil
		}
		sc.hostGone()
		sc.mu.Lock()
		sc.helloed = true
		sc.mu.Unlock()
		var hello []byte
		if sc.s.Hello != nil {
			hello = sc.s.Hello()
		}
		enc, _ := appendFrame(nil, nil, kindHelloAck, 0, f.id, append(append([]byte{}, f.payload...), hello...))
		return sc.ignoreClosed(sc.snd.control(enc))
	case kindRequest:
		return sc.request(f)
	case kindPing:
		enc, _ := appendFrame(nil, nil, kindPong, 0, f.id, nil)
		return sc.ignoreClosed(sc.snd.control(enc))
	case kindCancel:
		sc.mu.Lock()
		delete(sc.in, f.id)
		if cancel, ok := sc.running[streamKey{sc.epoch, f.id}]; ok {
			cancel()
		}
		sc.mu.Unlock()
	}
	return nil
}

func (sc *serverConn) ignoreClosed(err error) error {
	if errors.Is(err, errClosed) {
		return nil
	}
	return err
}

// request adds a chunk to its stream's request and starts the handler
// once the request is whole.
func (sc *serverConn) request(f frame) error {
	sc.mu.Lock()
	if !sc.helloed {
		sc.mu.Unlock()
		if f.flags&flagFin != 0 {
			sc.log.Warn("mux: a request before this connection's hello; not run", "stream", f.id)
			enc, _ := appendFrame(nil, nil, kindNoHello, 0, f.id, nil)
			return sc.ignoreClosed(sc.snd.control(enc))
		}
		return nil
	}
	m, ok := sc.in[f.id]
	if !ok {
		m = &inMsg{}
		sc.in[f.id] = m
		if len(sc.in)+len(sc.running) > MaxStreams {
			m.rejected = true
			sc.reject(f.id, fmt.Sprintf("more than %d calls in flight", MaxStreams))
		}
	}
	if !m.rejected {
		if len(m.buf)+len(f.payload) > MaxMessageBytes {
			m.rejected, m.buf = true, nil
			sc.reject(f.id, fmt.Sprintf("request larger than %d bytes", MaxMessageBytes))
		} else {
			m.buf = append(m.buf, f.payload...)
		}
	}
	if f.flags&flagFin == 0 {
		sc.mu.Unlock()
		return nil
	}
	delete(sc.in, f.id)
	if m.rejected {
		sc.mu.Unlock()
		return nil
	}
	var req Request
	body, err := decodeMessage(m.buf, &req)
	if err != nil {
		sc.reject(f.id, err.Error())
		sc.mu.Unlock()
		return nil
	}
	req.Stdin = body
	key := streamKey{sc.epoch, f.id}
	ctx, cancel := context.WithCancel(sc.ctx)
	sc.running[key] = cancel
	sc.wg.Add(1)
	sc.mu.Unlock()
	go sc.serve(ctx, cancel, key, req)
	return nil
}

// reject answers a stream with kindReject. mu is held.
func (sc *serverConn) reject(id uint32, why string) {
	sc.log.Warn("mux: rejecting a call", "stream", id, "why", why)
	enc, _ := appendFrame(nil, nil, kindReject, flagFin, id, []byte(why))
	_ = sc.snd.control(enc)
}

func (sc *serverConn) serve(ctx context.Context, cancel context.CancelFunc, key streamKey, req Request) {
	defer sc.wg.Done()
	defer cancel()
	rep := sc.s.Handler(ctx, req)
	msg, err := encodeMessage(rep, rep.Stdout)
	sc.mu.Lock()
	delete(sc.running, key)
	sc.mu.Unlock()
	if err != nil {
		sc.log.Error("mux: encoding a reply", "err", err)
		return
	}
	_ = sc.snd.send(kindReply, key.id, msg, key.epoch)
}
