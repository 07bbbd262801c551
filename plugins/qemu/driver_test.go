package qemu

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// fakeAgent is a guest agent whose methods are function fields; a nil field
// fails the test when called. calls counts every call.
type fakeAgent struct {
	t          *testing.T
	calls      atomic.Int64
	ping       func(ctx context.Context) error
	info       func(ctx context.Context) (qga.Info, error)
	exec       func(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error)
	execStart  func(ctx context.Context, req qga.ExecRequest) (int64, error)
	execStatus func(ctx context.Context, pid, max int64) (qga.ExecStatus, error)
	kill       func(ctx context.Context, pid int64) error
	fileRead   func(ctx context.Context, path string, max int64) ([]byte, bool, error)
	fileWrite  func(ctx context.Context, path string, data []byte, mode uint32) error
	shutdown   func(ctx context.Context, mode string) error
}

func (f *fakeAgent) missing(name string) error {
	f.t.Errorf("unexpected agent call %s", name)
	return fmt.Errorf("fake agent: %s not scripted", name)
}

func (f *fakeAgent) Ping(ctx context.Context) error {
	f.calls.Add(1)
	if f.ping == nil {
		return f.missing("Ping")
	}
	return f.ping(ctx)
}

func (f *fakeAgent) Info(ctx context.Context) (qga.Info, error) {
	f.calls.Add(1)
	if f.info == nil {
		return qga.Info{}, f.missing("Info")
	}
	return f.info(ctx)
}

func (f *fakeAgent) Exec(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error) {
	f.calls.Add(1)
	if f.exec == nil {
		return qga.ExecStatus{}, f.missing("Exec")
	}
	return f.exec(ctx, req)
}

func (f *fakeAgent) ExecStart(ctx context.Context, req qga.ExecRequest) (int64, error) {
	f.calls.Add(1)
	if f.execStart == nil {
		return 0, f.missing("ExecStart")
	}
	return f.execStart(ctx, req)
}

func (f *fakeAgent) ExecStatus(ctx context.Context, pid, max int64) (qga.ExecStatus, error) {
	f.calls.Add(1)
	if f.execStatus == nil {
		return qga.ExecStatus{}, f.missing("ExecStatus")
	}
	return f.execStatus(ctx, pid, max)
}

func (f *fakeAgent) KillTree(ctx context.Context, pid int64) error {
	f.calls.Add(1)
	if f.kill == nil {
		return f.missing("KillTree")
	}
	return f.kill(ctx, pid)
}

func (f *fakeAgent) FileRead(ctx context.Context, path string, max int64) ([]byte, bool, error) {
	f.calls.Add(1)
	if f.fileRead == nil {
		return nil, false, f.missing("FileRead")
	}
	return f.fileRead(ctx, path, max)
}

func (f *fakeAgent) FileWrite(ctx context.Context, path string, data []byte, mode uint32) error {
	f.calls.Add(1)
	if f.fileWrite == nil {
		return f.missing("FileWrite")
	}
	return f.fileWrite(ctx, path, data, mode)
}

func (f *fakeAgent) Shutdown(ctx context.Context, mode string) error {
	f.calls.Add(1)
	if f.shutdown == nil {
		return f.missing("Shutdown")
	}
	return f.shutdown(ctx, mode)
}

func (f *fakeAgent) Close() error { return nil }

// fakeMonitor answers QMP commands through run; connect may refuse.
type fakeMonitor struct {
	connect func(ctx context.Context) error
	run     func(ctx context.Context, command string) (string, error)

	mu       sync.Mutex
	commands []string
}

func (f *fakeMonitor) ConnectContext(ctx context.Context) error {
	if f.connect != nil {
		return f.connect(ctx)
	}
	return nil
}

func (f *fakeMonitor) RunContext(ctx context.Context, command []byte) ([]byte, error) {
	f.mu.Lock()
	f.commands = append(f.commands, string(command))
	f.mu.Unlock()
	out, err := f.run(ctx, string(command))
	return []byte(out), err
}

