package qemu

import (
	"context"
	"fmt"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/guestnet"
)

var _ hypervisor.GuestNetworker = (*Driver)(nil)

// networkAgent is the part of a guest agent GuestNetwork needs; *qga.Client
// implements it.
type networkAgent interface {
	NetworkInterfaces(ctx context.Context) ([]qga.NetworkInterface, error)
}

// GuestNetwork asks the guest agent for its interfaces
// (guest-network-get-interfaces), cleaned as the contract says.
func (d *Driver) GuestNetwork(ctx context.Context, name string) ([]hypervisor.NetInterface, error) {
	const op = "guest network"
	vm, err := d.lookup(op, name)
	if err != nil {
		return nil, err
	}
	a, ok := d.agentOf(vm).(networkAgent)
	if !ok {
		return nil, fmt.Errorf("qemu: %s: %w: the agent client cannot list interfaces", op, hypervisor.ErrNotSupported)
	}
	ifs, err := a.NetworkInterfaces(ctx)
	if err != nil {
		return nil, d.core.Err(ctx, d.target(vm), op, err)
	}
	return guestnet.FromQGA(ifs), nil
}
