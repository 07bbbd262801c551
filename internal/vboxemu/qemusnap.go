package vboxemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// An online snapshot of a lab-backed machine holds the guest for real: its
// memory and device state go into a QEMU internal snapshot through QMP's
// job-based snapshot-save, snapshot-load and snapshot-delete (QEMU 6.0 and
// later), tagged with the VirtualBox snapshot's UUID. The lab VM has no disk
// (it boots from an initramfs), so the state is kept in a qcow2 image of
// the emulator's own, <machine folder>/Snapshots/vmstate.qcow2 (VirtualBox
// keeps a snapshot's saved state in that folder too), added to the running
// QEMU with blockdev-add as the node stateNode and attached to no device.
// Disks a lab VM might have are not part of the snapshot. Without qemu-img,
// or for a machine without a lab VM, only VirtualBox's record exists.

// stateNode is the node name of the state image in the lab VM's QEMU.
const stateNode = "vboxemu-state"

// stateImage is the path of m's state image.
func (e *emu) stateImage(m *Machine) string {
	return filepath.Join(e.w.dir(e.h.path), m.Name, "Snapshots", "vmstate.qcow2")
}

// attachState makes sure the lab VM's QEMU has the state image as
// stateNode, creating the image first if needed; ok is false when it
// cannot have one (no qemu-img).
func (e *emu) attachState(ctx context.Context, m *Machine) (ok bool, err error) {
	raw, err := qmpExec(ctx, m.QMPSocket, "query-named-block-nodes", nil)
	if err != nil {
		return false, err
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
	}
	if err := json.Unmarshal(raw, &nodes); err != nil {
		return false, fmt.Errorf("qmp: query-named-block-nodes: %w", err)
	}
	for _, n := range nodes {
		if n.NodeName == stateNode {
			return true, nil
		}
	}
	img := e.stateImage(m)
	if !fileExists(img) {
		qemuImg, err := exec.LookPath("qemu-img")
		if err != nil {
			return false, nil
		}
		if err := os.MkdirAll(filepath.Dir(img), 0o755); err != nil {
			return false, err
		}
		// The virtual size does not bound the state, which qcow2 keeps
		// past the end of the disk.
		if out, err := exec.CommandContext(ctx, qemuImg, "create", "-q", "-f", "qcow2", img, "1M").CombinedOutput(); err != nil {
			return false, fmt.Errorf("qemu-img create: %v: %s", err, out)
		}
	}
	_, err = qmpExec(ctx, m.QMPSocket, "blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": stateNode,
		"file": map[string]any{"driver": "file", "filename": img},
	})
	return err == nil, err
}

// detachState takes the state image out of the lab VM's QEMU (a clone's
// lab VM goes back to the spares), and removes it when del is set.
func (e *emu) detachState(m *Machine, del bool) {
	if m.QMPSocket != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		qmpExec(ctx, m.QMPSocket, "blockdev-del", map[string]any{"node-name": stateNode})
		cancel()
	}
	if del {
		os.Remove(e.stateImage(m))
	}
}

// qemuSnapshot runs command (snapshot-save, snapshot-load or
// snapshot-delete) for tag on m's lab VM; done is false when the machine
// cannot hold the guest's state (no lab VM, no qemu-img).
func (e *emu) qemuSnapshot(m *Machine, command, tag string) (done bool, err error) {
	if m.QMPSocket == "" {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if ok, err := e.attachState(ctx, m); !ok || err != nil {
		return false, err
	}
	id := "vboxemu-" + command
	args := map[string]any{"job-id": id, "tag": tag, "devices": []string{stateNode}}
	if command != "snapshot-delete" {
		args["vmstate"] = stateNode
	}
	if _, err := qmpExec(ctx, m.QMPSocket, command, args); err != nil {
		return false, err
	}
	return true, waitJob(ctx, m.QMPSocket, id)
}

// waitJob polls query-jobs until job id concludes, dismisses it and
// returns its error.
func waitJob(ctx context.Context, sock, id string) error {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		raw, err := qmpExec(ctx, sock, "query-jobs", nil)
		if err != nil {
			return err
		}
		var jobs []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := json.Unmarshal(raw, &jobs); err != nil {
			return fmt.Errorf("qmp: query-jobs: %w", err)
		}
		for _, j := range jobs {
			if j.ID == id && j.Status == "concluded" {
				qmpExec(ctx, sock, "job-dismiss", map[string]any{"id": id})
				if j.Error != "" {
					return fmt.Errorf("qmp: %s", j.Error)
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
