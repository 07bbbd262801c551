package pluginhost

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

func launchSleepy(t *testing.T, h *Host, name string) *Supervisor {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, Spec{Driver: "sleepy", Backend: "test", Config: []byte(`{"name":"` + name + `"}`)})
	if err != nil {
		t.Fatalf("Launch(sleepy) = %v", err)
	}
	s, ok := d.(*Supervisor)
	if !ok {
		t.Fatalf("Launch(sleepy) = %T; want *Supervisor", d)
	}
	return s
}

func TestBuiltinPluginIsASeparateConfiguredProcess(t *testing.T) {
	t.Setenv("VMGATE_TEST_SECRET", "s3cr3t")
	h, logs := newTestHost(t, Options{})
	s := launchSleepy(t, h, "vm1")
	ctx := context.Background()

	pid := s.PID()
	if pid <= 0 || pid == os.Getpid() || !alive(pid) {
		t.Fatalf("PID() = %d; want a live process other than %d", pid, os.Getpid())
	}
	vms, err := s.ListVMs(ctx)
	if err != nil || len(vms) != 1 || vms[0].Name != "vm1" {
		t.Fatalf("ListVMs() = %+v, %v; want the VM named by the config", vms, err)
	}
	if want := "stdin=/dev/null secret="; vms[0].Info != want {
		t.Errorf("plugin sees %q; want %q (stdin is /dev/null, the server's secrets stay out)", vms[0].Info, want)
	}
	st, err := s.Status(ctx, "vm1")
	if err != nil || st.Detail != "pid "+strconv.Itoa(pid) {
		t.Errorf("Status(vm1) = %+v, %v; want it answered by pid %d", st, err, pid)
	}
	if _, err := s.Status(ctx, "nope"); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("Status(nope) = %v; want ErrUnknownVM", err)
	}
	// The plugin's slog record reached the host's slog with its level and attributes.
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "sleepy configured") || !strings.Contains(l, "name=vm1") {
		t.Errorf("host log lacks the plugin's WARN record:\n%s", l)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if !waitGone(pid, 5*time.Second) {
		t.Errorf("plugin pid %d still alive after Host.Close", pid)
	}
	if _, err := s.ListVMs(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("ListVMs() after Close = %v; want ErrClosed", err)
	}
}

func TestPluginKilledMidCallFailsThatCallAndRestarts(t *testing.T) {
	h, logs := newTestHost(t, Options{})
	s := launchSleepy(t, h, "vm1")
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	oldPID := s.PID()

	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		_, err := hypervisor.Run(ctx, s, "vm1", hypervisor.ExecRequest{Argv: []string{"sleep", "5"}})
		done <- result{err, time.Since(start)}
	}()
	// Kill the plugin once the command started inside it (it says so in the log).
	waitLog(t, logs, "sleepy exec started")
	if err := syscall.Kill(oldPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill(%d) = %v", oldPID, err)
	}
	r := <-done
	if !errors.Is(r.err, hypervisor.ErrPluginExited) {
		t.Fatalf("Run(sleep 5) with the plugin killed = %v; want ErrPluginExited", r.err)
	}
	if want := "driver sleepy exited"; !strings.Contains(r.err.Error(), want) {
		t.Errorf("error %q does not say %q", r.err, want)
	}
	if r.took >= 5*time.Second {
		t.Errorf("the failed Run took %v; want it to fail when the plugin died", r.took)
	}

	res, err := hypervisor.Run(ctx, s, "vm1", hypervisor.ExecRequest{Argv: []string{"sleep", "0.05"}})
	if err != nil || !res.Exited || string(res.Stdout) != "slept\n" {
		t.Fatalf("Run() after the restart = %+v, %v; want it to succeed", res, err)
	}
	if newPID := s.PID(); newPID == oldPID || newPID <= 0 {
		t.Errorf("PID() after restart = %d; want a new process (old %d)", newPID, oldPID)
	}
	if got := s.Restarts(); got != 1 {
		t.Errorf("Restarts() = %d; want 1", got)
	}
	if l := logs.String(); !strings.Contains(l, "driver plugin exited") || !strings.Contains(l, "driver plugin restarted") {
		t.Errorf("host log lacks the exit and the restart:\n%s", l)
	}
}

