package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/mcptest"
)

const undoPolicy = `{"version":"1","default":"allow","tools":{
  "vm_power": {"snapshot_before": {"retention": "2h"}, "limits": [{"counter": "power", "window": "minute", "max": 5, "scope": "grant"}]}
}}`

// undoFixture is a server over a snapFake whose Power is recorded in order
// with the snapshots.
type undoFixture struct {
	*fixture
	sf    *snapFake
	mu    sync.Mutex
	order []string
}

func newUndoFixture(t *testing.T, pol string, modes hypervisor.SnapshotModes) *undoFixture {
	t.Helper()
	u := &undoFixture{sf: newSnapFake()}
	drv := u.sf.driver(modes)
	create := drv.SnapshotCreateFunc
	drv.SnapshotCreateFunc = func(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
		u.note("snapshot " + req.Name)
		return create(ctx, vm, req)
	}
	drv.PowerFunc = func(ctx context.Context, vm string, action hypervisor.PowerAction) error {
		u.note("power " + string(action))
		return nil
	}
	u.fixture = newFixture(t, fixtureOpts{driver: drv, policy: pol})
	t.Cleanup(func() { u.s.Close() })
	return u
}

func (u *undoFixture) note(s string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.order = append(u.order, s)
}

func (u *undoFixture) steps() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.order)
}

func outcomeOf(recs []audit.Record, tool string) (audit.Record, bool) {
	for _, r := range recs {
		if r.Kind == audit.KindOutcome && r.Tool == tool {
			return r, true
		}
	}
	return audit.Record{}, false
}

