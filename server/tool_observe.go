package server

import (
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
)

// Observing a VM: vm_network (the guest's interfaces, from the driver's
// GuestNetworker) and vm_metrics (the guest's own figures from
// vmgate-guest metrics, the same on every backend, plus the hypervisor's
// where the driver is a MetricsReader). Both are read-only.

func vmNetworkTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_network", title: "Guest network", readOnly: true, idempotent: true,
		desc:   "List a VM's network interfaces as its guest agent reports them: name, MAC, IPv4 and IPv6 addresses with prefixes, counters.",
		fields: []field{vmField(true)},
		output: []map[string]any{oObject(map[string]any{"vm": oString, "interfaces": oArray(oOpen(map[string]any{
			"name": oString, "mac": oString, "stats": map[string]any{"type": "object"},
			"addresses": oArray(oObject(map[string]any{"family": map[string]any{"type": "string", "enum": []string{"ipv4", "ipv6"}}, "address": oString, "prefix": oNonNeg}, "family", "address", "prefix")),
		}, "name", "addresses"))}, "vm", "interfaces")},
	}, (*Server).runVMNetwork)
}

func vmMetricsTool() *toolSpec {
	return newTool(toolSpec{
		name: "vm_metrics", title: "VM metrics", readOnly: true, idempotent: true,
		desc: "Read a VM's load: the guest's CPU (busy percent over a sample), memory, load averages, disks and network, " +
			"measured in the guest by vmgate-guest (installed on first use), plus the hypervisor's figures where the backend has them.",
		fields: []field{
			vmField(true),
			{name: "sample_ms", kind: kindInteger, desc: fmt.Sprintf("CPU sample in ms (default %d).", wire.DefaultMetricsSampleMS), min: 1, max: wire.MaxMetricsSampleMS},
		},
		output: []map[string]any{oObject(map[string]any{
			"vm": oString, "guest": map[string]any{"type": "object"}, "guest_error": oString,
			"hypervisor": oOpen(map[string]any{"time": oTime, "source": oString, "vcpus": oNonNeg}, "time", "source"), "hypervisor_error": oString,
		}, "vm")},
	}, (*Server).runVMMetrics)
}

func (s *Server) runVMNetwork(c *call, _ *noArgs) result {
	n, ok := hypervisor.AsGuestNetworker(c.driver)
	if !ok {
		return failure(TagBackend, fmt.Sprintf("backend %q cannot read a guest's network interfaces", c.backend), true)
	}
	ifs, err := n.GuestNetwork(c.ctx, c.name)
	if err != nil {
		return driverFailure(err)
	}
	ifs = hypervisor.CleanNetInterfaces(ifs)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d interface(s)", c.vm, len(ifs))
	for _, ifc := range ifs {
		fmt.Fprintf(&b, "\n%s", ifc.Name)
		if ifc.MAC != "" {
			fmt.Fprintf(&b, " %s", ifc.MAC)
		}
		for _, a := range ifc.Addresses {
			fmt.Fprintf(&b, " %s/%d", a.Address, a.Prefix)
		}
	}
	return success(map[string]any{"vm": c.vm, "interfaces": ifs}, b.String())
}

// metricsArgs are vm_metrics' arguments.
type metricsArgs struct {
	SampleMS int64 `arg:"sample_ms"` // 0: the default
}

// runVMMetrics reads both sources; one that fails is named in the result
// with its reason, and only both failing is an error.
func (s *Server) runVMMetrics(c *call, a *metricsArgs) result {
	out := map[string]any{"vm": c.vm}
	var text []string
	guest, gerr := s.guestMetrics(c, a.SampleMS)
	if gerr == nil {
		out["guest"] = guest
		text = append(text, fmt.Sprintf("guest: CPU %.1f%% of %d over %d ms, memory %s of %s used (%.1f%%), load %.2f",
			guest.CPU.Percent, guest.CPU.Count, guest.CPU.SampleMS, mib(guest.Memory.UsedBytes), mib(guest.Memory.TotalBytes), guest.Memory.UsedPercent, guest.Load.Load1))
	} else {
		out["guest_error"] = gerr.text
	}
	host, herr := hostMetrics(c)
	if herr == nil {
		out["hypervisor"] = host
		text = append(text, hostSummary(host))
	} else {
		out["hypervisor_error"] = herr.text
	}
	if gerr != nil && herr != nil {
		r := *gerr
		r.text = "no figures: guest: " + gerr.text + "; hypervisor: " + herr.text
		r.detail = gerr.detail + "; " + herr.detail
		return r
	}
	return success(out, c.vm+": "+strings.Join(text, "; "))
}

func (s *Server) guestMetrics(c *call, sampleMS int64) (guestctl.Metrics, *result) {
	h, r := s.guest.helperFor(c)
	if r != nil {
		return guestctl.Metrics{}, r
	}
	m, err := h.Metrics(c.ctx, c.name, sampleMS)
	if err != nil {
		r := helperFailure(err)
		return guestctl.Metrics{}, &r
	}
	return m, nil
}

func hostMetrics(c *call) (hypervisor.VMMetrics, *result) {
	mr, ok := hypervisor.AsMetricsReader(c.driver)
	if !ok {
		r := failure(TagBackend, fmt.Sprintf("backend %q reports no hypervisor figures", c.backend), true)
		return hypervisor.VMMetrics{}, &r
	}
	m, err := mr.VMMetrics(c.ctx, c.name)
	if err != nil {
		r := driverFailure(err)
		return hypervisor.VMMetrics{}, &r
	}
	return m, nil
}

func hostSummary(m hypervisor.VMMetrics) string {
	var parts []string
	if m.VCPUs > 0 {
		parts = append(parts, fmt.Sprintf("%d vCPU", m.VCPUs))
	}
	if m.CPUTimeNS != nil {
		parts = append(parts, fmt.Sprintf("CPU time %.1f s", float64(*m.CPUTimeNS)/1e9))
	}
	if m.MemoryBytes != nil {
		parts = append(parts, "memory "+mib(*m.MemoryBytes))
	}
	if m.HostRSSBytes != nil {
		parts = append(parts, "host RSS "+mib(*m.HostRSSBytes))
	}
	return "hypervisor (" + m.Source + "): " + strings.Join(parts, ", ")
}

func mib(b uint64) string { return fmt.Sprintf("%d MiB", b>>20) }
