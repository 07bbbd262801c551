package tools

import (
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/server/catalog"
)

// Observing a VM: vm_network (the guest's interfaces, from the driver's
// GuestNetworker) and vm_metrics (the guest's own figures from
// vmgate-guest metrics, the same on every backend, plus the hypervisor's
// where the driver is a MetricsReader). Both are read-only.

func vmNetworkTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_network", Title: "Guest network", ReadOnly: true, Idempotent: true,
		Desc:   "List a VM's network interfaces as its guest agent reports them: name, MAC, IPv4 and IPv6 addresses with prefixes, counters.",
		Fields: []catalog.Field{catalog.VMField(true)},
		Output: []map[string]any{catalog.OObject(map[string]any{"vm": catalog.OString(), "interfaces": catalog.OArray(catalog.OOpen(map[string]any{
			"name": catalog.OString(), "mac": catalog.OString(), "stats": map[string]any{"type": "object"},
			"addresses": catalog.OArray(catalog.OObject(map[string]any{"family": map[string]any{"type": "string", "enum": []string{"ipv4", "ipv6"}}, "address": catalog.OString(), "prefix": catalog.ONonNeg()}, "family", "address", "prefix")),
		}, "name", "addresses"))}, "vm", "interfaces")},
	}, runVMNetwork)
}

func vmMetricsTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "vm_metrics", Title: "VM metrics", ReadOnly: true, Idempotent: true,
		Desc: "Read a VM's load: the guest's CPU (busy percent over a sample), memory, load averages, disks and network, " +
			"measured in the guest by vmgate-guest (installed on first use), plus the hypervisor's figures where the backend has them.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "sample_ms", Kind: catalog.KindInteger, Desc: fmt.Sprintf("CPU sample in ms (default %d).", wire.DefaultMetricsSampleMS), Min: 1, Max: wire.MaxMetricsSampleMS},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"vm": catalog.OString(), "guest": map[string]any{"type": "object"}, "guest_error": catalog.OString(),
			"hypervisor": catalog.OOpen(map[string]any{"time": catalog.OTime(), "source": catalog.OString(), "vcpus": catalog.ONonNeg()}, "time", "source"), "hypervisor_error": catalog.OString(),
		}, "vm")},
	}, runVMMetrics)
}

func runVMNetwork(e *catalog.Env, c *catalog.Call, _ *catalog.NoArgs) catalog.Result {
	n, ok := hypervisor.AsGuestNetworker(c.Driver)
	if !ok {
		return catalog.Failure(catalog.TagBackend, fmt.Sprintf("backend %q cannot read a guest's network interfaces", c.Backend), true)
	}
	ifs, err := n.GuestNetwork(c.Ctx, c.Name)
	if err != nil {
		return catalog.DriverFailure(err)
	}
	ifs = hypervisor.CleanNetInterfaces(ifs)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d interface(s)", c.VM, len(ifs))
	for _, ifc := range ifs {
		fmt.Fprintf(&b, "\n%s", ifc.Name)
		if ifc.MAC != "" {
			fmt.Fprintf(&b, " %s", ifc.MAC)
		}
		for _, a := range ifc.Addresses {
			fmt.Fprintf(&b, " %s/%d", a.Address, a.Prefix)
		}
	}
	return catalog.Success(map[string]any{"vm": c.VM, "interfaces": ifs}, b.String())
}

// metricsArgs are vm_metrics' arguments.
type metricsArgs struct {
	SampleMS int64 `arg:"sample_ms"` // 0: the default
}

// runVMMetrics reads both sources; one that fails is named in the result
// with its reason, and only both failing is an error.
func runVMMetrics(e *catalog.Env, c *catalog.Call, a *metricsArgs) catalog.Result {
	out := map[string]any{"vm": c.VM}
	var text []string
	guest, gerr := guestMetrics(e, c, a.SampleMS)
	if gerr == nil {
		out["guest"] = guest
		text = append(text, fmt.Sprintf("guest: CPU %.1f%% of %d over %d ms, memory %s of %s used (%.1f%%), load %.2f",
			guest.CPU.Percent, guest.CPU.Count, guest.CPU.SampleMS, mib(guest.Memory.UsedBytes), mib(guest.Memory.TotalBytes), guest.Memory.UsedPercent, guest.Load.Load1))
	} else {
		out["guest_error"] = gerr.Text
	}
	host, herr := hostMetrics(c)
	if herr == nil {
		out["hypervisor"] = host
		text = append(text, hostSummary(host))
	} else {
		out["hypervisor_error"] = herr.Text
	}
	if gerr != nil && herr != nil {
		r := *gerr
		r.Text = "no figures: guest: " + gerr.Text + "; hypervisor: " + herr.Text
		r.Detail = gerr.Detail + "; " + herr.Detail
		return r
	}
	return catalog.Success(out, c.VM+": "+strings.Join(text, "; "))
}

func guestMetrics(e *catalog.Env, c *catalog.Call, sampleMS int64) (guestctl.Metrics, *catalog.Result) {
	h, r := e.Guest.HelperFor(c)
	if r != nil {
		return guestctl.Metrics{}, r
	}
	m, err := h.Metrics(c.Ctx, c.Name, sampleMS)
	if err != nil {
		r := catalog.HelperFailure(err)
		return guestctl.Metrics{}, &r
	}
	return m, nil
}

func hostMetrics(c *catalog.Call) (hypervisor.VMMetrics, *catalog.Result) {
	mr, ok := hypervisor.AsMetricsReader(c.Driver)
	if !ok {
		r := catalog.Failure(catalog.TagBackend, fmt.Sprintf("backend %q reports no hypervisor figures", c.Backend), true)
		return hypervisor.VMMetrics{}, &r
	}
	m, err := mr.VMMetrics(c.Ctx, c.Name)
	if err != nil {
		r := catalog.DriverFailure(err)
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
