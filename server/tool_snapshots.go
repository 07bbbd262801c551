package server

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// Snapshots: snapshot_create, snapshot_list, snapshot_revert and
// snapshot_delete, straight to the driver's Snapshotter. A name follows
// hypervisor.ValidateSnapshotName (the rule every backend takes), checked
// by the gate before the policy sees the call, so a bad name never parks
// an approval. A backend without snapshots says so by name.

// snapshotDeadline bounds a snapshot call: saving or loading a VM's memory
// takes longer than the other tools (a var so that tests can shorten it).
var snapshotDeadline = 10 * time.Minute

func snapshotNameField(desc string) field {
	return field{name: "name", kind: kindString, required: true, maxLen: 64,
		desc: desc + " 2-40 characters: a letter, then letters, digits, '_' or '-'."}
}

func snapshotCreateTool() *toolSpec {
	return newTool(toolSpec{
		name: "snapshot_create", title: "Take a snapshot", destructive: true,
		desc: "Take a snapshot of a VM (its disks, and its memory where the backend can). " +
			"Without memory the backend decides: with memory when it can, else disks only. snapshot_revert returns the VM to it.",
		fields: []field{
			vmField(true),
			snapshotNameField("Name of the new snapshot; an existing name is refused."),
			{name: "description", kind: kindString, desc: "Free text kept with the snapshot (at most 1024 bytes, no control characters but newline and tab).", maxLen: 4 * hypervisor.MaxSnapshotDescription},
			{name: "memory", kind: kindBoolean, desc: "true: include the VM's memory (a revert resumes it where it was); false: disks only."},
		},
		output: []map[string]any{oObject(map[string]any{"vm": oString, "snapshot": snapshotShape()}, "vm", "snapshot")},
	}, (*Server).runSnapshotCreate)
}

func snapshotListTool() *toolSpec {
	return newTool(toolSpec{
		name: "snapshot_list", title: "List snapshots", readOnly: true, idempotent: true,
		desc:   "List a VM's snapshots, oldest first, with their descriptions, times and whether they hold memory.",
		fields: []field{vmField(true)},
		output: []map[string]any{oObject(map[string]any{"vm": oString, "snapshots": oArray(snapshotShape())}, "vm", "snapshots")},
	}, (*Server).runSnapshotList)
}

func snapshotRevertTool() *toolSpec {
	return newTool(toolSpec{
		name: "snapshot_revert", title: "Revert to a snapshot", destructive: true,
		desc: "Return a VM to a snapshot: everything since it was taken is lost. " +
			"With a memory snapshot the VM runs on from that moment; with a disk-only one its disks are restored.",
		fields: []field{vmField(true), snapshotNameField("Snapshot to return to (from snapshot_list).")},
		output: []map[string]any{oObject(map[string]any{"vm": oString, "snapshot": oString, "reverted": oBoolean}, "vm", "snapshot", "reverted")},
	}, (*Server).runSnapshotRevert)
}

func snapshotDeleteTool() *toolSpec {
	return newTool(toolSpec{
		name: "snapshot_delete", title: "Delete a snapshot", destructive: true,
		desc:   "Delete a VM's snapshot; the VM's current state is unchanged, but the snapshot can no longer be reverted to.",
		fields: []field{vmField(true), snapshotNameField("Snapshot to delete (from snapshot_list).")},
		output: []map[string]any{oObject(map[string]any{"vm": oString, "snapshot": oString, "deleted": oBoolean}, "vm", "snapshot", "deleted")},
	}, (*Server).runSnapshotDelete)
}

// snapshotCreateArgs are snapshot_create's arguments.
type snapshotCreateArgs struct {
	Name        string `arg:"name"`
	Description string `arg:"description"`
	Memory      *bool  `arg:"memory"` // nil: memory when the backend can
}

func (a *snapshotCreateArgs) checkArgs() error {
	if err := checkSnapshotNameFree(a.Name); err != nil {
		return err
	}
	return cleanSnapshotError(hypervisor.ValidateSnapshotRequest(hypervisor.SnapshotRequest{Name: a.Name, Description: a.Description}))
}

