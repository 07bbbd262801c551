package mux

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func sec(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }

// TestSilenceTick: which silences give the connection up, tick by tick
// (every 1 s, limit 10 s).
func TestSilenceTick(t *testing.T) {
	type step struct {
		at    float64 // the tick's time, seconds after t0
		heard uint64  // frames heard so far
		calls int     // calls in flight, the oldest sent at t0
		ping  bool    // a ping goes out after the tick
	}
	steady := func(from, to int, heard uint64, calls int) []step {
		var s []step
		for i := from; i <= to; i++ {
			s = append(s, step{at: float64(i), heard: heard, calls: calls, ping: true})
		}
		return s
	}
	cat := func(parts ...[]step) []step {
		var out []step
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name     string
		steps    []step
		wantFail int // the step that fails, -1 for none
		wantText []string
	}{
		{"a dead guest, idle: pings unanswered", steady(1, 12, 1, 0), 10, []string{"nothing for 10s", "limit 10s", "10 ping(s)"}},
		{"a dead guest with a call in flight", steady(1, 12, 1, 1), 10, []string{"nothing for 10s", `1 call(s) (the oldest, "run", sent 11s ago)`}},
		{"a slow guest: a frame every 9 s", cat(steady(1, 9, 1, 1), steady(10, 18, 2, 1), steady(19, 27, 3, 1), steady(28, 36, 4, 1)), -1, nil},
		{"a slow guest that then goes quiet", cat(steady(1, 9, 1, 1), steady(10, 25, 2, 1)), 10 + 9, []string{"nothing for 10s"}},
		{"the host stalls: long gaps between few ticks are not silence", []step{
			{at: 1, heard: 1, ping: true}, {at: 60, heard: 1, ping: true}, {at: 120, heard: 1, ping: true},
			{at: 400, heard: 1, ping: true}, {at: 401, heard: 1, ping: true},
		}, -1, nil},
		{"the host stalls, then the ticks reach the limit", cat([]step{{at: 1, heard: 1, ping: true}, {at: 60, heard: 1, ping: true}},
			steady(61, 75, 1, 0)), 10, []string{"nothing for 1m8s", "limit 10s"}},
		{"nothing owed, nothing counted (no ping went out)", []step{{at: 1, heard: 1}, {at: 30, heard: 1}, {at: 31, heard: 1}}, -1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s silence
			failed := -1
			var err error
			for i, st := range tt.steps {
				o := owed{calls: st.calls}
				if st.calls > 0 {
					o.oldestSent, o.oldestWhat = t0, "run"
				}
				if err = s.tick(sec(st.at), st.heard, o, time.Second, 10*time.Second); err != nil {
					failed = i
					break
				}
				if st.ping {
					s.pinged(sec(st.at))
				}
			}
			if failed != tt.wantFail {
				t.Fatalf("failed at step %d (%v); want step %d", failed, err, tt.wantFail)
			}
			if err != nil && !errors.Is(err, ErrSilent) {
				t.Errorf("tick() = %v; want ErrSilent", err)
			}
			for _, w := range tt.wantText {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("tick() = %v; want it to say %q", err, w)
				}
			}
		})
	}
}

func TestCallName(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "run"},
		{[]string{"session", "create", "--id", "abc"}, "session create"},
		{[]string{"ps", "--session", "s1"}, "ps"},
		{[]string{"file", "write", "/etc/secret"}, "file write"},
		{[]string{"/etc/secret"}, "(unnamed)"},
		{nil, "(unnamed)"},
	} {
		if got := callName(tt.args); got != tt.want {
			t.Errorf("callName(%q) = %q; want %q", tt.args, got, tt.want)
		}
	}
}

// fakeClock is a Client's clock driven by the test: ticks go out when
// the test sends them, and now is the last tick's time.
type fakeClock struct {
	mu   sync.Mutex
	cur  time.Time
	tick chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{cur: t0, tick: make(chan time.Time)} }

func (f *fakeClock) clock() *clock {
	return &clock{
		now: func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.cur },
		ticker: func(time.Duration) (<-chan time.Time, func()) {
			return f.tick, func() {}
		},
	}
}

// advance sets now to at and delivers a tick of that time.
func (f *fakeClock) advance(at time.Time) {
	f.mu.Lock()
	f.cur = at
	f.mu.Unlock()
	f.tick <- at
}

// rawGuest is a guest the test speaks for, frame by frame: it answers the
// hello at once, hands every other frame to frames, and sends what the
// test tells it to.
type rawGuest struct {
	c      net.Conn
	frames chan frame
}

func newRawGuest(t *testing.T, c net.Conn) *rawGuest {
	g := &rawGuest{c: c, frames: make(chan frame, 1024)}
	go func() {
		defer close(g.frames)
		var dec decoder
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			_ = dec.feed(buf[:n], func(f frame) error {
				f.payload = append([]byte(nil), f.payload...)
				if f.kind == kindHello {
					enc, _ := appendFrame(nil, nil, kindHelloAck, 0, f.id, append(f.payload, helloJSON()...))
					go c.Write(enc)
					return nil
				}
				g.frames <- f
				return nil
			})
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { c.Close() })
	return g
}

