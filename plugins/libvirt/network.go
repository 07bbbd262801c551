package libvirt

import (
	"context"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/guestnet"
)

var _ hypervisor.GuestNetworker = (*Driver)(nil)

// GuestNetwork asks the guest agent, through libvirt, for the guest's
// interfaces (guest-network-get-interfaces: libvirt's own
// DomainInterfaceAddresses drops the counters), cleaned as the contract says.
func (d *Driver) GuestNetwork(ctx context.Context, name string) ([]hypervisor.NetInterface, error) {
	const op = "guest network"
	s, err := d.lookup(ctx, op, name)
	if err != nil {
		return nil, err
	}
	ifs, err := s.agent(d).NetworkInterfaces(ctx)
	if err != nil {
		return nil, d.core.Err(ctx, d.target(s), op, err)
	}
	return guestnet.FromQGA(ifs), nil
}
