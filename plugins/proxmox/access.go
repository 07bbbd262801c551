package proxmox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// Privilege is one privilege the driver's calls need, with the privileges
// that stand in for it and what it is for.
type Privilege struct {
	Name string
	// Or lists privileges that satisfy the same checks.
	Or []string
	// For says which calls need it.
	For string
}

// Privileges lists what the API token needs on the VMs (/vms or
// /vms/VMID), by Proxmox VE major version. The agent endpoints check
// VM.Monitor up to PVE 8 and the VM.GuestAgent.* privileges since PVE 9.0
// (qemu-server 9.0.3, commit b92a40ce): exec and exec-status need
// VM.GuestAgent.Unrestricted; ping, info and network-get-interfaces
// VM.GuestAgent.Audit, file-read
// VM.GuestAgent.FileRead and file-write VM.GuestAgent.FileWrite, each or
// VM.GuestAgent.Unrestricted.
func Privileges(major int) []Privilege {
	p := []Privilege{
		{Name: "VM.Audit", For: "listing VMs, their status and vm_metrics' hypervisor figures (status/current)"},
		{Name: "VM.PowerMgmt", For: "vm_power"},
		{Name: "VM.Snapshot", For: "snapshot_create and snapshot_delete"},
		{Name: "VM.Snapshot.Rollback", Or: []string{"VM.Snapshot"}, For: "snapshot_revert"},
		{Name: "VM.Console", For: "the screen, the keyboard and the serial console (sendkey, vncproxy, termproxy, vncwebsocket)"},
	}
	if major < 9 {
		return append(p, Privilege{Name: "VM.Monitor", For: "the guest agent (agent status, exec, file read and write, vm_network)"})
	}
	return append(p,
		Privilege{Name: "VM.GuestAgent.Audit", Or: []string{"VM.GuestAgent.Unrestricted"}, For: "the guest agent's status and vm_network (agent/network-get-interfaces)"},
		Privilege{Name: "VM.GuestAgent.Unrestricted", For: "exec, vm_file_read and vm_file_write (both run through vmgate-guest), pushing vmgate-guest"},
		Privilege{Name: "VM.GuestAgent.FileRead", Or: []string{"VM.GuestAgent.Unrestricted"}, For: "the guest agent's file-read (no tool needs it alone since the file tools run through vmgate-guest)"},
		Privilege{Name: "VM.GuestAgent.FileWrite", Or: []string{"VM.GuestAgent.Unrestricted"}, For: "the guest agent's file-write (no tool needs it alone since the file tools run through vmgate-guest)"},
	)
}

// pveVersionRE reads GET /version's "version" (pve-manager's, a.b.c).
var pveVersionRE = regexp.MustCompile(`^(\d+)\.(\d+)(?:\.(\d+))?`)

// vmPathRE is an ACL path the VMs' privileges can come from.
var vmPathRE = regexp.MustCompile(`^/vms/[1-9][0-9]{2,8}$`)

// accessTimeout bounds Open's version and privilege check.
const accessTimeout = 30 * time.Second

// Open builds a Driver (New) and checks the API at once: it reads the
// Proxmox VE version (GET /version) and the token's privileges (GET
// /access/permissions). A refused token, or one without VM.Audit on any VM
// (it would see no VM), is an error; other missing privileges are logged,
// named with the calls that will fail. An API that does not answer, or
// answers the checks otherwise, is logged too: the checks then happen call
// by call.
func Open(ctx context.Context, cfg Config) (*Driver, error) {
	d, err := New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, accessTimeout)
	defer cancel()
	if err := d.CheckAccess(ctx); err != nil {
		if errors.Is(err, ErrAuth) {
			d.Close()
			return nil, err
		}
		d.log.Warn("cannot check the Proxmox API token's privileges now; calls will tell", "err", err)
	}
	return d, nil
}

// CheckAccess reads the version and the token's privileges (see Open) and
// remembers the version.
func (d *Driver) CheckAccess(ctx context.Context) error {
	var ver struct {
		Version string `json:"version"`
		Release string `json:"release"`
	}
	if err := d.api.do(ctx, "GET", "/version", nil, nil, &ver); err != nil {
		return d.classify("version", err)
	}
	m := pveVersionRE.FindStringSubmatch(ver.Version)
	if m == nil {
		return fmt.Errorf("proxmox: version: %w: %q is not a Proxmox VE version", hypervisor.ErrBackend, ver.Version)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	d.mu.Lock()
	d.major, d.minor = major, minor
	d.mu.Unlock()
	var perms map[string]map[string]flexBool
	if err := d.api.do(ctx, "GET", "/access/permissions", nil, nil, &perms); err != nil {
		return d.classify("access permissions", err)
	}
	missing := MissingPrivileges(major, perms)
	if len(missing) == 0 {
		d.log.Info("Proxmox VE API ready", "version", ver.Version)
		return nil
	}
	var names []string
	for _, p := range missing {
		if p.Name == "VM.Audit" {
			return fmt.Errorf("proxmox: access: %w: %w: the API token %s has no VM.Audit on /vms or any VM, so it sees no VM; grant it (for example the PVEAuditor role) on /vms",
				hypervisor.ErrBackend, ErrAuth, d.tokenID)
		}
		names = append(names, p.Name+" ("+p.For+")")
	}
	d.log.Warn("the API token lacks privileges; these calls will fail", "token", d.tokenID,
		"version", ver.Version, "missing", strings.Join(names, ", "))
	return nil
}

// MissingPrivileges checks GET /access/permissions's answer (path ->
// privilege -> propagate) against Privileges(major): a privilege counts
// when the token holds it (or a stand-in) on a VM, or propagated on / or
// /vms. A token limited to some VMs passes when it holds them on one.
func MissingPrivileges(major int, perms map[string]map[string]flexBool) []Privilege {
	has := func(name string) bool {
		for path, privs := range perms {
			prop, ok := privs[name]
			if !ok {
				continue
			}
			if vmPathRE.MatchString(path) || ((path == "/" || path == "/vms") && bool(prop)) {
				return true
			}
		}
		return false
	}
	var missing []Privilege
	for _, p := range Privileges(major) {
		ok := has(p.Name)
		for _, alt := range p.Or {
			ok = ok || has(alt)
		}
		if !ok {
			missing = append(missing, p)
		}
	}
	return missing
}

// pveMajor is the major version CheckAccess found, 0 when unknown.
func (d *Driver) pveMajor() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.major
}
