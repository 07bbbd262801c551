package pveemu

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// The running VM's figures of vm status/current: qemu-server
// src/PVE/QemuServer.pm vmstatus with $full, read from the lab VM's QEMU
// process and monitor the way vmstatus reads a PVE node's.

// userHZ is $cpuinfo->{user_hz} (PVE::ProcFSTools::read_cpuinfo:
// POSIX::sysconf(_SC_CLK_TCK)), 100 on Linux.
const userHZ = 100

// procPidStat is what PVE::ProcFSTools::read_proc_pid_stat takes from
// /proc/PID/stat: utime and stime in ticks, rss in bytes (pages times the
// page size), vsize in bytes and starttime in ticks since boot.
type procPidStat struct {
	utime, stime, rss, vsize, starttime uint64
}

// readProcPidStat is PVE::ProcFSTools::read_proc_pid_stat.
func readProcPidStat(pid int) (procPidStat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procPidStat{}, false
	}
	// The fields after the command name, which is in parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procPidStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime 15, starttime 22,
	// vsize 23, rss 24.
	if len(f) < 22 {
		return procPidStat{}, false
	}
	n := func(k int) uint64 { x, _ := strconv.ParseUint(f[k-3], 10, 64); return x }
	return procPidStat{utime: n(14), stime: n(15), starttime: n(22), vsize: n(23),
		rss: n(24) * uint64(os.Getpagesize())}, true
}

// pidCPU is one entry of vmstatus's $last_proc_pid_stat.
type pidCPU struct {
	time time.Time
	used uint64
	cpu  float64
}

// cpuUsage is vmstatus's CPU figure: the share of the VM's CPUs the QEMU
// process used since the previous status read that was more than 1000
// ticks of all host CPUs ago (the first read of a process answers 0, a
// read too soon after the previous one repeats its figure).
func (e *Emulator) cpuUsage(pid int, used uint64, cpus int) float64 {
	cpucount := runtime.NumCPU() // $cpuinfo->{cpus}
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pidStat == nil {
		e.pidStat = map[int]pidCPU{}
	}
	old, ok := e.pidStat[pid]
	if !ok {
		e.pidStat[pid] = pidCPU{time: now, used: used}
		return 0
	}
	dtime := now.Sub(old.time).Seconds() * float64(cpucount) * userHZ
	if dtime <= 1000 {
		return old.cpu
	}
	cpu := (float64(used-old.used) / dtime) * float64(cpucount) / float64(cpus)
	e.pidStat[pid] = pidCPU{time: now, used: used, cpu: cpu}
	return cpu
}

// smapsPss is the Pss line of /proc/PID/smaps_rollup in bytes, which
// vmstatus sums over the processes of the VM's cgroup scope
// (qemu.slice/VMID.scope) for memhost. The lab VM runs in no such scope:
// its one QEMU process stands for the scope's processes.
func smapsPss(pid int) uint64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := pssRE.FindStringSubmatch(sc.Text()); m != nil {
			kb, _ := strconv.ParseUint(m[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

var pssRE = regexp.MustCompile(`^Pss:\s+([0-9]+) kB$`)

// tapRE is vmstatus's name of a VM's tap devices, tap{vmid}i{n}.
var tapRE = regexp.MustCompile(`^tap([1-9]\d*)i`)

// netDev is vmstatus's walk of PVE::ProcFSTools::read_proc_net_dev: the
// bytes the host received from (netout) and sent to (netin) the VM's tap
// devices. A lab VM on user networking has none: both stay 0, as on a
// node where the VM has no tap device.
func netDev(vmid int) (netin, netout uint64) {
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		m := tapRE.FindStringSubmatch(strings.TrimSpace(name))
		if m == nil || m[1] != strconv.Itoa(vmid) {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue
		}
		rx, _ := strconv.ParseUint(f[0], 10, 64)
		tx, _ := strconv.ParseUint(f[8], 10, 64)
		netout += rx
		netin += tx
	}
	return netin, netout
}

// runningStatus fills d with vmstatus's figures of a running VM: the
// /proc/PID/stat part (uptime, cpu, mem or memhost), then the $full QMP
// part that follows a successful query-status ($statuscb): query-blockstats
// ($blockstatscb: diskread, diskwrite) and query-balloon ($ballooncb, which
// needs Proxmox's QEMU patch for max_mem and does nothing without it). The
// commands $statuscb queues between them (query-proxmox-support,
// query-machines, query-version) feed fields the emulator does not serve
// and are not sent (the lab's QEMU has no query-proxmox-support); as in
// QMPClient's queue, a failed command aborts the ones after it.
func (e *Emulator) runningStatus(r *request, v *vm, pid, cpus int, d map[string]any) {
	netin, netout := netDev(v.vmid)
	d["netin"], d["netout"] = netin, netout
	if ps, ok := readProcPidStat(pid); ok {
		if e.version.MemHost() {
			d["memhost"] = smapsPss(pid)
			d["mem"] = d["memhost"]
		} else if ps.vsize > 0 {
			d["mem"] = int64(float64(ps.rss) / float64(ps.vsize) * float64(d["maxmem"].(int64)))
		}
		d["cpu"] = e.cpuUsage(pid, ps.utime+ps.stime, cpus)
	}
	raw, qerr := e.monQMP(r.ctx, v, "query-status", nil, time.Second)
	var st struct {
		Status string `json:"status"`
	}
	if qerr != nil || json.Unmarshal(raw, &st) != nil || st.Status == "" {
		return
	}
	d["qmpstatus"] = st.Status
	raw, qerr = e.monQMP(r.ctx, v, "query-blockstats", nil, time.Second)
	if qerr != nil {
		return
	}
	var stats []struct {
		Stats struct {
			RdBytes uint64 `json:"rd_bytes"`
			WrBytes uint64 `json:"wr_bytes"`
		} `json:"stats"`
	}
	if json.Unmarshal(raw, &stats) == nil {
		var rd, wr uint64
		for _, s := range stats {
			rd += s.Stats.RdBytes
			wr += s.Stats.WrBytes
		}
		d["diskread"], d["diskwrite"] = rd, wr
	}
	if raw, qerr := e.monQMP(r.ctx, v, "query-balloon", nil, time.Second); qerr == nil {
		var b struct {
			Actual   uint64  `json:"actual"`
			MaxMem   uint64  `json:"max_mem"`
			TotalMem *uint64 `json:"total_mem"`
			FreeMem  *uint64 `json:"free_mem"`
		}
		if json.Unmarshal(raw, &b) == nil && b.MaxMem != 0 {
			d["maxmem"], d["balloon"] = b.MaxMem, b.Actual
			if b.TotalMem != nil && b.FreeMem != nil {
				d["mem"], d["freemem"] = *b.TotalMem-*b.FreeMem, *b.FreeMem
			}
		}
	}
}