func (f *fakeMonitor) Disconnect() error { return nil }

func (f *fakeMonitor) sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.commands...)
}

func refused(context.Context) error {
	return fmt.Errorf("qmp: connect: %w", &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED})
}

// running answers query-status with status and everything else with {}.
func running(status string) func(context.Context, string) (string, error) {
	return func(_ context.Context, cmd string) (string, error) {
		if strings.Contains(cmd, "query-status") {
			return `{"return": {"status": "` + status + `", "running": true}, "id": 1}`, nil
		}
		return `{"return": {}, "id": 1}`, nil
	}
}

func execInfo(enabled bool) func(context.Context) (qga.Info, error) {
	return func(context.Context) (qga.Info, error) {
		return qga.Info{Version: "7.2.0", SupportedCommands: []qga.Command{
			{Name: "guest-exec", Enabled: enabled}, {Name: "guest-exec-status", Enabled: true},
		}}, nil
	}
}

// newFakeDriver makes a Driver whose configured VMs (name → agent, monitor)
// use the fakes.
func newFakeDriver(t *testing.T, cfg Config, agents map[string]*fakeAgent, monitors map[string]*fakeMonitor) *Driver {
	t.Helper()
	for name := range agents {
		cfg.VMs = append(cfg.VMs, VMConfig{Name: name, QMPSocket: name + ".qmp", QGASocket: name + ".qga"})
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New() = %v; want nil", err)
	}
	d.newAgent = func(p string) agent {
		name := strings.TrimSuffix(filepath.Base(p), ".qga")
		if strings.HasSuffix(p, "qga.sock") {
			name = filepath.Base(filepath.Dir(p))
		}
		if a, ok := agents[name]; ok {
			return a
		}
		t.Errorf("no fake agent for %s", p)
		return &fakeAgent{t: t}
	}
	d.newMonitor = func(p string) monitor {
		name := strings.TrimSuffix(filepath.Base(p), ".qmp")
		if strings.HasSuffix(p, "qmp.sock") {
			name = filepath.Base(filepath.Dir(p))
		}
		if m, ok := monitors[name]; ok {
			return m
		}
		return &fakeMonitor{connect: refused}
	}
	d.startProcess = func(context.Context, []string) error {
		t.Errorf("unexpected process start")
		return errors.New("not allowed")
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestDriverAgentErrorMapping(t *testing.T) {
	disabled := &qga.DisabledError{Command: "guest-exec", Err: &qga.Error{Class: "CommandNotFound", Desc: "Command guest-exec has been disabled"}}
	tests := []struct {
		name    string
		err     error
		want    error
		wantMsg string
	}{
		{"disabled", disabled, hypervisor.ErrCommandDisabled, "guest-exec is disabled in this guest"},
		{"no agent", fmt.Errorf("connect x: %w", qga.ErrNoAgent), hypervisor.ErrAgentUnavailable, "guest agent unavailable"},
		{"connection lost", qga.ErrConnLost, hypervisor.ErrAgentUnavailable, "guest agent unavailable"},
		{"timeout", fmt.Errorf("guest-exec: %w", qga.ErrTimeout), hypervisor.ErrTimeout, "timed out"},
		{"deadline", context.DeadlineExceeded, hypervisor.ErrTimeout, "timed out"},
		{"unknown exec", qga.ErrUnknownExec, hypervisor.ErrUnknownExec, "unknown exec"},
		{"invalid", qga.ErrInvalidArgument, hypervisor.ErrInvalidArgument, "invalid argument"},
		// Any other reply of the agent is its own reason, passed through.
		{"agent reply", &qga.Error{Class: "GenericError", Desc: "failed to open file '/nope' (mode: 'r'): No such file or directory"},
			hypervisor.ErrBackend, "backend error: the guest agent answered: failed to open file '/nope' (mode: 'r'): No such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &fakeAgent{t: t, info: execInfo(true),
				execStart: func(context.Context, qga.ExecRequest) (int64, error) { return 0, tt.err },
				fileRead:  func(context.Context, string, int64) ([]byte, bool, error) { return nil, false, tt.err },
			}
			d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": a}, nil)
			_, err := d.ExecStart(context.Background(), "vm1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantMsg) || !strings.HasPrefix(err.Error(), "qemu: exec start: ") {
				t.Errorf("ExecStart() = %v; want %v containing %q", err, tt.want, tt.wantMsg)
			}
			_, err = d.FileRead(context.Background(), "vm1", "/etc/hostname", 10)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("FileRead() = %v; want %v containing %q", err, tt.want, tt.wantMsg)
			}
		})
	}
}

