package hypervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
)

// Creator is an optional capability: a driver that makes VMs from a
// template and deletes the VMs it made (vm_create, vm_delete).
//
// Ownership is the driver's to check as well as the server's: CreateVM
// marks the VM with req.Mark (a file next to a lab VM, libvirt metadata,
// the Proxmox description, VirtualBox extra data) and DeleteVM deletes
// only a VM that carries the mark it is given, so neither a confused
// server nor a forged request deletes a VM vmgate did not create.
type Creator interface {
	// CreateVM makes a VM as req says and returns once its guest agent
	// answers. On failure nothing of the VM is left: the driver deletes
	// what it made before returning the error.
	CreateVM(ctx context.Context, req CreateRequest) (CreatedVM, error)
	// DeleteVM stops and deletes the VM req names, disks included, if and
	// only if it carries req.Mark. ErrUnknownVM when there is no such VM
	// (deleted already); ErrNotCreated when it exists without the mark.
	DeleteVM(ctx context.Context, req DeleteRequest) error
}

// ErrNotCreated: the VM exists but vmgate did not create it (or another
// lease did): it is never deleted.
var ErrNotCreated = errors.New("VM was not created by vmgate")

// CreateRequest is a VM to make.
type CreateRequest struct {
	// Name is the backend-local name to give the VM.
	Name string `json:"name"`
	// Source is the template's source in the driver's own terms (JSON
	// object); the driver decodes it strictly.
	Source json.RawMessage `json:"source"`
	// MemoryMB and CPUs size the VM (within the template's bounds, which
	// the server checked).
	MemoryMB int64 `json:"memory_mb"`
	CPUs     int64 `json:"cpus"`
	// Mark is the lease id: the driver marks the VM with it.
	Mark string `json:"mark"`
}

// CreatedVM is what CreateVM made.
type CreatedVM struct {
	// Name is the backend-local name the VM is known by (ListVMs, every
	// other call): Name of the request on most backends, the vmid that
	// Proxmox gave the clone.
	Name string `json:"name"`
}

// DeleteRequest names a VM to delete.
type DeleteRequest struct {
	// Name is the backend-local name: CreatedVM.Name, or, when creation
	// was interrupted before the backend named the VM, the request's Name
	// (the driver then finds the VM by its mark).
	Name string `json:"name"`
	Mark string `json:"mark"`
}

// CreateBounds are the sizes a backend can make VMs in; zero means no
// bound of the backend's own (CreateRequest's still apply).
type CreateBounds struct {
	MinMemoryMB, MaxMemoryMB int64
	MaxCPUs                  int64
	// Why says where the bounds come from, for an error ("the lab image
	// needs 96 MiB to boot").
	Why string
}

// The bounds of a CreateRequest.
const (
	MaxCreateMemoryMB = 1 << 20
	MaxCreateCPUs     = 256
	maxSourceBytes    = 64 << 10
)

var (
	createNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	markRE       = regexp.MustCompile(`^[A-Za-z0-9_.:-]{8,128}$`)
)

// Validate checks req before any side effect; an error wraps
// ErrInvalidArgument.
func (req CreateRequest) Validate() error {
	switch {
	case !createNameRE.MatchString(req.Name):
		return fmt.Errorf("%w: VM name %q: want [a-z0-9][a-z0-9-]{0,62}", ErrInvalidArgument, req.Name)
	case req.MemoryMB < 0 || req.MemoryMB > MaxCreateMemoryMB:
		return fmt.Errorf("%w: memory %d MiB: want 0..%d", ErrInvalidArgument, req.MemoryMB, MaxCreateMemoryMB)
	case req.CPUs < 0 || req.CPUs > MaxCreateCPUs:
		return fmt.Errorf("%w: %d CPUs: want 0..%d", ErrInvalidArgument, req.CPUs, MaxCreateCPUs)
	case !ValidMark(req.Mark):
		return fmt.Errorf("%w: mark %q: want 8 to 128 of [A-Za-z0-9_.:-]", ErrInvalidArgument, req.Mark)
	case len(req.Source) > maxSourceBytes:
		return fmt.Errorf("%w: template source of %d bytes (at most %d)", ErrInvalidArgument, len(req.Source), maxSourceBytes)
	}
	return nil
}

// Validate checks req before any side effect; an error wraps
// ErrInvalidArgument.
func (req DeleteRequest) Validate() error {
	switch {
	case req.Name == "" || len(req.Name) > 255:
		return fmt.Errorf("%w: VM name of %d bytes", ErrInvalidArgument, len(req.Name))
	case !ValidMark(req.Mark):
		return fmt.Errorf("%w: mark %q: want 8 to 128 of [A-Za-z0-9_.:-]", ErrInvalidArgument, req.Mark)
	}
	return nil
}

// ValidMark reports whether s may mark a VM: 8 to 128 of [A-Za-z0-9_.:-]
// (a lease id), safe in a file, XML, a Proxmox description and a
// VirtualBox extra-data value.
func ValidMark(s string) bool { return markRE.MatchString(s) }

// DecodeSource decodes a template source strictly into v (a pointer to
// the driver's source type): unknown fields and trailing data are
// ErrInvalidArgument; an empty source is {}.
func DecodeSource(src json.RawMessage, v any) error {
	if len(src) == 0 {
		src = json.RawMessage(`{}`)
	}
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: template source: %v", ErrInvalidArgument, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: template source: data after the object", ErrInvalidArgument)
	}
	return nil
}
