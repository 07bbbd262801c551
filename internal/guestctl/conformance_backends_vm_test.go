//go:build linux

package guestctl

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pveemu"
	"github.com/vmgate/vmgate/internal/vboxemu"
	"github.com/vmgate/vmgate/plugins/proxmox"
	"github.com/vmgate/vmgate/plugins/virtualbox"
)

// The roads on the backends without a channel of their own to the guest:
// the Proxmox and VirtualBox drivers, over their emulators with the lab VM
// "cg" behind them. The resident helper is reached through the agent's
// exec (`vmgate-guest call` to its socket: Proxmox's agent/exec with
// input-data and agent/exec-status, VirtualBox's guestcontrol run with
// stdin staged by copyto), or a process runs per command; the road says
// why not a channel.

// pveSettings starts an emulated PVE 9.2 whose VM 101 is the lab VM "cg"
// and returns the Proxmox driver's settings for it, and the VM.
func pveSettings(t *testing.T) (proxmox.Settings, string) {
	t.Helper()
	v := labtest.VM(t, "cg")
	e := pveemu.Start(t, pveemu.Options{Version: pveemu.PVE92()})
	const tokenID, secret = "vmgate@pve!files", "0d7c3b1e-8f8d-4c55-9a3e-0d6c2b7f4a99"
	var privs []string
	for _, p := range proxmox.Privileges(9) {
		privs = append(privs, p.Name)
	}
	if err := e.AddToken(pveemu.Token{ID: tokenID, Secret: secret, ACL: []pveemu.ACL{{Path: "/vms", Privs: privs, Propagate: true}}}); err != nil {
		t.Fatal(err)
	}
	if err := e.AddVM(pveemu.VMSpec{VMID: 101, Node: "pve", Name: "cg", Machine: pveemu.NewLabMachine(v)}); err != nil {
		t.Fatal(err)
	}
	ca, secretFile := e.ClientFiles(t, secret)
	return proxmox.Settings{URL: e.URL(), TokenID: tokenID, TokenSecretFile: secretFile, CAFile: ca}, "101"
}

// pveDriver is the Proxmox driver over an emulated PVE 9.2 whose VM 101 is
// the lab VM "cg".
func pveDriver(t *testing.T) (hypervisor.Driver, string) {
	t.Helper()
	s, vm := pveSettings(t)
	d, err := proxmox.New(proxmox.Config{URL: s.URL, TokenID: s.TokenID, TokenSecretFile: s.TokenSecretFile, CAFile: s.CAFile, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, vm
}

var (
	vboxOnce sync.Once
	vboxBin  string
	vboxErr  error
)

// vboxSettings makes a VBoxManage emulator (7.1) whose machine "cg" is the
// lab VM "cg" and returns the VirtualBox driver's settings for it, and the
// VM.
func vboxSettings(t *testing.T) (virtualbox.Settings, string) {
	t.Helper()
	v := labtest.VM(t, "cg")
	vboxOnce.Do(func() {
		vboxBin = filepath.Join(guestDir, "vboxmanage-emulator")
		out, err := exec.Command("go", "build", "-o", vboxBin, "github.com/vmgate/vmgate/internal/vboxemu/cmd/vboxmanage").CombinedOutput()
		if err != nil {
			vboxErr = errors.New(string(out))
		}
	})
	if vboxErr != nil {
		t.Fatalf("building the VBoxManage emulator: %v", vboxErr)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "VBoxManage") // the emulator finds its world next to itself
	raw, err := os.ReadFile(vboxBin)
	if err != nil || os.WriteFile(bin, raw, 0o700) != nil {
		t.Fatalf("copying the emulator: %v", err)
	}
	const user, password = "vagrant", "correct horse battery"
	w := &vboxemu.World{Version: "7.1", Users: map[string]string{user: password}, VMs: []*vboxemu.Machine{{
		Name: "cg", UUID: "6d1f6a2c-0b7e-4c9e-9a51-3f0f6a8f00c9", State: "running", StateChange: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		QGASocket: v.QGASocket, QMPSocket: v.QMPSocket}}}
	if err := vboxemu.WriteWorld(filepath.Join(dir, vboxemu.WorldFile), w); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "password")
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return virtualbox.Settings{VBoxManage: bin, Username: user, PasswordFile: pw}, "cg"
}

// vboxDriver is the VirtualBox driver over the VBoxManage emulator (7.1)
// whose machine "cg" is the lab VM "cg".
func vboxDriver(t *testing.T) (hypervisor.Driver, string) {
	t.Helper()
	s, vm := vboxSettings(t)
	d, err := virtualbox.New(virtualbox.Config{VBoxManage: s.VBoxManage, Username: s.Username, PasswordFile: s.PasswordFile, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, vm
}

// TestLabRoadsConformanceNoChannel: the roads' suite on Proxmox and
// VirtualBox, through the resident helper by the agent's exec and per
// command; either road says there is no channel on the backend.
func TestLabRoadsConformanceNoChannel(t *testing.T) {
	for _, b := range []struct {
		name   string
		driver func(*testing.T) (hypervisor.Driver, string)
	}{{"proxmox", pveDriver}, {"virtualbox", vboxDriver}} {
		t.Run(b.name+"/call", func(t *testing.T) {
			d, vm := b.driver(t)
			h := New(d, &DirBinaries{Dirs: []string{guestDir}}, WithCallRoad(true))
			roadSuite(t, h, vm, Road{Kind: RoadResident, Via: ViaCall})
			if r := h.Road(vm); r.Why != NoChannelWhy || r.Jobs != ViaCall {
				t.Errorf("road of %s = %+v; want why %q, jobs through the agent's exec", vm, r, NoChannelWhy)
			}
		})
		t.Run(b.name+"/per-command", func(t *testing.T) {
			d, vm := b.driver(t)
			h := New(d, &DirBinaries{Dirs: []string{guestDir}})
			roadSuite(t, h, vm, Road{Kind: RoadPerCommand})
			if r := h.Road(vm); r.Why != NoChannelWhy || r.Jobs != ViaCall {
				t.Errorf("road of %s = %+v; want why %q, jobs through the agent's exec", vm, r, NoChannelWhy)
			}
		})
	}
}
