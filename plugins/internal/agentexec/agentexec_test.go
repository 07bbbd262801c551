package agentexec

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// fakeAgent is a qga.Execer whose methods are function fields; a nil field
// fails the test when called. It counts every call.
type fakeAgent struct {
	t          *testing.T
	calls      atomic.Int64
	kills      atomic.Int64
	execStart  func(ctx context.Context, req qga.ExecRequest) (int64, error)
	execStatus func(ctx context.Context, pid, maxOut int64) (qga.ExecStatus, error)
	killTree   func(ctx context.Context, pid int64) error
}

func (a *fakeAgent) ExecStart(ctx context.Context, req qga.ExecRequest) (int64, error) {
	a.calls.Add(1)
	if a.execStart == nil {
		a.t.Errorf("unexpected ExecStart(%+v)", req)
		return 0, errors.New("unexpected call")
	}
	return a.execStart(ctx, req)
}

func (a *fakeAgent) ExecStatus(ctx context.Context, pid, maxOut int64) (qga.ExecStatus, error) {
	a.calls.Add(1)
	if a.execStatus == nil {
		a.t.Errorf("unexpected ExecStatus(%d, %d)", pid, maxOut)
		return qga.ExecStatus{}, errors.New("unexpected call")
	}
	return a.execStatus(ctx, pid, maxOut)
}

func (a *fakeAgent) KillTree(ctx context.Context, pid int64) error {
	a.calls.Add(1)
	a.kills.Add(1)
	if a.killTree == nil {
		a.t.Errorf("unexpected KillTree(%d)", pid)
		return errors.New("unexpected call")
	}
	return a.killTree(ctx, pid)
}

// sleeper is a fake guest command with pid 42: it runs until killed, then
// reports signal 9 and the partial output it had.
func sleeper(t *testing.T) *fakeAgent {
	var killed atomic.Bool
	return &fakeAgent{t: t,
		execStart: func(context.Context, qga.ExecRequest) (int64, error) { return 42, nil },
		execStatus: func(_ context.Context, pid, maxOut int64) (qga.ExecStatus, error) {
			if pid != 42 || maxOut != 100 {
				return qga.ExecStatus{}, qga.ErrUnknownExec
			}
			if killed.Load() {
				return qga.ExecStatus{PID: 42, Exited: true, ExitCode: -1, Signal: 9, Stdout: []byte("partial")}, nil
			}
			return qga.ExecStatus{PID: 42, Stdout: []byte("partial")}, nil
		},
		killTree: func(_ context.Context, pid int64) error {
			if pid == 42 {
				killed.Store(true)
			}
			return nil
		},
	}
}

// fakeClock is a Clock whose time moves only by Advance, which runs the
// callbacks of the timers that came due (outside its lock).
type fakeClock struct {
	mu     sync.Mutex // guards now and timers
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c              *fakeClock
	when           time.Time
	f              func()
	stopped, fired bool // guarded by c.mu
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, when: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	pending := !t.stopped && !t.fired
	t.stopped = true
	return pending
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for _, t := range c.timers {
		if !t.stopped && !t.fired && !t.when.After(c.now) {
			t.fired = true
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// pending counts the timers neither stopped nor fired.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped && !t.fired {
			n++
		}
	}
	return n
}

func newTracker(c *fakeClock, max int) *Tracker {
	return New(Config{Logger: slog.New(slog.DiscardHandler), Clock: c, ResultTTL: time.Hour, MaxTracked: max})
}

var req = qga.ExecRequest{Path: "sleep", Args: []string{"100"}, Timeout: time.Minute, MaxOutputBytes: 100}