// next returns the next frame of kind (others are skipped); ok is false
// once the connection has ended.
func (g *rawGuest) next(kind byte) (frame, bool) {
	for f := range g.frames {
		if f.kind == kind {
			return f, true
		}
	}
	return frame{}, false
}

func (g *rawGuest) send(t *testing.T, kind, flags byte, id uint32, payload []byte) {
	enc, _ := appendFrame(nil, nil, kind, flags, id, payload)
	if _, err := g.c.Write(enc); err != nil {
		t.Fatalf("guest write: %v", err)
	}
}

// liveClient dials a rawGuest with a fake clock, a 1 s ping and a 10 s
// limit.
func liveClient(t *testing.T) (*Client, *rawGuest, *fakeClock) {
	a, b := net.Pipe()
	g := newRawGuest(t, b)
	fc := newFakeClock()
	cl, _, err := DialWith(ctxT(t, 10*time.Second), a, Options{PingEvery: time.Second, SilenceLimit: 10 * time.Second, clk: fc.clock()})
	if err != nil {
		t.Fatalf("DialWith() = %v; want nil", err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl, g, fc
}

// startCall runs Call(args) in the background and returns once the guest
// has the request; the result comes on the channel.
func startCall(t *testing.T, cl *Client, g *rawGuest, args ...string) (uint32, <-chan error) {
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Call(context.Background(), Request{Args: args})
		errc <- err
	}()
	f, ok := g.next(kindRequest)
	if !ok {
		t.Fatal("the guest got no request")
	}
	return f.id, errc
}

// tickExpectPing delivers a tick and waits for the ping it sends; false
// when the connection ended instead.
func tickExpectPing(cl *Client, g *rawGuest, fc *fakeClock, at time.Time) bool {
	fc.advance(at)
	pinged := make(chan bool, 1)
	go func() { _, ok := g.next(kindPing); pinged <- ok }()
	select {
	case ok := <-pinged:
		return ok
	case <-cl.Done():
		return false
	}
}

// TestClientKeepsASlowGuest: a guest that answers a ping only every 8 s,
// and a call after 30 s, stays connected under a 10 s limit; the call
// gets its reply.
func TestClientKeepsASlowGuest(t *testing.T) {
	cl, g, fc := liveClient(t)
	id, errc := startCall(t, cl, g, "run")
	for i := 1; i <= 30; i++ {
		if !tickExpectPing(cl, g, fc, sec(float64(i))) {
			t.Fatalf("the connection ended at tick %d: %v; want it kept", i, cl.Err())
		}
		if i%8 == 0 {
			before := cl.heard.Load()
			g.send(t, kindPong, 0, uint32(i), nil)
			for cl.heard.Load() == before { // the client has read it
				pause()
			}
		}
	}
	msg, _ := encodeMessage(Reply{Exit: 3}, []byte("late"))
	g.send(t, kindReply, flagFin, id, msg)
	if err := <-errc; err != nil {
		t.Fatalf("Call to a slow guest = %v; want its reply", err)
	}
	select {
	case <-cl.Done():
		t.Fatalf("the connection ended: %v; want it kept", cl.Err())
	default:
	}
}

// TestClientDropsADeadGuest: a guest that sends nothing more is given up
// exactly when it has owed an answer for the limit, and the error says
// how long and what it owed; the call in flight fails with it.
func TestClientDropsADeadGuest(t *testing.T) {
	cl, g, fc := liveClient(t)
	_, errc := startCall(t, cl, g, "session", "create", "--secret-arg")
	for i := 1; i <= 10; i++ {
		if !tickExpectPing(cl, g, fc, sec(float64(i))) {
			t.Fatalf("the connection ended at tick %d (%v); want it kept until the limit", i, cl.Err())
		}
	}
	fc.advance(sec(11))
	err := <-errc
	if !errors.Is(err, ErrSilent) {
		t.Fatalf("Call to a dead guest = %v; want ErrSilent", err)
	}
	for _, w := range []string{"nothing for 10s", "limit 10s", `"session create"`, "10 ping(s)"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q; want it to say %q", err, w)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error %q names a call argument; want only its command words", err)
	}
	if <-cl.Done(); !errors.Is(cl.Err(), ErrSilent) {
		t.Errorf("Err() = %v; want ErrSilent", cl.Err())
	}
}

// TestClientIdleGuestAnswering: an idle connection whose guest answers
// its pings lasts however many ticks pass.
func TestClientIdleGuestAnswering(t *testing.T) {
	cl, g, fc := liveClient(t)
	for i := 1; i <= 100; i++ {
		if !tickExpectPing(cl, g, fc, sec(float64(i))) {
			t.Fatalf("the connection ended at tick %d: %v", i, cl.Err())
		}
		before := cl.heard.Load()
		g.send(t, kindPong, 0, uint32(i), nil)
		for cl.heard.Load() == before {
			pause()
		}
	}
}
