package hypervisor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// connect serves d over a real in-process gRPC plugin connection and returns
// the host-side driver.
func connect(t testing.TB, name string, d hypervisor.Driver) hypervisor.Driver {
	t.Helper()
	ps := map[string]plugin.Plugin{hypervisor.PluginName: &hypervisor.GRPCPlugin{Impl: d, Name: name}}
	// The client's Close shuts the server down through go-plugin's controller
	// (stopping it here as well would race inside go-plugin).
	c, _ := plugin.TestPluginGRPCConn(t, false, ps)
	t.Cleanup(func() { c.Close() })
	raw, err := c.Dispense(hypervisor.PluginName)
	if err != nil {
		t.Fatalf("Dispense(%q) = %v", hypervisor.PluginName, err)
	}
	drv, ok := raw.(hypervisor.Driver)
	if !ok {
		t.Fatalf("Dispense returned %T; want a hypervisor.Driver", raw)
	}
	return drv
}

func TestSentinelsSurviveTheBoundary(t *testing.T) {
	sentinels := []error{
		hypervisor.ErrUnknownVM, hypervisor.ErrAgentUnavailable, hypervisor.ErrCommandDisabled,
		hypervisor.ErrTimeout, hypervisor.ErrNotSupported, hypervisor.ErrUnknownExec,
		hypervisor.ErrVMNotRunning, hypervisor.ErrInvalidArgument, hypervisor.ErrNotConfigured,
		hypervisor.ErrPluginExited, context.DeadlineExceeded, context.Canceled,
		hypervisor.ErrSnapshotNotFound, hypervisor.ErrSnapshotExists, hypervisor.ErrSnapshotMemory, hypervisor.ErrSnapshotDiskOnly,
		hypervisor.ErrNotCreated,
	}
	tests := []struct {
		name string
		err  error
		is   []error // sentinels errors.Is must find on the host side
	}{
		{"unknown VM", fmt.Errorf("qemu: status: %w: vm9", hypervisor.ErrUnknownVM), []error{hypervisor.ErrUnknownVM}},
		{"agent unavailable", fmt.Errorf("qemu: ping: %w", hypervisor.ErrAgentUnavailable), []error{hypervisor.ErrAgentUnavailable}},
		{"command disabled", fmt.Errorf("qemu: exec: %w", &hypervisor.CommandDisabledError{Command: "guest-exec"}), []error{hypervisor.ErrCommandDisabled}},
		{"timeout", fmt.Errorf("qemu: exec: %w: %w", hypervisor.ErrTimeout, context.DeadlineExceeded), []error{hypervisor.ErrTimeout, context.DeadlineExceeded}},
		{"not supported", fmt.Errorf("qemu: power start: %w", hypervisor.ErrNotSupported), []error{hypervisor.ErrNotSupported}},
		{"unknown exec", fmt.Errorf("qemu: exec status: %w", hypervisor.ErrUnknownExec), []error{hypervisor.ErrUnknownExec}},
		{"not running", fmt.Errorf("qemu: exec: %w", hypervisor.ErrVMNotRunning), []error{hypervisor.ErrVMNotRunning}},
		{"invalid argument", fmt.Errorf("qemu: file read: %w: empty path", hypervisor.ErrInvalidArgument), []error{hypervisor.ErrInvalidArgument}},
		{"two sentinels", errors.Join(hypervisor.ErrVMNotRunning, hypervisor.ErrAgentUnavailable), []error{hypervisor.ErrVMNotRunning, hypervisor.ErrAgentUnavailable}},
		{"canceled", fmt.Errorf("qemu: %w", context.Canceled), []error{context.Canceled}},
		{"plain error", errors.New("qemu: something odd"), nil},
		{"snapshot not found", fmt.Errorf("qemu: snapshot revert: %w", hypervisor.ErrSnapshotNotFound), []error{hypervisor.ErrSnapshotNotFound}},
		{"snapshot exists", fmt.Errorf("qemu: snapshot create: %w", hypervisor.ErrSnapshotExists), []error{hypervisor.ErrSnapshotExists}},
		{"snapshot memory", fmt.Errorf("qemu: snapshot create: %w", hypervisor.ErrSnapshotMemory), []error{hypervisor.ErrSnapshotMemory, hypervisor.ErrNotSupported}},
		{"snapshot disk only", fmt.Errorf("qemu: snapshot create: %w", hypervisor.ErrSnapshotDiskOnly), []error{hypervisor.ErrSnapshotDiskOnly, hypervisor.ErrNotSupported}},
		{"not created", fmt.Errorf("qemu: delete vm1: %w", hypervisor.ErrNotCreated), []error{hypervisor.ErrNotCreated}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			drv := connect(t, "fake", &hypervisortest.Fake{
				StatusFunc: func(context.Context, string) (hypervisor.Status, error) { return hypervisor.Status{}, tt.err },
			})
			_, err := drv.Status(context.Background(), "vm1")
			if err == nil {
				t.Fatalf("Status() = nil error; want %v", tt.err)
			}
			if err.Error() != tt.err.Error() {
				t.Errorf("Status() error = %q; want %q", err, tt.err)
			}
			for _, s := range sentinels {
				want := false
				for _, w := range tt.is {
					want = want || w == s
				}
				if got := errors.Is(err, s); got != want {
					t.Errorf("errors.Is(%v, %v) = %v; want %v", err, s, got, want)
				}
			}
		})
	}
}