func TestWatchdogKillsAtDeadlineWithoutPolling(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	a := sleeper(t)
	ctx := context.Background()
	h, err := tr.Start(ctx, "vm1", a, req)
	if err != nil || h.PID != 42 || h.Token == "" || !h.StartedAt.Equal(c.Now()) {
		t.Fatalf("Start() = %+v, %v; want pid 42 with a token, started now", h, err)
	}
	c.Advance(req.Timeout - time.Nanosecond)
	if n := a.kills.Load(); n != 0 {
		t.Fatalf("kills before the deadline = %d; want 0", n)
	}
	c.Advance(time.Nanosecond) // nobody polls: the watchdog kills at the deadline
	if n := a.kills.Load(); n != 1 {
		t.Fatalf("kills at the deadline = %d; want 1", n)
	}
	calls := a.calls.Load()
	res, err := tr.Status(ctx, "vm1", a, h)
	if err != nil || !res.Exited || !res.TimedOut || res.Signal != 9 || string(res.Stdout) != "partial" {
		t.Errorf("Status() = %+v, %v; want exited, timed out, signal 9, partial output", res, err)
	}
	if n := a.calls.Load() - calls; n != 0 {
		t.Errorf("agent calls for the kept result = %d; want 0", n)
	}
	if n := tr.Tracked(); n != 0 {
		t.Errorf("Tracked() after collection = %d; want 0", n)
	}
	// Collected: a second poll goes to the agent, which no longer knows it.
	a.execStatus = func(context.Context, int64, int64) (qga.ExecStatus, error) {
		return qga.ExecStatus{}, qga.ErrUnknownExec
	}
	if _, err := tr.Status(ctx, "vm1", a, h); !errors.Is(err, qga.ErrUnknownExec) {
		t.Errorf("Status() after collection = %v; want %v", err, qga.ErrUnknownExec)
	}
}

func TestWatchdogRealClock(t *testing.T) {
	tr := New(Config{Logger: slog.New(slog.DiscardHandler)})
	defer tr.Close()
	a := sleeper(t)
	killed := make(chan struct{})
	kill := a.killTree
	a.killTree = func(ctx context.Context, pid int64) error {
		err := kill(ctx, pid)
		close(killed)
		return err
	}
	r := req
	r.Timeout = 20 * time.Millisecond
	if _, err := tr.Start(context.Background(), "vm1", a, r); err != nil {
		t.Fatalf("Start() = %v; want nil", err)
	}
	select {
	case <-killed:
	case <-time.After(10 * time.Second):
		t.Fatal("the command was not killed at its deadline")
	}
}

func TestResultKeptThenForgotten(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	a := sleeper(t)
	h, err := tr.Start(context.Background(), "vm1", a, req)
	if err != nil {
		t.Fatalf("Start() = %v; want nil", err)
	}
	c.Advance(req.Timeout)
	c.Advance(time.Hour - time.Nanosecond)
	if n := tr.Tracked(); n != 1 {
		t.Fatalf("Tracked() before the result TTL = %d; want 1", n)
	}
	c.Advance(time.Nanosecond)
	if n := tr.Tracked(); n != 0 {
		t.Fatalf("Tracked() after the result TTL = %d; want 0", n)
	}
	// Forgotten: the poll goes to the agent (killed, so it reports the end),
	// overdue, but the command has exited, so it is not killed again.
	calls := a.calls.Load()
	res, err := tr.Status(context.Background(), "vm1", a, h)
	if err != nil || !res.Exited || res.TimedOut {
		t.Errorf("Status() after the TTL = %+v, %v; want exited from the agent (no kept TimedOut)", res, err)
	}
	if n := a.calls.Load() - calls; n != 1 {
		t.Errorf("agent calls = %d; want 1 (one ExecStatus)", n)
	}
	if n := a.kills.Load(); n != 1 {
		t.Errorf("kills = %d; want 1", n)
	}
}

func TestStatusPollsUntilExit(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	var exited atomic.Bool
	a := &fakeAgent{t: t,
		execStart: func(context.Context, qga.ExecRequest) (int64, error) { return 7, nil },
		execStatus: func(_ context.Context, pid, maxOut int64) (qga.ExecStatus, error) {
			return qga.ExecStatus{PID: pid, Exited: exited.Load(), ExitCode: 3, Stderr: []byte("e"), StderrTruncated: true}, nil
		},
	}
	ctx := context.Background()
	h, err := tr.Start(ctx, "vm1", a, req)
	if err != nil {
		t.Fatalf("Start() = %v; want nil", err)
	}
	res, err := tr.Status(ctx, "vm1", a, h)
	if err != nil || res.Exited || res.PID != 7 {
		t.Fatalf("Status() running = %+v, %v; want pid 7 not exited", res, err)
	}
	exited.Store(true)
	res, err = tr.Status(ctx, "vm1", a, h)
	want := hypervisor.ExecResult{PID: 7, Exited: true, ExitCode: 3, Stderr: []byte("e"), StderrTruncated: true}
	if err != nil || res.PID != want.PID || !res.Exited || res.ExitCode != 3 || string(res.Stderr) != "e" || !res.StderrTruncated || res.TimedOut {
		t.Fatalf("Status() exited = %+v, %v; want %+v", res, err, want)
	}
	if n := tr.Tracked(); n != 0 {
		t.Errorf("Tracked() after exit = %d; want 0", n)
	}
	if n := c.pending(); n != 0 {
		t.Errorf("pending timers after exit = %d; want 0", n)
	}
	c.Advance(2 * req.Timeout)
	if n := a.kills.Load(); n != 0 {
		t.Errorf("kills after an exited command's deadline = %d; want 0", n)
	}
}

