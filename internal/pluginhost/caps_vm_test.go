package pluginhost

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// qemuCapabilities are the QEMU driver's optional capabilities.
var qemuCapabilities = hypervisor.Capabilities{
	Snapshots: true, SnapshotModes: hypervisor.SnapshotModes{Memory: true}, GuestNetwork: true, Metrics: true, Create: true, HelperChannel: true,
	Screenshot: true, SendKeys: true, ConsoleRead: true, ConsoleWrite: true,
}

// TestSnapshotsThroughThePluginBoundary runs the snapshot suite against the
// QEMU driver as a plugin process, on a lab VM of its own (it reverts it).
func TestSnapshotsThroughThePluginBoundary(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "psnap"})
	h, _ := newTestHost(t, Options{})
	s := launchQEMU(t, h, filepath.Dir(v.Dir))
	if got := hypervisor.CapabilitiesOf(s); got != qemuCapabilities {
		t.Fatalf("CapabilitiesOf(supervised qemu plugin) = %+v; want %+v", got, qemuCapabilities)
	}
	hypervisortest.RunSnapshots(t, hypervisortest.Harness{Driver: s, VM: "psnap", DiskDir: "/data", Capabilities: qemuCapabilities})
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ifs, err := s.GuestNetwork(ctx, "psnap")
	if err != nil || len(ifs) < 2 {
		t.Errorf("GuestNetwork(psnap) through the plugin = %+v, %v; want lo and eth0", ifs, err)
	}
	m, err := s.VMMetrics(ctx, "psnap")
	if err != nil || m.Source != "qmp" || m.MemoryBytes == nil || *m.MemoryBytes != uint64(lab.DefaultMemoryMB)<<20 {
		t.Errorf("VMMetrics(psnap) through the plugin = %+v, %v; want QMP's figures with %d MiB", m, err, lab.DefaultMemoryMB)
	}
	if s.Restarts() != 0 {
		t.Errorf("Restarts() = %d; want 0", s.Restarts())
	}
}

// TestCapabilitiesOfAPluginWithout: the "sleepy" test driver has no
// optional capability; the supervisor says so and its calls are refused
// with ErrNotSupported.
func TestCapabilitiesOfAPluginWithout(t *testing.T) {
	h, _ := newTestHost(t, Options{})
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, Spec{Driver: "sleepy", Config: []byte(`{"name":"vm1"}`)})
	if err != nil {
		t.Fatalf("Launch(sleepy) = %v", err)
	}
	if got := hypervisor.CapabilitiesOf(d); got != (hypervisor.Capabilities{}) {
		t.Errorf("CapabilitiesOf(sleepy plugin) = %+v; want none", got)
	}
	if _, ok := hypervisor.AsSnapshotter(d); ok {
		t.Errorf("AsSnapshotter(sleepy plugin) ok = true; want false")
	}
	if _, err := d.(hypervisor.Snapshotter).SnapshotList(ctx, "vm1"); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("SnapshotList() on the sleepy plugin = %v; want ErrNotSupported", err)
	}
}
