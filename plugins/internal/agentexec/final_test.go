package agentexec

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
)

// TestStatusUsesTheStartingAgent: a tracked command is polled through the
// agent that started it (an agent may stand for one command), not the
// caller's.
func TestStatusUsesTheStartingAgent(t *testing.T) {
	c := newFakeClock()
	tr := newTracker(c, 0)
	owner := sleeper(t)
	other := &fakeAgent{t: t} // any call fails the test
	h, err := tr.Start(context.Background(), "vm1", owner, req)
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	if res, err := tr.Status(context.Background(), "vm1", other, h); err != nil || res.PID != 42 || res.Exited {
		t.Errorf("Status() = %+v, %v; want pid 42 running, read through its own agent", res, err)
	}
	if n := other.calls.Load(); n != 0 {
		t.Errorf("calls to the caller's agent = %d; want 0", n)
	}
}

// TestFinalErrorsEndTracking: an agent error marked Gone, or the agent no
// longer knowing the pid, is final: the command is forgotten at once; met
// by the watchdog, the error waits for the caller's next Status, once.
func TestFinalErrorsEndTracking(t *testing.T) {
	ended := errors.New("VBoxManage ended without an exit line")
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"gone", Gone(ended)},
		{"unknown pid", fmt.Errorf("qga: guest-exec-status: pid 42: %w", qga.ErrUnknownExec)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeClock()
			tr := newTracker(c, 0)
			a := &fakeAgent{t: t,
				execStart:  func(context.Context, qga.ExecRequest) (int64, error) { return 42, nil },
				execStatus: func(context.Context, int64, int64) (qga.ExecStatus, error) { return qga.ExecStatus{}, tt.err },
			}
			ctx := context.Background()
			h, err := tr.Start(ctx, "vm1", a, req)
			if err != nil {
				t.Fatalf("Start() = %v", err)
			}
			if _, err := tr.Status(ctx, "vm1", a, h); !errors.Is(err, tt.err) {
				t.Errorf("Status() = %v; want %v", err, tt.err)
			}
			if n, p := tr.Tracked(), c.pending(); n != 0 || p != 0 {
				t.Errorf("after a final error: Tracked(), pending timers = %d, %d; want 0, 0", n, p)
			}

			// The same error met by the watchdog at the deadline.
			h, err = tr.Start(ctx, "vm1", a, req)
			if err != nil {
				t.Fatalf("Start() = %v", err)
			}
			c.Advance(req.Timeout + time.Second)
			if n := a.kills.Load(); n != 0 {
				t.Errorf("kills of a gone command = %d; want 0", n)
			}
			other := &fakeAgent{t: t}
			if _, err := tr.Status(ctx, "vm1", other, h); !errors.Is(err, tt.err) {
				t.Errorf("Status() after the watchdog = %v; want the watchdog's %v", err, tt.err)
			}
			if n := tr.Tracked(); n != 0 {
				t.Errorf("Tracked() after the error was returned = %d; want 0", n)
			}
		})
	}
}
