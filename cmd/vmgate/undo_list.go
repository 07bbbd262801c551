package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server"
)

// `vmgate undo --list`: the calls whose undo snapshot can still be
// reverted to, from the audit log alone (read as the server writes it,
// without its locks, like `vmgate audit search`): a call's outcome record
// names the snapshot the server took before it and its identity, its
// decision record when it was made, and the name when the snapshot's
// retention ends. The server checks, when `vmgate undo CALL_ID` runs, that
// the snapshot is still there with that identity (one pruned to keep a
// grant within its bounds, or deleted on the backend, is refused then).

// undoListOptions are --list's flags.
type undoListOptions struct {
	log, grant, vm string
	json           bool
}

// undoable is one call that can be undone, as --list shows it.
type undoable struct {
	CallID        string    `json:"call_id"`
	Time          time.Time `json:"time"`
	Grant         string    `json:"grant"`
	Tool          string    `json:"tool"`
	VM            string    `json:"vm"`
	Snapshot      string    `json:"snapshot"`
	SnapshotID    string    `json:"snapshot_id"`
	SnapshotTaken time.Time `json:"snapshot_taken,omitzero"`
	Expires       time.Time `json:"expires"`
	// Undone is when `vmgate undo` last reverted to the snapshot (it
	// stays, so the call can be undone again until it expires).
	Undone time.Time `json:"undone,omitzero"`
}

// undoPrefix starts the call id of an undo's own records.
const undoCallPrefix = "undo-"

// listUndoable reads the log at path for the calls of o.grant on o.vm
// (either may be empty: any) that can be undone at now, newest first.
func listUndoable(path string, o undoListOptions, now time.Time) ([]undoable, error) {
	byCall := map[string]*undoable{}
	undone := map[string]time.Time{}
	err := searchLog(path, audit.Filter{Kind: audit.KindOutcome, VM: o.vm}, func(r *audit.Record) {
		switch {
		case r.Snapshot == "" || r.SnapshotID == "":
		case strings.HasPrefix(r.CallID, undoCallPrefix):
			if id := strings.TrimPrefix(r.CallID, undoCallPrefix); r.Outcome == "ok" && r.Time.After(undone[id]) {
				undone[id] = r.Time
			}
		case o.grant == "" || r.Grant == o.grant:
			byCall[r.CallID] = &undoable{CallID: r.CallID, Grant: r.Grant, Tool: r.Tool, VM: r.VM,
				Snapshot: r.Snapshot, SnapshotID: r.SnapshotID, SnapshotTaken: r.SnapshotTaken}
		}
	})
	if err != nil || len(byCall) == 0 {
		return nil, err
	}
	err = searchLog(path, audit.Filter{Kind: audit.KindDecision, VM: o.vm, Grant: o.grant}, func(r *audit.Record) {
		if u, ok := byCall[r.CallID]; ok && u.Time.IsZero() {
			u.Time = r.Time
		}
	})
	if err != nil {
		return nil, err
	}
	var out []undoable
	for id, u := range byCall {
		exp, ok := server.UndoExpiry(u.Snapshot, u.Time)
		if u.Time.IsZero() || !ok || !now.Before(exp) {
			continue // no decision record (undo refuses it too), not ours, or expired
		}
		u.Expires, u.Undone = exp, undone[id]
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b undoable) int {
		return cmp.Or(b.Time.Compare(a.Time), strings.Compare(a.CallID, b.CallID))
	})
	return out, nil
}

// searchLog calls fn with each record of the log at path that f matches.
func searchLog(path string, f audit.Filter, fn func(*audit.Record)) error {
	file, err := openLog("undo --list", path)
	if err != nil {
		return err
	}
	defer file.Close()
	if _, err := audit.Search(file, f, func(m *audit.Match) error { fn(&m.Record); return nil }); err != nil {
		return fmt.Errorf("undo --list: %s: %w", path, err)
	}
	return nil
}

// writeUndoable prints list as a table, or as a JSON array.
func writeUndoable(out io.Writer, list []undoable, asJSON bool) error {
	if asJSON {
		if list == nil {
			list = []undoable{}
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(out, "no call can be undone (no undo snapshot in the audit log that has not expired)")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL ID\tTIME\tGRANT\tTOOL\tVM\tSNAPSHOT\tIDENTITY\tEXPIRES\tUNDONE")
	for _, u := range list {
		done := "-"
		if !u.Undone.IsZero() {
			done = stamp(u.Undone)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(u.CallID, 40), stamp(u.Time), cell(u.Grant, 40), cell(u.Tool, 40),
			cell(u.VM, 80), cell(u.Snapshot, 80), cell(u.SnapshotID, 80), stamp(u.Expires), done)
	}
	return tw.Flush()
}
