package stdio

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
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/servertest"
)

// feed is a crew's read: it hands out the lines sent on lines, counting
// the members reading, until lines is closed (io.EOF).
type feed struct {
	lines   chan string
	reading atomic.Int32
	entered chan struct{} // a member entered read (dropped when full)
}

func newFeed() *feed {
	return &feed{lines: make(chan string), entered: make(chan struct{}, 100)}
}

func (f *feed) read() ([]byte, error) {
	f.reading.Add(1)
	defer f.reading.Add(-1)
	select {
	case f.entered <- struct{}{}:
	default: // nobody is waiting for it
	}
	l, ok := <-f.lines
	if !ok {
		return nil, io.EOF
	}
	return []byte(l), nil
}

// TestStdioCrewBound: at most max calls run at once, each on the member
// that read it; while all max run nobody reads, and the first member done
// takes the reading on; the end of the input ends the crew.
func TestStdioCrewBound(t *testing.T) {
	const max = 3
	release := make(chan struct{})
	running := make(chan string, 2*max)
	var now, peak atomic.Int32
	in := newFeed()
	c := newStdioCrew(max, in.read, func(line []byte) {
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
	c.start()
	for _, l := range []string{"a", "b", "c"} {
		in.lines <- l
	}
	for range max {
		<-running
	}
	if got := c.started(); got != max {
		t.Fatalf("started() = %d; want %d", got, max)
	}
	if got := in.reading.Load(); got != 0 {
		t.Fatalf("members reading while all %d run calls = %d; want 0", max, got)
	}
	for len(in.entered) > 0 {
		<-in.entered
	}
	release <- struct{}{} // one member finishes "a", "b" or "c" and reads on
	<-in.entered
	in.lines <- "d"
	if got := <-running; got != "d" {
		t.Fatalf("running %q; want d", got)
	}
	if got := c.started(); got != max {
		t.Fatalf("started() after a member was done = %d; want %d", got, max)
	}
	release <- struct{}{}
	<-in.entered
	close(in.lines)
	if err := <-c.ended(); err != io.EOF {
		t.Fatalf("ended() = %v; want io.EOF", err)
	}
	close(release)
	if p := peak.Load(); p != max {
		t.Fatalf("peak concurrency = %d; want %d", p, max)
	}
}

// TestStdioCrewReuse: messages one after another, each sent once the call
// before is done and its member idle again, run on the first member and
// the one it passed the reading to, alternately.
func TestStdioCrewReuse(t *testing.T) {
	done := make(chan struct{})
	in := newFeed()
	c := newStdioCrew(maxConcurrentCalls, in.read, func([]byte) { done <- struct{}{} })
	c.start()
	idle := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.idle
	}
	for range 100 {
		in.lines <- "x"
		<-done
		for idle() != 1 || in.reading.Load() != 1 { // one member waits for the lead, the other reads
			runtime.Gosched()
		}
	}
	if got := c.started(); got != 2 {
		t.Fatalf("started() after 100 messages one after another = %d; want 2", got)
	}
	c.stop()
	for idle() != 0 { // the idle member exits
		runtime.Gosched()
	}
	close(in.lines) // the member reading gets io.EOF
	if err := <-c.ended(); err != io.EOF {
		t.Fatalf("ended() = %v; want io.EOF", err)
	}
}

// stdioConn is a Serve of grant "local" over pipes.
type stdioConn struct {
	in      *io.PipeWriter
	replies *bufio.Scanner
	done    chan error
}

func serveStdioPipes(t *testing.T, s *server.Server) *stdioConn {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &stdioConn{in: inW, replies: bufio.NewScanner(outR), done: make(chan error, 1)}
	c.replies.Buffer(nil, 1<<20)
	go func() { c.done <- Serve(context.Background(), s, "local", inR, outW); outW.Close() }()
	t.Cleanup(func() { inW.Close(); outR.Close() })
	return c
}

func (c *stdioConn) send(t *testing.T, msg string) {
	t.Helper()
	if _, err := io.WriteString(c.in, msg+"\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// initialize completes the MCP handshake.
func (c *stdioConn) initialize(t *testing.T) {
	t.Helper()
	c.send(t, mcptest.InitMsg)
	if r := c.reply(t); r.Result == nil {
		t.Fatalf("initialize = %+v", r.Error)
	}
}

func (c *stdioConn) reply(t *testing.T) mcptest.Reply {
	t.Helper()
	if !c.replies.Scan() {
		t.Fatalf("no reply: %v", c.replies.Err())
	}
	var r mcptest.Reply
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
	drv := hypervisortest.Counting(new(atomic.Int64))
	drv.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
		if vm == "boom" {
			panic("fake: driver bug")
		}
		return hypervisor.Status{Name: vm, State: hypervisor.StateRunning}, nil
	}
	f := servertest.New(t, servertest.Options{Driver: drv})
	c := serveStdioPipes(t, f.S)
	c.initialize(t)
	c.send(t, `{"jsonrpc":"2.0","id":2,"method":"ping","params":{"pad":"`+strings.Repeat("x", 4*f.S.MaxMessageBytes())+`"}}`)
	if r := c.reply(t); r.Error == nil || r.Error.Code != mcp.PARSE_ERROR || r.Error.Message != "message too large" || string(r.ID) != "null" {
		t.Errorf("a line over the limit = id %s, error %+v; want %d message too large, id null", r.ID, r.Error, mcp.PARSE_ERROR)
	}
	c.send(t, mcptest.ToolCall(3, "vm_status", `{"vm":"lab/boom"}`))
	if r := c.reply(t); r.Error == nil || r.Error.Code != mcp.INTERNAL_ERROR {
		t.Errorf("a call whose driver panics = %+v, %q; want error %d", r.Error, r.Text(), mcp.INTERNAL_ERROR)
	}
	c.send(t, mcptest.ToolCall(4, "vm_status", `{"vm":"lab/vm1"}`))
	if r := c.reply(t); r.Result == nil || r.Result.IsError || string(r.ID) != "4" {
		t.Errorf("vm_status after the panic = id %s, %q; want a result", r.ID, r.Text())
	}
	c.in.Close()
	if err := <-c.done; err != nil {
		t.Errorf("ServeStdio = %v; want nil at EOF", err)
	}
	var outcomes []string
	for _, rec := range f.Rec.Records() {
		if rec.Kind == audit.KindOutcome && rec.VM == "lab/boom" {
			outcomes = append(outcomes, fmt.Sprintf("%s refunded=%v", rec.Outcome, rec.Refunded))
		}
	}
	if len(outcomes) != 1 || outcomes[0] != "error refunded=false" {
		t.Errorf("outcome records of the panicking call = %q; want [error refunded=false]", outcomes)
	}
}

// TestServeStdioDrain: when the input ends, a call in flight still gets
// its reply; one still running the shutdown grace later is cancelled, and
// ServeStdio returns.
func TestServeStdioDrain(t *testing.T) {
	entered := make(chan string, 2)
	release := make(chan struct{})
	var cancelled atomic.Bool
	drv := hypervisortest.Counting(new(atomic.Int64))
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
		cancelled.Store(false)
		f := servertest.New(t, servertest.Options{Driver: drv, Grace: tt.grace})
		c := serveStdioPipes(t, f.S)
		c.initialize(t)
		c.send(t, mcptest.ToolCall(5, "vm_status", `{"vm":"lab/vm1"}`))
		<-entered
		c.in.Close()
		if tt.release {
			release <- struct{}{}
		}
		r := c.reply(t)
		if string(r.ID) != "5" || r.Result == nil || r.Result.IsError == tt.release {
			t.Errorf("%s: the call in flight at EOF = id %s, %q (error %+v); want its reply, isError %v", tt.name, r.ID, r.Text(), r.Error, !tt.release)
		}
		if err := <-c.done; err != nil {
			t.Errorf("%s: ServeStdio = %v; want nil at EOF", tt.name, err)
		}
		if cancelled.Load() == tt.release {
			t.Errorf("%s: the driver's context cancelled = %v; want %v", tt.name, cancelled.Load(), !tt.release)
		}
	}
}

// TestServeStdioReadsWhileACallRuns: while one call runs, the connection
// reads on: another call is answered first, and a notifications/cancelled
// for the running call reaches its driver call; the cancelled call is not
// answered.
func TestServeStdioReadsWhileACallRuns(t *testing.T) {
	entered := make(chan string, 1)
	cancelled := make(chan struct{})
	drv := hypervisortest.Counting(new(atomic.Int64))
	drv.StatusFunc = func(ctx context.Context, vm string) (hypervisor.Status, error) {
		if vm != "lab/slow" && vm != "slow" {
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning}, nil
		}
		entered <- vm
		<-ctx.Done()
		close(cancelled)
		return hypervisor.Status{}, fmt.Errorf("fake: status: %w", ctx.Err())
	}
	f := servertest.New(t, servertest.Options{Driver: drv})
	c := serveStdioPipes(t, f.S)
	c.initialize(t)
	c.send(t, mcptest.ToolCall(2, "vm_status", `{"vm":"lab/slow"}`))
	<-entered
	c.send(t, mcptest.ToolCall(3, "vm_status", `{"vm":"lab/vm1"}`))
	if r := c.reply(t); string(r.ID) != "3" || r.Result == nil || r.Result.IsError {
		t.Fatalf("the call sent while another runs = id %s, %q (error %+v); want its result first", r.ID, r.Text(), r.Error)
	}
	c.send(t, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}`)
	select {
	case <-cancelled:
	case <-time.After(time.Minute): // a guard against a hang, not a timing
		t.Fatal("notifications/cancelled did not reach the running call's driver in a minute")
	}
	// The end of input drains the calls in flight: whatever the cancelled
	// call would write comes before the output's end.
	c.in.Close()
	if c.replies.Scan() {
		t.Errorf("the cancelled call was answered: %.200s; want no response (MCP: a cancelled request is not answered)", c.replies.Bytes())
	}
	if err := <-c.done; err != nil {
		t.Errorf("ServeStdio = %v; want nil at EOF", err)
	}
}
