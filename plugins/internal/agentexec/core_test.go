package agentexec

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// coreAgent is a guest agent for the Core: the Tracker's fake plus Info and
// Exec as function fields.
type coreAgent struct {
	*fakeAgent
	infos atomic.Int64
	info  func(ctx context.Context) (qga.Info, error)
	exec  func(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error)
}

func (a *coreAgent) Info(ctx context.Context) (qga.Info, error) {
	a.infos.Add(1)
	if a.info == nil {
		return qga.Info{SupportedCommands: []qga.Command{{Name: "guest-exec", Enabled: true}, {Name: "guest-exec-status", Enabled: true}}}, nil
	}
	return a.info(ctx)
}

func (a *coreAgent) Exec(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error) {
	a.calls.Add(1)
	if a.exec == nil {
		a.t.Errorf("unexpected Exec(%+v)", req)
		return qga.ExecStatus{}, errors.New("unexpected call")
	}
	return a.exec(ctx, req)
}

// newTestCore is a Core over one VM, "vm1", reached through a.
func newTestCore(t *testing.T, a *coreAgent, cfg CoreConfig) *Core {
	cfg.Driver = "fake"
	if cfg.ExecTimeout == 0 {
		cfg.ExecTimeout = time.Minute
	}
	cfg.Reach = func(_ context.Context, op, name string) (Target, error) {
		if name != "vm1" {
			return Target{}, fmt.Errorf("fake: %s: %w: %q", op, hypervisor.ErrUnknownVM, name)
		}
		return Target{Key: name, Agent: a}, nil
	}
	c := NewCore(cfg)
	t.Cleanup(c.Close)
	return c
}

func TestCoreRun(t *testing.T) {
	a := &coreAgent{fakeAgent: &fakeAgent{t: t}}
	var got qga.ExecRequest
	a.exec = func(_ context.Context, req qga.ExecRequest) (qga.ExecStatus, error) {
		got = req
		return qga.ExecStatus{PID: 5, Exited: true, ExitCode: 3, Stdout: []byte("out")}, nil
	}
	e := newTestCore(t, a, CoreConfig{ExecTimeout: 42 * time.Second}).Exec()
	res, err := e.Run(context.Background(), "vm1", hypervisor.ExecRequest{Argv: []string{"/bin/echo", "x"}, Cwd: "/tmp"})
	if err != nil || res.PID != 5 || res.ExitCode != 3 || string(res.Stdout) != "out" {
		t.Fatalf("Run() = %+v, %v; want pid 5 exit 3 stdout out", res, err)
	}
	if got.Path != "/bin/echo" || got.Cwd != "/tmp" || got.Timeout != 42*time.Second {
		t.Errorf("agent saw %+v; want /bin/echo in /tmp with the default timeout 42s", got)
	}
}

// TestCoreRefusesBeforeTheAgent: bad requests, unknown VMs and stdin over
// the relay's limit are refused before any agent call.
func TestCoreRefusesBeforeTheAgent(t *testing.T) {
	a := &coreAgent{fakeAgent: &fakeAgent{t: t}}
	e := newTestCore(t, a, CoreConfig{MaxStdin: 4}).Exec()
	ctx := context.Background()
	tests := []struct {
		name string
		vm   string
		req  hypervisor.ExecRequest
		want error
	}{
		{"empty argv", "vm1", hypervisor.ExecRequest{}, hypervisor.ErrInvalidArgument},
		{"relative cwd", "vm1", hypervisor.ExecRequest{Argv: []string{"true"}, Cwd: "tmp"}, hypervisor.ErrInvalidArgument},
		{"negative timeout", "vm1", hypervisor.ExecRequest{Argv: []string{"true"}, Timeout: -1}, hypervisor.ErrInvalidArgument},
		{"stdin over the limit", "vm1", hypervisor.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("12345")}, hypervisor.ErrInvalidArgument},
		{"unknown VM", "vm2", hypervisor.ExecRequest{Argv: []string{"true"}}, hypervisor.ErrUnknownVM},
	}
	for _, tt := range tests {
		if _, err := e.Run(ctx, tt.vm, tt.req); !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "fake: exec: ") {
			t.Errorf("Run(%s) = %v; want %v with the prefix \"fake: exec: \"", tt.name, err, tt.want)
		}
		if _, err := e.ExecStart(ctx, tt.vm, tt.req); !errors.Is(err, tt.want) {
			t.Errorf("ExecStart(%s) = %v; want %v", tt.name, err, tt.want)
		}
	}
	if n := a.calls.Load() + a.infos.Load(); n != 0 {
		t.Errorf("agent calls = %d; want 0", n)
	}
}

