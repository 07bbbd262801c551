package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmgate/vmgate/hypervisor"
)

// VMs made on demand (vm_create through the QEMU driver) are lab VMs like
// the ones `vmgate lab up` starts, with an owner:
//
//	owner       the mark of whoever created the VM (the lease id)
//
// Create makes the VM directory (refusing a name whose directory exists,
// so that no older VM's files are ever taken over), writes owner first,
// then starts the VM daemonized. Nobody in vmgate waits for that QEMU: it
// belongs to init, outlives the driver plugin and the server, and is found
// again through vm.json (Get, List), so a restarted server can still
// delete it. Remove deletes only a VM whose owner file holds the mark it
// is given: it stops QEMU (QMP quit, then SIGKILL by a pid still running
// this VM's argv) and removes the whole directory, disk overlay and logs
// included.

// OwnerFileName is the file in a created VM's directory naming its owner.
const OwnerFileName = "owner"

// MaxCPUs bounds Spec.CPUs.
const MaxCPUs = 64

// Errors of Create and Remove.
var (
	// ErrExists: a directory for a VM of that name exists already.
	ErrExists = errors.New("a lab VM of that name exists")
	// ErrNotOwned: the VM was not created with the given mark (a lab VM
	// `vmgate lab up` started, or another owner's).
	ErrNotOwned = errors.New("lab VM not created by this owner")
)

// Create starts a new lab VM owned by mark, daemonized (spec.Daemonize is
// ignored), and returns once its guest agent answers. On failure nothing
// of it is left.
func Create(ctx context.Context, spec Spec, mark string) (*VM, error) {
	if spec.StateDir == "" {
		d, err := DefaultStateDir()
		if err != nil {
			return nil, err
		}
		spec.StateDir = d
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("lab: create: %w", err)
	}
	if !hypervisor.ValidMark(mark) {
		return nil, fmt.Errorf("lab: create %s: %w: owner mark %q", spec.Name, ErrInvalidSpec, mark)
	}
	spec.Daemonize = true
	dir := filepath.Join(spec.StateDir, "lab", spec.Name)
	if err := os.MkdirAll(filepath.Dir(dir), DirMode); err != nil {
		return nil, fmt.Errorf("lab: create %s: %w", spec.Name, err)
	}
	if err := os.Mkdir(dir, DirMode); errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("lab: create %s: %w (%s)", spec.Name, ErrExists, dir)
	} else if err != nil {
		return nil, fmt.Errorf("lab: create %s: %w", spec.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, OwnerFileName), []byte(mark+"\n"), FileMode); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("lab: create %s: %w", spec.Name, err)
	}
	v, err := Start(ctx, spec)
	if err != nil {
		// Start stopped the VM; the directory is this call's own.
		os.RemoveAll(dir)
		return nil, fmt.Errorf("lab: create: %w", err)
	}
	return v, nil
}

// Owner returns the mark of the lab VM name, ErrNotFound when there is no
// such VM directory and ErrNotOwned when the VM was not created by Create.
func Owner(stateDir, name string) (string, error) {
	if !nameRE.MatchString(name) {
		return "", fmt.Errorf("lab: owner: %w: name %q", ErrInvalidSpec, name)
	}
	dir := filepath.Join(stateDir, "lab", name)
	b, err := os.ReadFile(filepath.Join(dir, OwnerFileName))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Lstat(dir); errors.Is(serr, fs.ErrNotExist) {
			return "", fmt.Errorf("lab: owner of %s: %w", name, ErrNotFound)
		}
		return "", fmt.Errorf("lab: owner of %s: %w", name, ErrNotOwned)
	}
	if err != nil {
		return "", fmt.Errorf("lab: owner of %s: %w", name, err)
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

// Remove stops the lab VM name and removes its directory, if and only if
// Create made it with mark. ErrNotFound when there is no such VM (already
// removed), ErrNotOwned when its owner is another or none.
func Remove(ctx context.Context, stateDir, name, mark string) error {
	owner, err := Owner(stateDir, name)
	if err != nil {
		return fmt.Errorf("lab: remove: %w", err)
	}
	if mark == "" || owner != mark {
		return fmt.Errorf("lab: remove %s: %w", name, ErrNotOwned)
	}
	v, err := Get(stateDir, name)
	switch {
	case errors.Is(err, ErrNotFound):
		// Never started, or stopped: only files are left.
	case err != nil:
		return fmt.Errorf("lab: remove: %w", err)
	default:
		if err := v.Stop(ctx); err != nil {
			return fmt.Errorf("lab: remove: %w", err)
		}
	}
	if err := os.RemoveAll(filepath.Join(stateDir, "lab", name)); err != nil {
		return fmt.Errorf("lab: remove %s: %w", name, err)
	}
	return nil
}
