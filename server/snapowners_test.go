package server

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
)

// TestSnapshotNamesReserved: names in the server's namespace, in any case
// and with '_' for '-', are refused by snapshot_create, snapshot_revert and
// snapshot_delete before the policy and the driver; names that only look
// alike are not.
func TestSnapshotNamesReserved(t *testing.T) {
	tests := []struct {
		name     string
		reserved bool
	}{
		{"vmgate-undo-t880qt-abcdefabcdef", true},
		{"vmgate-undo-2ljx6ex7-fake", true},
		{"VMGATE-UNDO-T880QT-ABC", true},
		{"Vmgate-Undo-x", true},
		{"vmgate_undo-x", true},
		{"VMGATE_UNDO_X", true},
		{"vmgate-undo", true},
		{"vmgate-undone", true},
		{"vmgate-Undo_", true},
		{"my-vmgate-undo-x", false},
		{"vmgate-und", false},
		{"undo-vmgate", false},
		{"vmgate-backup", false},
		{"vmgateundo-x", false},
	}
	for _, tt := range tests {
		if got := catalog.ReservedSnapshotName(tt.name); got != tt.reserved {
			t.Errorf("catalog.ReservedSnapshotName(%q) = %v; want %v", tt.name, got, tt.reserved)
		}
		if !tt.reserved {
			continue
		}
		for _, tool := range []string{"snapshot_create", "snapshot_revert", "snapshot_delete"} {
			f, sf := newSnapFixture(t, bothModes, mcptest.AllowAll)
			sf.put("vm1", hypervisor.Snapshot{Name: tt.name, ID: "fake:planted"})
			r := f.call(t, tool, `{"vm":"lab/vm1","name":"`+tt.name+`"}`)
			if !mcptest.HasTag(r, TagInvalid) || !strings.Contains(r.Text(), "belong to the server's undo snapshots") || !strings.Contains(r.Text(), "vmgate undo") {
				t.Errorf("%s(%q) = %q; want %s saying the name is the server's", tool, tt.name, r.Text(), TagInvalid)
			}
			if n := sf.calls.Load(); n != 0 {
				t.Errorf("%s(%q): %d driver calls; want none", tool, tt.name, n)
			}
		}
	}
	// snapshot_list still shows them.
	f, sf := newSnapFixture(t, bothModes, mcptest.AllowAll)
	sf.put("vm1", hypervisor.Snapshot{Name: "vmgate-undo-t880qt-abc", ID: "fake:u"})
	if r := f.call(t, "snapshot_list", `{"vm":"lab/vm1"}`); r.Result == nil || r.Result.IsError || !strings.Contains(r.Text(), "vmgate-undo-t880qt-abc") {
		t.Errorf("snapshot_list = %q; want the undo snapshot listed", r.Text())
	}
}

// ownersPolicy lets grant "local" act on others' snapshots with others set.
func ownersPolicy(others bool) string {
	o := ""
	if others {
		o = `"snapshots": {"others": true}`
	}
	return `{"version":"1","default":"allow","tools":{"snapshot_revert":{` + o + `},"snapshot_delete":{` + o + `}}}`
}

