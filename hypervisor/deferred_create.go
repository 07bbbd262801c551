package hypervisor

import (
	"context"
	"fmt"
)

// Deferred's Creator: forwarded to the built driver when it has the
// capability, ErrNotSupported (ErrNotConfigured before Configure) otherwise.

var _ Creator = (*Deferred)(nil)

func (f *Deferred) creator(op string) (Creator, error) {
	d, err := f.driver()
	if err != nil {
		return nil, err
	}
	c, ok := AsCreator(d)
	if !ok {
		return nil, fmt.Errorf("%s: %w: this backend has no VM creation", op, ErrNotSupported)
	}
	return c, nil
}

// CreateVM implements Creator.
func (f *Deferred) CreateVM(ctx context.Context, req CreateRequest) (CreatedVM, error) {
	c, err := f.creator("create")
	if err != nil {
		return CreatedVM{}, err
	}
	return c.CreateVM(ctx, req)
}

// DeleteVM implements Creator.
func (f *Deferred) DeleteVM(ctx context.Context, req DeleteRequest) error {
	c, err := f.creator("delete")
	if err != nil {
		return err
	}
	return c.DeleteVM(ctx, req)
}
