package hypervisortest

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/hypervisor"
)

// ipv4View is what VirtualBox's Additions would publish of the local
// driver's interfaces: those with an IPv4 address, loopback left out, the
// first IPv4 address each.
func ipv4View(ctx context.Context, d *localDriver, vm string) ([]hypervisor.NetInterface, error) {
	ifs, err := d.GuestNetwork(ctx, vm)
	var out []hypervisor.NetInterface
	for _, ifc := range ifs {
		i := slices.IndexFunc(ifc.Addresses, func(a hypervisor.IPAddress) bool { return a.Family == "ipv4" })
		if ifc.Name == "lo" || i < 0 {
			continue
		}
		ifc.Addresses = []hypervisor.IPAddress{ifc.Addresses[i]}
		out = append(out, ifc)
	}
	return out, err
}

// TestIPv4OnlyNetwork: with Harness.NetworkIPv4Only, the Network check
// passes a driver that reports exactly the non-loopback IPv4 interfaces
// and fails one that reports more, less or other addresses.
func TestIPv4OnlyNetwork(t *testing.T) {
	tests := []struct {
		name string
		view func(context.Context, *localDriver, string) ([]hypervisor.NetInterface, error)
		fail bool
	}{
		{"the IPv4 view", ipv4View, false},
		{"every interface, loopback included", func(ctx context.Context, d *localDriver, vm string) ([]hypervisor.NetInterface, error) {
			return d.GuestNetwork(ctx, vm)
		}, true},
		{"nothing", func(context.Context, *localDriver, string) ([]hypervisor.NetInterface, error) {
			return []hypervisor.NetInterface{}, nil
		}, true},
		{"another address", func(ctx context.Context, d *localDriver, vm string) ([]hypervisor.NetInterface, error) {
			ifs, err := ipv4View(ctx, d, vm)
			for i := range ifs {
				ifs[i].Addresses[0].Address = "198.51.100.77"
			}
			return ifs, err
		}, true},
		{"another MAC", func(ctx context.Context, d *localDriver, vm string) ([]hypervisor.NetInterface, error) {
			ifs, err := ipv4View(ctx, d, vm)
			for i := range ifs {
				ifs[i].MAC = "02:00:00:00:00:01"
			}
			return ifs, err
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newLocalDriver(t)
			h := d.harness(t)
			f := delegate(d)
			f.GuestNetworkFunc = func(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) { return tt.view(ctx, d, vm) }
			h.Driver, h.NetworkIPv4Only = f, true
			if r := record(checkGuestNetwork, h); r.Failed() != tt.fail || r.Skipped() {
				t.Errorf("checkGuestNetwork(IPv4 only, %s) failed %v, skipped %v; want failed %v. Log:\n%s",
					tt.name, r.Failed(), r.Skipped(), tt.fail, strings.Join(r.logs, "\n"))
			}
		})
	}
}

// TestDeclaredCreate: the Create capability is declared exactly too.
func TestDeclaredCreate(t *testing.T) {
	d := newLocalDriver(t)
	creator := &Fake{StatusFunc: d.Status, CreateVMFunc: func(context.Context, hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
		return hypervisor.CreatedVM{}, nil
	}}
	tests := []struct {
		name     string
		driver   hypervisor.Driver
		declared hypervisor.Capabilities
		fail     bool
	}{
		{"creator, declared", creator, hypervisor.Capabilities{Create: true}, false},
		{"creator, not declared", creator, hypervisor.Capabilities{}, true},
		{"no creator, declared", &Fake{StatusFunc: d.Status}, hypervisor.Capabilities{Create: true}, true},
	}
	for _, tt := range tests {
		h := Harness{Driver: tt.driver, VM: d.vm, Capabilities: tt.declared}
		if r := record(checkDeclaredCapabilities, h); r.Failed() != tt.fail || r.Skipped() {
			t.Errorf("checkDeclaredCapabilities(%s) failed %v, skipped %v; want failed %v", tt.name, r.Failed(), r.Skipped(), tt.fail)
		}
	}
}