func (a *snapshotCreateArgs) deadline(Limits) time.Duration { return snapshotDeadline }

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

func (a *snapshotNameArgs) checkArgs() error {
	if err := checkSnapshotNameFree(a.Name); err != nil {
		return err
	}
	return cleanSnapshotError(hypervisor.ValidateSnapshotName(a.Name))
}

func (a *snapshotNameArgs) deadline(Limits) time.Duration { return snapshotDeadline }

// snapshotListArgs are snapshot_list's arguments (the vm only).
type snapshotListArgs struct{}

func (a *snapshotListArgs) deadline(Limits) time.Duration { return snapshotDeadline }

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
func snapshotterFor(c *call) (hypervisor.Snapshotter, *result) {
	sn, ok := hypervisor.AsSnapshotter(c.driver)
	if !ok {
		r := failure(TagBackend, fmt.Sprintf("backend %q cannot take snapshots (vm_status and list_vms still work)", c.backend), true)
		return nil, &r
	}
	return sn, nil
}

// snapshotFailure maps a Snapshotter error to a tagged result that says
// what to do next; anything else goes through driverFailure.
func snapshotFailure(c *call, name string, err error) result {
	r := driverFailure(err)
	switch {
	case errors.Is(err, hypervisor.ErrSnapshotNotFound):
		r.tag, r.noEffect = TagInvalid, true
		r.text = fmt.Sprintf("%s has no snapshot %q (snapshot_list shows its snapshots)", c.vm, name)
	case errors.Is(err, hypervisor.ErrSnapshotExists):
		r.tag, r.noEffect = TagInvalid, true
		r.text = fmt.Sprintf("%s already has a snapshot %q: choose another name, or snapshot_delete it first", c.vm, name)
	case errors.Is(err, hypervisor.ErrSnapshotMemory):
		r.tag, r.noEffect = TagInvalid, true
		r.text = fmt.Sprintf("backend %q cannot take a snapshot with memory of %s (a stopped VM has none): retry with memory false", c.backend, c.vm)
	case errors.Is(err, hypervisor.ErrSnapshotChanged):
		r.tag, r.noEffect = TagInvalid, true
		r.text = fmt.Sprintf("%s: snapshot %q was made anew while the call ran (its identity changed); nothing was done: snapshot_list shows it as it is now", c.vm, name)
	case errors.Is(err, hypervisor.ErrSnapshotDiskOnly):
		r.tag, r.noEffect = TagInvalid, true
		r.text = fmt.Sprintf("backend %q cannot take a snapshot without memory: retry with memory true", c.backend)
	case errors.Is(err, hypervisor.ErrNotSupported):
		r.text = fmt.Sprintf("backend %q cannot do this with snapshots: %s", c.backend, backendReason(err.Error()))
	}
	return r
}

