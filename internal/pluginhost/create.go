package pluginhost

import (
	"context"

	"github.com/vmgate/vmgate/hypervisor"
)

// The Supervisor's Creator: forwarded to the running plugin like the other
// capabilities (capabilities.go), with the state cache emptied around each
// call (the VM list changes). Neither call is retried on another
// plugin instance: a CreateVM that a dying plugin may have half done is
// the server's to clean up, by the lease's mark.

var _ hypervisor.Creator = (*Supervisor)(nil)

// CreateVM implements hypervisor.Creator.
func (s *Supervisor) CreateVM(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	return changing(s, ctx, func(d remote) (hypervisor.CreatedVM, error) {
		c, err := capability[hypervisor.Creator]("create", d)
		if err != nil {
			return hypervisor.CreatedVM{}, err
		}
		return c.CreateVM(ctx, req)
	})
}

// DeleteVM implements hypervisor.Creator.
func (s *Supervisor) DeleteVM(ctx context.Context, req hypervisor.DeleteRequest) error {
	_, err := changing(s, ctx, func(d remote) (struct{}, error) {
		c, err := capability[hypervisor.Creator]("delete", d)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, c.DeleteVM(ctx, req)
	})
	return err
}
