package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// ErrNoQemuImg: qemu-img (qemu-utils) is not installed, so no state image
// can be created.
var ErrNoQemuImg = errors.New("qemu-img is not installed")

// ErrNoNode: QEMU has no block node of that name and none is to be added.
var ErrNoNode = errors.New("QEMU has no such block node")

// StateImage is the qcow2 block node Node of the QEMU on Socket that holds
// a VM's internal snapshots: the VM's memory and device state, and Node's
// own contents, through the job-based snapshot-save, snapshot-load and
// snapshot-delete (QEMU 6.0 and later). Node is the VM's disk (a lab VM's
// lab.DiskNodeName), or, for a VM that has no disk, File: a qcow2 image
// made for the purpose and added to QEMU as Node, attached to no device.
// Disks other than Node are not part of these snapshots.
type StateImage struct {
	Socket, Node string
	// File, when set, is the image that becomes Node if QEMU lacks it.
	File string
}

// Attach makes sure QEMU has Node: when it has not, File is created (if it
// does not exist) and added as Node (again after QEMU was relaunched);
// without File that is ErrNoNode.
func (s StateImage) Attach(ctx context.Context) error {
	raw, err := Call(ctx, s.Socket, "query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		return err
	}
	var nodes []struct {
		NodeName string `json:"node-name"`
	}
	if err := json.Unmarshal(raw, &nodes); err != nil {
		return fmt.Errorf("qmp: query-named-block-nodes: %w", err)
	}
	for _, n := range nodes {
		if n.NodeName == s.Node {
			return nil
		}
	}
	if s.File == "" {
		return fmt.Errorf("%w: %q", ErrNoNode, s.Node)
	}
	if _, err := os.Stat(s.File); errors.Is(err, os.ErrNotExist) {
		qemuImg, err := exec.LookPath("qemu-img")
		if err != nil {
			return ErrNoQemuImg
		}
		// The virtual size does not bound the state, which qcow2 keeps
		// past the end of the disk.
		if out, err := exec.CommandContext(ctx, qemuImg, "create", "-q", "-f", "qcow2", s.File, "1G").CombinedOutput(); err != nil {
			return fmt.Errorf("qemu-img create: %w: %s", err, strings.TrimSpace(string(out)))
		}
	}
	_, err = Call(ctx, s.Socket, "blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": s.Node,
		"file": map[string]any{"driver": "file", "filename": s.File},
	})
	return err
}

// Detach takes an added Node out of QEMU; File stays.
func (s StateImage) Detach(ctx context.Context) error {
	_, err := Call(ctx, s.Socket, "blockdev-del", map[string]any{"node-name": s.Node})
	return err
}

// Save stores the VM's state as the snapshot tag (snapshot-save stops a
// running VM for the copy and lets it run again).
func (s StateImage) Save(ctx context.Context, tag string) error {
	return s.job(ctx, "snapshot-save", map[string]any{"tag": tag, "vmstate": s.Node, "devices": []string{s.Node}})
}

// Load puts the VM back into the state of snapshot tag.
func (s StateImage) Load(ctx context.Context, tag string) error {
	return s.job(ctx, "snapshot-load", map[string]any{"tag": tag, "vmstate": s.Node, "devices": []string{s.Node}})
}

// Delete removes snapshot tag.
func (s StateImage) Delete(ctx context.Context, tag string) error {
	return s.job(ctx, "snapshot-delete", map[string]any{"tag": tag, "devices": []string{s.Node}})
}

// job attaches the image, runs a snapshot job and waits until it
// concludes; a failed job's error is QEMU's text alone.
func (s StateImage) job(ctx context.Context, command string, args map[string]any) error {
	if err := s.Attach(ctx); err != nil {
		return err
	}
	id := fmt.Sprintf("%s-%d", s.Node, time.Now().UnixNano())
	args["job-id"] = id
	if _, err := Call(ctx, s.Socket, command, args); err != nil {
		return err
	}
	var b hypervisor.Backoff
	for {
		raw, err := Call(ctx, s.Socket, "query-jobs", nil)
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
			if j.ID != id || j.Status != "concluded" {
				continue
			}
			if _, err := Call(ctx, s.Socket, "job-dismiss", map[string]any{"id": id}); err != nil {
				return err
			}
			if j.Error != "" {
				return errors.New(j.Error)
			}
			return nil
		}
		if b.Sleep(ctx, 0) != nil {
			return ctx.Err()
		}
	}
}
