package proxmox

import (
	"testing"

	"github.com/vmgate/vmgate/internal/pveemu"
)

// The driver's tests run against internal/pveemu, the Proxmox VE emulator
// rebuilt from upstream source, with lab VMs behind it.

const (
	emuTokenID = "vmgate@pve!ci"
	emuSecret  = "5b0c3b1e-8f8d-4c55-9a3e-0d6c2b7f4a11"
)

// driverPrivs is every privilege the driver needs on version v's VMs.
func driverPrivs(v pveemu.Version) []string {
	var out []string
	major := 9
	if !v.GuestAgentPrivileges() {
		major = 8
	}
	for _, p := range Privileges(major) {
		out = append(out, p.Name)
	}
	return out
}

// testEmu is an emulator and a driver Config for its token.
type testEmu struct {
	*pveemu.Emulator
	cfg Config
}

// startEmu starts an emulator of version v with nodes pve and pve-2, the
// token emuTokenID holding acl (nil: driverPrivs on /vms, propagated) and
// the VMs given.
func startEmu(t testing.TB, v pveemu.Version, acl []pveemu.ACL, vms ...pveemu.VMSpec) *testEmu {
	t.Helper()
	e := pveemu.Start(t, pveemu.Options{Version: v, Nodes: []string{"pve", "pve-2"}})
	if acl == nil {
		acl = []pveemu.ACL{{Path: "/vms", Privs: driverPrivs(v), Propagate: true}}
	}
	if err := e.AddToken(pveemu.Token{ID: emuTokenID, Secret: emuSecret, ACL: acl}); err != nil {
		t.Fatal(err)
	}
	for _, s := range vms {
		if err := e.AddVM(s); err != nil {
			t.Fatal(err)
		}
	}
	ca, secret := e.ClientFiles(t, emuSecret)
	return &testEmu{Emulator: e, cfg: Config{URL: e.URL(), TokenID: emuTokenID, TokenSecretFile: secret, CAFile: ca}}
}
