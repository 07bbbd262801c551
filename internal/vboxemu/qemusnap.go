package vboxemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/vmgate/vmgate/internal/qmp"
)

// An online snapshot of a lab-backed machine holds the guest for real: its
// memory and device state go into a QEMU internal snapshot (qmp.StateImage)
// tagged with the VirtualBox snapshot's UUID. The lab VM has no disk (it
// boots from an initramfs), so the state is kept in a qcow2 image of the
// emulator's own, <machine folder>/Snapshots/vmstate.qcow2 (VirtualBox
// keeps a snapshot's saved state in that folder too). Without qemu-img, or
// for a machine without a lab VM, only VirtualBox's record exists.

// stateImage is m's state image in its lab VM's QEMU.
func (e *emu) stateImage(m *Machine) qmp.StateImage {
	return qmp.StateImage{Socket: m.QMPSocket, Node: "vboxemu-state",
		File: filepath.Join(e.w.dir(e.h.path), m.Name, "Snapshots", "vmstate.qcow2")}
}

// qemuSnapshot saves, loads or deletes (op) the state tag in m's lab VM;
// done is false when the machine cannot hold the guest's state (no lab
// VM, no qemu-img).
func (e *emu) qemuSnapshot(m *Machine, op func(qmp.StateImage, context.Context, string) error, tag string) (done bool, err error) {
	if m.QMPSocket == "" {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img := e.stateImage(m)
	if err := os.MkdirAll(filepath.Dir(img.File), 0o755); err != nil {
		return false, err
	}
	if err := op(img, ctx, tag); errors.Is(err, qmp.ErrNoQemuImg) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return true, nil
}

// detachState takes the state image out of the lab VM's QEMU (a clone's
// lab VM goes back to the spares), and removes it when del is set.
func (e *emu) detachState(m *Machine, del bool) {
	img := e.stateImage(m)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	img.Detach(ctx) // absent when no snapshot was ever taken
	cancel()
	if del {
		os.Remove(img.File)
	}
}
