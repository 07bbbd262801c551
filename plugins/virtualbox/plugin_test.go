package virtualbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/internal/vboxemu"
)

// launchPlugin starts the driver in a plugin process (this test binary,
// started by pluginhost) configured for e.
func launchPlugin(t *testing.T, e *emulator) hypervisor.Driver {
	t.Helper()
	h := pluginhost.New(pluginhost.Options{Executable: os.Args[0], Registry: pluginhost.Registered(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { h.Close() })
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, pluginhost.Spec{Driver: "virtualbox", Backend: "vbox", Config: e.jsonConfig()})
	if err != nil {
		t.Fatalf("Launch(virtualbox) = %v", err)
	}
	return d
}

// TestConformancePlugin runs the suite through the go-plugin boundary for
// every emulated release: the driver lives in a plugin process; the
// emulator finds its world next to its binary.
func TestConformancePlugin(t *testing.T) {
	t1 := labtest.VM(t, "t1")
	noexec := labtest.VM(t, "noexec")
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			e := newEmulator(t, v, []*vboxemu.Machine{
				labMachine("t1", uuidT1, t1),
				machine("noexec", uuidNoExec, noexec.QGASocket, noexec.QMPSocket),
			})
			hypervisortest.Run(t, hypervisortest.Harness{Driver: launchPlugin(t, e), VM: "t1", NoExecVM: "noexec", Capabilities: vboxCapabilities,
				NetworkIPv4Only: true})
		})
	}
}

// TestPowerPlugin runs the power suite through the plugin for every
// release, on a lab VM of its own: the emulator powers the machine off by
// stopping the VM's vCPUs and on by a reset, so each start is a fresh boot.
func TestPowerPlugin(t *testing.T) {
	vm := labtest.Start(t, lab.Spec{Name: "vboxpower"})
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			e := newEmulator(t, v, []*vboxemu.Machine{machine("pwr", uuidT1, vm.QGASocket, vm.QMPSocket)})
			d := launchPlugin(t, e)
			hypervisortest.RunPower(t, hypervisortest.Harness{Driver: d, VM: "pwr", PowerTimeout: 5 * time.Minute})
		})
	}
}

func TestRegisteredSettings(t *testing.T) {
	e := newEmulator(t, "7.1", nil)
	good := e.jsonConfig()
	d, err := registry.New(context.Background(), Name, good)
	if err != nil {
		t.Fatalf("registry.New(Name, %s) = %v; want nil", good, err)
	}
	d.(hypervisor.Closer).Close()
	for _, bad := range []string{
		`{"username":"u","password_file":"/x","password":"inline"}`,
		`{"username":"u","password_file":"` + e.passwordFile + `","exec_timeout":"soon"}`,
		`{"vboxmanage":"` + e.bin + `","username":"u","password_file":"` + e.passwordFile + `","stdio_block":-5}`,
		`{"username":"u","password_file":"` + e.passwordFile + `"} {}`,
		`{"username":7}`,
		`[]`,
	} {
		if _, err := registry.New(context.Background(), Name, []byte(bad)); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("registry.New(Name, %s) = %v; want %v", bad, err, hypervisor.ErrInvalidArgument)
		}
	}
}

// vboxCapabilities are the driver's capabilities, exactly: snapshots
// with memory (VirtualBox saves a running machine's memory with each),
// guest network (from the Additions' guest properties), VMs on demand
// (clonevm), no metrics.
var vboxCapabilities = hypervisor.Capabilities{Snapshots: true, SnapshotModes: hypervisor.SnapshotModes{Memory: true}, GuestNetwork: true, Create: true,
	Screenshot: true, SendKeys: true, ConsoleRead: true}

// TestSnapshotsPlugin runs the snapshot suite through the plugin for every
// release, on a lab VM of its own (a revert powers the machine off, restores
// the snapshot's disk and memory and starts it again), files on the qcow2
// disk (/data) included.
func TestSnapshotsPlugin(t *testing.T) {
	vm := labtest.Start(t, lab.Spec{Name: "vboxsnaps"})
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			e := newEmulator(t, v, []*vboxemu.Machine{machine("snap", uuidT1, vm.QGASocket, vm.QMPSocket)})
			d := launchPlugin(t, e)
			hypervisortest.RunSnapshots(t, hypervisortest.Harness{Driver: d, VM: "snap", DiskDir: "/data", Capabilities: vboxCapabilities})
		})
	}
}
