package hypervisortest

import (
	"context"

	"github.com/vmgate/vmgate/hypervisor"
)

var _ hypervisor.Creator = (*Fake)(nil)

// CreateVM calls CreateVMFunc.
func (f *Fake) CreateVM(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	if f.CreateVMFunc == nil {
		return hypervisor.CreatedVM{}, unset("CreateVM")
	}
	return f.CreateVMFunc(ctx, req)
}

// DeleteVM calls DeleteVMFunc.
func (f *Fake) DeleteVM(ctx context.Context, req hypervisor.DeleteRequest) error {
	if f.DeleteVMFunc == nil {
		return unset("DeleteVM")
	}
	return f.DeleteVMFunc(ctx, req)
}
