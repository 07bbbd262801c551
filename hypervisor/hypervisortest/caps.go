package hypervisortest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// The checks of the optional capabilities that read (Network, Metrics);
// RunSnapshots (snapshot.go) has the snapshot checks.

// requireCapability fails t unless the harness declares the capability
// and the driver has it.
func requireCapability(t testing.TB, h Harness, what string, has func(hypervisor.Capabilities) bool) {
	t.Helper()
	got := hypervisor.CapabilitiesOf(h.Driver)
	switch {
	case !has(h.Capabilities):
		t.Fatalf("the harness does not declare the %s capability (Harness.Capabilities = %+v)", what, h.Capabilities)
	case !has(got):
		t.Fatalf("the driver has no %s capability (CapabilitiesOf = %+v); the harness declares it", what, got)
	}
}

// checkDeclaredCapabilities: the driver reports exactly the optional
// capabilities the harness declares.
func checkDeclaredCapabilities(t testing.TB, h Harness) {
	got := hypervisor.CapabilitiesOf(h.Driver)
	for _, c := range []struct {
		what      string
		has, want bool
	}{
		{"snapshots", got.Snapshots, h.Capabilities.Snapshots},
		{"guest network", got.GuestNetwork, h.Capabilities.GuestNetwork},
		{"metrics", got.Metrics, h.Capabilities.Metrics},
		{"create", got.Create, h.Capabilities.Create},
		{"screenshot", got.Screenshot, h.Capabilities.Screenshot},
		{"send keys", got.SendKeys, h.Capabilities.SendKeys},
		{"console read", got.ConsoleRead, h.Capabilities.ConsoleRead},
		{"console write", got.ConsoleWrite, h.Capabilities.ConsoleWrite},
	} {
		if c.has != c.want {
			t.Errorf("CapabilitiesOf(driver) %s = %v; the harness declares %v", c.what, c.has, c.want)
		}
	}
}

func hasNetwork(k hypervisor.Capabilities) bool   { return k.GuestNetwork }
func hasMetrics(k hypervisor.Capabilities) bool   { return k.Metrics }
func hasSnapshots(k hypervisor.Capabilities) bool { return k.Snapshots }

// guestInterfaces asks the guest itself (through exec) for its interfaces
// and their MAC addresses, from /sys/class/net.
func guestInterfaces(t testing.TB, h Harness) map[string]string {
	t.Helper()
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c",
		`for i in /sys/class/net/*; do printf '%s %s\n' "${i##*/}" "$(cat "$i/address" 2>/dev/null)"; done`}}
	res := run(t, h, req)
	wantExit0(t, req, res)
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		name, mac, _ := strings.Cut(line, " ")
		if name != "" {
			out[name] = strings.ToLower(strings.TrimSpace(mac))
		}
	}
	return out
}

func checkGuestNetwork(t testing.TB, h Harness) {
	requireCapability(t, h, "guest network", hasNetwork)
	n, _ := hypervisor.AsGuestNetworker(h.Driver)
	ifs, err := n.GuestNetwork(h.ctx(t), h.VM)
	if err != nil {
		t.Fatalf("GuestNetwork(%q) error: %v", h.VM, err)
	}
	if h.NetworkIPv4Only {
		checkIPv4Interfaces(t, h, ifs)
		return
	}
	byName := map[string]hypervisor.NetInterface{}
	for _, ifc := range ifs {
		if _, dup := byName[ifc.Name]; dup {
			t.Errorf("GuestNetwork(%q) lists %q twice", h.VM, ifc.Name)
		}
		byName[ifc.Name] = ifc
		for _, a := range ifc.Addresses {
			if a.Family != "ipv4" && a.Family != "ipv6" {
				t.Errorf("GuestNetwork(%q) %s address %+v: family %q; want ipv4 or ipv6", h.VM, ifc.Name, a, a.Family)
			}
		}
	}
	lo, ok := byName["lo"]
	if !ok || !slices.Contains(lo.Addresses, hypervisor.IPAddress{Family: "ipv4", Address: "127.0.0.1", Prefix: 8}) {
		t.Errorf("GuestNetwork(%q) = %+v; want lo with 127.0.0.1/8", h.VM, ifs)
	}
	// The guest's own view: the same interfaces, with the same addresses.
	guest := guestInterfaces(t, h)
	var names, guestNames []string
	for name := range byName {
		names = append(names, name)
	}
	for name := range guest {
		guestNames = append(guestNames, name)
	}
	slices.Sort(names)
	slices.Sort(guestNames)
	if !slices.Equal(names, guestNames) {
		t.Errorf("GuestNetwork(%q) names %q; the guest's /sys/class/net has %q", h.VM, names, guestNames)
	}
	for name, mac := range guest {
		if ifc, ok := byName[name]; ok && mac != "" && ifc.MAC != mac {
			t.Errorf("GuestNetwork(%q) %s MAC %q; the guest says %q", h.VM, name, ifc.MAC, mac)
		}
	}
}