// TestSnapshotOwnership: a grant reverts and deletes its own snapshots; a
// snapshot of another grant, or one made outside vmgate (no record, or a
// record of a snapshot since made anew), only with others on the tool,
// and the refusal names the owner.
func TestSnapshotOwnership(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(t *testing.T, f *fixture, sf *snapFake) // makes snapshot "s1" of lab/vm1
		others bool
		want   string // "" for allowed; else in the [POLICY DENIED] text
	}{
		{"own", func(t *testing.T, f *fixture, sf *snapFake) {
			okCall(t, f, "local", "snapshot_create", `{"vm":"lab/vm1","name":"s1"}`)
		}, false, ""},
		{"another grant's", func(t *testing.T, f *fixture, sf *snapFake) {
			okCall(t, f, "other", "snapshot_create", `{"vm":"lab/vm1","name":"s1"}`)
		}, false, "belongs to grant other"},
		{"another grant's, others allowed", func(t *testing.T, f *fixture, sf *snapFake) {
			okCall(t, f, "other", "snapshot_create", `{"vm":"lab/vm1","name":"s1"}`)
		}, true, ""},
		{"made outside vmgate", func(t *testing.T, f *fixture, sf *snapFake) {
			sf.put("vm1", hypervisor.Snapshot{Name: "s1", ID: "fake:outside"})
		}, false, "was not made through vmgate"},
		{"made outside vmgate, others allowed", func(t *testing.T, f *fixture, sf *snapFake) {
			sf.put("vm1", hypervisor.Snapshot{Name: "s1", ID: "fake:outside"})
		}, true, ""},
		{"own, made anew outside vmgate", func(t *testing.T, f *fixture, sf *snapFake) {
			okCall(t, f, "local", "snapshot_create", `{"vm":"lab/vm1","name":"s1"}`)
			sf.put("vm1", hypervisor.Snapshot{Name: "s1", ID: "fake:replaced"})
		}, false, "was not made through vmgate"},
		{"no identity from the backend", func(t *testing.T, f *fixture, sf *snapFake) { sf.put("vm1", hypervisor.Snapshot{Name: "s1"}) }, false, "was not made through vmgate"},
	}
	for _, tt := range tests {
		for _, tool := range []string{"snapshot_revert", "snapshot_delete"} {
			t.Run(tt.name+"/"+tool, func(t *testing.T) {
				sf := newSnapFake()
				f := newFixture(t, fixtureOpts{driver: sf.driver(bothModes), policy: ownersPolicy(tt.others), otherVMs: []string{"lab/*"}})
				t.Cleanup(func() { f.s.Close() })
				tt.setup(t, f, sf)
				r := f.call(t, tool, `{"vm":"lab/vm1","name":"s1"}`)
				_, kept := sf.get("vm1", "s1")
				switch {
				case tt.want == "" && (r.Result == nil || r.Result.IsError):
					t.Errorf("%s = %q; want it done", tool, r.Text())
				case tt.want != "" && (!mcptest.HasTag(r, TagDenied) || !strings.Contains(r.Text(), tt.want) || !strings.Contains(r.Text(), `"snapshots": {"others": true}`)):
					t.Errorf("%s = %q; want %s containing %q and naming the knob", tool, r.Text(), TagDenied, tt.want)
				case tt.want != "" && (len(sf.reverted) != 0 || !kept):
					t.Errorf("%s refused, yet reverted %q, snapshot kept %v", tool, sf.reverted, kept)
				case tt.want == "" && tool == "snapshot_delete" && kept:
					t.Errorf("%s done, yet s1 still exists", tool)
				case tt.want == "" && tool == "snapshot_revert" && len(sf.reverted) != 1:
					t.Errorf("%s done: reverts %q; want one", tool, sf.reverted)
				}
			})
		}
	}
}

// TestSnapshotListOwners: snapshot_list names each snapshot's owner, to
// any grant that may see the VM.
func TestSnapshotListOwners(t *testing.T) {
	sf := newSnapFake()
	f := newFixture(t, fixtureOpts{driver: sf.driver(bothModes), otherVMs: []string{"lab/*"}})
	t.Cleanup(func() { f.s.Close() })
	okCall(t, f, "local", "snapshot_create", `{"vm":"lab/vm1","name":"mine"}`)
	okCall(t, f, "other", "snapshot_create", `{"vm":"lab/vm1","name":"theirs"}`)
	sf.put("vm1", hypervisor.Snapshot{Name: "outside", ID: "fake:o", CreatedAt: time.Unix(1800000000, 0)})
	r := okCall(t, f, "other", "snapshot_list", `{"vm":"lab/vm1"}`)
	owners := map[string]any{}
	for _, s := range r.Result.StructuredContent["snapshots"].([]any) {
		m := s.(map[string]any)
		owners[m["name"].(string)] = m["owner"]
	}
	if want := map[string]any{"mine": "local", "theirs": "other", "outside": nil}; !maps.Equal(owners, want) {
		t.Errorf("snapshot_list owners = %v; want %v", owners, want)
	}
}