func TestDriverAgentUnavailableSaysWhetherQEMUIsGone(t *testing.T) {
	tests := []struct {
		name        string
		mon         *fakeMonitor
		wantStopped bool
	}{
		{"qemu gone", &fakeMonitor{connect: refused}, true},
		{"qemu running", &fakeMonitor{run: running("running")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &fakeAgent{t: t, info: func(context.Context) (qga.Info, error) { return qga.Info{}, qga.ErrConnLost }}
			d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": a}, map[string]*fakeMonitor{"vm1": tt.mon})
			_, err := d.Run(context.Background(), "vm1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
			if !errors.Is(err, hypervisor.ErrAgentUnavailable) || errors.Is(err, hypervisor.ErrVMNotRunning) != tt.wantStopped {
				t.Errorf("Run() = %v; want ErrAgentUnavailable, ErrVMNotRunning %v", err, tt.wantStopped)
			}
		})
	}
}

func TestDriverPreflightDisabledExec(t *testing.T) {
	var infos atomic.Int64
	a := &fakeAgent{t: t, info: func(ctx context.Context) (qga.Info, error) {
		infos.Add(1)
		return execInfo(false)(ctx)
	}}
	d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": a}, nil)
	for range 3 {
		_, err := d.ExecStart(context.Background(), "vm1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
		var de *hypervisor.CommandDisabledError
		if !errors.As(err, &de) || de.Command != "guest-exec" || err.Error() != "qemu: exec start: guest-exec is disabled in this guest" {
			t.Errorf("ExecStart() = %v; want *CommandDisabledError{guest-exec}", err)
		}
		if _, err := d.Run(context.Background(), "vm1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}}); !errors.Is(err, hypervisor.ErrCommandDisabled) {
			t.Errorf("Run() = %v; want ErrCommandDisabled", err)
		}
	}
	if n := infos.Load(); n != 1 {
		t.Errorf("guest-info calls = %d; want 1 (cached)", n)
	}
}

func TestDriverUnknownVM(t *testing.T) {
	lab := t.TempDir()
	if err := os.MkdirAll(filepath.Join(lab, "nojson"), 0o755); err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{t: t}
	d := newFakeDriver(t, Config{LabDir: lab}, map[string]*fakeAgent{"vm1": a}, nil)
	ctx := context.Background()
	for _, name := range []string{"", "nope", "nojson", "../vm1", "vm1/../vm1", ".", "..", "a b", "vm1\x00", strings.Repeat("v", 65)} {
		if _, err := d.Status(ctx, name); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("Status(%q) = %v; want ErrUnknownVM", name, err)
		}
		if _, err := d.Run(ctx, name, hypervisor.ExecRequest{Argv: []string{"/bin/true"}}); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("Run(%q) = %v; want ErrUnknownVM", name, err)
		}
		if err := d.Power(ctx, name, hypervisor.PowerStop); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("Power(%q, stop) = %v; want ErrUnknownVM", name, err)
		}
	}
	if n := a.calls.Load(); n != 0 {
		t.Errorf("agent calls = %d; want 0", n)
	}
}