// guestIPv4 asks the guest (through exec) for its IPv4 addresses per
// interface, as "address/prefix".
func guestIPv4(t testing.TB, h Harness) map[string][]string {
	t.Helper()
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `ip -o -f inet addr show`}}
	res := run(t, h, req)
	wantExit0(t, req, res)
	out := map[string][]string{}
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		f := strings.Fields(line)
		for i := 2; i+1 < len(f); i++ {
			if f[i] == "inet" {
				out[strings.TrimSuffix(f[1], ":")] = append(out[strings.TrimSuffix(f[1], ":")], f[i+1])
				break
			}
		}
	}
	return out
}

// checkIPv4Interfaces: exactly the guest's non-loopback interfaces with an
// IPv4 address are reported, each with one of its addresses and its MAC.
func checkIPv4Interfaces(t testing.TB, h Harness, ifs []hypervisor.NetInterface) {
	guest := guestInterfaces(t, h)
	addrs := guestIPv4(t, h)
	var want []string
	for name := range addrs {
		if name != "lo" {
			want = append(want, name)
		}
	}
	var got []string
	for _, ifc := range ifs {
		got = append(got, ifc.Name)
		if mac := guest[ifc.Name]; ifc.MAC != mac {
			t.Errorf("GuestNetwork(%q) %s MAC %q; the guest says %q", h.VM, ifc.Name, ifc.MAC, mac)
		}
		if len(ifc.Addresses) != 1 || ifc.Addresses[0].Family != "ipv4" {
			t.Errorf("GuestNetwork(%q) %s addresses %+v; want one IPv4 address", h.VM, ifc.Name, ifc.Addresses)
			continue
		}
		a := ifc.Addresses[0]
		if cidr := fmt.Sprintf("%s/%d", a.Address, a.Prefix); !slices.Contains(addrs[ifc.Name], cidr) {
			t.Errorf("GuestNetwork(%q) %s address %s; the guest has %q", h.VM, ifc.Name, cidr, addrs[ifc.Name])
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("GuestNetwork(%q) names %q; the guest's non-loopback interfaces with IPv4 are %q (want at least one)", h.VM, got, want)
	}
}

func checkGuestNetworkUnknownVM(t testing.TB, h Harness) {
	requireCapability(t, h, "guest network", hasNetwork)
	n, _ := hypervisor.AsGuestNetworker(h.Driver)
	if _, err := n.GuestNetwork(h.ctx(t), h.unknownVM()); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("GuestNetwork(%q) error %v; want %v", h.unknownVM(), err, hypervisor.ErrUnknownVM)
	}
}

// guestMemTotal returns the guest's MemTotal in bytes.
func guestMemTotal(t testing.TB, h Harness) uint64 {
	t.Helper()
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `grep '^MemTotal:' /proc/meminfo`}}
	res := run(t, h, req)
	wantExit0(t, req, res)
	f := strings.Fields(string(res.Stdout))
	if len(f) < 2 {
		t.Fatalf("guest /proc/meminfo MemTotal line %q", res.Stdout)
	}
	kb, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Fatalf("guest /proc/meminfo MemTotal line %q: %v", res.Stdout, err)
	}
	return kb * 1024
}

func readMetrics(t testing.TB, h Harness) hypervisor.VMMetrics {
	t.Helper()
	mr, _ := hypervisor.AsMetricsReader(h.Driver)
	before := time.Now()
	m, err := mr.VMMetrics(h.ctx(t), h.VM)
	if err != nil {
		t.Fatalf("VMMetrics(%q) error: %v", h.VM, err)
	}
	if m.Time.Before(before.Add(-time.Minute)) || m.Time.After(time.Now().Add(time.Minute)) {
		t.Errorf("VMMetrics(%q).Time = %v; want about now (%v)", h.VM, m.Time, before)
	}
	return m
}

// counters names the cumulative figures, which never go down.
func counters(m hypervisor.VMMetrics) map[string]*uint64 {
	return map[string]*uint64{
		"CPUTimeNS": m.CPUTimeNS, "DiskReadBytes": m.DiskReadBytes, "DiskWriteBytes": m.DiskWriteBytes,
		"DiskReadOps": m.DiskReadOps, "DiskWriteOps": m.DiskWriteOps, "NetRxBytes": m.NetRxBytes, "NetTxBytes": m.NetTxBytes,
	}
}