// TestCorePreflight: a guest with guest-exec disabled gets a
// CommandDisabledError from cached guest-info; AgentInfo reads it fresh.
func TestCorePreflight(t *testing.T) {
	a := &coreAgent{fakeAgent: &fakeAgent{t: t}}
	a.info = func(context.Context) (qga.Info, error) {
		return qga.Info{Version: "9.2", SupportedCommands: []qga.Command{{Name: "guest-exec"}, {Name: "guest-exec-status", Enabled: true}}}, nil
	}
	c := newTestCore(t, a, CoreConfig{InfoTTL: time.Hour})
	e := c.Exec()
	ctx := context.Background()
	for range 3 {
		var cd *hypervisor.CommandDisabledError
		if _, err := e.ExecStart(ctx, "vm1", hypervisor.ExecRequest{Argv: []string{"true"}}); !errors.As(err, &cd) || cd.Command != "guest-exec" {
			t.Fatalf("ExecStart() = %v; want guest-exec disabled", err)
		}
	}
	if n := a.infos.Load(); n != 1 {
		t.Errorf("guest-info calls for 3 preflights = %d; want 1 (cached)", n)
	}
	info, err := e.AgentInfo(ctx, "vm1")
	if err != nil || info.Version != "9.2" || info.Enabled("guest-exec") || !info.Enabled("guest-exec-status") || a.infos.Load() != 2 {
		t.Errorf("AgentInfo() = %+v, %v after %d guest-info calls; want fresh 9.2 with guest-exec disabled", info, err, a.infos.Load())
	}
	c.ForgetInfo("vm1")
	e.ExecStart(ctx, "vm1", hypervisor.ExecRequest{Argv: []string{"true"}})
	if n := a.infos.Load(); n != 3 {
		t.Errorf("guest-info calls after ForgetInfo = %d; want 3", n)
	}
}

// TestCoreStartStatus: ExecStart goes through the Tracker, ExecStatus
// reaches the command, Forget stops its watchdog.
func TestCoreStartStatus(t *testing.T) {
	a := &coreAgent{fakeAgent: sleeper(t)}
	c := newTestCore(t, a, CoreConfig{Tracker: Config{Clock: newFakeClock()}})
	e := c.Exec()
	ctx := context.Background()
	h, err := e.ExecStart(ctx, "vm1", hypervisor.ExecRequest{Argv: []string{"sleep", "1000"}, MaxOutputBytes: 100})
	if err != nil || h.PID != 42 {
		t.Fatalf("ExecStart() = %+v, %v; want pid 42", h, err)
	}
	res, err := e.ExecStatus(ctx, "vm1", h)
	if err != nil || res.Exited || string(res.Stdout) != "partial" {
		t.Errorf("ExecStatus() = %+v, %v; want running with partial output", res, err)
	}
	if _, err := e.ExecStatus(ctx, "vm2", h); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("ExecStatus(vm2) = %v; want %v", err, hypervisor.ErrUnknownVM)
	}
	if n := c.execs.Tracked(); n != 1 {
		t.Errorf("Tracked() = %d; want 1", n)
	}
	c.Forget("vm1")
	if n := c.execs.Tracked(); n != 0 {
		t.Errorf("Tracked() after Forget = %d; want 0", n)
	}
}

// TestCoreErr: agent errors map to the sentinels with the driver's prefix;
// Why explains an unavailable agent and only that.
func TestCoreErr(t *testing.T) {
	c := newTestCore(t, &coreAgent{fakeAgent: &fakeAgent{t: t}}, CoreConfig{})
	gone := errors.New("QEMU is gone")
	var asked atomic.Int64
	tg := Target{Key: "vm1", Why: func(context.Context, error) error { asked.Add(1); return gone }}
	ctx := context.Background()
	err := c.Err(ctx, tg, "file read", fmt.Errorf("x: %w", qga.ErrNoAgent))
	if !errors.Is(err, hypervisor.ErrAgentUnavailable) || !errors.Is(err, gone) || !strings.HasPrefix(err.Error(), "fake: file read: ") {
		t.Errorf("Err(no agent) = %v; want unavailable, explained, with the prefix", err)
	}
	err = c.Err(ctx, tg, "exec", fmt.Errorf("x: %w", qga.ErrTimeout))
	if !errors.Is(err, hypervisor.ErrTimeout) || errors.Is(err, gone) || asked.Load() != 1 {
		t.Errorf("Err(timeout) = %v (Why asked %d times); want a timeout, Why not asked", err, asked.Load())
	}
	tg.Why = func(context.Context, error) error { return nil }
	if err := c.Err(ctx, tg, "exec", qga.ErrNoAgent); err.Error() != "fake: exec: guest agent unavailable: no guest agent" {
		t.Errorf("Err(no agent, nothing to add) = %q", err)
	}
}
