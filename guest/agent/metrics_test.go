//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// metricsCommand runs `metrics args...` through Main and decodes the reply.
func metricsCommand(t *testing.T, args ...string) (wire.Metrics, *wire.Error, int) {
	t.Helper()
	a, err := New(Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code := a.Main(context.Background(), append([]string{"metrics"}, args...), strings.NewReader(""), &out)
	var reply struct {
		OK     bool          `json:"ok"`
		Result *wire.Metrics `json:"result"`
		Error  *wire.Error   `json:"error"`
	}
	if err := json.Unmarshal(out.Bytes(), &reply); err != nil {
		t.Fatalf("metrics %q: reply %q: %v", args, out.Bytes(), err)
	}
	if reply.Result == nil {
		return wire.Metrics{}, reply.Error, code
	}
	return *reply.Result, reply.Error, code
}

// TestMetricsMatchTheKernel compares the figures with what the kernel says
// through other means (sysinfo, statfs, net.Interfaces).
func TestMetricsMatchTheKernel(t *testing.T) {
	before := time.Now()
	m, werr, code := metricsCommand(t, "--sample-ms", "100")
	if werr != nil || code != 0 {
		t.Fatalf("metrics = error %+v, exit %d", werr, code)
	}
	if m.TimeMS < before.UnixMilli() || m.TimeMS > time.Now().UnixMilli() {
		t.Errorf("TimeMS = %d; want between %d and now", m.TimeMS, before.UnixMilli())
	}
	if m.CPU.Count != runtime.NumCPU() || m.CPU.SampleMS != 100 || m.CPU.Percent < 0 || m.CPU.Percent > 100 {
		t.Errorf("CPU = %+v; want %d CPUs, a 100 ms sample, a percent in 0..100", m.CPU, runtime.NumCPU())
	}
	if m.CPU.UserS <= 0 || m.CPU.IdleS <= 0 {
		t.Errorf("CPU = %+v; want cumulative user and idle time", m.CPU)
	}
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	if total := uint64(si.Totalram) * uint64(si.Unit); m.Memory.TotalBytes != total {
		t.Errorf("Memory.TotalBytes = %d; sysinfo says %d", m.Memory.TotalBytes, total)
	}
	if m.Memory.UsedBytes == 0 || m.Memory.UsedBytes > m.Memory.TotalBytes || m.Memory.AvailableBytes > m.Memory.TotalBytes {
		t.Errorf("Memory = %+v; want used and available within the total", m.Memory)
	}
	if m.Load.Load1 < 0 || m.Load.ProcsRunning < 1 {
		t.Errorf("Load = %+v; want loads >= 0 and at least this process running", m.Load)
	}
	i := slices.IndexFunc(m.Disks, func(d wire.DiskUsage) bool { return d.Mountpoint == "/" })
	var st syscall.Statfs_t
	if err := syscall.Statfs("/", &st); err != nil {
		t.Fatal(err)
	}
	if i < 0 || m.Disks[i].TotalBytes != st.Blocks*uint64(st.Bsize) {
		t.Errorf("Disks = %+v; want / with %d bytes (statfs)", m.Disks, st.Blocks*uint64(st.Bsize))
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names, got []string
	for _, ifc := range ifs {
		names = append(names, ifc.Name)
	}
	for _, n := range m.Network {
		got = append(got, n.Name)
	}
	slices.Sort(names)
	slices.Sort(got)
	if !slices.Equal(names, got) {
		t.Errorf("Network names %q; net.Interfaces has %q", got, names)
	}
}

// TestMetricsCPUMoves: CPU time this process burns shows in the guest's
// cumulative busy time (which counts every process, so it is at least ours).
func TestMetricsCPUMoves(t *testing.T) {
	busy := func(m wire.Metrics) float64 { return m.CPU.UserS + m.CPU.SystemS }
	self := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	m1, werr, _ := metricsCommand(t, "--sample-ms", "0")
	if werr != nil {
		t.Fatal(werr)
	}
	r1 := self()
	deadline := time.Now().Add(300 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	r2 := self()
	m2, werr, _ := metricsCommand(t, "--sample-ms", "0")
	if werr != nil {
		t.Fatal(werr)
	}
	burned := (r2 - r1).Seconds()
	// 0.05 s: the kernel's tick accounting of both figures.
	if grew := busy(m2) - busy(m1); grew+0.05 < burned {
		t.Errorf("cumulative busy CPU grew by %.3f s while this process alone burned %.3f s (%d loops); want at least that", grew, burned, x)
	}
}

func TestMetricsRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--sample-ms", "-1"}, {"--sample-ms", "5001"}, {"--sample-ms", "x"}, {"--bogus"}, {"extra"}} {
		_, werr, code := metricsCommand(t, args...)
		if werr == nil || werr.Code != wire.CodeInvalid || code != 1 {
			t.Errorf("metrics %q = error %+v, exit %d; want %s, exit 1", args, werr, code, wire.CodeInvalid)
		}
	}
	a, _ := New(Config{Root: t.TempDir()})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Metrics(ctx, time.Second); err == nil {
		t.Errorf("Metrics() with a cancelled context and a 1 s sample = nil error; want the context's")
	}
}
