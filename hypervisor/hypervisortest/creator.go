package hypervisortest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/vmgate/vmgate/hypervisor"
)

// Creator is a hypervisor.Creator whose behaviour a test sets: by default
// it keeps the VMs it made by name with their marks, and deletes only a VM
// whose mark matches (ErrUnknownVM for none, ErrNotCreated for another
// mark). It records every deletion it was asked for. Safe for concurrent
// use; CreateFunc and DeleteFunc are set while no call is in flight.
type Creator struct {
	// CreateFunc and DeleteFunc, when set, answer instead.
	CreateFunc func(req hypervisor.CreateRequest) (hypervisor.CreatedVM, error)
	DeleteFunc func(req hypervisor.DeleteRequest) error

	mu      sync.Mutex // guards vms and deletes
	vms     map[string]string
	deletes []hypervisor.DeleteRequest
}

var _ hypervisor.Creator = (*Creator)(nil)

// CreateVM makes req's VM (or asks CreateFunc).
func (f *Creator) CreateVM(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	if f.CreateFunc != nil {
		return f.CreateFunc(req)
	}
	f.Put(req.Name, req.Mark)
	return hypervisor.CreatedVM{Name: req.Name}, nil
}

// DeleteVM records req and deletes its VM (or asks DeleteFunc).
func (f *Creator) DeleteVM(ctx context.Context, req hypervisor.DeleteRequest) error {
	f.mu.Lock()
	f.deletes = append(f.deletes, req)
	f.mu.Unlock()
	if f.DeleteFunc != nil {
		return f.DeleteFunc(req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	mark, ok := f.vms[req.Name]
	switch {
	case !ok:
		return fmt.Errorf("fake: %w", hypervisor.ErrUnknownVM)
	case mark != req.Mark:
		return fmt.Errorf("fake: %w", hypervisor.ErrNotCreated)
	}
	delete(f.vms, req.Name)
	return nil
}

// Put records a VM name with mark, as if made (a test's own doing).
func (f *Creator) Put(name, mark string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.vms == nil {
		f.vms = map[string]string{}
	}
	f.vms[name] = mark
}

// Remove forgets the VM name, as if deleted.
func (f *Creator) Remove(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.vms, name)
}

// Names are the VMs it keeps, sorted.
func (f *Creator) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.vms))
	for n := range f.vms {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Deletes are the deletions it was asked for, in order.
func (f *Creator) Deletes() []hypervisor.DeleteRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.deletes)
}
