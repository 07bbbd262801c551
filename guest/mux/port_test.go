package mux

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakePort behaves as a virtio-serial port does for the guest: a read
// returns nothing at once while the host's end is closed, a write waits
// until a host is there, and what the guest wrote and no host read yet
// reaches the next host (stale bytes for it to drop).
//
// mu guards every field; cond signals any change.
type fakePort struct {
	mu        sync.Mutex
	cond      *sync.Cond
	connected bool
	gen       int
	toGuest   []byte
	toHost    []byte
}

func newFakePort() *fakePort {
	p := &fakePort{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

func (p *fakePort) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.toGuest) == 0 && p.connected {
		p.cond.Wait()
	}
	n := copy(b, p.toGuest)
	p.toGuest = p.toGuest[n:]
	return n, nil
}

func (p *fakePort) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.connected {
		p.cond.Wait()
	}
	p.toHost = append(p.toHost, b...)
	p.cond.Broadcast()
	return len(b), nil
}

// connect opens the host's end: the previous one, if any, is closed.
func (p *fakePort) connect() *hostEnd {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	p.connected = true
	p.cond.Broadcast()
	return &hostEnd{p: p, gen: p.gen}
}

type hostEnd struct {
	p   *fakePort
	gen int
}

func (h *hostEnd) live() bool { return h.p.gen == h.gen && h.p.connected }

func (h *hostEnd) Read(b []byte) (int, error) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.toHost) == 0 && h.live() {
		p.cond.Wait()
	}
	if !h.live() {
		return 0, io.EOF
	}
	n := copy(b, p.toHost)
	p.toHost = p.toHost[n:]
	return n, nil
}

func (h *hostEnd) Write(b []byte) (int, error) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if !h.live() {
		return 0, syscall.EPIPE
	}
	p.toGuest = append(p.toGuest, b...)
	p.cond.Broadcast()
	return len(b), nil
}

func (h *hostEnd) Close() error {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.live() {
		p.connected = false
		p.cond.Broadcast()
	}
	return nil
}

// TestPortSurvivesHostCloseAtAnyByte: a host that leaves after any prefix
// of its hello and request leaves the helper able to serve the next host
// at once, and the torn request never runs.
func TestPortSurvivesHostCloseAtAnyByte(t *testing.T) {
	port := newFakePort()
	var torn atomic.Int32
	s := &Server{Hello: helloJSON, Handler: func(ctx context.Context, req Request) Reply {
		if len(req.Args) > 0 && req.Args[0] == "torn" {
			torn.Add(1)
		}
		return echo(ctx, req)
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.ServePort(ctx, port) }()

	hello, _ := appendFrame(append([]byte{}, lineBreak...), nil, kindHello, 0, 0, make([]byte, nonceBytes))
	msg, _ := encodeMessage(Request{Args: []string{"torn", "request"}}, []byte("stdin of the torn request"))
	req, _ := appendFrame(nil, nil, kindRequest, flagFin, 99, msg)
	prefix := append(hello, req...)
	for k := 0; k < len(prefix); k++ {
		h1 := port.connect()
		if _, err := h1.Write(prefix[:k]); err != nil {
			t.Fatal(err)
		}
		h1.Close()
		h2 := port.connect()
		cl, _, err := Dial(ctxT(t, 10*time.Second), h2)
		if err != nil {
			t.Fatalf("cut at %d: Dial() = %v; want nil", k, err)
		}
		rep, err := cl.Call(ctxT(t, 10*time.Second), Request{Args: []string{"after"}, Stdin: []byte{byte(k)}})
		if err != nil || string(rep.Stdout) != "after|"+string([]byte{byte(k)}) {
			t.Fatalf("cut at %d: Call() = %q, %v; want the answer", k, rep.Stdout, err)
		}
		cl.Close()
	}
	if n := torn.Load(); n != 0 {
		t.Errorf("the torn request ran %d times; want 0", n)
	}
	cancel()
	port.connect().Close() // a read waiting for data returns
	if err := <-served; err != nil {
		t.Errorf("ServePort() = %v; want nil", err)
	}
}

// TestPortDropsRepliesOfAHostThatLeft: a reply owed to a host that left is
// not sent to the next one, and the command still ran.
func TestPortDropsRepliesOfAHostThatLeft(t *testing.T) {
	port := newFakePort()
	started, release, ran := make(chan struct{}), make(chan struct{}), make(chan struct{})
	s := &Server{Hello: helloJSON, Handler: func(ctx context.Context, req Request) Reply {
		if req.Args[0] == "slow" {
			close(started)
			<-release
			close(ran)
		}
		return echo(ctx, req)
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); port.connect().Close() }()
	go func() { _ = s.ServePort(ctx, port) }()

	h1 := port.connect()
	cl1, _, err := Dial(ctxT(t, 10*time.Second), h1)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = cl1.Call(context.Background(), Request{Args: []string{"slow"}}) }()
	<-started
	cl1.Close()

	h2 := port.connect()
	var raw rawHost
	raw.h = h2
	if err := raw.hello(); err != nil {
		t.Fatal(err)
	}
	raw.until(t, kindHelloAck, 0) // the new epoch has begun
	close(release)
	<-ran
	raw.send(t, 5, Request{Args: []string{"x"}})
	kinds := raw.until(t, kindReply, 5)
	for _, f := range kinds {
		if f.kind == kindReply && f.id != 5 {
			t.Errorf("the new host got a reply for stream %d (the old host's); want only its own", f.id)
		}
	}
}

