package proxmox

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// Snapshots through qemu-server's API2/Qemu.pm: snapshot_list (GET
// {vmid}/snapshot), snapshot (POST {vmid}/snapshot, a qmsnapshot task),
// rollback (POST {vmid}/snapshot/{snapname}/rollback, a qmrollback task)
// and delsnapshot (DELETE {vmid}/snapshot/{snapname}, a qmdelsnapshot
// task). The tasks are waited for like the power tasks; their failures are
// pve-guest-common AbstractConfig.pm's words, which the driver maps to the
// snapshot sentinels.
//
// Proxmox takes both kinds: with vmstate (RAM, a rollback resumes the VM)
// and without (the disks). A snapshot with memory of a VM that is not
// running is refused here (upstream silently saves no vmstate then). A
// rollback to a disk-only snapshot stops the VM; the driver asks Proxmox
// to start it again (rollback's start, qemu-server 7.3+) when it was
// running before, so the guest runs on from the snapshot's disks.

var _ hypervisor.Snapshotter = (*Driver)(nil)

// How AbstractConfig.pm and Qemu.pm word the snapshot failures the driver
// tells apart (task exit statuses or API messages).
var (
	// snapshot_rollback, snapshot_delete: "snapshot 'NAME' does not exist".
	snapNotFoundRE = regexp.MustCompile(`snapshot '[^']*' does not exist`)
	// snapshot_prepare: "snapshot name 'NAME' already used".
	snapExistsRE = regexp.MustCompile(`snapshot name '[^']*' already used`)
)

// SnapshotModes implements hypervisor.Snapshotter: both kinds.
func (d *Driver) SnapshotModes() hypervisor.SnapshotModes {
	return hypervisor.SnapshotModes{Memory: true, DiskOnly: true}
}

// pveSnapshot is one item of snapshot_list.
type pveSnapshot struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	SnapTime    int64  `json:"snaptime"`
	VMState     int    `json:"vmstate"`
	Parent      string `json:"parent"`
	SnapState   string `json:"snapstate"`
}

// SnapshotList implements hypervisor.Snapshotter. Snapshots still being
// taken or deleted (a snapstate) are left out, and so is "current" (the
// VM itself), whose parent is the current snapshot.
func (d *Driver) SnapshotList(ctx context.Context, name string) ([]hypervisor.Snapshot, error) {
	v, err := d.lookup(ctx, "snapshot list", name)
	if err != nil {
		return nil, err
	}
	return d.snapshotList(ctx, v)
}

func (d *Driver) snapshotList(ctx context.Context, v vmRef) ([]hypervisor.Snapshot, error) {
	var items []pveSnapshot
	if err := d.api.do(ctx, "GET", v.path+"/snapshot", nil, nil, &items); err != nil {
		return nil, d.classify("snapshot list", err)
	}
	current := ""
	for _, it := range items {
		if it.Name == "current" {
			current = it.Parent
		}
	}
	out := []hypervisor.Snapshot{}
	for _, it := range items {
		if it.Name == "current" || it.SnapState != "" {
			continue
		}
		sn := hypervisor.Snapshot{Name: it.Name, Description: it.Description, Memory: it.VMState != 0, Parent: it.Parent, Current: it.Name == current}
		if it.SnapTime > 0 {
			sn.CreatedAt = time.Unix(it.SnapTime, 0)
			// Proxmox names a snapshot by its name alone; its snaptime
			// (AbstractConfig.pm snapshot_prepare: time(), seconds) and
			// vmstate tell one made anew under the name apart.
			sn.ID = "pve:" + strconv.FormatInt(it.SnapTime, 10) + ":" + strconv.Itoa(it.VMState)
		}
		out = append(out, sn)
	}
	sortSnapshots(out)
	return out, nil
}

