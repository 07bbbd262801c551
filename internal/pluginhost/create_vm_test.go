package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// TestCreatedVMOutlivesItsPlugin: a VM the QEMU plugin created belongs to
// no process of vmgate (QEMU is daemonized), so it outlives the plugin
// killed with SIGKILL; the restarted plugin finds it again through its
// vm.json and deletes it, leaving no process and no files.
func TestCreatedVMOutlivesItsPlugin(t *testing.T) {
	img := labtest.Image(t)
	state := t.TempDir()
	labDir := filepath.Join(state, "lab")
	h, _ := newTestHost(t, Options{})
	s := launchQEMU(t, h, labDir)
	ctx, cancel := context.WithTimeout(context.Background(), labtest.BootTimeout)
	defer cancel()
	src, _ := json.Marshal(map[string]string{"image": img.Dir})
	const mark = "LPLUGIN0123456789"
	if _, err := s.CreateVM(ctx, hypervisor.CreateRequest{Name: "made1", Source: src, Mark: mark}); err != nil {
		t.Fatalf("CreateVM through the plugin = %v", err)
	}
	t.Cleanup(func() { _ = lab.Remove(context.Background(), state, "made1", mark) })
	v, err := lab.Get(state, "made1")
	if err != nil || v.State != lab.StateRunning {
		t.Fatalf("lab.Get(made1) = %+v, %v; want running", v, err)
	}
	pid := s.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	res, err := hypervisor.Run(ctx, s, "made1", hypervisor.ExecRequest{Argv: []string{"/bin/hostname"}})
	if err != nil && errors.Is(err, hypervisor.ErrPluginExited) {
		res, err = hypervisor.Run(ctx, s, "made1", hypervisor.ExecRequest{Argv: []string{"/bin/hostname"}})
	}
	if err != nil || string(res.Stdout) != "made1\n" {
		t.Fatalf("Run(hostname) after the plugin was killed = %q, %v; want the VM still answering", res.Stdout, err)
	}
	if s.PID() == pid {
		t.Fatalf("the plugin was not restarted (pid %d)", pid)
	}
	if err := s.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "made1", Mark: mark}); err != nil {
		t.Fatalf("DeleteVM through the restarted plugin = %v", err)
	}
	if err := syscall.Kill(v.PID, 0); err == nil {
		if b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(v.PID), "cmdline")); len(b) > 0 {
			t.Errorf("QEMU pid %d runs after DeleteVM", v.PID)
		}
	}
	if _, err := os.Lstat(filepath.Join(labDir, "made1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("VM directory after DeleteVM: %v; want gone", err)
	}
}
