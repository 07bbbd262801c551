package hypervisor_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// runner is a fake driver that runs commands itself.
type runner struct {
	*hypervisortest.Fake
	runs atomic.Int64
}

func (r *runner) Run(_ context.Context, _ string, req hypervisor.ExecRequest) (hypervisor.ExecResult, error) {
	r.runs.Add(1)
	return hypervisor.ExecResult{PID: 7, Exited: true, Stdout: []byte(req.Argv[0])}, nil
}

// counting is a fake driver without Run whose commands exit on the second
// poll; it counts the calls that reach it.
func counting(starts, polls *atomic.Int64) *hypervisortest.Fake {
	return &hypervisortest.Fake{
		ExecStartFunc: func(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			starts.Add(1)
			return hypervisor.ExecHandle{PID: 9, Token: "t"}, nil
		},
		ExecStatusFunc: func(context.Context, string, hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			n := polls.Add(1)
			return hypervisor.ExecResult{PID: 9, Exited: n >= 2, Stdout: []byte("polled")}, nil
		},
	}
}

// TestRunDecidesOnceNextToTheDriver: through a plugin whose driver is built
// by a Deferred, a Run is one RPC that reaches the built driver's own Run
// exactly once; a driver without Run is polled inside the plugin. Nothing
// between decides anything.
func TestRunDecidesOnceNextToTheDriver(t *testing.T) {
	ctx := context.Background()
	req := hypervisor.ExecRequest{Argv: []string{"ran"}}

	inner := &runner{Fake: &hypervisortest.Fake{
		ExecStartFunc: func(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			t.Error("ExecStart reached a driver that runs commands itself")
			return hypervisor.ExecHandle{}, errors.New("unexpected")
		},
	}}
	d := hypervisor.NewDeferred(func(context.Context, []byte) (hypervisor.Driver, error) { return inner, nil })
	if _, ok := hypervisor.Driver(d).(hypervisor.Runner); ok {
		t.Errorf("Deferred is a Runner; want it to leave the decision to Run on the built driver")
	}
	host := connect(t, "deferred-runner", d)
	if _, err := hypervisor.Run(ctx, host, "vm1", req); !errors.Is(err, hypervisor.ErrNotConfigured) {
		t.Errorf("Run() before Configure = %v; want %v", err, hypervisor.ErrNotConfigured)
	}
	if err := host.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatalf("Configure() = %v", err)
	}
	res, err := hypervisor.Run(ctx, host, "vm1", req)
	if err != nil || string(res.Stdout) != "ran" || inner.runs.Load() != 1 {
		t.Errorf("Run() = %+v, %v with %d driver Runs; want the driver's own Run, once", res, err, inner.runs.Load())
	}

	var starts, polls atomic.Int64
	plain := hypervisor.NewDeferred(func(context.Context, []byte) (hypervisor.Driver, error) { return counting(&starts, &polls), nil })
	host = connect(t, "deferred-plain", plain)
	if err := host.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatalf("Configure() = %v", err)
	}
	res, err = hypervisor.Run(ctx, host, "vm1", req)
	if err != nil || !res.Exited || string(res.Stdout) != "polled" || starts.Load() != 1 || polls.Load() != 2 {
		t.Errorf("Run() = %+v, %v after %d starts and %d polls; want one start polled to exit", res, err, starts.Load(), polls.Load())
	}
}

// TestBackoffLateness: a command that exits at any time t between 1 ms and
// 10 s is seen (the first poll at or after t, polls not counting their own
// time) by 1.3 t + 1 ms, and reaching the 200 ms cap takes fewer than 30 polls.
func TestBackoffLateness(t *testing.T) {
	var polls []time.Duration
	var b hypervisor.Backoff
	at := time.Duration(0)
	for at < 10*time.Second {
		at += b.Next()
		polls = append(polls, at)
	}
	for exit := time.Millisecond; exit <= 10*time.Second; exit += exit / 16 {
		i, _ := slices.BinarySearch(polls, exit)
		if seen := polls[i]; seen > time.Duration(1.3*float64(exit))+time.Millisecond {
			t.Errorf("a command exiting at %v is seen at %v; want by %v", exit, seen, time.Duration(1.3*float64(exit))+time.Millisecond)
		}
	}
	var c hypervisor.Backoff
	n := 1
	for c.Next() < hypervisor.PollCeiling {
		n++
	}
	if n >= 30 {
		t.Errorf("Backoff reaches %v after %d polls; want fewer than 30", hypervisor.PollCeiling, n)
	}
	if d := c.Next(); d != hypervisor.PollCeiling {
		t.Errorf("Backoff after the cap = %v; want %v", d, hypervisor.PollCeiling)
	}
}

// TestBackoffSleep: Sleep takes the next interval (the schedule moves on)
// and returns nil, or the context's error at once when it has ended, even
// with the interval at the 200 ms cap.
func TestBackoffSleep(t *testing.T) {
	var b hypervisor.Backoff
	if err := b.Sleep(context.Background(), 0); err != nil {
		t.Fatalf("Sleep(live context) = %v; want nil", err)
	}
	if d := b.Next(); d != hypervisor.PollFirst+hypervisor.PollFirst/4 {
		t.Errorf("Next after one Sleep = %v; want the second interval %v", d, hypervisor.PollFirst+hypervisor.PollFirst/4)
	}
	for b.Next() < hypervisor.PollCeiling { // on to the cap
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep(ended context) = %v; want %v", err, context.Canceled)
	}
}