func (s *Server) runSnapshotCreate(c *call, a *snapshotCreateArgs) result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return *r
	}
	unlock, err := s.snaps.lock(c.ctx, c.vm)
	if err != nil {
		return failure(TagTimedOut, err.Error(), true)
	}
	defer unlock()
	req := a.request(sn.SnapshotModes())
	var b snapBudget
	if bounded(c.snapRules) {
		if b, r = s.budgetOf(c, sn); r != nil {
			return *r
		}
		if why := b.over(c.snapRules, req.Memory); why != "" {
			if !req.Memory || a.Memory != nil || !sn.SnapshotModes().DiskOnly || b.over(c.snapRules, false) != "" {
				return failure(TagDenied, c.vm+": "+why+": snapshot_delete one of the grant's snapshots first (snapshot_list shows them, their owners and sizes)", true)
			}
			req.Memory = false // memory alone broke the size bound, and the call left it to the server
		}
	}
	snap, err := sn.SnapshotCreate(c.ctx, c.name, req)
	if err != nil {
		return snapshotFailure(c, a.Name, err)
	}
	if why := s.snaps.fitsAfter(c, sn, &b, c.snapRules, snap, false); why != "" {
		return failure(TagDenied, c.vm+": "+why+s.dropTaken(c, sn, snap.Name), false)
	}
	if err := s.snaps.put(c.ctx, c, snap, nil); err != nil {
		r := failure(TagBackend, c.vm+": the snapshot was taken, but the grant could not be recorded as its owner ("+backendReason(err.Error())+")"+s.dropTaken(c, sn, snap.Name), false)
		r.detail = err.Error()
		return r
	}
	kind := "disks only"
	if snap.Memory {
		kind = "with memory"
	}
	return success(map[string]any{"vm": c.vm, "snapshot": snapshotView{Snapshot: snap, Owner: c.grant.Name}}, fmt.Sprintf("%s: snapshot %q taken (%s)", c.vm, snap.Name, kind))
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
func (s *Server) views(c *call, list []hypervisor.Snapshot) ([]snapshotView, error) {
	out := make([]snapshotView, len(list))
	recs, err := s.snaps.store.ListSnapshots(c.ctx, c.vm)
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

func (s *Server) runSnapshotList(c *call, _ *snapshotListArgs) result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return *r
	}
	list, err := sn.SnapshotList(c.ctx, c.name)
	if err != nil {
		return snapshotFailure(c, "", err)
	}
	views, err := s.views(c, list)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d snapshot(s)\n", c.vm, len(views))
	if err != nil {
		s.log.Warn("server: snapshot owners unknown", "vm", c.vm, "err", err)
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
			fmt.Fprintf(tw, "%s\t%s\t%t\t%t\t%s\t%s\n", v.Name, created, v.Memory, v.Current, owner, truncate(strings.Join(strings.Fields(v.Description), " "), 80))
		}
		tw.Flush()
	}
	return success(map[string]any{"vm": c.vm, "snapshots": views}, strings.TrimRight(b.String(), "\n"))
}

// touchable finds c's named snapshot and checks the grant may act on it.
func (s *Server) touchable(c *call, sn hypervisor.Snapshotter, name string) (hypervisor.Snapshot, *result) {
	snap, err := hypervisor.FindSnapshot(c.ctx, sn, c.name, name)
	if err != nil {
		r := snapshotFailure(c, name, err)
		return snap, &r
	}
	return snap, s.mayTouch(c, snap)
}

func (s *Server) runSnapshotRevert(c *call, a *snapshotNameArgs) result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return *r
	}
	snap, r := s.touchable(c, sn, a.Name)
	if r != nil {
		return *r
	}
	if err := revertChecked(c, sn, snap); err != nil {
		return snapshotFailure(c, a.Name, err)
	}
	return success(map[string]any{"vm": c.vm, "snapshot": a.Name, "reverted": true}, fmt.Sprintf("%s: reverted to snapshot %q", c.vm, a.Name))
}

func (s *Server) runSnapshotDelete(c *call, a *snapshotNameArgs) result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return *r
	}
	if _, r := s.touchable(c, sn, a.Name); r != nil {
		return *r
	}
	if err := sn.SnapshotDelete(c.ctx, c.name, a.Name); err != nil {
		return snapshotFailure(c, a.Name, err)
	}
	s.snaps.forget(c.ctx, c.vm, a.Name)
	return success(map[string]any{"vm": c.vm, "snapshot": a.Name, "deleted": true}, fmt.Sprintf("%s: snapshot %q deleted", c.vm, a.Name))
}

// snapshotShape is a hypervisor.Snapshot as the snapshot tools show it.
func snapshotShape() map[string]any {
	return oOpen(map[string]any{
		"name": oString, "description": oString, "created_at": oTime, "memory": oBoolean,
		"size_bytes": oNonNeg, "parent": oString, "current": oBoolean, "id": oString, "owner": oString, "undo": oBoolean,
	}, "name", "memory")
}
