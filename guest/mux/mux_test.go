package mux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCOBSRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := [][]byte{nil, {0}, {0, 0}, {1}, bytes.Repeat([]byte{0xff}, 254), bytes.Repeat([]byte{0xff}, 255),
		bytes.Repeat([]byte{0xff}, 600), bytes.Repeat([]byte{0}, 300)}
	for range 200 {
		b := make([]byte, r.IntN(2000))
		for i := range b {
			if r.IntN(4) == 0 {
				b[i] = 0
			} else {
				b[i] = byte(r.UintN(256))
			}
		}
		cases = append(cases, b)
	}
	for _, c := range cases {
		enc := cobsEncode(nil, c)
		if bytes.IndexByte(enc, 0) >= 0 {
			t.Fatalf("cobsEncode(%x) = %x; has a zero", c, enc)
		}
		dec, ok := cobsDecode(nil, enc)
		if !ok || !bytes.Equal(dec, c) {
			t.Fatalf("cobsDecode(cobsEncode(%x)) = %x, %v; want the input", c, dec, ok)
		}
	}
}

// TestDecoderGarbage: what a torn or hostile stream may hold; only the
// good frames come out, each bad one is counted.
func TestDecoderGarbage(t *testing.T) {
	good, _ := appendFrame(nil, nil, kindRequest, flagFin, 7, []byte("hello"))
	torn := good[:len(good)/2]
	flipped := bytes.Clone(good)
	flipped[3] ^= 0x40
	long := append(bytes.Repeat([]byte{0xff}, maxEncoded+10), 0)
	tests := []struct {
		name      string
		in        []byte
		wantGood  int
		wantDrops int
	}{
		{"one frame", good, 1, 0},
		{"leading zeros", append([]byte{0, 0, 0}, good...), 1, 0},
		{"torn then zero then good", append(append(append([]byte{}, torn...), 0), good...), 1, 1},
		{"torn glued to good", append(append([]byte{}, torn...), good...), 0, 1},
		{"bit flip", flipped, 0, 1},
		{"over-long run", append(long, good...), 1, 1},
		{"short frame", []byte{1, 1, 0}, 0, 1},
		{"bad cobs code", []byte{9, 1, 0}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, step := range []int{1, 3, len(tt.in)} {
				var d decoder
				n := 0
				for i := 0; i < len(tt.in); i += step {
					_ = d.feed(tt.in[i:min(i+step, len(tt.in))], func(f frame) error {
						if f.id != 7 || string(f.payload) != "hello" {
							t.Errorf("frame %d %q; want 7 \"hello\"", f.id, f.payload)
						}
						n++
						return nil
					})
				}
				if n != tt.wantGood || d.dropped != tt.wantDrops {
					t.Errorf("feed by %d: %d frames, %d dropped; want %d, %d", step, n, d.dropped, tt.wantGood, tt.wantDrops)
				}
			}
		})
	}
}

// echo is a handler that answers "<args joined>|<stdin>"; "sleep" waits
// for its context; "big N" answers N bytes.
func echo(ctx context.Context, req Request) Reply {
	switch {
	case len(req.Args) > 0 && req.Args[0] == "sleep":
		<-ctx.Done()
		return Reply{Exit: 9, Stdout: []byte("canceled")}
	case len(req.Args) == 2 && req.Args[0] == "big":
		var n int
		fmt.Sscan(req.Args[1], &n)
		return Reply{Stdout: bytes.Repeat([]byte{'x'}, n)}
	}
	return Reply{Exit: len(req.Args), Stdout: []byte(strings.Join(req.Args, " ") + "|" + string(req.Stdin))}
}

func helloJSON() []byte { return []byte(`{"version":"test"}`) }

