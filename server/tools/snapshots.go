package tools

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/catalog"
)

// Snapshots: snapshot_create, snapshot_list, snapshot_revert and
// snapshot_delete, straight to the driver's Snapshotter. A name follows
// hypervisor.ValidateSnapshotName (the rule every backend takes), checked
// by the gate before the policy sees the call, so a bad name never parks
// an approval. A backend without snapshots says so by name.

func snapshotNameField(desc string) catalog.Field {
	return catalog.Field{Name: "name", Kind: catalog.KindString, Required: true, MaxLen: 64,
		Desc: desc + " 2-40 characters: a letter, then letters, digits, '_' or '-'."}
}

func snapshotCreateTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "snapshot_create", Title: "Take a snapshot", Destructive: true,
		Desc: "Take a snapshot of a VM (its disks, and its memory where the backend can). " +
			"Without memory the backend decides: with memory when it can, else disks only. snapshot_revert returns the VM to it.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			snapshotNameField("Name of the new snapshot; an existing name is refused."),
			{Name: "description", Kind: catalog.KindString, Desc: "Free text kept with the snapshot (at most 1024 bytes, no control characters but newline and tab).", MaxLen: 4 * hypervisor.MaxSnapshotDescription},
			{Name: "memory", Kind: catalog.KindBoolean, Desc: "true: include the VM's memory (a revert resumes it where it was); false: disks only."},
		},
		Output: []map[string]any{catalog.OObject(map[string]any{"vm": catalog.OString(), "snapshot": snapshotShape()}, "vm", "snapshot")},
	}, runSnapshotCreate)
}

func snapshotListTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "snapshot_list", Title: "List snapshots", ReadOnly: true, Idempotent: true,
		Desc:   "List a VM's snapshots, oldest first, with their descriptions, times and whether they hold memory.",
		Fields: []catalog.Field{catalog.VMField(true)},
		Output: []map[string]any{catalog.OObject(map[string]any{"vm": catalog.OString(), "snapshots": catalog.OArray(snapshotShape())}, "vm", "snapshots")},
	}, runSnapshotList)
}

func snapshotRevertTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "snapshot_revert", Title: "Revert to a snapshot", Destructive: true,
		Desc: "Return a VM to a snapshot: everything since it was taken is lost. " +
			"With a memory snapshot the VM runs on from that moment; with a disk-only one its disks are restored.",
		Fields: []catalog.Field{catalog.VMField(true), snapshotNameField("Snapshot to return to (from snapshot_list).")},
		Output: []map[string]any{catalog.OObject(map[string]any{"vm": catalog.OString(), "snapshot": catalog.OString(), "reverted": catalog.OBoolean()}, "vm", "snapshot", "reverted")},
	}, runSnapshotRevert)
}

func snapshotDeleteTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "snapshot_delete", Title: "Delete a snapshot", Destructive: true,
		Desc:   "Delete a VM's snapshot; the VM's current state is unchanged, but the snapshot can no longer be reverted to.",
		Fields: []catalog.Field{catalog.VMField(true), snapshotNameField("Snapshot to delete (from snapshot_list).")},
		Output: []map[string]any{catalog.OObject(map[string]any{"vm": catalog.OString(), "snapshot": catalog.OString(), "deleted": catalog.OBoolean()}, "vm", "snapshot", "deleted")},
	}, runSnapshotDelete)
}

// snapshotCreateArgs are snapshot_create's arguments.
type snapshotCreateArgs struct {
	Name        string `arg:"name"`
	Description string `arg:"description"`
	Memory      *bool  `arg:"memory"` // nil: memory when the backend can
}

func (a *snapshotCreateArgs) CheckArgs() error {
	if err := catalog.CheckSnapshotNameFree(a.Name); err != nil {
		return err
	}
	return cleanSnapshotError(hypervisor.ValidateSnapshotRequest(hypervisor.SnapshotRequest{Name: a.Name, Description: a.Description}))
}

func (a *snapshotCreateArgs) Deadline(e *catalog.Env) time.Duration { return e.Timeouts.Snapshot }

// request is a as the driver takes it, with memory decided for modes.
func (a *snapshotCreateArgs) request(modes hypervisor.SnapshotModes) hypervisor.SnapshotRequest {
	mem := modes.Memory
	if a.Memory != nil {
		mem = *a.Memory
	}
	return hypervisor.SnapshotRequest{Name: a.Name, Description: a.Description, Memory: mem}
}

