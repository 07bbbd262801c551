package pveemu

import (
	"fmt"
	"strconv"
	"strings"
)

// Version says which Proxmox VE the emulator is: the pve-manager version
// GET /version reports and the versions of the packages whose behaviour
// differs between releases. The feature predicates below name the upstream
// commit that changed each behaviour.
type Version struct {
	// Manager is the pve-manager version (GET /version "version").
	Manager string
	// Release is the point release, x.y (GET /version "release").
	Release string
	// RepoID is the pve-manager commit the version was built from (16 hex digits).
	RepoID string
	// QemuServer is the qemu-server version: the VM, agent and task endpoints.
	QemuServer string
}

// The versions the emulator is tested as. Each pairs a pve-manager release
// with a qemu-server release of the same time (pve-manager's debian/control
// requires at least that qemu-server), read from the upstream changelogs:
//
//   - PVE84: pve-manager 8.4.21 (commit 2606ac85, stable-bookworm), qemu-server
//     8.4.10 (commit 5ccd363e, stable-bookworm): VM.Monitor for every agent
//     endpoint, "qmp command" wording, file-read without count.
//   - PVE90: pve-manager 9.0.11 (commit 3bf5476b), qemu-server 9.0.23 (commit
//     78e5d8a8): the VM.GuestAgent.* privileges, still "qmp command".
//   - PVE91: pve-manager 9.1.2 (commit 9d436f37), qemu-server 9.1.1 (commit
//     9a6a59d9): "qga command", file-read still without count.
//   - PVE92: pve-manager 9.2.11 (commit f6997e69), qemu-server 9.2.6 (commit
//     e6352be6): file-read with count, offset and decode.
func PVE84() Version {
	return Version{Manager: "8.4.21", Release: "8.4", RepoID: "2606ac850d46da29", QemuServer: "8.4.10"}
}

func PVE90() Version {
	return Version{Manager: "9.0.11", Release: "9.0", RepoID: "3bf5476b8a4699e2", QemuServer: "9.0.23"}
}

func PVE91() Version {
	return Version{Manager: "9.1.2", Release: "9.1", RepoID: "9d436f37a0ac4172", QemuServer: "9.1.1"}
}

func PVE92() Version {
	return Version{Manager: "9.2.11", Release: "9.2", RepoID: "f6997e698c7933ea", QemuServer: "9.2.6"}
}

// Versions lists the presets, oldest first.
func Versions() []Version { return []Version{PVE84(), PVE90(), PVE91(), PVE92()} }

// String is the release, for test names.
func (v Version) String() string { return "pve" + strings.ReplaceAll(v.Release, ".", "") }

// Validate checks that every field is set and the versions parse.
func (v Version) Validate() error {
	for name, s := range map[string]string{"manager": v.Manager, "qemu-server": v.QemuServer} {
		if _, err := parseVersion(s); err != nil {
			return fmt.Errorf("pveemu: version: %s: %w", name, err)
		}
	}
	if v.Release == "" || !strings.HasPrefix(v.Manager, v.Release+".") {
		return fmt.Errorf("pveemu: version: release %q does not match manager %q", v.Release, v.Manager)
	}
	if len(v.RepoID) != 16 {
		return fmt.Errorf("pveemu: version: repoid %q is not 16 hex digits", v.RepoID)
	}
	return nil
}

// parseVersion reads "a.b.c" (Debian revisions such as 9.1.4.1 keep their
// fourth part).
func parseVersion(s string) ([]int, error) {
	parts := strings.Split(s, ".")
	if len(parts) < 3 {
		return nil, fmt.Errorf("%q is not a.b.c", s)
	}
	out := make([]int, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a.b.c", s)
		}
		out[i] = n
	}
	return out, nil
}

// atLeast reports whether version s is at least want (both a.b.c).
func atLeast(s, want string) bool {
	a, err1 := parseVersion(s)
	b, err2 := parseVersion(want)
	if err1 != nil || err2 != nil {
		return false
	}
	for i := range max(len(a), len(b)) {
		var x, y int
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			return x > y
		}
	}
	return true
}

// GuestAgentPrivileges: the agent endpoints check VM.GuestAgent.Audit,
// .Unrestricted, .FileRead and .FileWrite (and VM.PowerMgmt for the power
// commands) instead of VM.Monitor. qemu-server commit b92a40ce "api: agent:
// use more specific guest agent privileges" (2025-07-17), first released in
// 9.0.3; not on stable-bookworm (8.x).
func (v Version) GuestAgentPrivileges() bool { return atLeast(v.QemuServer, "9.0.3") }

// QGAPeerWording: QMPClient's failures of guest agent commands read "VM N qga
// command 'X' failed - ..." instead of "VM N qmp command ...". qemu-server
// commit 9f619716 "qmp client: better abstract peer in preparation for
// qemu-storage-daemon" (src/PVE/QMPClient.pm, sub cmd), first released in
// 9.0.26.
func (v Version) QGAPeerWording() bool { return atLeast(v.QemuServer, "9.0.26") }

// FileReadCount: agent/file-read takes count, offset and decode.
// qemu-server commits 5c623f82, a1397a11 and ec268ede (2026-02-26), first
// released in 9.1.5.
func (v Version) FileReadCount() bool { return atLeast(v.QemuServer, "9.1.5") }

// JSONErrorMessage: error answers carry "message" in the JSON body.
// pve-http-server commit 9a2112e "fix #6503: return api handler errors in the
// json body", released in 5.2.0, which both PVE 8.4 and 9.x ship.
func (v Version) JSONErrorMessage() bool { return true }

// MemHost: vm status/current reports memhost, the host's view of the VM's
// memory (the PSS of the processes of its cgroup scope), and mem is no
// longer derived from the QEMU process's rss/vsize. qemu-server commit
// d426de6c "vmstatus: add memhost for host view of vm mem consumption"
// (src/PVE/QemuServer.pm, vmstatus), first released in 9.0.11.
func (v Version) MemHost() bool { return atLeast(v.QemuServer, "9.0.11") }
