package hypervisor

import (
	"context"
	"time"
)

// MetricsReader is an optional capability: a driver that can say what the
// hypervisor measures of a VM (QMP's query-balloon and block statistics
// plus the host's accounting of the vCPU threads; libvirt's domain stats)
// implements it. These are the host's figures; what the guest sees of
// itself (its CPU, memory, disk and network use) is the guest helper's
// `vmgate-guest metrics`, the same on every backend.
type MetricsReader interface {
	// VMMetrics reads vm's figures now. Counters are cumulative since the
	// VM started; a rate is the difference of two readings over the
	// difference of their Time.
	VMMetrics(ctx context.Context, vm string) (VMMetrics, error)
}

// VMMetrics are a hypervisor's figures for one VM. A nil field is one the
// backend does not report (for example no balloon device); zero is a
// reported zero.
type VMMetrics struct {
	// Time is when the figures were read (the driver's clock).
	Time time.Time `json:"time"`
	// Source names where they came from ("qmp", "libvirt").
	Source string `json:"source"`
	// VCPUs is the number of virtual CPUs, 0 when unknown.
	VCPUs int `json:"vcpus,omitempty"`
	// CPUTimeNS is the host CPU time the vCPUs have used, in nanoseconds.
	CPUTimeNS *uint64 `json:"cpu_time_ns,omitempty"`
	// MemoryBytes is the memory the VM was given (its maximum).
	MemoryBytes *uint64 `json:"memory_bytes,omitempty"`
	// BalloonBytes is the memory the balloon leaves the guest now.
	BalloonBytes *uint64 `json:"balloon_bytes,omitempty"`
	// HostRSSBytes is the VM process's resident memory on the host.
	HostRSSBytes *uint64 `json:"host_rss_bytes,omitempty"`
	// Disk counters, summed over the VM's disks.
	DiskReadBytes  *uint64 `json:"disk_read_bytes,omitempty"`
	DiskWriteBytes *uint64 `json:"disk_write_bytes,omitempty"`
	DiskReadOps    *uint64 `json:"disk_read_ops,omitempty"`
	DiskWriteOps   *uint64 `json:"disk_write_ops,omitempty"`
	// Network counters, summed over the VM's interfaces, as the host sees them.
	NetRxBytes *uint64 `json:"net_rx_bytes,omitempty"`
	NetTxBytes *uint64 `json:"net_tx_bytes,omitempty"`
}

// Uint64 returns a pointer to v, for filling VMMetrics.
func Uint64(v uint64) *uint64 { return &v }