// burnScript keeps one guest CPU busy for about two seconds of guest time.
const burnScript = `end=$(($(date +%s) + 2)); i=0; while [ "$(date +%s)" -lt "$end" ]; do i=$((i + 1)); done; echo "$i"`

func checkMetrics(t testing.TB, h Harness) {
	requireCapability(t, h, "hypervisor metrics", hasMetrics)
	m1 := readMetrics(t, h)
	if m1.Source == "" {
		t.Errorf("VMMetrics(%q).Source is empty; want where the figures came from", h.VM)
	}
	if m1.VCPUs < 1 {
		t.Errorf("VMMetrics(%q).VCPUs = %d; want at least 1", h.VM, m1.VCPUs)
	}
	if m1.MemoryBytes != nil {
		// The guest sees at most what it was given.
		if total := guestMemTotal(t, h); *m1.MemoryBytes < total {
			t.Errorf("VMMetrics(%q).MemoryBytes = %d; the guest's MemTotal is %d, which cannot exceed it", h.VM, *m1.MemoryBytes, total)
		}
		if m1.BalloonBytes != nil && *m1.BalloonBytes > *m1.MemoryBytes {
			t.Errorf("VMMetrics(%q).BalloonBytes = %d > MemoryBytes %d", h.VM, *m1.BalloonBytes, *m1.MemoryBytes)
		}
	}
	// Load: CPU in the guest, and writes to its disk when the harness names one.
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", burnScript}}
	wantExit0(t, req, run(t, h, req))
	if h.DiskDir != "" {
		path := h.DiskDir + "/hypervisortest-metrics.bin"
		w := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `head -c 1048576 /dev/zero > "$1" && sync && rm -f "$1" && sync`, "sh", path}}
		wantExit0(t, w, run(t, h, w))
	}
	m2 := readMetrics(t, h)
	c1, c2 := counters(m1), counters(m2)
	for name, v1 := range c1 {
		v2 := c2[name]
		if (v1 == nil) != (v2 == nil) {
			t.Errorf("VMMetrics(%q).%s reported %v then %v; want the same fields each time", h.VM, name, v1 != nil, v2 != nil)
			continue
		}
		if v1 != nil && *v2 < *v1 {
			t.Errorf("VMMetrics(%q).%s went from %d down to %d; counters never go down", h.VM, name, *v1, *v2)
		}
	}
	if m1.CPUTimeNS != nil && m2.CPUTimeNS != nil && *m2.CPUTimeNS-*m1.CPUTimeNS < uint64(10*time.Millisecond) {
		t.Errorf("VMMetrics(%q).CPUTimeNS grew by %v while the guest kept a CPU busy for 2 s; want it to move", h.VM,
			time.Duration(*m2.CPUTimeNS-*m1.CPUTimeNS))
	}
	if h.DiskDir != "" && m1.DiskWriteBytes != nil && *m2.DiskWriteBytes-*m1.DiskWriteBytes < 1<<20 {
		t.Errorf("VMMetrics(%q).DiskWriteBytes grew by %d after 1 MiB was written and synced to %s; want at least 1 MiB", h.VM,
			*m2.DiskWriteBytes-*m1.DiskWriteBytes, h.DiskDir)
	}
	t.Logf("metrics of %s: %s", h.VM, describeMetrics(m2))
}

func describeMetrics(m hypervisor.VMMetrics) string {
	var parts []string
	parts = append(parts, fmt.Sprintf("source %s, %d vCPUs", m.Source, m.VCPUs))
	for _, f := range []struct {
		name string
		v    *uint64
	}{{"cpu_time_ns", m.CPUTimeNS}, {"memory", m.MemoryBytes}, {"balloon", m.BalloonBytes}, {"host_rss", m.HostRSSBytes},
		{"disk_read", m.DiskReadBytes}, {"disk_write", m.DiskWriteBytes}, {"net_rx", m.NetRxBytes}, {"net_tx", m.NetTxBytes}} {
		if f.v != nil {
			parts = append(parts, fmt.Sprintf("%s %d", f.name, *f.v))
		}
	}
	return strings.Join(parts, ", ")
}

func checkMetricsUnknownVM(t testing.TB, h Harness) {
	requireCapability(t, h, "hypervisor metrics", hasMetrics)
	mr, _ := hypervisor.AsMetricsReader(h.Driver)
	ctx, cancel := testload.WithTimeout(context.Background(), h.callTimeout())
	defer cancel()
	if _, err := mr.VMMetrics(ctx, h.unknownVM()); !errors.Is(err, hypervisor.ErrUnknownVM) {
		t.Errorf("VMMetrics(%q) error %v; want %v", h.unknownVM(), err, hypervisor.ErrUnknownVM)
	}
}
