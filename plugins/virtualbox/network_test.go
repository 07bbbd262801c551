package virtualbox

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/vboxemu"
)

// The outputs below follow VBoxManageGuestProp.cpp handleEnumGuestProperty's
// format strings (6.1: "Name: %ls, value: %ls, timestamp: %lld, flags:
// %ls"; 7.x: "%-*ls = '%ls'" without timestamp and flags) and the
// properties VBoxServiceVMInfo.cpp vgsvcVMInfoWriteNetwork writes. No
// public sample of the network properties was found to copy.
const (
	enum61 = `Name: /VirtualBox/GuestInfo/Net/0/V4/IP, value: 10.0.2.15, timestamp: 1700000000000000000, flags: TRANSIENT, TRANSRESET
Name: /VirtualBox/GuestInfo/Net/0/V4/Broadcast, value: 10.0.2.255, timestamp: 1700000000000000000, flags: TRANSIENT, TRANSRESET
Name: /VirtualBox/GuestInfo/Net/0/V4/Netmask, value: 255.255.255.0, timestamp: 1700000000000000000, flags: TRANSIENT, TRANSRESET
Name: /VirtualBox/GuestInfo/Net/0/MAC, value: 080027A1B2C3, timestamp: 1700000000000000000, flags: TRANSIENT, TRANSRESET
Name: /VirtualBox/GuestInfo/Net/0/Status, value: Up, timestamp: 1700000000000000000, flags: TRANSIENT, TRANSRESET
Name: /VirtualBox/GuestInfo/Net/0/Name, value: eth0, timestamp: 1700000000000000000, flags: TRANSIENT, TRANSRESET
Name: /VirtualBox/GuestInfo/Net/Count, value: 1, timestamp: 1700000000000000000, flags: 
`
	enum7x = `/VirtualBox/GuestInfo/Net/0/MAC           = '080027A1B2C3'
/VirtualBox/GuestInfo/Net/0/Name          = 'eth0'
/VirtualBox/GuestInfo/Net/0/Status        = 'Up'
/VirtualBox/GuestInfo/Net/0/V4/Broadcast  = '10.0.2.255'
/VirtualBox/GuestInfo/Net/0/V4/IP         = '10.0.2.15'
/VirtualBox/GuestInfo/Net/0/V4/Netmask    = '255.255.255.0'
/VirtualBox/GuestInfo/Net/Count           = '1'
`
)

var eth0 = hypervisor.NetInterface{Name: "eth0", MAC: "08:00:27:a1:b2:c3",
	Addresses: []hypervisor.IPAddress{{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}}}

// netTable builds 7.x output from name/value pairs.
func netTable(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, "%-40s = '%s'\n", "/VirtualBox/GuestInfo/Net/"+kv[i], kv[i+1])
	}
	return b.String()
}

// many256 is a guest that publishes more interfaces than are kept.
func many256() string {
	kv := []string{"Count", fmt.Sprint(hypervisor.MaxNetInterfaces + 10)}
	for i := range hypervisor.MaxNetInterfaces + 10 {
		kv = append(kv, fmt.Sprintf("%d/Name", i), fmt.Sprintf("if%d", i))
	}
	return netTable(kv...)
}

