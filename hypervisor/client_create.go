package hypervisor

import (
	"context"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// The host side of the Creator capability (see client_caps.go).

var _ Creator = (*client)(nil)

func hasCreate(k Capabilities) bool { return k.Create }

func (c *client) CreateVM(ctx context.Context, req CreateRequest) (CreatedVM, error) {
	if err := c.need(ctx, "create", "VM creation", hasCreate); err != nil {
		return CreatedVM{}, err
	}
	resp, err := c.rpc.CreateVM(ctx, createRequestToPB(req))
	if err != nil {
		return CreatedVM{}, c.fromStatus(ctx, "create", err)
	}
	return CreatedVM{Name: resp.GetName()}, nil
}

func (c *client) DeleteVM(ctx context.Context, req DeleteRequest) error {
	if err := c.need(ctx, "delete", "VM creation", hasCreate); err != nil {
		return err
	}
	if _, err := c.rpc.DeleteVM(ctx, &pb.DeleteVMRequest{Name: req.Name, Mark: req.Mark}); err != nil {
		return c.fromStatus(ctx, "delete", err)
	}
	return nil
}