// boundsPolicy bounds local's snapshots per VM and snapshots every stop.
func boundsPolicy(bounds string) string {
	return `{"version":"1","default":"allow","snapshots":` + bounds + `,"tools":{"vm_power":{"snapshot_before":{"retention":"2h"}}}}`
}

// TestSnapshotBounds: snapshot_create and undo snapshots count against one
// bound per grant and VM; undo prunes the grant's oldest undo snapshots
// first (never its other snapshots, never another grant's), falls back to
// disks only when memory breaks the size bound, and refuses the call when
// nothing fits; snapshot_create never prunes.
func TestSnapshotBounds(t *testing.T) {
	const mem = 100 << 20
	type step struct {
		grant, tool, args string
		want              string // "" success; else a tag
	}
	create := func(grant, name string) step {
		return step{grant, "snapshot_create", `{"vm":"lab/vm1","name":"` + name + `"}`, ""}
	}
	stop := step{"local", "vm_power", `{"vm":"lab/vm1","action":"stop"}`, ""}
	tests := []struct {
		name   string
		bounds string
		modes  hypervisor.SnapshotModes
		steps  []step
		// after: local's snapshots of vm1 left, oldest first ("undo" for an
		// undo snapshot), and the memory of the last undo request.
		after     []string
		lastMem   bool
		refusedBy string // text the refused step's result holds
	}{
		{"count: undo prunes its oldest undo snapshot", `{"max_count": 2}`, bothModes,
			[]step{create("local", "keep"), stop, stop}, []string{"keep", "undo"}, true, ""},
		{"count: other grants do not count, are never pruned", `{"max_count": 2}`, bothModes,
			[]step{create("other", "theirs"), create("other", "theirs2"), stop, stop, stop}, []string{"undo", "undo"}, true, ""},
		{"count: only undo snapshots are pruned", `{"max_count": 2}`, bothModes,
			[]step{create("local", "s-a"), create("local", "s-b"), {stop.grant, stop.tool, stop.args, TagDenied}}, []string{"s-a", "s-b"}, true, "only the grant's undo snapshots are pruned"},
		{"count: snapshot_create never prunes", `{"max_count": 2}`, bothModes,
			[]step{stop, stop, {"local", "snapshot_create", `{"vm":"lab/vm1","name":"s-c"}`, TagDenied}}, []string{"undo", "undo"}, true, "max_count 2"},
		{"size: undo prunes, then fits with memory", `{"max_mb": 250}`, bothModes,
			[]step{stop, stop, stop, stop}, []string{"undo", "undo"}, true, ""},
		{"size: memory breaks the bound, disks only fit", `{"max_mb": 150}`, bothModes,
			[]step{create("local", "s-a"), stop}, []string{"s-a", "undo"}, false, ""},
		{"size: no disk-only mode, refused", `{"max_mb": 150}`, hypervisor.SnapshotModes{Memory: true},
			[]step{create("local", "s-a"), {stop.grant, stop.tool, stop.args, TagDenied}}, []string{"s-a"}, true, "max_mb 150"},
		{"size: snapshot_create with memory asked is refused", `{"max_mb": 150}`, bothModes,
			[]step{create("local", "s-a"), {"local", "snapshot_create", `{"vm":"lab/vm1","name":"s-b","memory":true}`, TagDenied}}, []string{"s-a"}, true, "max_mb 150"},
		{"size: snapshot_create falls back to disks only", `{"max_mb": 150}`, bothModes,
			[]step{create("local", "s-a"), create("local", "s-b")}, []string{"s-a", "s-b"}, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sf := newSnapFake()
			sf.memSize = mem
			drv := sf.driver(tt.modes)
			drv.PowerFunc = func(context.Context, string, hypervisor.PowerAction) error { return nil }
			f := newFixture(t, fixtureOpts{driver: drv, policy: boundsPolicy(tt.bounds), otherVMs: []string{"lab/*"}})
			t.Cleanup(func() { f.s.Close() })
			var refused mcptest.Reply
			for i, st := range tt.steps {
				f.advance(time.Second)
				r := f.sendAs(t, st.grant, mcptest.ToolCall(1, st.tool, st.args))
				if st.want == "" && (r.Result == nil || r.Result.IsError) {
					t.Fatalf("step %d %s as %s = %q; want success", i, st.tool, st.grant, r.Text())
				}
				if st.want != "" {
					if !mcptest.HasTag(r, st.want) {
						t.Fatalf("step %d %s as %s = %q; want %s", i, st.tool, st.grant, r.Text(), st.want)
					}
					refused = r
				}
			}
			if tt.refusedBy != "" && !strings.Contains(refused.Text(), tt.refusedBy) {
				t.Errorf("refusal = %q; want it to contain %q", refused.Text(), tt.refusedBy)
			}
			recs, _ := f.s.env.Snapshots.Store.ListSnapshots(context.Background(), "lab/vm1")
			var got []string
			for _, r := range recs {
				sn, ok := sf.get("vm1", r.Name)
				if r.Grant != "local" || !ok || sn.ID != r.ID {
					continue
				}
				if r.Undo {
					got = append(got, "undo")
				} else {
					got = append(got, r.Name)
				}
			}
			if !slices.Equal(got, tt.after) {
				t.Errorf("local's snapshots of lab/vm1 = %q; want %q", got, tt.after)
			}
			if undo := lastUndoReq(sf); undo != nil && undo.Memory != tt.lastMem {
				t.Errorf("last undo snapshot request memory = %v; want %v", undo.Memory, tt.lastMem)
			}
			for _, st := range tt.steps {
				if st.grant == "other" && st.tool == "snapshot_create" {
					var a struct{ Name string }
					_ = json.Unmarshal([]byte(st.args), &a)
					if _, ok := sf.get("vm1", a.Name); !ok {
						t.Errorf("grant other's snapshot %s is gone; want it never pruned", a.Name)
					}
				}
			}
			if sn, ok := sf.get("vm1", "s-b"); ok && strings.HasSuffix(tt.name, "falls back to disks only") && sn.Memory {
				t.Errorf("snapshot s-b = %+v; want it taken without memory", sn)
			}
			if strings.Contains(tt.name, "undo prunes") && !strings.Contains(strings.Join(sf.deleted, ","), "vmgate-undo-") {
				t.Errorf("deleted %q; want an undo snapshot pruned", sf.deleted)
			}
		})
	}
}