// snapshotNameArgs are the arguments of snapshot_revert and snapshot_delete.
type snapshotNameArgs struct {
	Name string `arg:"name"`
}

func (a *snapshotNameArgs) CheckArgs() error {
	if err := catalog.CheckSnapshotNameFree(a.Name); err != nil {
		return err
	}
	return cleanSnapshotError(hypervisor.ValidateSnapshotName(a.Name))
}

func (a *snapshotNameArgs) Deadline(e *catalog.Env) time.Duration { return e.Timeouts.Snapshot }

// snapshotListArgs are snapshot_list's arguments (the vm only).
type snapshotListArgs struct{}

func (a *snapshotListArgs) Deadline(e *catalog.Env) time.Duration { return e.Timeouts.Snapshot }

// cleanSnapshotError drops the sentinel's "invalid argument: " prefix: the
// tag says it already.
func cleanSnapshotError(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(strings.TrimPrefix(err.Error(), hypervisor.ErrInvalidArgument.Error()+": "))
}

// snapshotterFor returns c's driver as a Snapshotter, or the result that
// says the backend has no snapshots.
func snapshotterFor(c *catalog.Call) (hypervisor.Snapshotter, *catalog.Result) {
	sn, ok := hypervisor.AsSnapshotter(c.Driver)
	if !ok {
		r := catalog.Failure(catalog.TagBackend, fmt.Sprintf("backend %q cannot take snapshots (vm_status and list_vms still work)", c.Backend), true)
		return nil, &r
	}
	return sn, nil
}

func runSnapshotCreate(e *catalog.Env, c *catalog.Call, a *snapshotCreateArgs) catalog.Result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return *r
	}
	unlock, err := e.Snapshots.Lock(c.Ctx, c.VM)
	if err != nil {
		return catalog.Failure(catalog.TagTimedOut, err.Error(), true)
	}
	defer unlock()
	req := a.request(sn.SnapshotModes())
	var b catalog.SnapBudget
	if catalog.Bounded(c.Rules.Snapshots) {
		if b, r = e.Snapshots.Budget(c, sn); r != nil {
			return *r
		}
		if why := b.Over(c.Rules.Snapshots, req.Memory); why != "" {
			if !req.Memory || a.Memory != nil || !sn.SnapshotModes().DiskOnly || b.Over(c.Rules.Snapshots, false) != "" {
				return catalog.Failure(catalog.TagDenied, c.VM+": "+why+": snapshot_delete one of the grant's snapshots first (snapshot_list shows them, their owners and sizes)", true)
			}
			req.Memory = false // memory alone broke the size bound, and the call left it to the server
		}
	}
	snap, err := sn.SnapshotCreate(c.Ctx, c.Name, req)
	if err != nil {
		return catalog.SnapshotFailure(c, a.Name, err)
	}
	if why := e.Snapshots.FitsAfter(c, sn, &b, c.Rules.Snapshots, snap, false); why != "" {
		return catalog.Failure(catalog.TagDenied, c.VM+": "+why+e.Snapshots.DropTaken(c, sn, snap.Name), false)
	}
	if err := e.Snapshots.Put(c.Ctx, c, snap, time.Time{}); err != nil {
		r := catalog.Failure(catalog.TagBackend, c.VM+": the snapshot was taken, but the grant could not be recorded as its owner ("+catalog.BackendReason(err.Error())+")"+e.Snapshots.DropTaken(c, sn, snap.Name), false)
		r.Detail = err.Error()
		return r
	}
	kind := "disks only"
	if snap.Memory {
		kind = "with memory"
	}
	return catalog.Success(map[string]any{"vm": c.VM, "snapshot": snapshotView{Snapshot: snap, Owner: c.Grant.Name}}, fmt.Sprintf("%s: snapshot %q taken (%s)", c.VM, snap.Name, kind))
}

// snapshotView is a snapshot as the snapshot tools show it: with its
// owner (the grant that made it; empty when it was made outside vmgate)
// and whether it is an undo snapshot.
type snapshotView struct {
	hypervisor.Snapshot
	Owner string `json:"owner,omitempty"`
	Undo  bool   `json:"undo,omitempty"`
}

// views adds the owners the store knows to list.
func views(e *catalog.Env, c *catalog.Call, list []hypervisor.Snapshot) ([]snapshotView, error) {
	out := make([]snapshotView, len(list))
	recs, err := e.Snapshots.Store.ListSnapshots(c.Ctx, c.VM)
	byName := make(map[string]int, len(recs))
	for i, r := range recs {
		byName[r.Name] = i
	}
	for i, sn := range list {
		out[i].Snapshot = sn
		if j, ok := byName[sn.Name]; ok && sn.ID != "" && recs[j].ID == sn.ID {
			out[i].Owner, out[i].Undo = recs[j].Grant, recs[j].Undo
		}
	}
	return out, err
}

