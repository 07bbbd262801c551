package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
)

// undoName is an undo snapshot's name as the server makes it
// (server/undo.go: vmgate-undo-<expiry, base 36>-<call id, 12, lower>).
func undoName(callID string, expires time.Time) string {
	return "vmgate-undo-" + strconv.FormatInt(expires.Unix(), 36) + "-" + strings.ToLower(callID[:12])
}

// undoLog writes the calls of an undo list: UNDOALPHAONE (alpha on
// lab/a, 30 min ago, undone since), UNDOBETATWOX (beta on lab/b, 10 min
// ago), UNDOEXPIREDX (its retention over), UNDONOIDXXXX (no identity),
// UNDOFORGEDXX (a name beyond any retention: not the server's),
// UNDONODECISN (an outcome without a decision), UNDOPLAINXXX (no
// snapshot), and a failed undo of UNDOBETATWOX.
func undoLog(t *testing.T, now time.Time) string {
	t.Helper()
	type call struct {
		id, grant, vm string
		ago           time.Duration
		expires       time.Time
		snapID        string
		decision      bool
	}
	calls := []call{
		{"UNDOALPHAONE", "alpha", "lab/a", 30 * time.Minute, now.Add(time.Hour), "sn-1", true},
		{"UNDOBETATWOX", "beta", "lab/b", 10 * time.Minute, now.Add(time.Hour), "sn-2", true},
		{"UNDOEXPIREDX", "alpha", "lab/a", 3 * time.Hour, now.Add(-time.Minute), "sn-3", true},
		{"UNDONOIDXXXX", "alpha", "lab/a", 5 * time.Minute, now.Add(time.Hour), "", true},
		{"UNDOFORGEDXX", "alpha", "lab/a", 5 * time.Minute, now.Add(400 * 24 * time.Hour), "sn-5", true},
		{"UNDONODECISN", "alpha", "lab/a", 5 * time.Minute, now.Add(time.Hour), "sn-6", false},
		{"UNDOPLAINXXX", "alpha", "lab/a", 4 * time.Minute, time.Time{}, "", true},
	}
	var recs []audit.Record
	for _, c := range calls {
		at := now.Add(-c.ago)
		if c.decision {
			recs = append(recs, audit.Record{Time: at, Kind: audit.KindDecision, CallID: c.id, Grant: c.grant, Transport: "http",
				Tool: "vm_agent_exec", VM: c.vm, Decision: "allow", Args: map[string]any{"vm": c.vm, "shell": "rm -rf /srv"}})
		}
		out := audit.Record{Time: at.Add(time.Second), Kind: audit.KindOutcome, CallID: c.id, Grant: c.grant, Transport: "http",
			Tool: "vm_agent_exec", VM: c.vm, Outcome: "ok"}
		if !c.expires.IsZero() {
			out.Snapshot, out.SnapshotID, out.SnapshotTaken = undoName(c.id, c.expires), c.snapID, at
		}
		recs = append(recs, out)
	}
	for _, u := range []struct {
		call, outcome string
		at            time.Time
	}{{"UNDOALPHAONE", "ok", now.Add(-20 * time.Minute)}, {"UNDOBETATWOX", "error", now.Add(-time.Minute)}} {
		recs = append(recs, audit.Record{Time: u.at, Kind: audit.KindOutcome, CallID: "undo-" + u.call, Grant: "operator", Transport: "operator",
			Tool: "undo", VM: "lab/x", Outcome: u.outcome, Snapshot: "whatever", SnapshotID: "sn"})
	}
	return writeAuditLog(t, recs)
}

// TestUndoList: `vmgate undo --list` lists the calls whose undo snapshot
// can still be reverted to, newest first, with what each did and its
// snapshot's identity; a call whose retention is over, without an
// identity, with a name the server does not make, without a decision
// record or without a snapshot is left out; --grant and --vm narrow it;
// a successful undo is shown, a failed one is not.
func TestUndoList(t *testing.T) {
	now := time.Now()
	path := undoLog(t, now)
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"UNDOBETATWOX", "UNDOALPHAONE"}},
		{[]string{"--grant", "alpha"}, []string{"UNDOALPHAONE"}},
		{[]string{"--vm", "lab/b"}, []string{"UNDOBETATWOX"}},
		{[]string{"--grant", "alpha", "--vm", "lab/b"}, nil},
	} {
		out, errOut, code := runVmgate(t, append([]string{"undo", "--list", "--log", path, "--json"}, tt.args...)...)
		if code != 0 {
			t.Fatalf("undo --list %v: code %d, %s", tt.args, code, errOut)
		}
		var got []undoable
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("undo --list %v --json: %v: %q", tt.args, err, out)
		}
		var ids []string
		for _, u := range got {
			ids = append(ids, u.CallID)
		}
		if !slices.Equal(ids, tt.want) {
			t.Errorf("undo --list %v = %v; want %v", tt.args, ids, tt.want)
		}
		for _, u := range got {
			wantUndone := u.CallID == "UNDOALPHAONE"
			if u.Tool != "vm_agent_exec" || u.SnapshotID == "" || u.Snapshot != undoName(u.CallID, u.Expires) || u.Time.IsZero() || wantUndone == u.Undone.IsZero() {
				t.Errorf("undo --list %v: %+v; want the tool, the snapshot and its identity, its expiry, the call's time, undone %v", tt.args, u, wantUndone)
			}
		}
	}
	out, _, code := runVmgate(t, "undo", "--list", "--log", path)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "CALL ID") || !strings.HasPrefix(lines[1], "UNDOBETATWOX") ||
		!strings.Contains(lines[1], "sn-2") || !strings.Contains(lines[1], "lab/b") || !strings.Contains(lines[2], "alpha") {
		t.Errorf("undo --list table = %d, %q; want a header and the two calls, newest first, with VM, grant and identity", code, out)
	}
}

// TestUndoListRefusals: flags that belong to --list are refused without
// it, --list takes no call id, and a log that is not there says so.
func TestUndoListRefusals(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"undo", "CALLID", "--json"}, "go with --list"},
		{[]string{"undo", "--list", "CALLID"}, "unknown command"},
		{[]string{"undo", "--list", "--log", filepath.Join(t.TempDir(), "none.log")}, "there is no audit log"},
	} {
		_, errOut, code := runVmgate(t, tt.args...)
		if code == 0 || !strings.Contains(errOut, tt.want) {
			t.Errorf("vmgate %v = %d, %q; want an error saying %q", tt.args, code, errOut, tt.want)
		}
	}
	out, _, code := runVmgate(t, "undo", "--list", "--log", undoLog(t, time.Now().Add(30*24*time.Hour)), "--grant", "nobody", "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("undo --list with nothing to undo, --json = %d, %q; want []", code, out)
	}
}
