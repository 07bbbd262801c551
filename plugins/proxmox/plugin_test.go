package proxmox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/hypervisor/registry"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pluginhost"
	"github.com/vmgate/vmgate/internal/pveemu"
	"github.com/vmgate/vmgate/internal/testload"
)

func jsonConfig(cfg Config) []byte {
	b, _ := json.Marshal(Settings{URL: cfg.URL, TokenID: cfg.TokenID, TokenSecretFile: cfg.TokenSecretFile, CAFile: cfg.CAFile})
	return b
}

// launchPlugin starts the driver in a plugin process (this test binary)
// through pluginhost, configured for e.
func launchPlugin(t *testing.T, cfg Config) hypervisor.Driver {
	t.Helper()
	h := pluginhost.New(pluginhost.Options{Executable: os.Args[0], Registry: pluginhost.Registered(), Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { h.Close() })
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, pluginhost.Spec{Driver: "proxmox", Backend: "pve", Config: jsonConfig(cfg)})
	if err != nil {
		t.Fatalf("Launch(proxmox) = %v", err)
	}
	return d
}

// TestConformancePlugin runs the suite through the go-plugin boundary
// against every emulated Proxmox VE version, with lab VMs behind it.
func TestConformancePlugin(t *testing.T) {
	for _, v := range pveemu.Versions() {
		t.Run(v.String(), func(t *testing.T) {
			e := startEmu(t, v, nil, labVMs(t)...)
			d := launchPlugin(t, e.cfg)
			hypervisortest.Run(t, hypervisortest.Harness{Driver: d, VM: "101", NoExecVM: "103", UnknownVM: "999",
				Capabilities: pveCapabilities, DiskDir: "/data"})
		})
	}
}

// TestConformancePower runs the power suite (reset, stop, start) through the
// plugin boundary against every emulated version, on a lab VM of its own
// that the emulator's power tasks really stop and relaunch; and a reboot
// (a shutdown through the agent, then qmeventd's start) on the newest
// version, which must return in the guest's new boot (issue 32, item 11).
func TestConformancePower(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "pvepower"})
	m := pveemu.NewLabMachine(v)
	t.Cleanup(func() { m.Close() })
	versions := pveemu.Versions()
	for i, ver := range versions {
		t.Run(ver.String(), func(t *testing.T) {
			e := startEmu(t, ver, nil, pveemu.VMSpec{VMID: 110, Node: "pve", Name: "power", Machine: m})
			d := launchPlugin(t, e.cfg)
			h := hypervisortest.Harness{Driver: d, VM: "110", UnknownVM: "999"}
			hypervisortest.RunPower(t, h)
			if i == len(versions)-1 {
				hypervisortest.RunPowerReboot(t, h)
			}
		})
	}
}

// TestConformanceSnapshots runs the snapshot suite through the plugin
// boundary against every emulated version, on a lab VM of its own whose
// whole state the emulator's snapshot tasks save and restore through QMP
// (internal/pveemu/snapshot.go).
func TestConformanceSnapshots(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "pvesnap"})
	m := pveemu.NewLabMachine(v)
	t.Cleanup(func() { m.Close() })
	for _, ver := range pveemu.Versions() {
		t.Run(ver.String(), func(t *testing.T) {
			e := startEmu(t, ver, nil, pveemu.VMSpec{VMID: 120, Node: "pve", Name: "snap", Machine: m})
			d := launchPlugin(t, e.cfg)
			hypervisortest.RunSnapshots(t, hypervisortest.Harness{Driver: d, VM: "120", UnknownVM: "999",
				Capabilities: pveCapabilities})
		})
	}
}

func TestRegisteredSettings(t *testing.T) {
	e := startEmu(t, pveemu.PVE92(), nil)
	good := jsonConfig(e.cfg)
	d, err := registry.New(context.Background(), Name, good)
	if err != nil {
		t.Fatalf("registry.New(Name, %s) = %v; want nil", good, err)
	}
	d.(hypervisor.Closer).Close()
	var m map[string]any
	json.Unmarshal(good, &m)
	for name, mod := range map[string]func(map[string]any){
		"unknown field": func(m map[string]any) { m["tokenid"] = "x" },
		"bad duration":  func(m map[string]any) { m["exec_timeout"] = "ten minutes" },
		"wrong type":    func(m map[string]any) { m["insecure_skip_verify"] = "yes" },
		"no url":        func(m map[string]any) { delete(m, "url") },
	} {
		c := map[string]any{}
		for k, v := range m {
			c[k] = v
		}
		mod(c)
		b, _ := json.Marshal(c)
		if _, err := registry.New(context.Background(), Name, b); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("registry.New(Name, %s) [%s] = %v; want %v", b, name, err, hypervisor.ErrInvalidArgument)
		}
	}
	if _, err := registry.New(context.Background(), Name, append(good, []byte(" {}")...)); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("registry.New(Name, with trailing data) = %v; want %v", err, hypervisor.ErrInvalidArgument)
	}
}

// TestBackendErrorsPlugin: a failed power task and a refused privilege reach
// the host side of the plugin boundary as hypervisor.ErrBackend with
// Proxmox's reason (the task's exit status, the privilege).
func TestBackendErrorsPlugin(t *testing.T) {
	e := startEmu(t, pveemu.PVE92(), []pveemu.ACL{{Path: "/vms", Privs: []string{"VM.Audit", "VM.PowerMgmt"}, Propagate: true}},
		pveemu.VMSpec{VMID: 102, Node: "pve", Name: "on", Running: true})
	d := launchPlugin(t, e.cfg)
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := d.Power(ctx, "102", hypervisor.PowerStart)
	if !errors.Is(err, hypervisor.ErrBackend) || !strings.Contains(err.Error(), "qmstart task of VM 102 failed: VM 102 already running") {
		t.Errorf("Power(102, start) of a running VM through the plugin = %v; want %v naming the task's exit status", err, hypervisor.ErrBackend)
	}
	_, err = d.FileRead(ctx, "102", "/etc/hostname", 10)
	if !errors.Is(err, hypervisor.ErrBackend) || !strings.Contains(err.Error(), "grant VM.GuestAgent.FileRead or VM.GuestAgent.Unrestricted on /vms/102") {
		t.Errorf("FileRead without the privilege through the plugin = %v; want %v naming the privilege", err, hypervisor.ErrBackend)
	}
}