func runSnapshotList(e *catalog.Env, c *catalog.Call, _ *snapshotListArgs) catalog.Result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return *r
	}
	list, err := sn.SnapshotList(c.Ctx, c.Name)
	if err != nil {
		return catalog.SnapshotFailure(c, "", err)
	}
	views, err := views(e, c, list)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d snapshot(s)\n", c.VM, len(views))
	if err != nil {
		e.Log.Warn("server: snapshot owners unknown", "vm", c.VM, "err", err)
		b.WriteString("(owners unknown: the store did not answer)\n")
	}
	if len(views) > 0 {
		tw := tabwriter.NewWriter(&b, 0, 4, 1, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCREATED\tMEMORY\tCURRENT\tOWNER\tDESCRIPTION")
		for _, v := range views {
			created, owner := "-", "-"
			if !v.CreatedAt.IsZero() {
				created = v.CreatedAt.UTC().Format(time.RFC3339)
			}
			if v.Owner != "" {
				owner = v.Owner
			}
			fmt.Fprintf(tw, "%s\t%s\t%t\t%t\t%s\t%s\n", v.Name, created, v.Memory, v.Current, owner, catalog.Truncate(strings.Join(strings.Fields(v.Description), " "), 80))
		}
		tw.Flush()
	}
	return catalog.Success(map[string]any{"vm": c.VM, "snapshots": views}, strings.TrimRight(b.String(), "\n"))
}

// touchable finds c's named snapshot and checks the grant may act on it.
func touchable(e *catalog.Env, c *catalog.Call, sn hypervisor.Snapshotter, name string) (hypervisor.Snapshot, *catalog.Result) {
	snap, err := hypervisor.FindSnapshot(c.Ctx, sn, c.Name, name)
	if err != nil {
		r := catalog.SnapshotFailure(c, name, err)
		return snap, &r
	}
	return snap, e.Snapshots.MayTouch(c, snap)
}

func runSnapshotRevert(e *catalog.Env, c *catalog.Call, a *snapshotNameArgs) catalog.Result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return *r
	}
	snap, r := touchable(e, c, sn, a.Name)
	if r != nil {
		return *r
	}
	if err := revertChecked(c, sn, snap); err != nil {
		return catalog.SnapshotFailure(c, a.Name, err)
	}
	return catalog.Success(map[string]any{"vm": c.VM, "snapshot": a.Name, "reverted": true}, fmt.Sprintf("%s: reverted to snapshot %q", c.VM, a.Name))
}

func runSnapshotDelete(e *catalog.Env, c *catalog.Call, a *snapshotNameArgs) catalog.Result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return *r
	}
	if _, r := touchable(e, c, sn, a.Name); r != nil {
		return *r
	}
	if err := sn.SnapshotDelete(c.Ctx, c.Name, a.Name); err != nil {
		return catalog.SnapshotFailure(c, a.Name, err)
	}
	e.Snapshots.Forget(c.Ctx, c.VM, a.Name)
	return catalog.Success(map[string]any{"vm": c.VM, "snapshot": a.Name, "deleted": true}, fmt.Sprintf("%s: snapshot %q deleted", c.VM, a.Name))
}

// snapshotShape is a hypervisor.Snapshot as the snapshot tools show it.
func snapshotShape() map[string]any {
	return catalog.OOpen(map[string]any{
		"name": catalog.OString(), "description": catalog.OString(), "created_at": catalog.OTime(), "memory": catalog.OBoolean(),
		"size_bytes": catalog.ONonNeg(), "parent": catalog.OString(), "current": catalog.OBoolean(), "id": catalog.OString(), "owner": catalog.OString(), "undo": catalog.OBoolean(),
	}, "name", "memory")
}

// revertChecked reverts c's VM to snap, bound to the identity it was
// listed with where it has one (the driver checks it again as it reverts).
func revertChecked(c *catalog.Call, sn hypervisor.Snapshotter, snap hypervisor.Snapshot) error {
	if r, ok := sn.(hypervisor.SnapshotIDReverter); ok && snap.ID != "" {
		return r.SnapshotRevertID(c.Ctx, c.Name, snap.Name, snap.ID)
	}
	return sn.SnapshotRevert(c.Ctx, c.Name, snap.Name)
}
