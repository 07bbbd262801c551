package virtualbox

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/hypervisor"
)

// The guest's network interfaces come from the guest properties the Guest
// Additions publish (VBoxServiceVMInfo.cpp vgsvcVMInfoWriteNetwork):
// /VirtualBox/GuestInfo/Net/Count, then for each N below it N/V4/IP,
// N/V4/Broadcast, N/V4/Netmask, N/MAC (12 hex digits), N/Status (Up or
// Down) and N/Name. On Linux and the BSDs the Additions list the
// interfaces SIOCGIFCONF returns: those with an IPv4 address, one address
// each, the loopback left out; there is no IPv6. Their stale-entry cleanup
// is compiled out (#if 0), so entries at or above Count may be left from
// an earlier boot: only those below Count are read.
//
// The properties are the guest's word: the guest can write them, so they
// are parsed as untrusted text and cleaned (hypervisor.CleanNetInterfaces).

var _ hypervisor.GuestNetworker = (*Driver)(nil)

// netPattern is the guest property pattern of the network properties.
const netPattern = "/VirtualBox/GuestInfo/Net/*"

// maxNetProps bounds how many property lines are read (8 per interface).
const maxNetProps = 16 * hypervisor.MaxNetInterfaces

// GuestNetwork enumerates the VM's network guest properties.
func (d *Driver) GuestNetwork(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) {
	const op = "guest network"
	if err := d.checkName(op, vm); err != nil {
		return nil, err
	}
	ver, err := d.version(ctx)
	if err != nil {
		return nil, err
	}
	r, err := d.vbox(ctx, enumerateArgs(ver, vm)...)
	if err != nil {
		return nil, ctxError(op, err)
	}
	if r.code != 0 {
		return nil, vboxError(op, r)
	}
	props, err := ParseGuestProperties(r.stdout, ver.atLeast(7, 0))
	if err != nil {
		return nil, fmt.Errorf("virtualbox: %s: %w: %w", op, hypervisor.ErrBackend, err)
	}
	if _, ok := props["/VirtualBox/GuestInfo/Net/Count"]; !ok {
		return nil, d.noNetworkProps(ctx, op, vm)
	}
	return hypervisor.CleanNetInterfaces(NetInterfaces(props)), nil
}

// enumerateArgs builds guestproperty enumerate for the network properties.
// 6.1 (VBoxManageGuestProp.cpp handleEnumGuestProperty) takes the VM then
// "--patterns" and the patterns, and prints "Name: ..., value: ...,
// timestamp: ..., flags: ..." lines; 7.0 and 7.1 print a table ("name =
// 'value'") that --no-timestamp and --no-flags end after the value.
func enumerateArgs(ver vboxVersion, vm string) []string {
	if ver.atLeast(7, 0) {
		return []string{"guestproperty", "enumerate", vm, "--no-timestamp", "--no-flags", "--patterns", netPattern}
	}
	return []string{"guestproperty", "enumerate", vm, "--patterns", netPattern}
}

// noNetworkProps explains why the Additions published no network
// properties: the VM is not running, or its Additions do not (yet) run.
func (d *Driver) noNetworkProps(ctx context.Context, op, vm string) error {
	mi, err := d.showVMInfo(ctx, op, vm)
	if err != nil {
		return err
	}
	if stateOf(mi.State) != hypervisor.StateRunning {
		return fmt.Errorf("virtualbox: %s: %w: VMState %s; start the VM first", op, hypervisor.ErrVMNotRunning, mi.State)
	}
	return fmt.Errorf("virtualbox: %s: %w: the Guest Additions have published no network properties (run level %d); wait until VBoxService runs in the guest, or install the Guest Additions",
		op, hypervisor.ErrAgentUnavailable, mi.RunLevel)
}