func TestCommandDisabledErrorSurvives(t *testing.T) {
	drv := connect(t, "fake", &hypervisortest.Fake{
		ExecStartFunc: func(context.Context, string, hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			return hypervisor.ExecHandle{}, fmt.Errorf("qemu: exec: %w", &hypervisor.CommandDisabledError{Command: "guest-exec"})
		},
	})
	_, err := drv.ExecStart(context.Background(), "vm1", hypervisor.ExecRequest{Argv: []string{"true"}})
	var cd *hypervisor.CommandDisabledError
	if !errors.As(err, &cd) {
		t.Fatalf("ExecStart() = %v; want a *CommandDisabledError", err)
	}
	if cd.Command != "guest-exec" || cd.Error() != "guest-exec is disabled in this guest" {
		t.Errorf("CommandDisabledError = {%q, %q}; want {guest-exec, guest-exec is disabled in this guest}", cd.Command, cd.Error())
	}
}

func TestDeadlineBoundsAHungPlugin(t *testing.T) {
	released := make(chan struct{})
	drv := connect(t, "hang", &hypervisortest.Fake{
		StatusFunc: func(ctx context.Context, _ string) (hypervisor.Status, error) {
			<-ctx.Done() // the deadline travelled to the plugin
			close(released)
			return hypervisor.Status{}, ctx.Err()
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := drv.Status(ctx, "vm1")
	// Whichever side notices the deadline first answers: the host (ErrTimeout
	// wrapping DeadlineExceeded) or the plugin (its ctx.Err()).
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Status(hung) = %v; want context.DeadlineExceeded", err)
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Error("the plugin-side context was never cancelled")
	}
}

func TestValuesRoundTrip(t *testing.T) {
	started := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	req := hypervisor.ExecRequest{
		Argv: []string{"/bin/sh", "-c", "echo $X"}, Env: []string{"X=1"}, Stdin: []byte("in\x00put"),
		Cwd: "/tmp", Timeout: 3 * time.Second, MaxOutputBytes: 4096,
	}
	handle := hypervisor.ExecHandle{PID: 42, Token: "tok", StartedAt: started}
	result := hypervisor.ExecResult{
		PID: 42, Exited: true, ExitCode: 3, Signal: 9, Stdout: []byte("out"), Stderr: []byte("err"),
		StdoutTruncated: true, StderrTruncated: true, TimedOut: true,
	}
	var gotReq hypervisor.ExecRequest
	var gotHandle hypervisor.ExecHandle
	var gotWrite struct {
		path string
		data []byte
		mode uint32
	}
	var gotAction hypervisor.PowerAction
	vms := []hypervisor.VM{{Name: "a", State: hypervisor.StateRunning, Info: "lab VM", Agent: true}, {Name: "b", State: hypervisor.StateStopped}}
	st := hypervisor.Status{Name: "a", State: hypervisor.StatePaused, AgentConnected: true, AgentVersion: "9.2", Detail: "paused"}
	info := hypervisor.AgentInfo{Version: "9.2", Commands: []hypervisor.AgentCommand{{Name: "guest-exec", Enabled: true}, {Name: "guest-ping"}}}
	drv := connect(t, "fake", &hypervisortest.Fake{
		ListVMsFunc:   func(context.Context) ([]hypervisor.VM, error) { return vms, nil },
		StatusFunc:    func(context.Context, string) (hypervisor.Status, error) { return st, nil },
		AgentInfoFunc: func(context.Context, string) (hypervisor.AgentInfo, error) { return info, nil },
		ExecStartFunc: func(_ context.Context, _ string, r hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			gotReq = r
			return handle, nil
		},
		ExecStatusFunc: func(_ context.Context, _ string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			gotHandle = h
			return result, nil
		},
		FileReadFunc: func(_ context.Context, _, path string, max int64) (hypervisor.FileContent, error) {
			return hypervisor.FileContent{Data: []byte(path)[:max], Truncated: true}, nil
		},
		FileWriteFunc: func(_ context.Context, _, path string, data []byte, mode uint32) error {
			gotWrite.path, gotWrite.data, gotWrite.mode = path, data, mode
			return nil
		},
		PowerFunc: func(_ context.Context, _ string, a hypervisor.PowerAction) error { gotAction = a; return nil },
	})
	ctx := context.Background()

	if got, err := drv.ListVMs(ctx); err != nil || !reflect.DeepEqual(got, vms) {
		t.Errorf("ListVMs() = %+v, %v; want %+v", got, err, vms)
	}
	if got, err := drv.Status(ctx, "a"); err != nil || got != st {
		t.Errorf("Status() = %+v, %v; want %+v", got, err, st)
	}
	if got, err := drv.AgentInfo(ctx, "a"); err != nil || !reflect.DeepEqual(got, info) {
		t.Errorf("AgentInfo() = %+v, %v; want %+v", got, err, info)
	}
	h, err := drv.ExecStart(ctx, "a", req)
	if err != nil || h.PID != handle.PID || h.Token != handle.Token || !h.StartedAt.Equal(started) {
		t.Errorf("ExecStart() = %+v, %v; want %+v", h, err, handle)
	}
	if !reflect.DeepEqual(gotReq, req) {
		t.Errorf("driver saw request %+v; want %+v", gotReq, req)
	}
	res, err := drv.ExecStatus(ctx, "a", h)
	if err != nil || !reflect.DeepEqual(res, result) {
		t.Errorf("ExecStatus() = %+v, %v; want %+v", res, err, result)
	}
	if !gotHandle.StartedAt.Equal(started) || gotHandle.Token != "tok" {
		t.Errorf("driver saw handle %+v; want %+v", gotHandle, handle)
	}
	// The zero time stays zero across the boundary.
	if _, err := drv.ExecStatus(ctx, "a", hypervisor.ExecHandle{PID: 1}); err != nil || !gotHandle.StartedAt.IsZero() {
		t.Errorf("ExecStatus(zero StartedAt): driver saw %v, %v; want the zero time", gotHandle.StartedAt, err)
	}
	// Run goes through the plugin's Run RPC, which polls inside the plugin.
	if res, err := hypervisor.Run(ctx, drv, "a", req); err != nil || !reflect.DeepEqual(res, result) {
		t.Errorf("Run() = %+v, %v; want %+v", res, err, result)
	}
	if fc, err := drv.FileRead(ctx, "a", "/etc/hostname", 4); err != nil || string(fc.Data) != "/etc" || !fc.Truncated {
		t.Errorf("FileRead() = %+v, %v; want {/etc true}", fc, err)
	}
	if err := drv.FileWrite(ctx, "a", "/tmp/x", []byte{0, 1, 2}, 0o640); err != nil || gotWrite.path != "/tmp/x" || !bytes.Equal(gotWrite.data, []byte{0, 1, 2}) || gotWrite.mode != 0o640 {
		t.Errorf("FileWrite() = %v; driver saw %+v", err, gotWrite)
	}
	if err := drv.Power(ctx, "a", hypervisor.PowerReset); err != nil || gotAction != hypervisor.PowerReset {
		t.Errorf("Power(reset) = %v; driver saw %q", err, gotAction)
	}
}

func TestConfigure(t *testing.T) {
	var built []byte
	deferred := hypervisor.NewDeferred(func(_ context.Context, cfg []byte) (hypervisor.Driver, error) {
		if !json.Valid(cfg) {
			return nil, fmt.Errorf("fake config: %w: not JSON", hypervisor.ErrInvalidArgument)
		}
		built = cfg
		return &hypervisortest.Fake{ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
			return []hypervisor.VM{{Name: "configured"}}, nil
		}}, nil
	})
	drv := connect(t, "deferred", deferred)
	conf, ok := drv.(hypervisor.Configurer)
	if !ok {
		t.Fatalf("host driver %T is not a Configurer", drv)
	}
	ctx := context.Background()
	if _, err := drv.ListVMs(ctx); !errors.Is(err, hypervisor.ErrNotConfigured) {
		t.Errorf("ListVMs() before Configure = %v; want ErrNotConfigured", err)
	}
	if err := conf.Configure(ctx, []byte("{bad")); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("Configure(bad JSON) = %v; want ErrInvalidArgument", err)
	}
	if _, err := drv.ListVMs(ctx); !errors.Is(err, hypervisor.ErrNotConfigured) {
		t.Errorf("ListVMs() after a failed Configure = %v; want ErrNotConfigured", err)
	}
	if err := conf.Configure(ctx, []byte(`{"a":1}`)); err != nil {
		t.Fatalf("Configure(valid) = %v", err)
	}
	if string(built) != `{"a":1}` {
		t.Errorf("constructor saw %q; want {\"a\":1}", built)
	}
	if vms, err := drv.ListVMs(ctx); err != nil || len(vms) != 1 || vms[0].Name != "configured" {
		t.Errorf("ListVMs() after Configure = %v, %v; want [configured]", vms, err)
	}
	if err := conf.Configure(ctx, []byte(`{}`)); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("second Configure() = %v; want ErrInvalidArgument", err)
	}
}