func lastUndoReq(sf *snapFake) *hypervisor.SnapshotRequest {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	for i := len(sf.reqs) - 1; i >= 0; i-- {
		if strings.HasPrefix(sf.reqs[i].Name, undoPrefix) {
			r := sf.reqs[i]
			return &r
		}
	}
	return nil
}

// TestSnapshotBoundsPruneOrder: the oldest undo snapshot goes first.
func TestSnapshotBoundsPruneOrder(t *testing.T) {
	sf := newSnapFake()
	drv := sf.driver(bothModes)
	drv.PowerFunc = func(context.Context, string, hypervisor.PowerAction) error { return nil }
	f := newFixture(t, fixtureOpts{driver: drv, policy: boundsPolicy(`{"max_count": 2}`)})
	t.Cleanup(func() { f.s.Close() })
	var names []string
	for range 4 {
		f.advance(time.Minute)
		r := okCall(t, f, "local", "vm_power", `{"vm":"lab/vm1","action":"reset"}`)
		names = append(names, r.Result.StructuredContent["undo_snapshot"].(string))
	}
	want := []string{"vm1 " + names[0], "vm1 " + names[1]}
	if got := sf.deleted; !slices.Equal(got, want) {
		t.Errorf("pruned %q; want the oldest first: %q", got, want)
	}
	for _, n := range names[2:] {
		if _, ok := sf.get("vm1", n); !ok {
			t.Errorf("undo snapshot %s (among the newest) is gone", n)
		}
	}
}

