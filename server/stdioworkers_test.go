package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy/audit"
)

// TestStdioWorkersBound: at most max messages run at once; a message
// submitted while all workers are busy waits for one of them (no new
// worker) or gives up when its done channel closes; stop lets every
// worker exit and refuses what comes after.
func TestStdioWorkersBound(t *testing.T) {
	const max = 3
	release := make(chan struct{})
	running := make(chan string, 2*max)
	var now, peak atomic.Int32
	w := newStdioWorkers(max, func(line []byte) {
		n := now.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		running <- string(line)
		<-release
		now.Add(-1)
	})
	never := make(chan struct{})
	for _, l := range []string{"a", "b", "c"} {
		if !w.submit([]byte(l), never) {
			t.Fatalf("submit(%q) = false; want true", l)
		}
	}
	for range max {
		<-running
	}
	if got := w.started(); got != max {
		t.Fatalf("started() = %d; want %d", got, max)
	}
	closed := make(chan struct{})
	close(closed)
	if w.submit([]byte("d"), closed) {
		t.Fatalf("submit with every worker busy and done closed = true; want false")
	}
	release <- struct{}{} // one worker finishes "a", "b" or "c" and is idle again
	if !w.submit([]byte("e"), never) {
		t.Fatalf("submit(e) = false; want true")
	}
	if got := <-running; got != "e" {
		t.Fatalf("running %q; want e", got)
	}
	if got := w.started(); got != max {
		t.Fatalf("started() after a worker was idle again = %d; want %d", got, max)
	}
	w.stop()
	close(release)
	w.wg.Wait()
	if w.submit([]byte("f"), never) {
		t.Fatalf("submit after stop = true; want false")
	}
	if p := peak.Load(); p != max {
		t.Fatalf("peak concurrency = %d; want %d", p, max)
	}
}

// TestStdioWorkersReuse: messages one after another, each sent once the
// worker of the one before is idle, all run on the one worker the first
// started.
func TestStdioWorkersReuse(t *testing.T) {
	done := make(chan struct{})
	w := newStdioWorkers(maxConcurrentCalls, func([]byte) { done <- struct{}{} })
	for i := range 100 {
		if !w.submit([]byte("x"), nil) {
			t.Fatalf("submit #%d = false; want true", i)
		}
		<-done
		for w.idle.Load() == 0 { // the worker is on its way back to wait
			runtime.Gosched()
		}
	}
	if got := w.started(); got != 1 {
		t.Fatalf("started() after 100 messages one after another = %d; want 1", got)
	}
	w.stop()
	w.wg.Wait()
}

// stdioConn is a ServeStdio of grant "local" over pipes.
type stdioConn struct {
	in      *io.PipeWriter
	replies *bufio.Scanner
	done    chan error
}

func serveStdioPipes(t *testing.T, s *Server) *stdioConn {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &stdioConn{in: inW, replies: bufio.NewScanner(outR), done: make(chan error, 1)}
	c.replies.Buffer(nil, 1<<20)
	go func() { c.done <- s.ServeStdio(context.Background(), inR, outW); outW.Close() }()
	t.Cleanup(func() { inW.Close(); outR.Close() })
	return c
}

