package qemu

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// BenchmarkLabExecTrue measures an exec of /bin/true on a real lab VM through
// guest/qga, against the baseline of the existing Proxmox MCP servers: the
// same guest-exec polled once a second. Each iteration runs one of each,
// interleaved (A B A B …), and the benchmark reports the median of each and
// their ratio. Run it with a count of iterations, for example
//
//	go test -run '^$' -bench LabExecTrue -benchtime 5x ./plugins/qemu/
func BenchmarkLabExecTrue(b *testing.B) {
	v := labtest.VM(b, "t1")
	c := qga.New(v.QGASocket)
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx); err != nil {
		b.Fatalf("Ping() = %v", err)
	}
	var adaptive, fixed []time.Duration
	for b.Loop() {
		start := time.Now()
		st, err := c.Exec(ctx, qga.ExecRequest{Path: "/bin/true"})
		if err != nil || st.ExitCode != 0 {
			b.Fatalf("Exec(/bin/true) = %+v, %v", st, err)
		}
		adaptive = append(adaptive, time.Since(start))

		start = time.Now()
		pid, err := c.ExecStart(ctx, qga.ExecRequest{Path: "/bin/true"})
		if err != nil {
			b.Fatalf("ExecStart(/bin/true) = %v", err)
		}
		for {
			time.Sleep(time.Second)
			st, err := c.ExecStatus(ctx, pid, 0)
			if err != nil {
				b.Fatalf("ExecStatus(%d) = %v", pid, err)
			}
			if st.Exited {
				break
			}
		}
		fixed = append(fixed, time.Since(start))
	}
	ma, mf := median(adaptive), median(fixed)
	b.ReportMetric(ms(ma), "adaptive-median-ms")
	b.ReportMetric(ms(mf), "poll1s-median-ms")
	b.ReportMetric(float64(mf)/float64(ma), "speedup-x")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