// TestSnapshotBeforeStop: vm_power stop under snapshot_before takes a
// snapshot (with memory) first, names it in the result and the outcome
// record, and keeps it for the policy's retention.
func TestSnapshotBeforeStop(t *testing.T) {
	u := newUndoFixture(t, undoPolicy, bothModes)
	r := u.call(t, "vm_power", `{"vm":"lab/vm1","action":"stop"}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_power stop = %q; want success", r.Text())
	}
	name, _ := r.Result.StructuredContent["undo_snapshot"].(string)
	exp, _, ok := parseUndoName(name)
	wantExp := time.Unix(0, u.now.Load()).Add(2 * time.Hour)
	if !ok || !exp.Equal(wantExp.Truncate(time.Second)) {
		t.Fatalf("undo_snapshot = %q (expiry %v, ok %v); want an undo name expiring at %v", name, exp, ok, wantExp)
	}
	if got, want := u.steps(), []string{"snapshot " + name, "power stop"}; !slices.Equal(got, want) {
		t.Errorf("driver calls = %q; want %q", got, want)
	}
	if len(u.sf.reqs) != 1 || !u.sf.reqs[0].Memory || !strings.Contains(u.sf.reqs[0].Description, "before vm_power") {
		t.Errorf("snapshot requests = %+v; want one with memory describing the call", u.sf.reqs)
	}
	if !strings.Contains(r.Text(), "undo: snapshot "+name+" of lab/vm1") || !strings.Contains(r.Text(), "vmgate undo ") {
		t.Errorf("vm_power text = %q; want the undo snapshot named", r.Text())
	}
	out, ok := outcomeOf(u.rec.Records(), "vm_power")
	if !ok || out.Snapshot != name || out.Outcome != "ok" {
		t.Errorf("outcome record = %+v; want outcome ok with snapshot %q", out, name)
	}
	taken, _ := u.sf.get("vm1", name)
	if out.SnapshotID == "" || out.SnapshotID != taken.ID || !out.SnapshotTaken.Equal(taken.CreatedAt) {
		t.Errorf("outcome record snapshot identity %q taken %v; want the backend's %q, %v", out.SnapshotID, out.SnapshotTaken, taken.ID, taken.CreatedAt)
	}
	sc := r.Result.StructuredContent
	if sc["undo_call"] != out.CallID || sc["undo_taken"] != taken.CreatedAt.Format(time.RFC3339Nano) {
		t.Errorf("structuredContent = %v; want undo_call %s and undo_taken %v", sc, out.CallID, taken.CreatedAt)
	}
	if !strings.Contains(r.Text(), "vmgate undo "+out.CallID) {
		t.Errorf("vm_power text = %q; want the call id for vmgate undo", r.Text())
	}
}

// TestSnapshotBeforeOnlyDestructive: start and reboot take no snapshot; a
// snapshot that cannot be taken keeps the call from running.
func TestSnapshotBeforeOnlyDestructive(t *testing.T) {
	u := newUndoFixture(t, undoPolicy, bothModes)
	for _, a := range []string{"start", "reboot", "shutdown"} {
		if r := u.call(t, "vm_power", `{"vm":"lab/vm1","action":"`+a+`"}`); r.Result == nil || r.Result.IsError || r.Result.StructuredContent["undo_snapshot"] != nil {
			t.Errorf("vm_power %s = %q %v; want success without a snapshot", a, r.Text(), r.Result)
		}
	}
	if len(u.sf.reqs) != 0 {
		t.Errorf("snapshot requests = %+v; want none", u.sf.reqs)
	}

	tests := []struct {
		name  string
		err   error
		modes hypervisor.SnapshotModes
		want  string
	}{
		{"backend fails", fmt.Errorf("qmp: %w: no space left on device", hypervisor.ErrBackend), bothModes, "no space left on device; free space in the guest (vm_agent_exec with df -h shows where)); the call did not run"},
		{"timeout", fmt.Errorf("qmp: %w", hypervisor.ErrTimeout), bothModes, "could not be taken"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUndoFixture(t, undoPolicy, tt.modes)
			u.sf.err = tt.err
			r := u.call(t, "vm_power", `{"vm":"lab/vm1","action":"reset"}`)
			if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), tt.want) || !strings.Contains(r.Text(), "the call did not run") {
				t.Errorf("vm_power reset = %q; want %s containing %q", r.Text(), TagBackend, tt.want)
			}
			if slices.Contains(u.steps(), "power reset") {
				t.Errorf("driver calls = %q; want no power action", u.steps())
			}
			if out, _ := outcomeOf(u.rec.Records(), "vm_power"); !out.Refunded || out.Snapshot != "" {
				t.Errorf("outcome = %+v; want refunded, no snapshot", out)
			}
		})
	}
}

// TestSnapshotBeforeNoBackendSupport: a backend without snapshots is
// named, and the call does not run.
func TestSnapshotBeforeNoBackendSupport(t *testing.T) {
	var powered bool
	drv := hypervisortest.Counting(new(atomic.Int64))
	drv.PowerFunc = func(ctx context.Context, vm string, action hypervisor.PowerAction) error { powered = true; return nil }
	f := newFixture(t, fixtureOpts{driver: drv, policy: undoPolicy})
	t.Cleanup(func() { f.s.Close() })
	r := f.call(t, "vm_power", `{"vm":"lab/vm1","action":"stop"}`)
	if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), `backend "lab" cannot take snapshots`) || powered {
		t.Errorf("vm_power stop without snapshots = %q (powered %v); want %s naming the backend, and no power action", r.Text(), powered, TagBackend)
	}
}

// TestSnapshotBeforeDiskOnlyFallback: a VM the backend cannot snapshot
// with memory (a stopped one) gets a snapshot of its disks.
func TestSnapshotBeforeDiskOnlyFallback(t *testing.T) {
	u := newUndoFixture(t, undoPolicy, bothModes)
	u.sf.noMemory = true
	r := u.call(t, "vm_power", `{"vm":"lab/vm1","action":"stop"}`)
	if r.Result == nil || r.Result.IsError || r.Result.StructuredContent["undo_snapshot"] == nil {
		t.Fatalf("vm_power stop = %q; want success with an undo snapshot", r.Text())
	}
	if len(u.sf.reqs) != 2 || !u.sf.reqs[0].Memory || u.sf.reqs[1].Memory {
		t.Errorf("snapshot requests = %+v; want with memory, then disks only", u.sf.reqs)
	}
}

// TestUndoNames: names round-trip and fit every backend's rule; other
// names are not taken for undo snapshots.
func TestUndoNames(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	name := undoName("M367F7VAU6LKHFP3IHFGJXTBR7", exp)
	if err := hypervisor.ValidateSnapshotName(name); err != nil {
		t.Errorf("ValidateSnapshotName(%q) = %v; want nil", name, err)
	}
	got, call, ok := parseUndoName(name)
	if !ok || !got.Equal(exp) || call != "m367f7vau6lk" {
		t.Errorf("parseUndoName(%q) = %v, %q, %v; want %v, m367f7vau6lk, true", name, got, call, ok, exp)
	}
	for _, bad := range []string{"before-upgrade", "vmgate-undo-", "vmgate-undo-zz", "vmgate-undo--abc", "vmgate-undo-0-abc", "vmgate-undo-1x-a-b", "vmgate-undo-!!-abc"} {
		if _, _, ok := parseUndoName(bad); ok {
			t.Errorf("parseUndoName(%q) ok; want false", bad)
		}
	}
}

// TestUndoReaper: expired undo snapshots are deleted, others kept; after a
// restart the first pass finds the undo snapshots already on the VMs.
func TestUndoReaper(t *testing.T) {
	u := newUndoFixture(t, undoPolicy, bothModes)
	now := time.Unix(0, u.now.Load())
	old := undoName("OLDCALLAAAAAAAAA", now.Add(-time.Minute))
	keep := undoName("KEEPCALLAAAAAAAA", now.Add(time.Hour))
	u.sf.put("vm1", hypervisor.Snapshot{Name: old})
	u.sf.put("vm1", hypervisor.Snapshot{Name: keep})
	u.sf.put("vm1", hypervisor.Snapshot{Name: "mine"})
	if r := u.call(t, "vm_power", `{"vm":"lab/vm1","action":"stop"}`); r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_power stop = %q", r.Text())
	}
	taken := u.sf.reqs[0].Name
	if errs := u.s.undo.reap(context.Background()); len(errs) != 0 {
		t.Fatalf("reap = %v", errs)
	}
	if _, ok := u.sf.get("vm1", old); ok {
		t.Errorf("snapshot %s (expired before the restart) still exists after the first pass", old)
	}
	for _, n := range []string{keep, "mine", taken} {
		if _, ok := u.sf.get("vm1", n); !ok {
			t.Errorf("snapshot %s was deleted; want it kept", n)
		}
	}
	u.advance(2*time.Hour + time.Second)
	if errs := u.s.undo.reap(context.Background()); len(errs) != 0 {
		t.Fatalf("reap = %v", errs)
	}
	for n, want := range map[string]bool{keep: false, taken: false, "mine": true} {
		if _, ok := u.sf.get("vm1", n); ok != want {
			t.Errorf("after the retention, snapshot %s exists = %v; want %v", n, ok, want)
		}
	}
	// A delete that fails is retried on the next pass.
	again := undoName("AGAINCALLAAAAAAA", time.Unix(0, u.now.Load()).Add(-time.Second))
	u.sf.put("vm1", hypervisor.Snapshot{Name: again})
	u.s.undo.add(undoEntry{VM: "lab/vm1", Name: again, Expires: time.Unix(0, u.now.Load()).Add(-time.Second)})
	u.sf.err = errors.New("busy")
	if errs := u.s.undo.reap(context.Background()); len(errs) != 1 {
		t.Errorf("reap with a failing delete = %v; want one error", errs)
	}
	u.sf.err = nil
	if errs := u.s.undo.reap(context.Background()); len(errs) != 0 {
		t.Errorf("reap = %v", errs)
	}
	if _, ok := u.sf.get("vm1", again); ok {
		t.Errorf("snapshot %s still exists after the retry", again)
	}
}

// TestUndoOperator: vmgate undo parks an approval, reverts once it is
// granted, audits both, and needs a new approval for another revert.
func TestUndoOperator(t *testing.T) {
	u := newUndoFixture(t, undoPolicy, bothModes)
	var reverted []string
	drv := u.s.backends["lab"].(*hypervisortest.Fake)
	revert := drv.SnapshotRevertFunc
	drv.SnapshotRevertFunc = func(ctx context.Context, vm, name string) error {
		reverted = append(reverted, vm+" "+name)
		return revert(ctx, vm, name)
	}
	sock := startOperator(t, u.s, t.TempDir())
	if r := u.call(t, "vm_power", `{"vm":"lab/vm1","action":"reset"}`); r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_power reset = %q", r.Text())
	}
	out, _ := outcomeOf(u.rec.Records(), "vm_power")
	ctx := context.Background()
	undo := func() (*UndoResult, error) {
		return operatorUndo(ctx, sock, out.CallID)
	}
	first, err := undo()
	if err != nil || first == nil || first.Reverted || first.ApprovalID == "" || first.Snapshot != out.Snapshot || first.VM != "lab/vm1" {
		t.Fatalf("first undo = %+v, %v; want a parked approval for %s", first, err, out.Snapshot)
	}
	if again, err := undo(); err != nil || again.ApprovalID != first.ApprovalID || again.Reverted {
		t.Errorf("second undo before the grant = %+v, %v; want the same pending approval %s", again, err, first.ApprovalID)
	}
	if len(reverted) != 0 {
		t.Fatalf("reverted %q before any approval", reverted)
	}
	if err := operatorGrant(ctx, sock, first.ApprovalID); err != nil {
		t.Fatalf("grant: %v", err)
	}
	done, err := undo()
	if err != nil || !done.Reverted {
		t.Fatalf("undo after the grant = %+v, %v; want reverted", done, err)
	}
	if want := []string{"vm1 " + out.Snapshot}; !slices.Equal(reverted, want) {
		t.Errorf("reverts = %q; want %q", reverted, want)
	}
	if next, err := undo(); err != nil || next.Reverted || next.ApprovalID == first.ApprovalID {
		t.Errorf("undo after the approval was used = %+v, %v; want a new pending approval", next, err)
	}
	var sawOutcome bool
	for _, rec := range u.rec.Records() {
		if rec.Tool == undoTool && rec.Kind == audit.KindOutcome {
			sawOutcome = rec.Outcome == "ok" && rec.Snapshot == out.Snapshot && rec.VM == "lab/vm1"
		}
	}
	if !sawOutcome {
		t.Errorf("no ok outcome record of the undo with its snapshot in %+v", u.rec.Records())
	}
}