func TestDriverBadInput(t *testing.T) {
	a := &fakeAgent{t: t, info: execInfo(true)}
	d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": a}, map[string]*fakeMonitor{"vm1": {run: running("running")}})
	ctx := context.Background()
	// A well-formed token (the agentexec format) for pid 42 on vm1.
	tok := base64.RawURLEncoding.EncodeToString([]byte(`{"vm":"vm1","pid":42,"deadline":0,"max_out":10}`))
	tests := []struct {
		name string
		call func() error
	}{
		{"exec nil argv", func() error { _, err := d.Run(ctx, "vm1", hypervisor.ExecRequest{}); return err }},
		{"exec empty argv0", func() error { _, err := d.Run(ctx, "vm1", hypervisor.ExecRequest{Argv: []string{""}}); return err }},
		{"exec negative timeout", func() error {
			_, err := d.ExecStart(ctx, "vm1", hypervisor.ExecRequest{Argv: []string{"x"}, Timeout: -1})
			return err
		}},
		{"exec negative max output", func() error {
			_, err := d.Run(ctx, "vm1", hypervisor.ExecRequest{Argv: []string{"x"}, MaxOutputBytes: -1})
			return err
		}},
		{"exec relative cwd", func() error {
			_, err := d.Run(ctx, "vm1", hypervisor.ExecRequest{Argv: []string{"x"}, Cwd: "tmp"})
			return err
		}},
		{"status pid 0", func() error { _, err := d.ExecStatus(ctx, "vm1", hypervisor.ExecHandle{}); return err }},
		{"status garbage token", func() error {
			_, err := d.ExecStatus(ctx, "vm1", hypervisor.ExecHandle{PID: 42, Token: "!!"})
			return err
		}},
		{"status token of another pid", func() error {
			_, err := d.ExecStatus(ctx, "vm1", hypervisor.ExecHandle{PID: 43, Token: tok})
			return err
		}},
		{"status without token", func() error {
			_, err := d.ExecStatus(ctx, "vm1", hypervisor.ExecHandle{PID: 42})
			return err
		}},
		{"read relative path", func() error { _, err := d.FileRead(ctx, "vm1", "etc/passwd", 1); return err }},
		{"read empty path", func() error { _, err := d.FileRead(ctx, "vm1", "", 1); return err }},
		{"read negative max", func() error { _, err := d.FileRead(ctx, "vm1", "/etc/passwd", -1); return err }},
		{"write NUL in path", func() error { return d.FileWrite(ctx, "vm1", "/tmp/a\x00b", nil, 0) }},
		{"write mode too big", func() error { return d.FileWrite(ctx, "vm1", "/tmp/a", nil, 0o17777) }},
		{"power unknown action", func() error { return d.Power(ctx, "vm1", "explode") }},
		{"power empty action", func() error { return d.Power(ctx, "vm1", "") }},
	}
	for _, tt := range tests {
		if err := tt.call(); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("%s: err = %v; want ErrInvalidArgument", tt.name, err)
		}
	}
	if n := a.calls.Load(); n != 0 {
		t.Errorf("agent calls after bad input = %d; want 0", n)
	}
}

func TestDriverNewRejectsBadConfig(t *testing.T) {
	tests := []Config{
		{VMs: []VMConfig{{Name: "", QMPSocket: "q", QGASocket: "g"}}},
		{VMs: []VMConfig{{Name: "../x", QMPSocket: "q", QGASocket: "g"}}},
		{VMs: []VMConfig{{Name: "a", QGASocket: "g"}}},
		{VMs: []VMConfig{{Name: "a", QMPSocket: "q"}}},
		{VMs: []VMConfig{{Name: "a", QMPSocket: "q", QGASocket: "g"}, {Name: "a", QMPSocket: "q2", QGASocket: "g2"}}},
		{ExecTimeout: -time.Second},
	}
	for _, cfg := range tests {
		if _, err := New(cfg); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("New(%+v) = %v; want ErrInvalidArgument", cfg, err)
		}
	}
}

