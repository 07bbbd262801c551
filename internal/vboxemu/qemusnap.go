package vboxemu

import (
	"context"
	"errors"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/qmp"
)

// A snapshot of a lab-backed machine holds the guest for real: the lab
// VM's disk (its qcow2 overlay, node lab.DiskNodeName) with the guest's
// memory and device state go into a QEMU internal snapshot (qmp.StateImage)
// tagged with the VirtualBox snapshot's UUID, as VirtualBox's snapshot
// holds the disks' differencing images and, when online, the saved state.
// For a machine without a lab VM, or a QEMU without that disk, only
// VirtualBox's record exists.

// stateImage is where m's lab VM keeps snapshots.
func stateImage(m *Machine) qmp.StateImage {
	return qmp.StateImage{Socket: m.QMPSocket, Node: lab.DiskNodeName}
}

// qemuSnapshot saves, loads or deletes (op) the snapshot tag in m's lab
// VM; done is false when the machine cannot hold the guest's state.
func qemuSnapshot(m *Machine, op func(qmp.StateImage, context.Context, string) error, tag string) (done bool, err error) {
	if m.QMPSocket == "" {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := op(stateImage(m), ctx, tag); errors.Is(err, qmp.ErrNoNode) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return true, nil
}
