package qemu

import (
	"context"
	"errors"
	"fmt"

	"github.com/vmgate/vmgate/hypervisor"
)

// HelperCall implements hypervisor.HelperCaller over the VM's helper port:
// a lab VM's <lab dir>/<name>/guest.sock (made by QEMU when the lab started
// the VM with the port), a configured VM's helper socket.
func (d *Driver) HelperCall(ctx context.Context, name string, call hypervisor.HelperCall) (hypervisor.HelperReply, error) {
	vm, err := d.lookup("helper call", name)
	if err != nil {
		return hypervisor.HelperReply{}, err
	}
	if vm.helperPath == "" {
		return hypervisor.HelperReply{}, fmt.Errorf("qemu: helper call %s: %w: no helper socket is configured (give the VM a virtio-serial port org.vmgate.guest.0 and its socket as helper)", name, hypervisor.ErrNoHelperChannel)
	}
	d.watchHelper(vm)
	rep, err := d.helpers.Call(ctx, vm.helperPath, call)
	if errors.Is(err, hypervisor.ErrHelperUnavailable) {
		if gone := vm.gone(ctx, err); gone != nil {
			return rep, fmt.Errorf("qemu: helper call %s: %w (%w)", name, gone, err)
		}
	}
	if err != nil {
		return rep, fmt.Errorf("qemu: helper call %s: %w", name, err)
	}
	return rep, nil
}