// rawHost speaks frames by hand.
type rawHost struct {
	h   *hostEnd
	dec decoder
}

func (r *rawHost) hello() error {
	enc, _ := appendFrame(append([]byte{}, lineBreak...), nil, kindHello, 0, 0, make([]byte, nonceBytes))
	_, err := r.h.Write(enc)
	return err
}

func (r *rawHost) send(t *testing.T, id uint32, req Request) {
	msg, _ := encodeMessage(req, req.Stdin)
	enc, _ := appendFrame(nil, nil, kindRequest, flagFin, id, msg)
	if _, err := r.h.Write(enc); err != nil {
		t.Fatal(err)
	}
}

// until reads frames until one of kind on stream id and returns every
// frame seen.
func (r *rawHost) until(t *testing.T, kind byte, id uint32) []frame {
	var seen []frame
	buf := make([]byte, 4096)
	for {
		n, err := r.h.Read(buf)
		done := false
		_ = r.dec.feed(buf[:n], func(f frame) error {
			seen = append(seen, frame{kind: f.kind, id: f.id})
			done = done || f.kind == kind && f.id == id
			return nil
		})
		if done {
			return seen
		}
		if err != nil {
			t.Fatalf("reading: %v", err)
		}
	}
}

// TestPortDropsRequestsBeforeHello: a request in an epoch with no hello (a
// stale one, from a host that has gone) never runs, and is answered
// kindNoHello.
func TestPortDropsRequestsBeforeHello(t *testing.T) {
	port := newFakePort()
	var ran atomic.Int32
	s := &Server{Hello: helloJSON, Handler: func(ctx context.Context, req Request) Reply {
		ran.Add(1)
		return echo(ctx, req)
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); port.connect().Close() }()
	go func() { _ = s.ServePort(ctx, port) }()
	raw := rawHost{h: port.connect()}
	raw.send(t, 3, Request{Args: []string{"stale"}})
	raw.until(t, kindNoHello, 3)
	if err := raw.hello(); err != nil {
		t.Fatal(err)
	}
	raw.until(t, kindHelloAck, 0)
	raw.send(t, 4, Request{Args: []string{"fresh"}})
	for _, f := range raw.until(t, kindReply, 4) {
		if f.kind == kindReply && f.id == 3 {
			t.Errorf("the request sent before the hello was answered")
		}
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1 (the request after the hello)", n)
	}
}

// TestClientGivesUpOnASilentGuest: a helper that dies behind a port whose
// host end stays open (as QEMU's does) fails the calls in flight once
// the silence limit passes without a frame.
func TestClientGivesUpOnASilentGuest(t *testing.T) {
	port := newFakePort()
	s := &Server{Hello: helloJSON, Handler: echo}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = s.ServePort(ctx, port) }()
	fc := newFakeClock()
	cl, _, err := DialWith(ctxT(t, 10*time.Second), port.connect(), Options{SilenceLimit: 5 * time.Second, clk: fc.clock()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	go func() { // the keepalive's ticks, a second apart, while the test runs
		for i := 1; ; i++ {
			select {
			case fc.tick <- sec(float64(i)):
			case <-cl.Done():
				return
			}
		}
	}()
	// The helper dies: nothing reads the port or answers any more.
	cancel()
	port.mu.Lock()
	port.toGuest = append(port.toGuest, 0) // wake its read, which then sees ctx
	port.cond.Broadcast()
	port.mu.Unlock()
	_, err = cl.Call(ctxT(t, 60*time.Second), Request{Args: []string{"sleep"}})
	if !errors.Is(err, ErrSilent) {
		t.Fatalf("Call to a dead helper = %v; want ErrSilent (before the call's own minute)", err)
	}
}

// TestClientRedialsAfterTheHelperRestarted: a helper that restarted behind
// a port whose host end stayed open answers the next call kindNoHello;
// the call fails with ErrNeedHello, unrun, and the connection is given up.
func TestClientRedialsAfterTheHelperRestarted(t *testing.T) {
	port := newFakePort()
	var ran atomic.Int32
	s := &Server{Hello: helloJSON, Handler: func(ctx context.Context, req Request) Reply { ran.Add(1); return echo(ctx, req) }}
	ctx1, stop1 := context.WithCancel(context.Background())
	done1 := make(chan struct{})
	go func() { defer close(done1); _ = s.ServePort(ctx1, port) }()
	cl, _, err := Dial(ctxT(t, 10*time.Second), port.connect())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Call(ctxT(t, 10*time.Second), Request{Args: []string{"one"}}); err != nil {
		t.Fatal(err)
	}
	// The helper restarts; the host's end stays open.
	stop1()
	port.mu.Lock()
	port.toGuest = append(port.toGuest, 0)
	port.cond.Broadcast()
	port.mu.Unlock()
	<-done1
	ctx2, stop2 := context.WithCancel(context.Background())
	defer func() { stop2(); port.connect().Close() }()
	go func() { _ = s.ServePort(ctx2, port) }()
	if _, err := cl.Call(ctxT(t, 10*time.Second), Request{Args: []string{"two"}}); !errors.Is(err, ErrNeedHello) {
		t.Fatalf("Call after the restart = %v; want ErrNeedHello", err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1 (not the call after the restart)", n)
	}
	select {
	case <-cl.Done():
	default:
		t.Errorf("the connection is still up after ErrNeedHello; want it given up")
	}
}
