package qemu

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// VMMetrics reads what QEMU reports of the VM, through QMP: the vCPUs
// (query-cpus-fast), the memory it was given (query-memory-size-summary),
// the balloon (query-balloon, when the VM has a balloon device) and the
// disk counters (query-blockstats, summed over the disks). The vCPU time
// and the QEMU process's resident memory are the host kernel's accounting
// of the vCPU threads QMP names (/proc/<tid>/schedstat and the process's
// VmRSS), read only when those threads are QEMU vCPU threads in this pid
// namespace. QMP's query-stats is not used: in QEMU 7.2 its only provider
// is KVM, and the lab runs under TCG. QEMU has no per-NIC counters in QMP,
// so the network figures are not reported (the guest's own are, by
// vmgate-guest and guest-network-get-interfaces).
func (d *Driver) VMMetrics(ctx context.Context, name string) (hypervisor.VMMetrics, error) {
	const op = "metrics"
	vm, err := d.lookup(op, name)
	if err != nil {
		return hypervisor.VMMetrics{}, err
	}
	m := hypervisor.VMMetrics{Source: "qmp"}
	var tids []int
	err = vm.withQMP(ctx, func(s qmpSession) error {
		var cpus []struct {
			ThreadID int `json:"thread-id"`
		}
		if err := s.Run("query-cpus-fast", nil, &cpus); err != nil {
			return err
		}
		m.VCPUs = len(cpus)
		for _, c := range cpus {
			tids = append(tids, c.ThreadID)
		}
		mem, err := s.Raw.QueryMemorySizeSummary()
		if err != nil {
			return err
		}
		total := uint64(mem.BaseMemory)
		if mem.PluggedMemory != nil {
			total += uint64(*mem.PluggedMemory)
		}
		m.MemoryBytes = hypervisor.Uint64(total)
		bal, err := s.Raw.QueryBalloon()
		var qe *QMPError
		switch {
		case err == nil:
			m.BalloonBytes = hypervisor.Uint64(uint64(bal.Actual))
		case errors.As(err, &qe) && qe.Class == "DeviceNotActive":
			// no balloon device: not reported
		default:
			return err
		}
		stats, err := s.Raw.QueryBlockstats(nil)
		if err != nil {
			return err
		}
		var rb, wb, ro, wo uint64
		for _, st := range stats {
			rb += uint64(st.Stats.RdBytes)
			wb += uint64(st.Stats.WrBytes)
			ro += uint64(st.Stats.RdOperations)
			wo += uint64(st.Stats.WrOperations)
		}
		m.DiskReadBytes, m.DiskWriteBytes = hypervisor.Uint64(rb), hypervisor.Uint64(wb)
		m.DiskReadOps, m.DiskWriteOps = hypervisor.Uint64(ro), hypervisor.Uint64(wo)
		return nil
	})
	if err != nil {
		return hypervisor.VMMetrics{}, vmError(op, err)
	}
	m.Time = time.Now()
	cpuNS, rss, ok := vcpuHostFigures("/proc", tids)
	if ok {
		m.CPUTimeNS, m.HostRSSBytes = hypervisor.Uint64(cpuNS), hypervisor.Uint64(rss)
	} else {
		d.log.Debug("vCPU threads not readable here; host CPU time and RSS not reported", "vm", name, "tids", tids)
	}
	return m, nil
}

// vcpuComm is the name QEMU gives a vCPU thread with -name debug-threads=on:
// "CPU <n>/<accelerator>"; without it the thread has the process's name.
var vcpuComm = regexp.MustCompile(`^CPU [0-9]+/[A-Za-z]+$`)

// vcpuHostFigures sums the vCPU threads' CPU time (schedstat's first field,
// in nanoseconds) and reads their process's VmRSS. ok is false unless
// every tid is a thread of one QEMU process (its name starts with "qemu")
// visible in procDir, named as QEMU names vCPU threads or as the process.
func vcpuHostFigures(procDir string, tids []int) (cpuNS, rssBytes uint64, ok bool) {
	if len(tids) == 0 {
		return 0, 0, false
	}
	tgid := 0
	for _, tid := range tids {
		dir := filepath.Join(procDir, strconv.Itoa(tid))
		g, ok := statusField(filepath.Join(dir, "status"), "Tgid:")
		if !ok || (tgid != 0 && int(g) != tgid) {
			return 0, 0, false
		}
		tgid = int(g)
		comm, err := os.ReadFile(filepath.Join(dir, "comm"))
		pcomm, perr := os.ReadFile(filepath.Join(procDir, strconv.Itoa(tgid), "comm"))
		comm, pcomm = bytes.TrimSpace(comm), bytes.TrimSpace(pcomm)
		if err != nil || perr != nil || !bytes.HasPrefix(pcomm, []byte("qemu")) ||
			!(vcpuComm.Match(comm) || bytes.Equal(comm, pcomm)) {
			return 0, 0, false
		}
		// The thread must really belong to that process (not a reused tid).
		if _, err := os.Stat(filepath.Join(procDir, strconv.Itoa(tgid), "task", strconv.Itoa(tid))); err != nil {
			return 0, 0, false
		}
		ss, err := os.ReadFile(filepath.Join(dir, "schedstat"))
		if err != nil {
			return 0, 0, false
		}
		f := strings.Fields(string(ss))
		if len(f) < 1 {
			return 0, 0, false
		}
		ns, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, 0, false
		}
		cpuNS += ns
	}
	kb, ok := statusField(filepath.Join(procDir, strconv.Itoa(tgid), "status"), "VmRSS:")
	if !ok {
		return 0, 0, false
	}
	return cpuNS, kb * 1024, true
}

// statusField returns the first number after key in a /proc status file.
func statusField(path, key string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0, false
			}
			v, err := strconv.ParseUint(f[0], 10, 64)
			return v, err == nil
		}
	}
	return 0, false
}

var _ hypervisor.MetricsReader = (*Driver)(nil)