func (c *stdioConn) send(t *testing.T, msg string) {
	t.Helper()
	if _, err := io.WriteString(c.in, msg+"\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func (c *stdioConn) reply(t *testing.T) rpcReply {
	t.Helper()
	if !c.replies.Scan() {
		t.Fatalf("no reply: %v", c.replies.Err())
	}
	var r rpcReply
	if err := json.Unmarshal(c.replies.Bytes(), &r); err != nil {
		t.Fatalf("reply %.200q: %v", c.replies.Bytes(), err)
	}
	return r
}

// TestServeStdioLongLineAndPanic: a line over the limit is answered with
// a parse error and a handler that panics with an internal error; the
// connection (and the worker that ran the panicking call) serves on, and
// the panicking call's outcome is recorded as an error, not refunded.
func TestServeStdioLongLineAndPanic(t *testing.T) {
	drv := countingFake(new(atomic.Int64))
	drv.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
		if vm == "boom" {
			panic("fake: driver bug")
		}
		return hypervisor.Status{Name: vm, State: hypervisor.StateRunning}, nil
	}
	f := newFixture(t, fixtureOpts{driver: drv})
	c := serveStdioPipes(t, f.s)
	c.send(t, initMsg)
	if r := c.reply(t); r.Result == nil {
		t.Fatalf("initialize = %+v", r.Error)
	}
	c.send(t, `{"jsonrpc":"2.0","id":2,"method":"ping","params":{"pad":"`+strings.Repeat("x", 4*f.s.limits.MaxMessageBytes)+`"}}`)
	if r := c.reply(t); r.Error == nil || r.Error.Code != mcp.PARSE_ERROR || r.Error.Message != "message too large" || string(r.ID) != "null" {
		t.Errorf("a line over the limit = id %s, error %+v; want %d message too large, id null", r.ID, r.Error, mcp.PARSE_ERROR)
	}
	c.send(t, toolCall(3, "vm_status", `{"vm":"lab/boom"}`))
	if r := c.reply(t); r.Error == nil || r.Error.Code != mcp.INTERNAL_ERROR {
		t.Errorf("a call whose driver panics = %+v, %q; want error %d", r.Error, r.text(), mcp.INTERNAL_ERROR)
	}
	c.send(t, toolCall(4, "vm_status", `{"vm":"lab/vm1"}`))
	if r := c.reply(t); r.Result == nil || r.Result.IsError || string(r.ID) != "4" {
		t.Errorf("vm_status after the panic = id %s, %q; want a result", r.ID, r.text())
	}
	c.in.Close()
	if err := <-c.done; err != nil {
		t.Errorf("ServeStdio = %v; want nil at EOF", err)
	}
	var outcomes []string
	for _, rec := range f.rec.records() {
		if rec.Kind == audit.KindOutcome && rec.VM == "lab/boom" {
			outcomes = append(outcomes, fmt.Sprintf("%s refunded=%v", rec.Outcome, rec.Refunded))
		}
	}
	if len(outcomes) != 1 || outcomes[0] != "error refunded=false" {
		t.Errorf("outcome records of the panicking call = %q; want [error refunded=false]", outcomes)
	}
}

// TestServeStdioDrain: when the input ends, a call in flight still gets
// its reply; one still running ShutdownGrace later is cancelled, and
// ServeStdio returns.
func TestServeStdioDrain(t *testing.T) {
	old := ShutdownGrace
	t.Cleanup(func() { ShutdownGrace = old })
	entered := make(chan string, 2)
	release := make(chan struct{})
	var cancelled atomic.Bool
	drv := countingFake(new(atomic.Int64))
	drv.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
		entered <- vm
		select {
		case <-release:
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning}, nil
		case <-ctx.Done():
			cancelled.Store(true)
			return hypervisor.Status{}, fmt.Errorf("fake: status: %w", ctx.Err())
		}
	}
	for _, tt := range []struct {
		name    string
		grace   time.Duration
		release bool
	}{
		{"finishes within the grace", time.Hour, true},
		{"cancelled after the grace", 50 * time.Millisecond, false},
	} {
		ShutdownGrace = tt.grace
		cancelled.Store(false)
		f := newFixture(t, fixtureOpts{driver: drv})
		c := serveStdioPipes(t, f.s)
		c.send(t, initMsg)
		c.reply(t)
		c.send(t, toolCall(5, "vm_status", `{"vm":"lab/vm1"}`))
		<-entered
		c.in.Close()
		if tt.release {
			release <- struct{}{}
		}
		r := c.reply(t)
		if string(r.ID) != "5" || r.Result == nil || r.Result.IsError == tt.release {
			t.Errorf("%s: the call in flight at EOF = id %s, %q (error %+v); want its reply, isError %v", tt.name, r.ID, r.text(), r.Error, !tt.release)
		}
		if err := <-c.done; err != nil {
			t.Errorf("%s: ServeStdio = %v; want nil at EOF", tt.name, err)
		}
		if cancelled.Load() == tt.release {
			t.Errorf("%s: the driver's context cancelled = %v; want %v", tt.name, cancelled.Load(), !tt.release)
		}
	}
}
