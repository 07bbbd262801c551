package qemu

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// The lab VMs boot only when a test asks for one (labtest.VM).
func TestMain(m *testing.M) {
	os.Exit(labtest.Main(m,
		lab.Spec{Name: "t1"},
		lab.Spec{Name: "t2"},
		lab.Spec{Name: "noexec", Cmdline: map[string]string{"QGA_BLOCK": "guest-exec"}},
	))
}

// labDriver returns a Driver over the lab directory holding v.
func labDriver(t *testing.T, v *lab.VM) *Driver {
	t.Helper()
	d, err := New(Config{LabDir: filepath.Dir(v.Dir), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New() = %v; want nil", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// qmpCommand runs one QMP command on a lab VM over its own connection.
func qmpCommand(t *testing.T, v *lab.VM, command string) []byte {
	t.Helper()
	m := NewMonitor("unix", v.QMPSocket, MonitorOptions{Timeout: 10 * time.Second})
	if err := m.Connect(); err != nil {
		t.Fatalf("qmp connect %s: %v", v.Name, err)
	}
	defer m.Disconnect()
	out, err := m.Run([]byte(`{"execute":"` + command + `"}`))
	if err != nil {
		t.Fatalf("qmp %s on %s: %v", command, v.Name, err)
	}
	return out
}

func TestLabExec(t *testing.T) {
	v := labtest.VM(t, "t1")
	d := labDriver(t, v)
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	res, err := d.Run(ctx, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
	if err != nil || !res.Exited || res.ExitCode != 0 {
		t.Errorf("Run(/bin/true) = %+v, %v; want exit 0", res, err)
	}
	res, err = d.Run(ctx, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}})
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Errorf("Run(sh -c ...) = %+v, %v; want exit 3, out, err", res, err)
	}
	h, err := d.ExecStart(ctx, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
	if err != nil || h.PID <= 0 {
		t.Fatalf("ExecStart(/bin/true) = %+v, %v; want a pid", h, err)
	}
	res, err = hypervisor.Wait(ctx, d, "t1", h)
	if err != nil || !res.Exited || res.ExitCode != 0 || res.PID != h.PID {
		t.Errorf("Wait(ExecStart(/bin/true)) = %+v, %v; want exit 0 of pid %d", res, err, h.PID)
	}

	st, err := d.Status(ctx, "t1")
	if err != nil || st.State != hypervisor.StateRunning || !st.AgentConnected || st.AgentVersion == "" {
		t.Errorf("Status(t1) = %+v, %v; want running with an agent version", st, err)
	}
	info, err := d.AgentInfo(ctx, "t1")
	if err != nil || !info.Enabled("guest-exec") {
		t.Errorf("AgentInfo(t1) = %d commands, %v; want guest-exec enabled", len(info.Commands), err)
	}

	if err := d.FileWrite(ctx, "t1", "/tmp/vmgate-test", []byte("hello\n"), 0o600); err != nil {
		t.Fatalf("FileWrite() = %v; want nil", err)
	}
	fc, err := d.FileRead(ctx, "t1", "/tmp/vmgate-test", 3)
	if err != nil || string(fc.Data) != "hel" || !fc.Truncated {
		t.Errorf("FileRead(max 3) = %+v, %v; want hel, truncated", fc, err)
	}

	// The schema reply on a real VM is far above 64 KiB.
	if out := qmpCommand(t, v, "query-qmp-schema"); len(out) <= 64<<10 {
		t.Errorf("query-qmp-schema reply = %d bytes; want > 64 KiB", len(out))
	}
}

func TestLabExecDisabled(t *testing.T) {
	v := labtest.VM(t, "noexec")
	d := labDriver(t, v)
	ctx, cancel := testload.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := d.Run(ctx, "noexec", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
	var de *hypervisor.CommandDisabledError
	if !errors.As(err, &de) || de.Command != "guest-exec" {
		t.Errorf("Run() on a guest with guest-exec blocked = %v; want *CommandDisabledError{guest-exec}", err)
	}
	if _, err := d.ExecStart(ctx, "noexec", hypervisor.ExecRequest{Argv: []string{"/bin/true"}}); !errors.Is(err, hypervisor.ErrCommandDisabled) {
		t.Errorf("ExecStart() on a guest with guest-exec blocked = %v; want ErrCommandDisabled", err)
	}
}

// A paused VM: exec times out within its deadline while another VM answers.
func TestLabPausedVM(t *testing.T) {
	v1, v2 := labtest.VM(t, "t1"), labtest.VM(t, "t2")
	if filepath.Dir(v1.Dir) != filepath.Dir(v2.Dir) {
		t.Fatalf("lab VMs in different directories: %s, %s", v1.Dir, v2.Dir)
	}
	d := labDriver(t, v1)
	ctx := context.Background()
	// Warm the preflight cache so the exec itself is what hangs.
	if _, err := d.Run(ctx, "t2", hypervisor.ExecRequest{Argv: []string{"/bin/true"}}); err != nil {
		t.Fatalf("Run(t2) before pausing = %v; want nil", err)
	}
	qmpCommand(t, v2, "stop")
	resumed := false
	defer func() {
		if !resumed {
			qmpCommand(t, v2, "cont")
		}
	}()
	if st, err := d.Status(ctx, "t2"); err != nil || st.State != hypervisor.StatePaused || st.AgentConnected {
		t.Errorf("Status(t2) after stop = %+v, %v; want paused, no agent", st, err)
	}

	hung := make(chan error, 1)
	go func() {
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := d.Run(hctx, "t2", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
		hung <- err
	}()
	for i := range 3 {
		res, err := d.Run(ctx, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/echo", "alive"}})
		if err != nil || string(res.Stdout) != "alive\n" {
			t.Errorf("Run(t1) #%d while t2 is paused = %+v, %v; want alive", i, res, err)
		}
	}
	if err := <-hung; !errors.Is(err, hypervisor.ErrTimeout) {
		t.Errorf("Run(t2) while paused = %v; want ErrTimeout", err)
	}

	qmpCommand(t, v2, "cont")
	resumed = true
	rctx, cancel := testload.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if res, err := d.Run(rctx, "t2", hypervisor.ExecRequest{Argv: []string{"/bin/true"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("Run(t2) after cont = %+v, %v; want exit 0", res, err)
	}
}

// QEMU killed in the middle of an exec gives a clear error, then Status says stopped.
func TestLabKilledMidExec(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "victim"})
	d := labDriver(t, v)
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := d.ExecStart(ctx, "victim", hypervisor.ExecRequest{Argv: []string{"/bin/sleep", "60"}})
	if err != nil {
		t.Fatalf("ExecStart(sleep 60) = %v; want nil", err)
	}
	// The command runs and is polled: the kill lands mid-exec.
	if res, err := d.ExecStatus(ctx, "victim", h); err != nil || res.Exited {
		t.Fatalf("ExecStatus(sleep 60) = %+v, %v; want it running", res, err)
	}
	done := make(chan error, 1)
	go func() { _, err := hypervisor.Wait(ctx, d, "victim", h); done <- err }()
	if err := syscall.Kill(v.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill qemu pid %d: %v", v.PID, err)
	}
	err = <-done
	if !errors.Is(err, hypervisor.ErrAgentUnavailable) {
		t.Errorf("Wait() with QEMU killed = %v; want ErrAgentUnavailable", err)
	}
	t.Logf("Wait() with QEMU killed = %v", err)
	<-v.Done()
	if st, err := d.Status(ctx, "victim"); err != nil || st.State != hypervisor.StateStopped {
		t.Errorf("Status(victim) after kill = %+v, %v; want stopped", st, err)
	}
	if _, err := d.Run(ctx, "victim", hypervisor.ExecRequest{Argv: []string{"/bin/true"}}); !errors.Is(err, hypervisor.ErrAgentUnavailable) || !errors.Is(err, hypervisor.ErrVMNotRunning) {
		t.Errorf("Run(victim) after kill = %v; want ErrAgentUnavailable and ErrVMNotRunning", err)
	}
}

// Power stop ends QEMU: the pid is gone when it returns.
func TestLabPowerStop(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "stopme"})
	d := labDriver(t, v)
	ctx, cancel := testload.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Power(ctx, "stopme", hypervisor.PowerStop); err != nil {
		t.Fatalf("Power(stop) = %v; want nil", err)
	}
	if processAlive(v.PID) {
		t.Errorf("qemu pid %d alive after Power(stop)", v.PID)
	}
	if st, err := d.Status(ctx, "stopme"); err != nil || st.State != hypervisor.StateStopped {
		t.Errorf("Status(stopme) after stop = %+v, %v; want stopped", st, err)
	}
	if err := d.Power(ctx, "stopme", hypervisor.PowerReset); !errors.Is(err, hypervisor.ErrVMNotRunning) {
		t.Errorf("Power(reset) on a stopped VM = %v; want ErrVMNotRunning", err)
	}
}

// TestConformance runs the driver conformance suite against the QEMU driver
// on a real lab VM, with a second guest whose agent blocks guest-exec.
func TestConformance(t *testing.T) {
	v := labtest.VM(t, "t1")
	labtest.VM(t, "noexec")
	hypervisortest.Run(t, hypervisortest.Harness{Driver: labDriver(t, v), VM: "t1", NoExecVM: "noexec",
		Capabilities: labCapabilities, DiskDir: "/data"})
}

// TestConformancePower runs the power suite (reset, stop, start) and a
// reboot on a VM of its own (issue 32, item 11: reset and reboot return in
// the guest's new boot); labtest stops it at cleanup, also after the
// driver relaunched it.
func TestConformancePower(t *testing.T) {
	// Registered first, so it runs after labtest has stopped the VM: the QEMU
	// the driver relaunched must be gone too.
	relaunched := 0
	t.Cleanup(func() {
		if relaunched <= 0 {
			return
		}
		for range 50 {
			if err := syscall.Kill(relaunched, 0); errors.Is(err, syscall.ESRCH) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		syscall.Kill(relaunched, syscall.SIGKILL)
		t.Errorf("relaunched QEMU pid %d outlived the test's VM", relaunched)
	})
	v := labtest.Start(t, lab.Spec{Name: "power"})
	h := hypervisortest.Harness{Driver: labDriver(t, v), VM: "power"}
	hypervisortest.RunPower(t, h)
	hypervisortest.RunPowerReboot(t, h)
	b, err := os.ReadFile(filepath.Join(v.Dir, lab.PIDFileName))
	if err != nil {
		t.Fatalf("read pid file after power start: %v", err)
	}
	if relaunched, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil || relaunched == v.PID {
		t.Fatalf("pid file after power start = %q (%v); want the relaunched QEMU's pid, not %d", b, err, v.PID)
	}
}