func TestOverdueUntrackedHandle(t *testing.T) {
	c := newFakeClock()
	first := newTracker(c, 0)
	a := sleeper(t)
	ctx := context.Background()
	h, err := first.Start(ctx, "vm1", a, req)
	if err != nil {
		t.Fatalf("Start() = %v; want nil", err)
	}
	first.Close() // the driver restarted: a new Tracker knows nothing
	second := newTracker(c, 0)
	res, err := second.Status(ctx, "vm1", a, h)
	if err != nil || res.Exited || a.kills.Load() != 0 {
		t.Fatalf("Status() before the deadline = %+v, %v, %d kills; want running, no kill", res, err, a.kills.Load())
	}
	c.Advance(req.Timeout + time.Second)
	if n := a.kills.Load(); n != 0 {
		t.Fatalf("kills by a closed tracker = %d; want 0", n)
	}
	res, err = second.Status(ctx, "vm1", a, h)
	if err != nil || !res.Exited || !res.TimedOut || res.Signal != 9 {
		t.Errorf("Status() after the deadline = %+v, %v; want killed, timed out", res, err)
	}
	if n := a.kills.Load(); n != 1 {
		t.Errorf("kills = %d; want 1", n)
	}
}

func TestReusedPID(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	a := sleeper(t)
	ctx := context.Background()
	short := req
	short.Timeout = time.Second
	if _, err := tr.Start(ctx, "vm1", a, short); err != nil {
		t.Fatalf("Start(first) = %v; want nil", err)
	}
	// The agent collected pid 42 and hands it out again.
	h, err := tr.Start(ctx, "vm1", a, req)
	if err != nil || h.PID != 42 {
		t.Fatalf("Start(second) = %+v, %v; want pid 42", h, err)
	}
	if n, p := tr.Tracked(), c.pending(); n != 1 || p != 1 {
		t.Fatalf("Tracked(), pending timers = %d, %d; want 1, 1", n, p)
	}
	c.Advance(short.Timeout)
	if n := a.kills.Load(); n != 0 {
		t.Fatalf("kills at the first command's deadline = %d; want 0 (its watchdog was stopped)", n)
	}
	c.Advance(req.Timeout - short.Timeout)
	if n := a.kills.Load(); n != 1 {
		t.Errorf("kills at the second command's deadline = %d; want 1", n)
	}
}

func TestForgetAndClose(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	pids := map[string]int64{}
	var next atomic.Int64
	a := &fakeAgent{t: t, execStart: func(context.Context, qga.ExecRequest) (int64, error) { return 100 + next.Add(1), nil }}
	ctx := context.Background()
	for _, vm := range []string{"vm1", "vm1", "vm2", "vm3"} {
		h, err := tr.Start(ctx, vm, a, req)
		if err != nil {
			t.Fatalf("Start(%s) = %v; want nil", vm, err)
		}
		pids[vm] = h.PID
	}
	tr.Forget("vm1")
	if n, p := tr.Tracked(), c.pending(); n != 2 || p != 2 {
		t.Fatalf("after Forget(vm1): Tracked(), pending timers = %d, %d; want 2, 2", n, p)
	}
	tr.Close()
	if n, p := tr.Tracked(), c.pending(); n != 0 || p != 0 {
		t.Fatalf("after Close: Tracked(), pending timers = %d, %d; want 0, 0", n, p)
	}
	c.Advance(2 * req.Timeout) // no watchdog runs: the fake agent has no KillTree or ExecStatus
	calls := a.calls.Load()
	if _, err := tr.Start(ctx, "vm1", a, req); !errors.Is(err, ErrClosed) {
		t.Errorf("Start() after Close = %v; want %v", err, ErrClosed)
	}
	if n := a.calls.Load() - calls; n != 0 {
		t.Errorf("agent calls by Start after Close = %d; want 0", n)
	}
}

