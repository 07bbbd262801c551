package lab_test

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

const mark = "lease-0123456789"

// TestCreateRemove: a created VM is daemonized (not this process's child,
// so it outlives whoever created it), runs with the CPUs asked for, and is
// removed, process and directory, only with its own mark.
func TestCreateRemove(t *testing.T) {
	img := labtest.Image(t)
	state := t.TempDir()
	ctx, cancel := testload.WithTimeout(context.Background(), labtest.BootTimeout)
	defer cancel()
	v, err := lab.Create(ctx, lab.Spec{Name: "made", StateDir: state, Image: &img, CPUs: 2, MemoryMB: 192}, mark)
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	t.Cleanup(func() { _ = lab.Remove(context.Background(), state, "made", mark) })
	if ppid := parentOf(t, v.PID); ppid == os.Getpid() {
		t.Errorf("created QEMU (pid %d) is a child of this process; want it daemonized", v.PID)
	}
	st, err := guestRun(t, v, "/bin/sh", "-c", "grep -c ^processor /proc/cpuinfo")
	if out, _ := base64.StdEncoding.DecodeString(st.OutData); err != nil || strings.TrimSpace(string(out)) != "2" {
		t.Errorf("guest CPUs = %q, %v; want 2", out, err)
	}
	if owner, err := lab.Owner(state, "made"); err != nil || owner != mark {
		t.Errorf("Owner(made) = %q, %v; want %q", owner, err, mark)
	}
	// The same name again is refused, and the running VM is untouched.
	if _, err := lab.Create(ctx, lab.Spec{Name: "made", StateDir: state, Image: &img}, "other-mark-123"); !errors.Is(err, lab.ErrExists) {
		t.Errorf("Create(made again) = %v; want ErrExists", err)
	}
	if err := lab.Remove(ctx, state, "made", "other-mark-123"); !errors.Is(err, lab.ErrNotOwned) {
		t.Errorf("Remove(made, another mark) = %v; want ErrNotOwned", err)
	}
	if got, err := lab.Get(state, "made"); err != nil || got.State != lab.StateRunning {
		t.Fatalf("Get(made) after refusals = %+v, %v; want it running", got, err)
	}
	if err := lab.Remove(ctx, state, "made", mark); err != nil {
		t.Fatalf("Remove(made) = %v", err)
	}
	if err := syscall.Kill(v.PID, 0); !errors.Is(err, syscall.ESRCH) && processIs(v.PID, v.Argv) {
		t.Errorf("QEMU pid %d still runs after Remove", v.PID)
	}
	if _, err := os.Lstat(filepath.Join(state, "lab", "made")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("VM directory after Remove: %v; want it gone", err)
	}
	if err := lab.Remove(ctx, state, "made", mark); !errors.Is(err, lab.ErrNotFound) {
		t.Errorf("Remove twice = %v; want ErrNotFound", err)
	}
}

// TestCreateFailureLeavesNothing: a VM that cannot boot leaves no
// directory and no process.
func TestCreateFailureLeavesNothing(t *testing.T) {
	img := labtest.Image(t)
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Two seconds are too short for TCG to boot the guest.
	if _, err := lab.Create(ctx, lab.Spec{Name: "slow", StateDir: state, Image: &img}, mark); err == nil {
		_ = lab.Remove(context.Background(), state, "slow", mark)
		t.Fatal("Create with a 2 s deadline succeeded; want a boot timeout")
	}
	if _, err := os.Lstat(filepath.Join(state, "lab", "slow")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory of a failed Create: %v; want none", err)
	}
	if vms, err := lab.List(state); err != nil || len(vms) != 0 {
		t.Errorf("List after a failed Create = %v, %v; want none", vms, err)
	}
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatalf("stat of pid %d: %v", pid, err)
	}
	// pid (comm) state ppid ...; comm may hold spaces: split after ')'.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// processIs reports whether pid runs argv.
func processIs(pid int, argv []string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.Join(argv, "\x00")+"\x00" == string(b)
}