// A killed plugin is restarted without a call asking for it, and whoever
// watches the process (the server, which tells its clients) hears of the
// exit and then of the restart.
func TestPluginRestartsInTheBackground(t *testing.T) {
	h, _ := newTestHost(t, Options{})
	s := launchSleepy(t, h, "vm1")
	events := make(chan hypervisor.ProcessEvent, 8)
	s.WatchProcess(func(ev hypervisor.ProcessEvent) { events <- ev })
	oldPID := s.PID()
	if err := syscall.Kill(oldPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill(%d) = %v", oldPID, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for s.Restarts() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s.Restarts() != 1 || s.PID() == oldPID || s.PID() == 0 {
		t.Fatalf("after the kill and no call: Restarts() = %d, PID() = %d (old %d); want a background restart", s.Restarts(), s.PID(), oldPID)
	}
	want := []hypervisor.ProcessEvent{
		{Driver: "sleepy", Kind: hypervisor.ProcessExited, Restarts: 0},
		{Driver: "sleepy", Kind: hypervisor.ProcessRestarted, Restarts: 1},
	}
	for i, w := range want {
		select {
		case ev := <-events:
			if ev.Driver != w.Driver || ev.Kind != w.Kind || ev.Restarts != w.Restarts || (w.Kind == hypervisor.ProcessExited) != (ev.RestartIn > 0) {
				t.Errorf("event %d = %+v; want %+v (a restart delay only on the exit)", i, ev, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d (%s) never came", i, w.Kind)
		}
	}
}

func TestDeadlineBoundsTheWaitForARestart(t *testing.T) {
	// A long backoff: the next call cannot wait for the restart.
	h, _ := newTestHost(t, Options{MinBackoff: time.Minute, MaxBackoff: time.Minute})
	s := launchSleepy(t, h, "vm1")
	pid := s.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill(%d) = %v", pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.PID() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.PID() != 0 {
		t.Fatalf("the supervisor never noticed that pid %d was killed", pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.ListVMs(ctx)
	if !errors.Is(err, hypervisor.ErrPluginExited) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ListVMs() during the backoff = %v; want ErrPluginExited and DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("ListVMs() took %v; want it bounded by its 200ms deadline", took)
	}
}

func TestServerKilledTakesItsPluginsAlong(t *testing.T) {
	cmd := exec.Command(os.Args[0], "hold-plugin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr logBuffer
	cmd.Stderr = &stderr
	defer func() {
		if t.Failed() {
			t.Logf("helper stderr:\n%s", stderr.String())
		}
	}()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	waited := false
	defer func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the helper's plugin pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	if err != nil || pid <= 0 || !alive(pid) {
		t.Fatalf("helper said %q; want the pid of a live plugin", line)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill helper: %v", err)
	}
	cmd.Wait()
	waited = true
	if !waitGone(pid, 5*time.Second) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("plugin pid %d survived its server's SIGKILL", pid)
	}
}

func TestInProcess(t *testing.T) {
	h, _ := newTestHost(t, Options{InProcess: true})
	d, err := h.Launch(context.Background(), Spec{Driver: "sleepy", Config: []byte(`{"name":"here"}`)})
	if err != nil {
		t.Fatalf("Launch(sleepy, in process) = %v", err)
	}
	if _, ok := d.(*Supervisor); ok {
		t.Fatalf("Launch in process returned a *Supervisor; want the driver itself")
	}
	vms, err := d.ListVMs(context.Background())
	if err != nil || len(vms) != 1 || vms[0].Name != "here" {
		t.Errorf("ListVMs() = %+v, %v; want [here]", vms, err)
	}
}

func TestLaunchRefusesBadSpecs(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ExternalPrefix+"notexec"), []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, _ := newTestHost(t, Options{PluginDir: dir})
	tests := []struct {
		name string
		spec Spec
		want error
	}{
		{"empty name", Spec{}, hypervisor.ErrInvalidArgument},
		{"path in name", Spec{Driver: "../qemu"}, hypervisor.ErrInvalidArgument},
		{"upper case", Spec{Driver: "QEMU"}, hypervisor.ErrInvalidArgument},
		{"too long", Spec{Driver: strings.Repeat("a", 33)}, hypervisor.ErrInvalidArgument},
		{"bad JSON", Spec{Driver: "sleepy", Config: []byte(`{"name":`)}, hypervisor.ErrInvalidArgument},
		{"unknown driver", Spec{Driver: "nosuch"}, ErrUnknownDriver},
		{"not executable", Spec{Driver: "notexec"}, ErrUnknownDriver},
		{"config refused", Spec{Driver: "sleepy", Config: []byte(`{"name":"x","extra":1}`)}, hypervisor.ErrInvalidArgument},
		{"config incomplete", Spec{Driver: "sleepy", Config: []byte(`{}`)}, hypervisor.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := h.Launch(context.Background(), tt.spec)
			if !errors.Is(err, tt.want) {
				t.Errorf("Launch(%+v) = %v, %v; want %v", tt.spec, d, err, tt.want)
			}
		})
	}
	if n := len(h.launched); n != 0 {
		t.Errorf("host holds %d drivers after only refused launches; want 0", n)
	}
}

func TestBackoff(t *testing.T) {
	s := newSupervisor(Options{MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, StableAfter: time.Hour},
		nil, Spec{Driver: "x"}, command{})
	s.closed = true // no background restarts: only the bookkeeping runs
	var got []time.Duration
	for range 6 {
		inst := &instance{started: time.Now()}
		s.mu.Lock()
		s.noteExitLocked(inst)
		s.noteExitLocked(inst) // observed twice, counted once
		s.mu.Unlock()
		got = append(got, inst.delay)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("restart delays = %v; want %v", got, want)
	}
	// A plugin that stayed up for StableAfter resets the backoff.
	inst := &instance{started: time.Now().Add(-2 * time.Hour)}
	s.mu.Lock()
	s.noteExitLocked(inst)
	s.mu.Unlock()
	if inst.delay != 100*time.Millisecond {
		t.Errorf("delay after a stable run = %v; want 100ms", inst.delay)
	}
}

// BenchmarkCall measures one no-op driver call (Status on the sleepy fake)
// with the driver in process and through a real plugin process (its call
// socket; the state cache is off, so every call crosses): the per-call cost
// of the plugin boundary.
func BenchmarkCall(b *testing.B) {
	for _, bc := range []struct {
		name      string
		inProcess bool
	}{{"in-process", true}, {"plugin", false}} {
		b.Run(bc.name, func(b *testing.B) {
			h := New(Options{Executable: os.Args[0], Registry: testRegistry(), InProcess: bc.inProcess,
				Logger: slog.New(slog.DiscardHandler), StateTTL: -1})
			defer h.Close()
			ctx := context.Background()
			d, err := h.Launch(ctx, Spec{Driver: "sleepy", Config: []byte(`{"name":"vm1"}`)})
			if err != nil {
				b.Fatalf("Launch(sleepy) = %v", err)
			}
			var took []time.Duration
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				if st, err := d.Status(ctx, "vm1"); err != nil || st.Name != "vm1" {
					b.Fatalf("Status(vm1) = %+v, %v", st, err)
				}
				took = append(took, time.Since(start))
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2])/float64(time.Microsecond), "p50-µs")
		})
	}
}
