//go:build linux

package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shirou/gopsutil/v4/cpu"
	"github.com/shirou/gopsutil/v4/disk"
	"github.com/shirou/gopsutil/v4/load"
	"github.com/shirou/gopsutil/v4/mem"
	"github.com/shirou/gopsutil/v4/net"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Metrics reads the guest's figures with gopsutil v4: CPU (two readings
// of the cumulative times sample apart give the busy percent), memory,
// load, the filesystems of physical devices plus "/", the block devices'
// and the interfaces' counters. It runs as one short-lived vmgate-guest
// process like every command; the sample is the only wait, bounded by ctx.
func (a *Agent) Metrics(ctx context.Context, sample time.Duration) (wire.Metrics, error) {
	if sample < 0 || sample > wire.MaxMetricsSampleMS*time.Millisecond {
		return wire.Metrics{}, invalidf("metrics: sample %v: want 0..%d ms", sample, wire.MaxMetricsSampleMS)
	}
	var m wire.Metrics
	steps := []struct {
		name string
		run  func(context.Context, *wire.Metrics) error
	}{
		{"cpu", func(ctx context.Context, m *wire.Metrics) error { return readCPU(ctx, m, sample) }},
		{"memory", readMemory},
		{"load", readLoad},
		{"disks", readDisks},
		{"network", readNetwork},
	}
	for _, s := range steps {
		if err := s.run(ctx, &m); err != nil {
			return wire.Metrics{}, fmt.Errorf("metrics: %s: %w", s.name, err)
		}
	}
	m.TimeMS = time.Now().UnixMilli()
	return m, nil
}

func busyIdle(t cpu.TimesStat) (busy, total float64) {
	idle := t.Idle + t.Iowait
	total = t.User + t.System + t.Idle + t.Nice + t.Iowait + t.Irq + t.Softirq + t.Steal
	return total - idle, total
}

func readCPU(ctx context.Context, m *wire.Metrics, sample time.Duration) error {
	n, err := cpu.CountsWithContext(ctx, true)
	if err != nil {
		return err
	}
	first, err := cpu.TimesWithContext(ctx, false)
	if err != nil || len(first) != 1 {
		return fmt.Errorf("cpu times: %v (%d rows)", err, len(first))
	}
	last := first
	if sample > 0 {
		t := time.NewTimer(sample)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if last, err = cpu.TimesWithContext(ctx, false); err != nil || len(last) != 1 {
			return fmt.Errorf("cpu times: %v (%d rows)", err, len(last))
		}
		b1, t1 := busyIdle(first[0])
		b2, t2 := busyIdle(last[0])
		if t2 > t1 {
			m.CPU.Percent = min(100, max(0, 100*(b2-b1)/(t2-t1)))
		}
	}
	c := last[0]
	m.CPU.Count, m.CPU.SampleMS = n, sample.Milliseconds()
	m.CPU.UserS, m.CPU.SystemS, m.CPU.IdleS, m.CPU.IOWaitS, m.CPU.StealS = c.User+c.Nice, c.System+c.Irq+c.Softirq, c.Idle, c.Iowait, c.Steal
	return nil
}

func readMemory(ctx context.Context, m *wire.Metrics) error {
	v, err := mem.VirtualMemoryWithContext(ctx)
	if err != nil {
		return err
	}
	m.Memory = wire.MemoryMetrics{TotalBytes: v.Total, AvailableBytes: v.Available, UsedBytes: v.Used, UsedPercent: v.UsedPercent}
	if s, err := mem.SwapMemoryWithContext(ctx); err == nil {
		m.Memory.SwapTotalBytes, m.Memory.SwapUsedBytes = s.Total, s.Used
	}
	return nil
}

func readLoad(ctx context.Context, m *wire.Metrics) error {
	avg, err := load.AvgWithContext(ctx)
	if err != nil {
		return err
	}
	m.Load = wire.LoadMetrics{Load1: avg.Load1, Load5: avg.Load5, Load15: avg.Load15}
	if misc, err := load.MiscWithContext(ctx); err == nil {
		m.Load.ProcsRunning, m.Load.ProcsBlocked = misc.ProcsRunning, misc.ProcsBlocked
	}
	return nil
}

// readDisks reports the filesystems of physical devices and "/" (in the
// lab guest an initramfs), and every block device's counters.
func readDisks(ctx context.Context, m *wire.Metrics) error {
	parts, err := disk.PartitionsWithContext(ctx, false)
	if err != nil {
		return err
	}
	mounts := []disk.PartitionStat{{Mountpoint: "/"}}
	for _, p := range parts {
		if i := slices.IndexFunc(mounts, func(q disk.PartitionStat) bool { return q.Mountpoint == p.Mountpoint }); i >= 0 {
			mounts[i] = p
			continue
		}
		mounts = append(mounts, p)
	}
	m.Disks = []wire.DiskUsage{}
	for _, p := range mounts[:min(len(mounts), wire.MaxMetricsRows)] {
		u, err := disk.UsageWithContext(ctx, p.Mountpoint)
		if err != nil {
			continue // unmounted meanwhile, or not ours to stat
		}
		fstype := p.Fstype
		if fstype == "" {
			fstype = u.Fstype
		}
		m.Disks = append(m.Disks, wire.DiskUsage{Mountpoint: p.Mountpoint, Device: p.Device, FSType: fstype,
			TotalBytes: u.Total, UsedBytes: u.Used, FreeBytes: u.Free, UsedPercent: u.UsedPercent})
	}
	io, err := disk.IOCountersWithContext(ctx)
	if err != nil {
		return err
	}
	m.DiskIO = []wire.DiskIO{}
	for name, c := range io {
		m.DiskIO = append(m.DiskIO, wire.DiskIO{Name: name, ReadBytes: c.ReadBytes, WriteBytes: c.WriteBytes, ReadOps: c.ReadCount, WriteOps: c.WriteCount})
	}
	slices.SortFunc(m.DiskIO, func(a, b wire.DiskIO) int { return strings.Compare(a.Name, b.Name) })
	m.DiskIO = m.DiskIO[:min(len(m.DiskIO), wire.MaxMetricsRows)]
	return nil
}

func readNetwork(ctx context.Context, m *wire.Metrics) error {
	nics, err := net.IOCountersWithContext(ctx, true)
	if err != nil {
		return err
	}
	m.Network = []wire.NetIO{}
	for _, n := range nics[:min(len(nics), wire.MaxMetricsRows)] {
		m.Network = append(m.Network, wire.NetIO{Name: n.Name, RxBytes: n.BytesRecv, TxBytes: n.BytesSent,
			RxPackets: n.PacketsRecv, TxPackets: n.PacketsSent, RxErrors: n.Errin, TxErrors: n.Errout,
			RxDropped: n.Dropin, TxDropped: n.Dropout})
	}
	return nil
}
