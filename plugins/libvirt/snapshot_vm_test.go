package libvirt

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/libvirttest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/testload"
)

// libvirtCapabilities are what the libvirt driver must have.
var libvirtCapabilities = hypervisor.Capabilities{
	Snapshots: true, SnapshotModes: hypervisor.SnapshotModes{Memory: true}, GuestNetwork: true, Metrics: true, Create: true, HelperChannel: true,
	// The screen, the keyboard and the console: on every domain.
	Screenshot: true, SendKeys: true, ConsoleRead: true, ConsoleWrite: true,
}

func TestCapabilities(t *testing.T) {
	d, err := New(Config{URI: "qemu:///system"})
	if err != nil {
		t.Fatal(err)
	}
	if got := hypervisor.CapabilitiesOf(d); got != libvirtCapabilities {
		t.Errorf("CapabilitiesOf(libvirt driver) = %+v; want %+v", got, libvirtCapabilities)
	}
}

// TestConformanceSnapshots runs the snapshot suite on vmT1 (its qcow2 disk
// at /data included) on the real libvirtd; the revert is to a state the
// test itself made, so the domain is as other tests expect afterwards.
func TestConformanceSnapshots(t *testing.T) {
	_, d := envDriver(t, Config{})
	hypervisortest.RunSnapshots(t, hypervisortest.Harness{Driver: d, VM: vmT1, DiskDir: "/data", Capabilities: libvirtCapabilities})

	// What the suite does not check: libvirt's tree and current snapshot.
	ctx, cancel := testload.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, name := range []string{"tree-a", "tree-b"} {
		if _, err := d.SnapshotCreate(ctx, vmT1, hypervisor.SnapshotRequest{Name: name, Memory: true}); err != nil {
			t.Fatalf("SnapshotCreate(%s) = %v", name, err)
		}
		t.Cleanup(func() { d.SnapshotDelete(context.Background(), vmT1, name) })
	}
	list, err := d.SnapshotList(ctx, vmT1)
	if err != nil {
		t.Fatalf("SnapshotList() = %v", err)
	}
	i := slices.IndexFunc(list, func(s hypervisor.Snapshot) bool { return s.Name == "tree-b" })
	if i < 0 || list[i].Parent != "tree-a" || !list[i].Current || !list[i].Memory {
		t.Errorf("SnapshotList() = %+v; want tree-b, a memory snapshot, current, child of tree-a", list)
	}
	// A disk-only snapshot of a running domain is refused before libvirt sees it.
	if _, err := d.SnapshotCreate(ctx, vmT1, hypervisor.SnapshotRequest{Name: "diskonly"}); !errors.Is(err, hypervisor.ErrSnapshotDiskOnly) {
		t.Errorf("SnapshotCreate(memory false) = %v; want ErrSnapshotDiskOnly", err)
	}
	// A domain without a qcow2 disk cannot take one: libvirt's reason comes back.
	_, err = d.SnapshotCreate(ctx, vmNoExec, hypervisor.SnapshotRequest{Name: "nodisk", Memory: true})
	if err == nil {
		d.SnapshotDelete(ctx, vmNoExec, "nodisk")
		t.Errorf("SnapshotCreate() on a domain without a disk succeeded; want libvirt's refusal")
	} else {
		t.Logf("SnapshotCreate() on a domain without a disk: %v", err)
	}
}

func TestGuestNetworkAndMetrics(t *testing.T) {
	_, d := envDriver(t, Config{})
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ifs, err := d.GuestNetwork(ctx, vmT1)
	if err != nil {
		t.Fatalf("GuestNetwork() = %v", err)
	}
	i := slices.IndexFunc(ifs, func(n hypervisor.NetInterface) bool { return n.Name == "eth0" })
	want := hypervisor.IPAddress{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}
	if i < 0 || !slices.Contains(ifs[i].Addresses, want) || ifs[i].MAC == "" {
		t.Errorf("GuestNetwork(%s) = %+v; want eth0 with a MAC and %+v", vmT1, ifs, want)
	}
	m, err := d.VMMetrics(ctx, vmT1)
	if err != nil {
		t.Fatalf("VMMetrics() = %v", err)
	}
	if m.Source != "libvirt" || m.VCPUs != 1 || m.CPUTimeNS == nil || m.MemoryBytes == nil || *m.MemoryBytes != 256<<20 ||
		m.DiskWriteBytes == nil || m.NetRxBytes == nil {
		t.Errorf("VMMetrics(%s) = %+v; want libvirt's cpu, 256 MiB, block and net counters", vmT1, m)
	}
}

// TestSnapshotsThroughPlugin runs the snapshot suite with the driver in a
// plugin process.
func TestSnapshotsThroughPlugin(t *testing.T) {
	env := libvirttest.Env(t)
	config, err := json.Marshal(Settings{URI: env.URI(), NameGlob: "vmgate-*"})
	if err != nil {
		t.Fatal(err)
	}
	h := pluginhost.New(pluginhost.Options{Executable: os.Args[0], Registry: pluginhost.Registered(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { h.Close() })
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, pluginhost.Spec{Driver: "libvirt", Backend: "virt", Config: config})
	if err != nil {
		t.Fatalf("Launch(libvirt) = %v", err)
	}
	if got := hypervisor.CapabilitiesOf(d); got != libvirtCapabilities {
		t.Fatalf("CapabilitiesOf(libvirt plugin) = %+v; want %+v", got, libvirtCapabilities)
	}
	hypervisortest.RunSnapshots(t, hypervisortest.Harness{Driver: d, VM: vmT1, DiskDir: "/data", Capabilities: libvirtCapabilities})
}