func TestTooMany(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 2)
	var next atomic.Int64
	a := &fakeAgent{t: t, execStart: func(context.Context, qga.ExecRequest) (int64, error) { return 100 + next.Add(1), nil }}
	for i := range 2 {
		if _, err := tr.Start(context.Background(), "vm1", a, req); err != nil {
			t.Fatalf("Start(#%d) = %v; want nil", i, err)
		}
	}
	if _, err := tr.Start(context.Background(), "vm1", a, req); !errors.Is(err, ErrTooMany) {
		t.Errorf("Start(#3) = %v; want %v", err, ErrTooMany)
	}
	if n := a.calls.Load(); n != 2 {
		t.Errorf("agent calls = %d; want 2 (the refused Start made none)", n)
	}
}

func TestStartErrors(t *testing.T) {
	agentErr := errors.New("agent said no")
	tests := []struct {
		name string
		key  string
		req  qga.ExecRequest
		want error
	}{
		{"empty key", "", req, hypervisor.ErrInvalidArgument},
		{"zero timeout", "vm1", qga.ExecRequest{Path: "x"}, hypervisor.ErrInvalidArgument},
		{"negative timeout", "vm1", qga.ExecRequest{Path: "x", Timeout: -time.Second}, hypervisor.ErrInvalidArgument},
		{"negative max output", "vm1", qga.ExecRequest{Path: "x", Timeout: time.Second, MaxOutputBytes: -1}, hypervisor.ErrInvalidArgument},
		{"agent error passes through", "vm1", qga.ExecRequest{Path: "fail", Timeout: time.Second}, agentErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeClock()
			tr := newTracker(c, 0)
			a := &fakeAgent{t: t, execStart: func(_ context.Context, r qga.ExecRequest) (int64, error) {
				if r.Path == "fail" {
					return 0, agentErr
				}
				t.Errorf("ExecStart(%+v) reached the agent; want refused before", r)
				return 5, nil
			}}
			h, err := tr.Start(context.Background(), tt.key, a, tt.req)
			if !errors.Is(err, tt.want) || h != (hypervisor.ExecHandle{}) {
				t.Errorf("Start(%q, %+v) = %+v, %v; want zero handle, %v", tt.key, tt.req, h, err, tt.want)
			}
			if n, p := tr.Tracked(), c.pending(); n != 0 || p != 0 {
				t.Errorf("Tracked(), pending timers = %d, %d; want 0, 0", n, p)
			}
		})
	}
}

func TestTokenRoundTrip(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	a := sleeper(t)
	h, err := tr.Start(context.Background(), "101", a, req)
	if err != nil {
		t.Fatalf("Start() = %v; want nil", err)
	}
	got, err := decodeToken(h.Token)
	want := token{VM: "101", PID: 42, Deadline: c.Now().Add(req.Timeout).UnixNano(), MaxOut: 100}
	if err != nil || got != want {
		t.Errorf("decodeToken(%q) = %+v, %v; want %+v", h.Token, got, err, want)
	}
	for _, tok := range []token{{VM: "a", PID: 2}, {VM: "vm.1_x-y", PID: 1 << 40, Deadline: 1, MaxOut: 1 << 30}} {
		if got, err := decodeToken(tok.encode()); err != nil || got != tok {
			t.Errorf("decodeToken(encode(%+v)) = %+v, %v; want the same", tok, got, err)
		}
	}
}