// sortSnapshots orders by creation time, then name (Proxmox lists them in
// hash order).
func sortSnapshots(s []hypervisor.Snapshot) {
	slices.SortFunc(s, func(a, b hypervisor.Snapshot) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// SnapshotCreate implements hypervisor.Snapshotter: the qmsnapshot task,
// then the listing's entry (its time is Proxmox's).
func (d *Driver) SnapshotCreate(ctx context.Context, name string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
	if err := hypervisor.ValidateSnapshotRequest(req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("proxmox: snapshot create: %w", err)
	}
	v, err := d.lookup(ctx, "snapshot create", name)
	if err != nil {
		return hypervisor.Snapshot{}, err
	}
	if req.Memory {
		running, err := d.running(ctx, v)
		if err != nil {
			return hypervisor.Snapshot{}, d.classify("snapshot create", err)
		}
		if !running {
			return hypervisor.Snapshot{}, fmt.Errorf("proxmox: snapshot create: VM %d is not running: %w", v.vmid, hypervisor.ErrSnapshotMemory)
		}
	}
	body := map[string]any{"snapname": req.Name, "vmstate": req.Memory}
	if req.Description != "" {
		body["description"] = req.Description
	}
	if err := d.snapshotTask(ctx, v, "snapshot create", "POST", v.path+"/snapshot", nil, body); err != nil {
		return hypervisor.Snapshot{}, err
	}
	list, err := d.snapshotList(ctx, v)
	if err != nil {
		return hypervisor.Snapshot{}, err
	}
	for _, sn := range list {
		if sn.Name == req.Name {
			return sn, nil
		}
	}
	return hypervisor.Snapshot{}, fmt.Errorf("proxmox: snapshot create: %w: the task succeeded but snapshot %q is not listed", hypervisor.ErrBackend, req.Name)
}

// SnapshotRevert implements hypervisor.Snapshotter: the qmrollback task,
// with start when the VM runs now (see the package comment on disk-only
// snapshots).
func (d *Driver) SnapshotRevert(ctx context.Context, name, snap string) error {
	if err := hypervisor.ValidateSnapshotName(snap); err != nil {
		return fmt.Errorf("proxmox: snapshot revert: %w", err)
	}
	v, err := d.lookup(ctx, "snapshot revert", name)
	if err != nil {
		return err
	}
	running, err := d.running(ctx, v)
	if err != nil {
		return d.classify("snapshot revert", err)
	}
	body := map[string]any{}
	if running {
		body["start"] = true
	}
	return d.snapshotTask(ctx, v, "snapshot revert", "POST", v.path+"/snapshot/"+url.PathEscape(snap)+"/rollback", nil, body)
}

// SnapshotDelete implements hypervisor.Snapshotter: the qmdelsnapshot task.
func (d *Driver) SnapshotDelete(ctx context.Context, name, snap string) error {
	if err := hypervisor.ValidateSnapshotName(snap); err != nil {
		return fmt.Errorf("proxmox: snapshot delete: %w", err)
	}
	v, err := d.lookup(ctx, "snapshot delete", name)
	if err != nil {
		return err
	}
	return d.snapshotTask(ctx, v, "snapshot delete", "DELETE", v.path+"/snapshot/"+url.PathEscape(snap), nil, nil)
}

// running reports whether v's status/current says running.
func (d *Driver) running(ctx context.Context, v vmRef) (bool, error) {
	var cur struct {
		Status string `json:"status"`
	}
	if err := d.api.do(ctx, "GET", v.path+"/status/current", nil, nil, &cur); err != nil {
		return false, err
	}
	return cur.Status == "running", nil
}

// snapshotTask starts a snapshot task and waits for it, mapping Proxmox's
// words for a missing or taken name to the sentinels.
func (d *Driver) snapshotTask(ctx context.Context, v vmRef, op, method, path string, query url.Values, body any) error {
	err := d.runTask(ctx, v, op, method, path, query, body)
	if err == nil {
		return nil
	}
	var ae *APIError
	var te *TaskError
	msg := ""
	switch {
	case errors.As(err, &te):
		msg = te.ExitStatus
	case errors.As(err, &ae):
		msg = ae.Message
	}
	switch {
	case snapNotFoundRE.MatchString(msg):
		return fmt.Errorf("proxmox: %s: %w: %s", op, hypervisor.ErrSnapshotNotFound, strings.TrimSpace(msg))
	case snapExistsRE.MatchString(msg):
		return fmt.Errorf("proxmox: %s: %w: %s", op, hypervisor.ErrSnapshotExists, strings.TrimSpace(msg))
	case te != nil:
		return fmt.Errorf("proxmox: %s: %w", op, err)
	}
	return d.classify(op, err)
}
