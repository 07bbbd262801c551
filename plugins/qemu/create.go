package qemu

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/vmgate/vmgate/guest/image"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
)

var _ hypervisor.Creator = (*Driver)(nil)

// TemplateSource is what a qemu backend's template makes VMs from: the lab
// image (kernel and initramfs, shared read-only by every VM) booted under
// TCG with a fresh qcow2 disk overlay of the VM's own.
type TemplateSource struct {
	// Image is a built image's directory (<state>/images/<hash>); empty
	// means the newest image under the lab's state directory (the one
	// `vmgate lab up` built).
	Image string `json:"image,omitempty"`
	// Cmdline adds KEY=VALUE words to the guest's kernel command line
	// (lab.Spec.Cmdline: QGA_BLOCK, CGROUP2).
	Cmdline map[string]string `json:"cmdline,omitempty"`
	// DiskMB is the virtual size of the VM's disk overlay (lab.Spec.DiskMB;
	// 0: lab.DefaultDiskMB).
	DiskMB int `json:"disk_mb,omitempty"`
}

// stateDir is the lab's state directory (LabDir is <state>/lab).
func (d *Driver) stateDir() string { return filepath.Dir(d.cfg.LabDir) }

// CreateVM boots a new lab VM (lab.Create: daemonized, marked by req.Mark)
// and returns once its guest agent answers. Created VMs are lab VMs: the
// driver finds them like any other through vm.json, so a restarted plugin
// or server still reaches them.
func (d *Driver) CreateVM(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	if err := req.Validate(); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("qemu: create: %w", err)
	}
	if d.cfg.LabDir == "" {
		return hypervisor.CreatedVM{}, fmt.Errorf("qemu: create: %w: this backend has no lab directory (settings: lab: true)", hypervisor.ErrNotSupported)
	}
	if _, configured := d.configured[req.Name]; configured {
		return hypervisor.CreatedVM{}, fmt.Errorf("qemu: create %s: %w: a configured VM has that name", req.Name, hypervisor.ErrInvalidArgument)
	}
	var src TemplateSource
	if err := hypervisor.DecodeSource(req.Source, &src); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("qemu: create: %w", err)
	}
	spec := lab.Spec{Name: req.Name, StateDir: d.stateDir(), MemoryMB: int(req.MemoryMB), CPUs: int(req.CPUs), Cmdline: src.Cmdline, DiskMB: src.DiskMB}
	if err := spec.Validate(); err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("qemu: create: %w: %w", hypervisor.ErrInvalidArgument, err)
	}
	img, err := d.templateImage(src)
	if err != nil {
		return hypervisor.CreatedVM{}, fmt.Errorf("qemu: create %s: %w", req.Name, err)
	}
	spec.Image = &img
	if _, err := lab.Create(ctx, spec, req.Mark); err != nil {
		return hypervisor.CreatedVM{}, createError(req.Name, err)
	}
	return hypervisor.CreatedVM{Name: req.Name}, nil
}

// templateImage is the image src names, or the newest built one.
func (d *Driver) templateImage(src TemplateSource) (image.Image, error) {
	var img image.Image
	var err error
	if src.Image != "" {
		img, err = image.Open(src.Image)
	} else {
		img, err = image.Newest(d.stateDir())
	}
	if err != nil {
		return image.Image{}, fmt.Errorf("%w: %w", hypervisor.ErrBackend, err)
	}
	return img, nil
}

func createError(name string, err error) error {
	switch {
	case errors.Is(err, lab.ErrExists):
		return fmt.Errorf("qemu: create %s: %w: a lab VM of that name exists already", name, hypervisor.ErrInvalidArgument)
	case errors.Is(err, lab.ErrInvalidSpec):
		return fmt.Errorf("qemu: create %s: %w: %w", name, hypervisor.ErrInvalidArgument, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("qemu: create %s: %w: the guest agent did not answer in time: %w", name, hypervisor.ErrTimeout, err)
	}
	return fmt.Errorf("qemu: create %s: %w: %w", name, hypervisor.ErrBackend, err)
}

// DeleteVM stops and removes a lab VM that CreateVM made with req.Mark
// (lab.Remove), and forgets the driver's clients of it.
func (d *Driver) DeleteVM(ctx context.Context, req hypervisor.DeleteRequest) error {
	if err := req.Validate(); err != nil {
		return fmt.Errorf("qemu: delete: %w", err)
	}
	if d.cfg.LabDir == "" {
		return fmt.Errorf("qemu: delete: %w: this backend has no lab directory", hypervisor.ErrNotSupported)
	}
	if _, configured := d.configured[req.Name]; configured || !vmName.MatchString(req.Name) {
		return fmt.Errorf("qemu: delete %s: %w", req.Name, hypervisor.ErrNotCreated)
	}
	err := lab.Remove(ctx, d.stateDir(), req.Name, req.Mark)
	switch {
	case err == nil:
		d.forget(req.Name)
		return nil
	case errors.Is(err, lab.ErrNotFound):
		d.forget(req.Name)
		return fmt.Errorf("qemu: delete %s: %w", req.Name, hypervisor.ErrUnknownVM)
	case errors.Is(err, lab.ErrNotOwned), errors.Is(err, lab.ErrInvalidSpec):
		return fmt.Errorf("qemu: delete %s: %w", req.Name, hypervisor.ErrNotCreated)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("qemu: delete %s: %w: %w", req.Name, hypervisor.ErrTimeout, err)
	}
	return fmt.Errorf("qemu: delete %s: %w: %w", req.Name, hypervisor.ErrBackend, err)
}