func TestHostileHandles(t *testing.T) {
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	good := token{VM: "vm1", PID: 42, MaxOut: 100}.encode()
	tests := []struct {
		name string
		vm   string
		h    hypervisor.ExecHandle
	}{
		{"pid 0", "vm1", hypervisor.ExecHandle{Token: good}},
		{"negative pid", "vm1", hypervisor.ExecHandle{PID: -42, Token: good}},
		{"no token", "vm1", hypervisor.ExecHandle{PID: 42}},
		{"not base64", "vm1", hypervisor.ExecHandle{PID: 42, Token: "!!"}},
		{"padded base64", "vm1", hypervisor.ExecHandle{PID: 42, Token: base64.URLEncoding.EncodeToString([]byte(`{"vm":"vm1","pid":42,"max_out":10}`))}}, // 34 bytes: "==" padding
		{"not JSON", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc("pid=42")}},
		{"JSON array", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`[42]`)}},
		{"unknown field", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`{"vm":"vm1","pid":42,"extra":1}`)}},
		{"trailing data", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`{"vm":"vm1","pid":42}{}`)}},
		{"string pid", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`{"vm":"vm1","pid":"42"}`)}},
		{"no vm", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`{"pid":42}`)}},
		{"token of another pid", "vm1", hypervisor.ExecHandle{PID: 43, Token: good}},
		{"token of another VM", "vm2", hypervisor.ExecHandle{PID: 42, Token: good}},
		{"zero pid in token", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`{"vm":"vm1","pid":0}`)}},
		{"negative max output", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`{"vm":"vm1","pid":42,"max_out":-1}`)}},
		{"negative deadline", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`{"vm":"vm1","pid":42,"deadline":-1}`)}},
		{"pid overflow", "vm1", hypervisor.ExecHandle{PID: 42, Token: enc(`{"vm":"vm1","pid":99999999999999999999}`)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeClock()
			tr := newTracker(c, 0)
			a := &fakeAgent{t: t} // any agent call fails the test
			_, err := tr.Status(context.Background(), tt.vm, a, tt.h)
			if !errors.Is(err, hypervisor.ErrInvalidArgument) {
				t.Errorf("Status(%q, %+v) = %v; want %v", tt.vm, tt.h, err, hypervisor.ErrInvalidArgument)
			}
			if n := a.calls.Load(); n != 0 {
				t.Errorf("agent calls = %d; want 0", n)
			}
		})
	}
}

func TestWatchdogFailureRetriedByPoll(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	a := sleeper(t)
	kill := a.killTree
	var fail atomic.Bool
	fail.Store(true)
	a.killTree = func(ctx context.Context, pid int64) error {
		if fail.Load() {
			return qga.ErrConnLost
		}
		return kill(ctx, pid)
	}
	h, err := tr.Start(context.Background(), "vm1", a, req)
	if err != nil {
		t.Fatalf("Start() = %v; want nil", err)
	}
	c.Advance(req.Timeout + time.Nanosecond)
	if n := tr.Tracked(); n != 1 {
		t.Fatalf("Tracked() after a failed watchdog = %d; want 1", n)
	}
	if _, err := tr.Status(context.Background(), "vm1", a, h); !errors.Is(err, qga.ErrConnLost) {
		t.Fatalf("Status() with the agent gone = %v; want %v", err, qga.ErrConnLost)
	}
	fail.Store(false)
	res, err := tr.Status(context.Background(), "vm1", a, h)
	if err != nil || !res.Exited || !res.TimedOut {
		t.Errorf("Status() overdue = %+v, %v; want killed, timed out", res, err)
	}
	if n := tr.Tracked(); n != 0 {
		t.Errorf("Tracked() after collection = %d; want 0", n)
	}
}

func TestResult(t *testing.T) {
	st := qga.ExecStatus{PID: 9, Exited: true, ExitCode: 2, Signal: 15, Stdout: []byte("o"), Stderr: []byte("e"),
		StdoutTruncated: true, StderrTruncated: true, TimedOut: true}
	got := Result(st)
	if got.PID != 9 || !got.Exited || got.ExitCode != 2 || got.Signal != 15 || string(got.Stdout) != "o" ||
		string(got.Stderr) != "e" || !got.StdoutTruncated || !got.StderrTruncated || !got.TimedOut {
		t.Errorf("Result(%+v) = %+v; want every field carried over", st, got)
	}
}

// TestWatchdogDeadlineCountsSlowStart: the deadline runs from the start
// call, so an agent that takes long to report the pid (VirtualBox's pid
// comes with VBoxManage's buffered output) does not push the kill later.
func TestWatchdogDeadlineCountsSlowStart(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	a := sleeper(t)
	slow := a.execStart
	a.execStart = func(ctx context.Context, r qga.ExecRequest) (int64, error) {
		c.Advance(40 * time.Second) // the pid took 40 s of the minute
		return slow(ctx, r)
	}
	if _, err := tr.Start(context.Background(), "vm1", a, req); err != nil {
		t.Fatalf("Start() = %v", err)
	}
	c.Advance(req.Timeout - 40*time.Second - time.Nanosecond)
	if n := a.kills.Load(); n != 0 {
		t.Fatalf("kills before the deadline = %d; want 0", n)
	}
	c.Advance(time.Nanosecond)
	if n := a.kills.Load(); n != 1 {
		t.Errorf("kills at the deadline (%v after a start that took 40 s) = %d; want 1", req.Timeout, n)
	}
}
