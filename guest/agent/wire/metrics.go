package wire

// Metrics is what `vmgate-guest metrics` returns: the guest's own view of
// its CPU, memory, load, filesystems, block devices and network, read with
// gopsutil v4, so every backend reports the same figures. Counters are
// cumulative since the guest booted; CPU.Percent is measured over
// CPU.SampleMS.
type Metrics struct {
	// TimeMS is when the figures were read, ms since the Unix epoch (guest clock).
	TimeMS  int64         `json:"time_ms"`
	CPU     CPUMetrics    `json:"cpu"`
	Memory  MemoryMetrics `json:"memory"`
	Load    LoadMetrics   `json:"load"`
	Disks   []DiskUsage   `json:"disks"`
	DiskIO  []DiskIO      `json:"disk_io"`
	Network []NetIO       `json:"network"`
}

// CPUMetrics are the guest's CPUs.
type CPUMetrics struct {
	// Count is the number of logical CPUs.
	Count int `json:"count"`
	// Percent is the share of all CPUs' time spent busy over the sample
	// (100 = every CPU busy all the time).
	Percent  float64 `json:"percent"`
	SampleMS int64   `json:"sample_ms"`
	// Cumulative CPU time, seconds, summed over CPUs.
	UserS   float64 `json:"user_s"`
	SystemS float64 `json:"system_s"`
	IdleS   float64 `json:"idle_s"`
	IOWaitS float64 `json:"iowait_s"`
	StealS  float64 `json:"steal_s"`
}

// MemoryMetrics are the guest's memory and swap.
type MemoryMetrics struct {
	TotalBytes     uint64  `json:"total_bytes"`
	AvailableBytes uint64  `json:"available_bytes"`
	UsedBytes      uint64  `json:"used_bytes"`
	UsedPercent    float64 `json:"used_percent"`
	SwapTotalBytes uint64  `json:"swap_total_bytes"`
	SwapUsedBytes  uint64  `json:"swap_used_bytes"`
}

// LoadMetrics are the load averages and the process counts.
type LoadMetrics struct {
	Load1        float64 `json:"load1"`
	Load5        float64 `json:"load5"`
	Load15       float64 `json:"load15"`
	ProcsRunning int     `json:"procs_running"`
	ProcsBlocked int     `json:"procs_blocked"`
}

// DiskUsage is one mounted filesystem.
type DiskUsage struct {
	Mountpoint  string  `json:"mountpoint"`
	Device      string  `json:"device"`
	FSType      string  `json:"fstype"`
	TotalBytes  uint64  `json:"total_bytes"`
	UsedBytes   uint64  `json:"used_bytes"`
	FreeBytes   uint64  `json:"free_bytes"`
	UsedPercent float64 `json:"used_percent"`
}

// DiskIO are one block device's counters.
type DiskIO struct {
	Name       string `json:"name"`
	ReadBytes  uint64 `json:"read_bytes"`
	WriteBytes uint64 `json:"write_bytes"`
	ReadOps    uint64 `json:"read_ops"`
	WriteOps   uint64 `json:"write_ops"`
}

// NetIO are one interface's counters.
type NetIO struct {
	Name      string `json:"name"`
	RxBytes   uint64 `json:"rx_bytes"`
	TxBytes   uint64 `json:"tx_bytes"`
	RxPackets uint64 `json:"rx_packets"`
	TxPackets uint64 `json:"tx_packets"`
	RxErrors  uint64 `json:"rx_errors"`
	TxErrors  uint64 `json:"tx_errors"`
	RxDropped uint64 `json:"rx_dropped"`
	TxDropped uint64 `json:"tx_dropped"`
}

// Bounds of the metrics command.
const (
	// DefaultMetricsSampleMS is the CPU sample when --sample-ms is not given.
	DefaultMetricsSampleMS = 250
	// MaxMetricsSampleMS bounds --sample-ms.
	MaxMetricsSampleMS = 5000
	// MaxMetricsRows bounds each list (filesystems, block devices, interfaces).
	MaxMetricsRows = 256
)