// ParseGuestProperties parses `guestproperty enumerate` output: the 7.x
// table ("name = 'value'" lines, without timestamp and flags) when table
// is true, else 6.1's "Name: n, value: v, timestamp: t, flags: f" lines.
// "No properties found." is an empty map. Only /VirtualBox/GuestInfo/Net/
// properties are kept, at most maxNetProps; lines that do not parse are
// skipped (a value may hold a line break, which splits it), so a hostile
// value cannot make the listing fail.
func ParseGuestProperties(out []byte, table bool) (map[string]string, error) {
	out = stripWrapperWarnings(out)
	props := map[string]string{}
	if bytes.Equal(bytes.TrimSpace(out), []byte("No properties found.")) {
		return props, nil
	}
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimRight(line, "\r")
		name, value, ok := parsePropLine(line, table)
		if !ok || !strings.HasPrefix(name, "/VirtualBox/GuestInfo/Net/") {
			continue
		}
		if len(props) == maxNetProps {
			return nil, fmt.Errorf("more than %d network guest properties", maxNetProps)
		}
		if _, dup := props[name]; !dup {
			props[name] = value
		}
	}
	return props, nil
}

// parsePropLine reads one property line. The table line is
// RTPrintf("%-*ls = '%ls'"): the name padded with spaces, " = '", the
// value, "'". The old line's value runs to the last ", timestamp: ".
func parsePropLine(line string, table bool) (string, string, bool) {
	if table {
		name, rest, ok := strings.Cut(line, " = '")
		if !ok || !strings.HasSuffix(rest, "'") {
			return "", "", false
		}
		return strings.TrimRight(name, " "), rest[:len(rest)-1], true
	}
	rest, ok := strings.CutPrefix(line, "Name: ")
	if !ok {
		return "", "", false
	}
	name, rest, ok := strings.Cut(rest, ", value: ")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, ", timestamp: ")
	if i < 0 {
		return "", "", false
	}
	return name, rest[:i], true
}

// NetInterfaces turns the network properties into interfaces: Net/0 to
// Net/Count-1 (Count capped at hypervisor.MaxNetInterfaces; an index
// with no name, MAC nor address is skipped), each with its
// Name (or "net<N>" when the Additions wrote none: they skip a name that
// is not UTF-8), its MAC and its IPv4 address with the netmask's prefix
// (an address whose netmask is not a prefix is left out).
func NetInterfaces(props map[string]string) []hypervisor.NetInterface {
	count, err := strconv.Atoi(strings.TrimSpace(props["/VirtualBox/GuestInfo/Net/Count"]))
	if err != nil || count < 0 {
		return []hypervisor.NetInterface{}
	}
	count = min(count, hypervisor.MaxNetInterfaces)
	out := make([]hypervisor.NetInterface, 0, count)
	for i := range count {
		p := "/VirtualBox/GuestInfo/Net/" + strconv.Itoa(i) + "/"
		if props[p+"Name"] == "" && props[p+"MAC"] == "" && props[p+"V4/IP"] == "" {
			continue // nothing published (a Count larger than the list)
		}
		ifc := hypervisor.NetInterface{Name: props[p+"Name"], MAC: macOf(props[p+"MAC"]), Addresses: []hypervisor.IPAddress{}}
		if ifc.Name == "" {
			ifc.Name = "net" + strconv.Itoa(i)
		}
		if ip := props[p+"V4/IP"]; ip != "" {
			if prefix, ok := prefixOf(props[p+"V4/Netmask"]); ok {
				ifc.Addresses = append(ifc.Addresses, hypervisor.IPAddress{Family: "ipv4", Address: ip, Prefix: prefix})
			}
		}
		out = append(out, ifc)
	}
	return out
}

// macOf turns the Additions' "%02X%02X%02X%02X%02X%02X" into
// colon-separated form; anything else is left for CleanNetInterfaces to
// drop. An all-zero MAC (the Additions' "unknown") is none.
func macOf(s string) string {
	if len(s) != 12 || s == "000000000000" {
		return ""
	}
	var b strings.Builder
	for i := 0; i < 12; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(s[i : i+2])
	}
	return b.String()
}

// prefixOf returns the prefix length of a dotted IPv4 netmask.
func prefixOf(mask string) (int, bool) {
	ip := net.ParseIP(mask).To4()
	if ip == nil {
		return 0, false
	}
	ones, bits := net.IPMask(ip).Size()
	if bits == 0 {
		return 0, false // not a prefix mask
	}
	return ones, true
}