// A VM whose agent never answers (paused) must not delay calls to another VM.
func TestDriverHungVMDoesNotDelayOthers(t *testing.T) {
	release := make(chan struct{})
	hung := &fakeAgent{t: t, info: execInfo(true), exec: func(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error) {
		select {
		case <-release:
			return qga.ExecStatus{}, errors.New("released")
		case <-ctx.Done():
			return qga.ExecStatus{}, fmt.Errorf("guest-exec: %w", qga.ErrTimeout)
		}
	}}
	fine := &fakeAgent{t: t, info: execInfo(true), exec: func(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error) {
		return qga.ExecStatus{PID: 7, Exited: true, Stdout: []byte("ok\n")}, nil
	}}
	d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"paused": hung, "ok": fine}, nil)

	hungDone := make(chan error, 1)
	go func() {
		_, err := d.Run(context.Background(), "paused", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
		hungDone <- err
	}()
	for hung.calls.Load() < 2 { // Info, then Exec in progress
		time.Sleep(time.Millisecond)
	}
	for i := range 5 {
		res, err := d.Run(context.Background(), "ok", hypervisor.ExecRequest{Argv: []string{"/bin/echo", "ok"}})
		if err != nil || string(res.Stdout) != "ok\n" {
			t.Errorf("Run(ok) #%d = %+v, %v; want stdout ok", i, res, err)
		}
	}
	select {
	case err := <-hungDone:
		t.Fatalf("Run(paused) returned %v before it was released; the fake is broken", err)
	default:
	}
	close(release)
	if err := <-hungDone; err == nil {
		t.Errorf("Run(paused) after release = nil; want an error")
	}

	// And a deadline on the hung VM's call becomes ErrTimeout.
	hung.exec = func(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error) {
		<-ctx.Done()
		return qga.ExecStatus{}, fmt.Errorf("guest-exec: %w", qga.ErrTimeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := d.Run(ctx, "paused", hypervisor.ExecRequest{Argv: []string{"/bin/true"}}); !errors.Is(err, hypervisor.ErrTimeout) {
		t.Errorf("Run(paused) with a deadline = %v; want ErrTimeout", err)
	}
}

func TestDriverStatus(t *testing.T) {
	tests := []struct {
		name      string
		mon       *fakeMonitor
		ping      error
		wantState hypervisor.State
		wantAgent bool
	}{
		{"running with agent", &fakeMonitor{run: running("running")}, nil, hypervisor.StateRunning, true},
		{"running without agent", &fakeMonitor{run: running("running")}, qga.ErrNoAgent, hypervisor.StateRunning, false},
		{"paused", &fakeMonitor{run: running("paused")}, nil, hypervisor.StatePaused, false},
		{"guest shut down", &fakeMonitor{run: running("shutdown")}, nil, hypervisor.StateStopped, false},
		{"qemu gone", &fakeMonitor{connect: refused}, nil, hypervisor.StateStopped, false},
		{"missing socket", &fakeMonitor{connect: func(context.Context) error { return fmt.Errorf("qmp: connect: %w", os.ErrNotExist) }}, nil, hypervisor.StateStopped, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &fakeAgent{t: t, info: execInfo(true), ping: func(context.Context) error { return tt.ping }}
			d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": a}, map[string]*fakeMonitor{"vm1": tt.mon})
			st, err := d.Status(context.Background(), "vm1")
			if err != nil {
				t.Fatalf("Status() = %v; want nil", err)
			}
			if st.State != tt.wantState || st.AgentConnected != tt.wantAgent || st.Name != "vm1" {
				t.Errorf("Status() = %+v; want state %s, agent %v", st, tt.wantState, tt.wantAgent)
			}
			if tt.wantAgent && st.AgentVersion != "7.2.0" {
				t.Errorf("Status().AgentVersion = %q; want 7.2.0", st.AgentVersion)
			}
		})
	}
}

func TestDriverStatusQMPTimeout(t *testing.T) {
	mon := &fakeMonitor{run: func(ctx context.Context, _ string) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}}
	d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": {t: t}}, map[string]*fakeMonitor{"vm1": mon})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := d.Status(ctx, "vm1"); !errors.Is(err, hypervisor.ErrTimeout) {
		t.Errorf("Status() with a hung QMP = %v; want ErrTimeout", err)
	}
}

