package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// buildVMGate builds the vmgate binary in the main module (the parent
// directory), with its own dependencies, as scripts/bench.sh does.
func buildVMGate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vmgate")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/vmgate")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build vmgate: %v\n%s", err, out)
	}
	return bin
}

// TestLabRound runs one round of the lab rows' measurements on one lab VM
// and checks that lab down leaves no QEMU behind.
func TestLabRound(t *testing.T) {
	labtest.RequireQEMU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := startLab(ctx, buildVMGate(t), 1)
	if l != nil {
		defer l.stop()
	}
	if err != nil {
		t.Fatal(err)
	}
	vm1, err := lab.Get(l.stateDir, "vm1")
	if err != nil || vm1.State != lab.StateRunning || vm1.PID <= 0 {
		t.Fatalf("lab.Get(vm1) = %+v, %v; want a running VM with a pid", vm1, err)
	}
	cfg, err := l.writeConfig()
	if err != nil {
		t.Fatal(err)
	}
	benchSock, err := addAgent(ctx, vm1)
	if err != nil {
		t.Fatalf("addAgent(vm1) = %v", err)
	}
	bc := qga.New(benchSock)
	defer bc.Close()
	p, err := l.serve(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The baselines' agent answers while the server holds the first one,
	// and it is another qemu-ga process than the one the driver reaches.
	for range 2 {
		if d, err := execTrue(ctx, p.client, "vm1"); err != nil || d <= 0 {
			t.Errorf("execTrue(vm1) = %v, %v; want a latency", d, err)
		}
		if d, err := rawExec(ctx, bc, 0); err != nil || d <= 0 {
			t.Errorf("rawExec(second agent) = %v, %v; want a latency", d, err)
		}
	}
	st, err := bc.Exec(ctx, qga.ExecRequest{Path: "/bin/sh", Args: []string{"-c", `echo "$PPID $(cat /run/qga-bench.pid)"`}})
	if f := strings.Fields(string(st.Stdout)); err != nil || len(f) != 2 || f[0] != f[1] {
		t.Errorf("the second agent's pid and the parent of its command = %q, %v; want the same pid", st.Stdout, err)
	}
	if _, err := addAgent(ctx, vm1); err == nil {
		t.Errorf("addAgent(vm1) twice = nil; want an error")
	}
	if _, err := execTrue(ctx, p.client, "vm9"); err == nil || !strings.Contains(err.Error(), "[UNKNOWN VM]") {
		t.Errorf("execTrue(vm9) = %v; want [UNKNOWN VM]", err)
	}
	if rate, err := execRate(ctx, p.client, []string{"vm1"}, 2); err != nil || rate <= 0 {
		t.Errorf("execRate(vm1) = %v, %v; want a rate", rate, err)
	}
	if mib, n, err := treeRSS(p.cmd.Process.Pid); err != nil || mib <= 0 || n < 1 {
		t.Errorf("treeRSS(serve) = %v MiB, %d, %v; want > 0", mib, n, err)
	}
	if err := p.stop(); err != nil {
		t.Errorf("stop serve = %v", err)
	}
	c := qga.New(vm1.QGASocket)
	defer c.Close()
	if d, err := rawExec(ctx, c, 0); err != nil || d <= 0 {
		t.Errorf("rawExec(vm1) = %v, %v; want a latency", d, err)
	}
	c.Close()
	bc.Close()
	if err := l.stop(); err != nil {
		t.Errorf("lab stop = %v", err)
	}
	if cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(vm1.PID) + "/cmdline"); err == nil && strings.Contains(string(cmdline), "qemu") {
		t.Errorf("QEMU pid %d still runs after lab down", vm1.PID)
	}
	if _, err := os.Stat(l.stateDir); !os.IsNotExist(err) {
		t.Errorf("state directory after stop: %v; want it removed", err)
	}
}
