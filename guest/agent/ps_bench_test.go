//go:build linux

package agent

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
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
// 1,000 extra sleeps. Compare ns/op between the sub-benchmarks (and with
// -cpuprofile to see where the time goes).
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
	b.Run("host", run)
	startSleepers(b, 1000)
	b.Run("host+1000", run)
}