// undoCallOf runs a vm_power reset of vm under snapshot_before and returns
// its call id and undo snapshot.
func undoCallOf(t *testing.T, u *undoFixture, vm string) (string, string) {
	t.Helper()
	r := u.call(t, "vm_power", `{"vm":"`+vm+`","action":"reset"}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_power reset %s = %q", vm, r.Text())
	}
	return r.Result.StructuredContent["undo_call"].(string), r.Result.StructuredContent["undo_snapshot"].(string)
}

// TestUndoRevertsOnlyTheRecordedSnapshot: vmgate undo finds the call in the
// audit log, shows the operator when the snapshot was taken and what call
// it undoes, reverts the call's VM only, and refuses a snapshot that was
// made anew under the name since (before the approval and after it).
func TestUndoRevertsOnlyTheRecordedSnapshot(t *testing.T) {
	u := newUndoFixture(t, undoPolicy, bothModes)
	sock := startOperator(t, u.s, t.TempDir())
	ctx := context.Background()
	undo := func(call string) (*UndoResult, error) {
		return operatorUndo(ctx, sock, call)
	}
	grant := func(id string) {
		if err := operatorGrant(ctx, sock, id); err != nil {
			t.Fatalf("grant %s: %v", id, err)
		}
	}
	call1, snap1 := undoCallOf(t, u, "lab/vm1")
	taken, _ := u.sf.get("vm1", snap1)
	// The same name on another VM (made there directly): never looked at.
	u.sf.put("vm2", hypervisor.Snapshot{Name: snap1, ID: "fake:twin", CreatedAt: taken.CreatedAt})

	parked, err := undo(call1)
	if err != nil || parked.ApprovalID == "" || parked.VM != "lab/vm1" || parked.SnapshotID != taken.ID || !parked.Taken.Equal(taken.CreatedAt) || parked.Tool != "vm_power" || parked.Grant != "local" {
		t.Fatalf("undo = %+v, %v; want a parked approval for %s of lab/vm1 (%s), call vm_power of local", parked, err, snap1, taken.ID)
	}
	a, err := u.s.Approvals().Get(ctx, parked.ApprovalID)
	if err != nil {
		t.Fatal(err)
	}
	var args map[string]any
	if err := json.Unmarshal([]byte(a.FullArgs), &args); err != nil {
		t.Fatal(err)
	}
	if args["snapshot_taken"] != taken.CreatedAt.Format(time.RFC3339Nano) || args["call.tool"] != "vm_power" || args["call.grant"] != "local" ||
		args["snapshot_id"] != taken.ID || args["vm"] != "lab/vm1" || args["call.args.action"] != "reset" || args["call.time"] == "" || args["call"] != call1 {
		t.Errorf("approval arguments = %v; want when the snapshot was taken and the call it undoes", args)
	}
	grant(parked.ApprovalID)
	done, err := undo(call1)
	if err != nil || !done.Reverted {
		t.Fatalf("undo after the grant = %+v, %v; want reverted", done, err)
	}
	if want := []string{"vm1 " + snap1 + " " + taken.ID}; !slices.Equal(u.sf.reverted, want) {
		t.Errorf("reverts = %q; want %q (the call's VM, the recorded snapshot)", u.sf.reverted, want)
	}

	// Made anew under the name behind vmgate's back: refused, before and
	// after an approval.
	call2, snap2 := undoCallOf(t, u, "lab/vm1")
	old, _ := u.sf.get("vm1", snap2)
	p2, err := undo(call2)
	if err != nil {
		t.Fatalf("undo %s = %v", call2, err)
	}
	grant(p2.ApprovalID)
	u.sf.put("vm1", hypervisor.Snapshot{Name: snap2, ID: "fake:planted", CreatedAt: old.CreatedAt.Add(time.Minute), Memory: true})
	u.sf.reverted = nil
	for i := range 2 {
		res, err := undo(call2)
		if err == nil || !strings.Contains(err.Error(), "was replaced since the call") || !strings.Contains(err.Error(), "nothing reverted") || (res != nil && res.Reverted) {
			t.Errorf("undo %d of a replaced snapshot = %+v, %v; want refused, nothing reverted", i, res, err)
		}
	}
	if len(u.sf.reverted) != 0 {
		t.Errorf("reverts = %q; want none", u.sf.reverted)
	}
}

// TestUndoForgedNames: a name whose expiry lies beyond the longest
// retention is never the server's: the reaper neither adopts nor deletes
// it, and an outcome record naming one is not undone.
func TestUndoForgedNames(t *testing.T) {
	u := newUndoFixture(t, undoPolicy, bothModes)
	now := time.Unix(0, u.now.Load())
	forged := []string{"vmgate-undo-99999999999-fake", undoName("FORGEDAAAAAAAAAA", now.Add(31*24*time.Hour))}
	fair := undoName("FAIRAAAAAAAAAAAA", now.Add(29*24*time.Hour))
	for _, n := range append(forged, fair) {
		if _, _, ok := parseUndoName(n); !ok {
			t.Fatalf("parseUndoName(%q) not ok; the test needs names that parse", n)
		}
		u.sf.put("vm1", hypervisor.Snapshot{Name: n, ID: "fake:" + n})
	}
	if errs := u.s.undo.reap(context.Background()); len(errs) != 0 {
		t.Fatalf("reap = %v", errs)
	}
	u.s.undo.mu.Lock()
	var adopted []string
	for _, e := range u.s.undo.byKey {
		if e.VM == "lab/vm1" {
			adopted = append(adopted, e.Name)
		}
	}
	u.s.undo.mu.Unlock()
	if !slices.Equal(adopted, []string{fair}) {
		t.Errorf("the reaper adopted %q; want only %s", adopted, fair)
	}
	u.advance(40 * 24 * time.Hour)
	if errs := u.s.undo.reap(context.Background()); len(errs) != 0 {
		t.Fatalf("reap = %v", errs)
	}
	for _, n := range forged {
		if _, ok := u.sf.get("vm1", n); !ok {
			t.Errorf("forged %s was deleted as the server's", n)
		}
	}
	if _, ok := u.sf.get("vm1", fair); ok {
		t.Errorf("%s outlived its expiry", fair)
	}
	// An outcome record naming a forged name (a log edited by hand) is not undone.
	call := "FORGEDAAAAAAAAAAAAAAAAAAAA"
	_, _ = u.rec.Append(context.Background(), audit.Record{Kind: audit.KindDecision, CallID: call, Grant: "local", Tool: "vm_power", VM: "lab/vm1", Decision: "allow", Time: now})
	_ = u.rec.AppendLazy(context.Background(), audit.Record{Kind: audit.KindOutcome, CallID: call, Grant: "local", Tool: "vm_power", VM: "lab/vm1",
		Outcome: "ok", Snapshot: forged[1], SnapshotID: "fake:" + forged[1], SnapshotTaken: now})
	if _, err := u.s.Undo(context.Background(), call, "tester"); err == nil || !strings.Contains(err.Error(), "is not the name of an undo snapshot the server takes") {
		t.Errorf("Undo(a call naming %s) = %v; want refused", forged[1], err)
	}
	if _, err := u.s.Undo(context.Background(), "NOSUCHCALLAAAAAAAAAAAAAAAA", "tester"); err == nil || !strings.Contains(err.Error(), "the audit log has no outcome record") {
		t.Errorf("Undo(an unknown call) = %v; want the audit log named", err)
	}
}

// TestUndoOwnerRecord: an undo snapshot belongs to the call's grant, as an
// undo snapshot, and the reaper drops its record with it.
func TestUndoOwnerRecord(t *testing.T) {
	u := newUndoFixture(t, undoPolicy, bothModes)
	call, snap := undoCallOf(t, u, "lab/vm1")
	r, err := u.s.env.Snapshots.Store.GetSnapshot(context.Background(), "lab/vm1", snap)
	if err != nil || r.Grant != "local" || !r.Undo || r.CallID != call || r.Expires.IsZero() {
		t.Fatalf("owner record of %s = %+v, %v; want local's undo snapshot of call %s", snap, r, err, call)
	}
	u.advance(3 * time.Hour)
	if errs := u.s.undo.reap(context.Background()); len(errs) != 0 {
		t.Fatalf("reap = %v", errs)
	}
	if _, err := u.s.env.Snapshots.Store.GetSnapshot(context.Background(), "lab/vm1", snap); err == nil {
		t.Errorf("owner record of %s kept after the reaper deleted it", snap)
	} else if !strings.Contains(err.Error(), store.ErrUnknownSnapshot.Error()) {
		t.Errorf("GetSnapshot after the reap = %v; want unknown", err)
	}
}