func pair(t *testing.T) (*Client, *Server) {
	t.Helper()
	a, b := net.Pipe()
	s := &Server{Handler: echo, Hello: helloJSON}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.ServeConn(context.Background(), b) }()
	cl, hello, err := Dial(ctxT(t, 10*time.Second), a)
	if err != nil {
		t.Fatalf("Dial() = %v; want nil", err)
	}
	if string(hello) != string(helloJSON()) {
		t.Errorf("hello = %s; want %s", hello, helloJSON())
	}
	t.Cleanup(func() { cl.Close(); <-done })
	return cl, s
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestCallsConcurrent(t *testing.T) {
	cl, _ := pair(t)
	ctx := ctxT(t, 30*time.Second)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stdin := bytes.Repeat([]byte{byte('a' + i%26)}, i*1000)
			rep, err := cl.Call(ctx, Request{Args: []string{"run", fmt.Sprint(i)}, Stdin: stdin})
			want := fmt.Sprintf("run %d|%s", i, stdin)
			if err != nil || rep.Exit != 2 || string(rep.Stdout) != want {
				t.Errorf("Call(%d) = %d %.40q, %v; want 2 %.40q", i, rep.Exit, rep.Stdout, err, want)
			}
		}()
	}
	wg.Wait()
}

// TestSmallCallPassesLargeTransfer: a small call answers while a large
// reply is still on its way (the writer interleaves chunks).
func TestSmallCallPassesLargeTransfer(t *testing.T) {
	a, b := net.Pipe()
	slow := &slowConn{Conn: b, delay: 200 * time.Microsecond}
	s := &Server{Handler: echo, Hello: helloJSON}
	go func() { _ = s.ServeConn(context.Background(), slow) }()
	cl, _, err := Dial(ctxT(t, 10*time.Second), a)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := ctxT(t, time.Minute)
	var bigDone atomic.Bool
	bigErr := make(chan error, 1)
	go func() {
		rep, err := cl.Call(ctx, Request{Args: []string{"big", "8388608"}})
		bigDone.Store(true)
		if err == nil && len(rep.Stdout) != 8<<20 {
			err = fmt.Errorf("%d bytes; want %d", len(rep.Stdout), 8<<20)
		}
		bigErr <- err
	}()
	for slow.written.Load() < 256<<10 { // the big reply is flowing
		pause()
	}
	rep, err := cl.Call(ctx, Request{Args: []string{"small"}})
	if err != nil || string(rep.Stdout) != "small|" {
		t.Fatalf("small Call = %q, %v; want \"small|\"", rep.Stdout, err)
	}
	if bigDone.Load() {
		t.Errorf("the large reply finished before the small call's; want the small one to pass it")
	}
	if err := <-bigErr; err != nil {
		t.Errorf("big Call: %v", err)
	}
}

// slowConn slows each write, as a virtio-serial port does.
type slowConn struct {
	net.Conn
	delay   time.Duration
	written atomic.Int64
}

func (c *slowConn) Write(p []byte) (int, error) {
	time.Sleep(c.delay)
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

func TestCancelReachesHandler(t *testing.T) {
	cl, _ := pair(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Call(ctx, Request{Args: []string{"sleep"}})
		errc <- err
	}()
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Call = %v; want context.Canceled", err)
	}
	// The connection still works, and the canceled handler has ended (no
	// more than MaxStreams leak: run more than that many after).
	for i := range MaxStreams + 5 {
		c2, cancel2 := context.WithCancel(context.Background())
		go func() { time.Sleep(time.Millisecond); cancel2() }()
		_, _ = cl.Call(c2, Request{Args: []string{"sleep"}})
		if rep, err := cl.Call(ctxT(t, 10*time.Second), Request{Args: []string{"x"}}); err != nil || string(rep.Stdout) != "x|" {
			t.Fatalf("call %d after cancels = %q, %v", i, rep.Stdout, err)
		}
	}
}

func TestDialNoAnswer(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	go io.Copy(io.Discard, b)
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if _, _, err := Dial(ctx, a); !errors.Is(err, ErrNoHello) {
		t.Fatalf("Dial to a silent peer = %v; want ErrNoHello", err)
	}
}

func pause() { time.Sleep(50 * time.Microsecond) }
