//go:build linux

package agent

import (
	"context"
	"os/exec"
	"syscall"
	"testing"

	"github.com/shirou/gopsutil/v4/process"
)

// startSleepers starts n `sleep` processes owned by the benchmark and
// registers a cleanup that kills each by pid and waits for it.
func startSleepers(tb testing.TB, n int) {
	tb.Helper()
	path, err := exec.LookPath("sleep")
	if err != nil {
		tb.Skipf("no sleep on PATH: %v", err)
	}
	cmds := make([]*exec.Cmd, 0, n)
	tb.Cleanup(func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
		}
		for _, c := range cmds {
			_ = c.Wait()
		}
	})
	for i := 0; i < n; i++ {
		c := exec.Command(path, "3600")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			tb.Fatalf("starting sleeper %d: %v", i, err)
		}
		cmds = append(cmds, c)
	}
}

// BenchmarkPS runs the ps collection over this host's /proc, then with
// 1,000 extra sleeps, each against a baseline in the same process: the
// same pids read through gopsutil v4 (ppid, name, cmdline, user, create
// time: fewer fields than a ps row). Compare ns/op between the pairs (and
// use -cpuprofile to see where the time goes).
//
//	go test -run '^$' -bench BenchmarkPS -benchtime 20x ./guest/agent/
func BenchmarkPS(b *testing.B) {
	a, err := New(Config{Root: b.TempDir(), ProcDir: "/proc"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	run := func(b *testing.B) {
		rows := 0
		for b.Loop() {
			ps, err := a.PS(ctx, "")
			if err != nil || len(ps) == 0 {
				b.Fatalf("PS() = %d rows, %v; want rows", len(ps), err)
			}
			rows = len(ps)
		}
		b.ReportMetric(float64(rows), "rows")
	}
	baseline := func(b *testing.B) {
		for b.Loop() {
			pids, err := process.PidsWithContext(ctx)
			if err != nil {
				b.Fatal(err)
			}
			rows := 0
			for _, pid := range pids {
				if _, err := gopsutilProcess(ctx, pid); err == nil {
					rows++
				}
			}
			if rows == 0 {
				b.Fatalf("gopsutil read no process of %d", len(pids))
			}
		}
	}
	b.Run("host/baseline-gopsutil", baseline)
	b.Run("host/ps", run)
	startSleepers(b, 1000)
	b.Run("host+1000/baseline-gopsutil", baseline)
	b.Run("host+1000/ps", run)
}