func TestConfigureUnconfigurableDriver(t *testing.T) {
	drv := connect(t, "plain", &hypervisortest.Fake{})
	conf := drv.(hypervisor.Configurer)
	tests := []struct {
		config []byte
		want   error
	}{
		{nil, nil},
		{[]byte{}, nil},
		{[]byte(`{"lab_dir":"x"}`), hypervisor.ErrNotSupported},
	}
	for _, tt := range tests {
		err := conf.Configure(context.Background(), tt.config)
		if (tt.want == nil && err != nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("Configure(%q) = %v; want %v", tt.config, err, tt.want)
		}
	}
}

func TestPluginLogHandler(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(hypervisor.NewPluginLogHandler(&buf, slog.LevelDebug))
	l.Warn("agent slow", "vm", "vm1", "ms", 250)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("log line %q is not JSON: %v", buf.String(), err)
	}
	want := map[string]any{"@level": "warn", "@message": "agent slow", "vm": "vm1", "ms": float64(250)}
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("log record[%q] = %v; want %v (line %s)", k, rec[k], v, strings.TrimSpace(buf.String()))
		}
	}
	ts, _ := rec["@timestamp"].(string)
	if _, err := time.Parse("2006-01-02T15:04:05.000000Z07:00", ts); err != nil {
		t.Errorf("@timestamp %q does not parse in go-plugin's layout: %v", ts, err)
	}
}

// BenchmarkCall measures one no-op driver call (Status on a fake driver) in
// process and through a real gRPC plugin connection (same process, Unix
// socket): the per-call cost of the plugin boundary.
func BenchmarkCall(b *testing.B) {
	fake := &hypervisortest.Fake{StatusFunc: func(_ context.Context, vm string) (hypervisor.Status, error) {
		return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, AgentConnected: true}, nil
	}}
	for _, bc := range []struct {
		name string
		drv  func(b *testing.B) hypervisor.Driver
	}{
		{"in-process", func(*testing.B) hypervisor.Driver { return fake }},
		{"plugin", func(b *testing.B) hypervisor.Driver { return connect(b, "bench", fake) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			drv := bc.drv(b)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if st, err := drv.Status(ctx, "vm1"); err != nil || st.Name != "vm1" {
					b.Fatalf("Status(vm1) = %+v, %v", st, err)
				}
			}
		})
	}
}
