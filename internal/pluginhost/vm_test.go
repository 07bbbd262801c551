package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// launchQEMU runs the built-in qemu driver as a plugin process (this test
// binary, as `vmgate plugin qemu`) over the lab VMs of this package.
func launchQEMU(t *testing.T, h *Host, labDir string) *Supervisor {
	t.Helper()
	cfg, err := json.Marshal(qemu.Settings{LabDir: labDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, Spec{Driver: "qemu", Backend: "lab", Config: cfg})
	if err != nil {
		t.Fatalf("Launch(qemu) = %v", err)
	}
	return d.(*Supervisor)
}

func TestConformanceThroughThePluginBoundary(t *testing.T) {
	vm := labtest.VM(t, "t1")
	labtest.VM(t, "noexec")
	h, _ := newTestHost(t, Options{})
	s := launchQEMU(t, h, filepath.Dir(vm.Dir))
	hypervisortest.Run(t, hypervisortest.Harness{Driver: s, VM: "t1", NoExecVM: "noexec", Capabilities: qemuCapabilities})
	if s.Restarts() != 0 {
		t.Errorf("Restarts() = %d during the suite; want 0", s.Restarts())
	}
}

func TestQEMUPluginKilledDuringExec(t *testing.T) {
	vm := labtest.VM(t, "t1")
	h, _ := newTestHost(t, Options{})
	s := launchQEMU(t, h, filepath.Dir(vm.Dir))
	ctx, cancel := testload.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Warm up: the first exec connects the agent.
	if res, err := hypervisor.Run(ctx, s, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/echo", "warm"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("Run(echo) = %+v, %v", res, err)
	}
	pid := s.PID()
	errc := make(chan error, 1)
	marker := fmt.Sprintf("/tmp/vmgate-killed-during-exec-%d", time.Now().UnixNano())
	go func() {
		_, err := hypervisor.Run(ctx, s, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `: >"$1"; exec sleep 5`, "sh", marker}})
		errc <- err
	}()
	// The exec runs in the guest once its marker file exists (read through
	// the same plugin, between the Run's polls).
	var b hypervisor.Backoff
	for {
		if _, err := s.FileRead(ctx, "t1", marker, 1); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("the exec's marker %s never appeared: %v", marker, err)
		}
		time.Sleep(b.Next())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill(%d) = %v", pid, err)
	}
	err := <-errc
	if !errors.Is(err, hypervisor.ErrPluginExited) || !strings.Contains(err.Error(), "driver qemu exited") {
		t.Fatalf("Run(sleep 5) with the plugin killed = %v; want ErrPluginExited saying \"driver qemu exited\"", err)
	}
	res, err := hypervisor.Run(ctx, s, "t1", hypervisor.ExecRequest{Argv: []string{"/bin/echo", "again"}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "again\n" {
		t.Fatalf("Run(echo again) after the restart = %+v, %v; want exit 0 and \"again\\n\"", res, err)
	}
	if s.Restarts() != 1 || s.PID() == pid {
		t.Errorf("Restarts() = %d, PID() = %d (killed %d); want one restart", s.Restarts(), s.PID(), pid)
	}
}
