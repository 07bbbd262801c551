package proxmox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// The hypervisor's figures through qemu-server's API2/Qemu.pm vm_status
// (GET {vmid}/status/current, VM.Audit): PVE::QemuServer::vmstatus with
// $full. What it gives and where it comes from:
//   - cpus: the VM's vCPUs (sockets × cores, capped at the host's CPUs, or vcpus);
//   - maxmem: the memory the VM was given (query-balloon's max_mem when the
//     balloon reports it);
//   - balloon: query-balloon's actual, only with a balloon device;
//   - memhost (qemu-server 9.0.11+): the PSS of the VM's processes on the host;
//   - diskread, diskwrite: query-blockstats' rd_bytes and wr_bytes summed
//     over the drives, only while the VM runs;
//   - netin, netout: the bytes the host sent to and received from the VM's
//     tap devices;
//   - cpu: the share of the vCPUs used since the previous status read,
//     a rate, not a counter. Nothing in status/current is the CPU time the
//     VM has used, so CPUTimeNS stays nil rather than being made up from
//     the rate.

var _ hypervisor.MetricsReader = (*Driver)(nil)

// pveNumber is a number of a Proxmox answer: a JSON number or a numeric
// string (Perl scalars are either), absent when nil.
type pveNumber struct {
	set bool
	v   float64
}

func (n *pveNumber) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(b, &s) == nil {
		b = []byte(s)
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return &numberError{fmt.Sprintf("%.40q", b)}
	}
	n.set, n.v = true, f
	return nil
}

// numberError is a figure of status/current that is not a number.
type numberError struct{ text string }

func (e *numberError) Error() string { return "not a number: " + e.text }

// counter is n as a VMMetrics figure: nil when absent or negative.
func (n pveNumber) counter() *uint64 {
	if !n.set || n.v < 0 || n.v >= math.MaxUint64 {
		return nil
	}
	return hypervisor.Uint64(uint64(n.v))
}

// pveVMStatus is the part of vm_status's answer VMMetrics reads.
type pveVMStatus struct {
	Status    string    `json:"status"`
	CPUs      pveNumber `json:"cpus"`
	MaxMem    pveNumber `json:"maxmem"`
	Balloon   pveNumber `json:"balloon"`
	MemHost   pveNumber `json:"memhost"`
	DiskRead  pveNumber `json:"diskread"`
	DiskWrite pveNumber `json:"diskwrite"`
	NetIn     pveNumber `json:"netin"`
	NetOut    pveNumber `json:"netout"`
}

// VMMetrics implements hypervisor.MetricsReader.
func (d *Driver) VMMetrics(ctx context.Context, name string) (hypervisor.VMMetrics, error) {
	const op = "vm metrics"
	v, err := d.lookup(ctx, op, name)
	if err != nil {
		return hypervisor.VMMetrics{}, err
	}
	var st pveVMStatus
	if err := d.api.do(ctx, "GET", v.path+"/status/current", nil, nil, &st); err != nil {
		if ne := (*numberError)(nil); errors.As(err, &ne) {
			return hypervisor.VMMetrics{}, fmt.Errorf("proxmox: %s: %w: status/current: %w", op, hypervisor.ErrBackend, ne)
		}
		return hypervisor.VMMetrics{}, d.classify(op, err)
	}
	return metricsOf(st, time.Now()), nil
}

// metricsOf maps vm_status's answer to VMMetrics. The counters (disk and
// network bytes) are reported only while the VM runs: a stopped VM's
// zeros are no reading. netin is what the host sent to the guest (the
// guest's receive), netout what it got from it.
func metricsOf(st pveVMStatus, now time.Time) hypervisor.VMMetrics {
	m := hypervisor.VMMetrics{Time: now, Source: "proxmox", MemoryBytes: st.MaxMem.counter()}
	if st.CPUs.set && st.CPUs.v >= 1 && st.CPUs.v <= math.MaxInt32 {
		m.VCPUs = int(math.Ceil(st.CPUs.v))
	}
	if st.Status != "running" {
		return m
	}
	m.BalloonBytes = st.Balloon.counter()
	m.HostRSSBytes = st.MemHost.counter()
	m.DiskReadBytes, m.DiskWriteBytes = st.DiskRead.counter(), st.DiskWrite.counter()
	m.NetRxBytes, m.NetTxBytes = st.NetIn.counter(), st.NetOut.counter()
	return m
}
