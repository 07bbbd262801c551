package libvirt

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
)

var _ hypervisor.MetricsReader = (*Driver)(nil)

// statsConn is what metrics need of a libvirt connection.
type statsConn interface {
	ConnectGetAllDomainStats(doms []golibvirt.Domain, stats uint32, flags uint32) ([]golibvirt.DomainStatsRecord, error)
}

var _ statsConn = (*golibvirt.Libvirt)(nil)

// metricsStats are the groups of libvirt's domain stats VMMetrics reads.
const metricsStats = golibvirt.DomainStatsState | golibvirt.DomainStatsCPUTotal | golibvirt.DomainStatsBalloon |
	golibvirt.DomainStatsVCPU | golibvirt.DomainStatsInterface | golibvirt.DomainStatsBlock

// VMMetrics reads libvirt's domain stats (virDomainListGetStats): cpu.time,
// vcpu.current, balloon.maximum/current/rss (KiB), and the block and net
// counters summed over the domain's disks and interfaces.
func (d *Driver) VMMetrics(ctx context.Context, name string) (hypervisor.VMMetrics, error) {
	const op = "metrics"
	s, err := d.lookup(ctx, op, name)
	if err != nil {
		return hypervisor.VMMetrics{}, err
	}
	h := s.handle()
	var recs []golibvirt.DomainStatsRecord
	err = d.call(ctx, true, func(c conn) error {
		sc, ok := c.(statsConn)
		if !ok {
			return fmt.Errorf("%w: the libvirt connection has no domain stats", hypervisor.ErrNotSupported)
		}
		r, err := sc.ConnectGetAllDomainStats([]golibvirt.Domain{h}, uint32(metricsStats), 0)
		recs = r
		return err
	})
	if libvirtCode(err) == golibvirt.ErrNoDomain {
		d.forget(s)
		return hypervisor.VMMetrics{}, fmt.Errorf("libvirt: %s: %w: %q", op, hypervisor.ErrUnknownVM, name)
	}
	if err != nil {
		return hypervisor.VMMetrics{}, opError(op, err)
	}
	if len(recs) != 1 {
		return hypervisor.VMMetrics{}, fmt.Errorf("libvirt: %s: %d stats records for one domain", op, len(recs))
	}
	m := metricsFromParams(recs[0].Params)
	m.Time = time.Now()
	return m, nil
}

// metricsFromParams reads the typed parameters of one domain's stats.
func metricsFromParams(params []golibvirt.TypedParam) hypervisor.VMMetrics {
	m := hypervisor.VMMetrics{Source: "libvirt"}
	kib := func(v uint64) *uint64 { return hypervisor.Uint64(v * 1024) }
	var sums [6]uint64 // block rd.bytes, wr.bytes, rd.reqs, wr.reqs; net rx.bytes, tx.bytes
	var haveBlock, haveNet bool
	for _, p := range params {
		v, ok := paramUint(p.Value)
		if !ok {
			continue
		}
		switch f := p.Field; {
		case f == "cpu.time":
			m.CPUTimeNS = hypervisor.Uint64(v)
		case f == "vcpu.current":
			m.VCPUs = int(v)
		case f == "balloon.maximum":
			m.MemoryBytes = kib(v)
		case f == "balloon.current":
			m.BalloonBytes = kib(v)
		case f == "balloon.rss":
			m.HostRSSBytes = kib(v)
		case f == "block.count":
			haveBlock = true
		case f == "net.count":
			haveNet = true
		case strings.HasPrefix(f, "block."):
			if i := counterIndex(f, "block.", map[string]int{"rd.bytes": 0, "wr.bytes": 1, "rd.reqs": 2, "wr.reqs": 3}); i >= 0 {
				sums[i] += v
			}
		case strings.HasPrefix(f, "net."):
			if i := counterIndex(f, "net.", map[string]int{"rx.bytes": 4, "tx.bytes": 5}); i >= 0 {
				sums[i] += v
			}
		}
	}
	if haveBlock {
		m.DiskReadBytes, m.DiskWriteBytes = hypervisor.Uint64(sums[0]), hypervisor.Uint64(sums[1])
		m.DiskReadOps, m.DiskWriteOps = hypervisor.Uint64(sums[2]), hypervisor.Uint64(sums[3])
	}
	if haveNet {
		m.NetRxBytes, m.NetTxBytes = hypervisor.Uint64(sums[4]), hypervisor.Uint64(sums[5])
	}
	return m
}

// counterIndex maps "block.<n>.rd.bytes" to its index in names, -1 when
// the field is not one of them (or not per-device).
func counterIndex(field, prefix string, names map[string]int) int {
	n, rest, ok := strings.Cut(strings.TrimPrefix(field, prefix), ".")
	if !ok {
		return -1
	}
	if _, err := strconv.Atoi(n); err != nil {
		return -1
	}
	if i, ok := names[rest]; ok {
		return i
	}
	return -1
}

// paramUint reads an integer typed parameter.
func paramUint(v golibvirt.TypedParamValue) (uint64, bool) {
	switch x := v.I.(type) {
	case uint64:
		return x, true
	case uint32:
		return uint64(x), true
	case int64:
		return uint64(max(x, 0)), x >= 0
	case int32:
		return uint64(max(x, 0)), x >= 0
	}
	return 0, false
}