func TestDriverListVMs(t *testing.T) {
	lab := t.TempDir()
	for _, name := range []string{"vm2", "vm1", "bad name", "nojson"} {
		if err := os.MkdirAll(filepath.Join(lab, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if name != "nojson" {
			if err := os.WriteFile(filepath.Join(lab, name, "vm.json"), []byte(`{"name":"`+name+`"}`), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	monitors := map[string]*fakeMonitor{
		"vm1": {run: running("running")},
		"vm2": {run: running("paused")},
		"cfg": {connect: refused},
	}
	d := newFakeDriver(t, Config{LabDir: lab}, map[string]*fakeAgent{"cfg": {t: t}}, monitors)
	vms, err := d.ListVMs(context.Background())
	if err != nil {
		t.Fatalf("ListVMs() = %v; want nil", err)
	}
	want := []hypervisor.VM{
		{Name: "cfg", State: hypervisor.StateStopped, Info: "configured", Agent: true},
		{Name: "vm1", State: hypervisor.StateRunning, Info: "lab VM", Agent: true},
		{Name: "vm2", State: hypervisor.StatePaused, Info: "lab VM", Agent: true},
	}
	if fmt.Sprint(vms) != fmt.Sprint(want) {
		t.Errorf("ListVMs() = %v; want %v", vms, want)
	}
}

func TestDriverPower(t *testing.T) {
	tests := []struct {
		name      string
		action    hypervisor.PowerAction
		shutdown  error // the agent's answer
		wantMode  string
		wantQMP   string // the last QMP command, "" for none besides query-status
		wantError error
	}{
		{"shutdown via agent", hypervisor.PowerShutdown, nil, "powerdown", "", nil},
		{"shutdown fallback", hypervisor.PowerShutdown, qga.ErrNoAgent, "powerdown", "system_powerdown", nil},
		{"shutdown agent disabled", hypervisor.PowerShutdown, &qga.DisabledError{Command: "guest-shutdown", Err: &qga.Error{Class: "CommandNotFound", Desc: "Command guest-shutdown has been disabled"}}, "powerdown", "system_powerdown", nil},
		{"reboot via agent", hypervisor.PowerReboot, nil, "reboot", "", nil},
		{"reboot fallback", hypervisor.PowerReboot, fmt.Errorf("x: %w", qga.ErrTimeout), "reboot", "system_reset", nil},
		{"reset", hypervisor.PowerReset, nil, "", "system_reset", nil},
		{"stop", hypervisor.PowerStop, nil, "", "quit", nil},
		{"start configured", hypervisor.PowerStart, nil, "", "", hypervisor.ErrNotSupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var gotMode string
			a := &fakeAgent{t: t, shutdown: func(_ context.Context, mode string) error { gotMode = mode; return tt.shutdown }}
			mon := &fakeMonitor{run: running("running")}
			d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": a}, map[string]*fakeMonitor{"vm1": mon})
			err := d.Power(context.Background(), "vm1", tt.action)
			if !errors.Is(err, tt.wantError) || (tt.wantError == nil && err != nil) {
				t.Fatalf("Power(%s) = %v; want %v", tt.action, err, tt.wantError)
			}
			if gotMode != tt.wantMode {
				t.Errorf("Power(%s) agent mode = %q; want %q", tt.action, gotMode, tt.wantMode)
			}
			last := ""
			for _, c := range mon.sent() {
				if !strings.Contains(c, "query-status") {
					last = c
				}
			}
			if (tt.wantQMP == "" && last != "") || (tt.wantQMP != "" && !strings.Contains(last, `"`+tt.wantQMP+`"`)) {
				t.Errorf("Power(%s) QMP commands = %v; want last %q", tt.action, mon.sent(), tt.wantQMP)
			}
		})
	}
}

func TestDriverStartLabVM(t *testing.T) {
	lab := t.TempDir()
	dir := filepath.Join(lab, "vm1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	qmpSock := filepath.Join(dir, "qmp.sock")
	tests := []struct {
		name    string
		vmJSON  string
		wantErr bool
	}{
		{"good", `{"name":"vm1","argv":["/usr/bin/qemu-system-x86_64","-qmp","unix:` + qmpSock + `,server=on,wait=off"]}`, false},
		{"not qemu", `{"name":"vm1","argv":["/bin/sh","-c","echo hi","unix:` + qmpSock + `"]}`, true},
		{"another socket", `{"name":"vm1","argv":["qemu-system-x86_64","-qmp","unix:/elsewhere/qmp.sock"]}`, true},
		{"no argv", `{"name":"vm1"}`, true},
		{"not JSON", `{`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(dir, "vm.json"), []byte(tt.vmJSON), 0o644); err != nil {
				t.Fatal(err)
			}
			var started atomic.Bool
			var gotArgv []string
			mon := &fakeMonitor{
				connect: func(ctx context.Context) error {
					if !started.Load() {
						return refused(ctx)
					}
					return nil
				},
				run: running("running"),
			}
			d := newFakeDriver(t, Config{LabDir: lab}, nil, map[string]*fakeMonitor{"vm1": mon})
			d.startProcess = func(_ context.Context, argv []string) error {
				gotArgv = argv
				started.Store(true)
				return nil
			}
			err := d.Power(context.Background(), "vm1", hypervisor.PowerStart)
			if tt.wantErr {
				if err == nil || started.Load() {
					t.Errorf("Power(start) = %v, started %v; want an error and nothing started", err, started.Load())
				}
				return
			}
			if err != nil {
				t.Fatalf("Power(start) = %v; want nil", err)
			}
			if len(gotArgv) == 0 || gotArgv[len(gotArgv)-1] != "-daemonize" {
				t.Errorf("started argv = %q; want the stored argv plus -daemonize", gotArgv)
			}
		})
	}
}

func TestDriverExecTimeoutWatchdog(t *testing.T) {
	var killed atomic.Bool
	killedCh := make(chan struct{})
	a := &fakeAgent{t: t, info: execInfo(true),
		execStart: func(context.Context, qga.ExecRequest) (int64, error) { return 42, nil },
		execStatus: func(_ context.Context, pid, max int64) (qga.ExecStatus, error) {
			if pid != 42 || max != 100 {
				return qga.ExecStatus{}, fmt.Errorf("ExecStatus(%d, %d); want (42, 100)", pid, max)
			}
			if killed.Load() {
				return qga.ExecStatus{PID: 42, Exited: true, ExitCode: -1, Signal: 9, Stdout: []byte("partial")}, nil
			}
			return qga.ExecStatus{PID: 42, Stdout: []byte("partial")}, nil
		},
		kill: func(_ context.Context, pid int64) error {
			if pid == 42 && !killed.Swap(true) {
				close(killedCh)
			}
			return nil
		},
	}
	d := newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": a}, nil)
	h, err := d.ExecStart(context.Background(), "vm1", hypervisor.ExecRequest{Argv: []string{"sleep", "100"}, Timeout: 30 * time.Millisecond, MaxOutputBytes: 100})
	if err != nil || h.PID != 42 || h.Token == "" {
		t.Fatalf("ExecStart() = %+v, %v; want pid 42 with a token", h, err)
	}
	// Nobody polls: the watchdog kills at the deadline.
	select {
	case <-killedCh:
	case <-time.After(10 * time.Second):
		t.Fatal("the command was not killed at its deadline")
	}
	res, err := hypervisor.Wait(context.Background(), d, "vm1", h)
	if err != nil || !res.Exited || !res.TimedOut || res.Signal != 9 || string(res.Stdout) != "partial" {
		t.Errorf("Wait() = %+v, %v; want exited, timed out, signal 9, partial output", res, err)
	}
	// Collected: a second poll goes to the agent, which no longer knows it.
	a.execStatus = func(context.Context, int64, int64) (qga.ExecStatus, error) {
		return qga.ExecStatus{}, qga.ErrUnknownExec
	}
	if _, err := d.ExecStatus(context.Background(), "vm1", h); !errors.Is(err, hypervisor.ErrUnknownExec) {
		t.Errorf("ExecStatus() after collection = %v; want ErrUnknownExec", err)
	}
}