func TestParseGuestNetwork(t *testing.T) {
	many := &strings.Builder{}
	for i := range maxNetProps + 1 {
		fmt.Fprintf(many, "/VirtualBox/GuestInfo/Net/%d/Name = 'x'\n", i)
	}
	tests := []struct {
		name    string
		out     string
		table   bool
		want    []hypervisor.NetInterface
		wantErr bool
	}{
		{"6.1", enum61, false, []hypervisor.NetInterface{eth0}, false},
		{"7.x", enum7x, true, []hypervisor.NetInterface{eth0}, false},
		{"nothing", "No properties found.\n", true, []hypervisor.NetInterface{}, false},
		{"count zero", netTable("Count", "0"), true, []hypervisor.NetInterface{}, false},
		{"stale entries above Count", enum7x + netTable("1/Name", "eth9", "1/V4/IP", "192.0.2.9", "1/V4/Netmask", "255.0.0.0"), true,
			[]hypervisor.NetInterface{eth0}, false},
		{"count not a number", netTable("Count", "lots", "0/Name", "eth0"), true, []hypervisor.NetInterface{}, false},
		{"negative count", netTable("Count", "-3", "0/Name", "eth0"), true, []hypervisor.NetInterface{}, false},
		{"huge count, one interface", netTable("Count", "99999999999", "0/Name", "eth0"), true,
			[]hypervisor.NetInterface{{Name: "eth0", Addresses: []hypervisor.IPAddress{}}}, false},
		{"more interfaces than the cap", many256(), true, nil, false}, // checked below
		{"no name", netTable("Count", "1", "0/V4/IP", "10.0.2.15", "0/V4/Netmask", "255.255.255.0"), true,
			[]hypervisor.NetInterface{{Name: "net0", Addresses: []hypervisor.IPAddress{{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}}}}, false},
		{"mask not a prefix", netTable("Count", "1", "0/Name", "eth0", "0/V4/IP", "10.0.2.15", "0/V4/Netmask", "255.0.255.0"), true,
			[]hypervisor.NetInterface{{Name: "eth0", Addresses: []hypervisor.IPAddress{}}}, false},
		{"address not an address", netTable("Count", "1", "0/Name", "eth0", "0/V4/IP", "$(reboot)", "0/V4/Netmask", "255.255.255.0"), true,
			[]hypervisor.NetInterface{{Name: "eth0", Addresses: []hypervisor.IPAddress{}}}, false},
		{"bad MAC, zero MAC", netTable("Count", "2", "0/Name", "a", "0/MAC", "ZZ0027A1B2C3", "1/Name", "b", "1/MAC", "000000000000"), true,
			[]hypervisor.NetInterface{{Name: "a", Addresses: []hypervisor.IPAddress{}}, {Name: "b", Addresses: []hypervisor.IPAddress{}}}, false},
		{"quote and text in the name", netTable("Count", "1", "0/Name", "it's = 'x'"), true,
			[]hypervisor.NetInterface{{Name: "it's = 'x'", Addresses: []hypervisor.IPAddress{}}}, false},
		{"control characters in the name", netTable("Count", "1", "0/Name", "e\x1b[31mth0\x07"), true,
			[]hypervisor.NetInterface{{Name: "e[31mth0", Addresses: []hypervisor.IPAddress{}}}, false},
		{"line break in a value", "/VirtualBox/GuestInfo/Net/0/Name = 'a\nb'\n" + netTable("Count", "1", "0/V4/IP", "10.0.2.15", "0/V4/Netmask", "255.255.255.0"), true,
			[]hypervisor.NetInterface{{Name: "net0", Addresses: []hypervisor.IPAddress{{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}}}}, false},
		{"other properties ignored", "/VirtualBox/GuestInfo/OS/Product = 'Linux'\n" + enum7x, true, []hypervisor.NetInterface{eth0}, false},
		{"6.1 value holding the separator", strings.Replace(enum61, "value: eth0,", "value: eth0, timestamp: 5,", 1), false,
			[]hypervisor.NetInterface{{Name: "eth0, timestamp: 5", MAC: "08:00:27:a1:b2:c3",
				Addresses: []hypervisor.IPAddress{{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}}}}, false},
		{"garbage", "\x00\xff\n== ''\nName: \n", true, []hypervisor.NetInterface{}, false},
		{"too many properties", many.String(), true, nil, true},
	}
	for _, tt := range tests {
		props, err := ParseGuestProperties([]byte(tt.out), tt.table)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseGuestProperties(%s) error %v; want error %v", tt.name, err, tt.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		got := hypervisor.CleanNetInterfaces(NetInterfaces(props))
		if tt.want == nil {
			if len(got) != hypervisor.MaxNetInterfaces || got[0].Name != "if0" || got[len(got)-1].Name != fmt.Sprintf("if%d", hypervisor.MaxNetInterfaces-1) {
				t.Errorf("NetInterfaces(%s) = %d interfaces; want the first %d", tt.name, len(got), hypervisor.MaxNetInterfaces)
			}
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("NetInterfaces(%s) = %+v; want %+v", tt.name, got, tt.want)
		}
	}
}

// TestGuestNetworkErrors: a VM that is off, unknown or hostile gets a
// clear error; names that look like options never reach VBoxManage.
func TestGuestNetworkErrors(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			e := newEmulator(t, v, []*vboxemu.Machine{machine("off", uuidOff, "", "")})
			d := e.driver(t)
			ctx := ctxT(t)
			if _, err := d.GuestNetwork(ctx, "off"); !errors.Is(err, hypervisor.ErrVMNotRunning) || !strings.Contains(err.Error(), "start the VM") {
				t.Errorf("GuestNetwork(off) = %v; want %v saying what to do", err, hypervisor.ErrVMNotRunning)
			}
			if _, err := d.GuestNetwork(ctx, "nope"); !errors.Is(err, hypervisor.ErrUnknownVM) {
				t.Errorf("GuestNetwork(nope) = %v; want %v", err, hypervisor.ErrUnknownVM)
			}
			e.resetLog()
			for _, name := range []string{"--patterns", "-x", "a\nb", ""} {
				if _, err := d.GuestNetwork(ctx, name); !errors.Is(err, hypervisor.ErrInvalidArgument) {
					t.Errorf("GuestNetwork(%q) = %v; want %v", name, err, hypervisor.ErrInvalidArgument)
				}
			}
			if calls := e.calls(t); len(calls) != 0 {
				t.Errorf("hostile names ran VBoxManage: %v", calls)
			}
		})
	}
}
