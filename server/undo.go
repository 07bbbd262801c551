package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/server/catalog"
)

// Undo snapshots. When a call's decision carries a policy.SnapshotBefore
// (the tool's snapshot_before block) and the call is one that can destroy
// guest state (vm_power stop or reset, destroy_session, vm_agent_exec),
// the server takes a snapshot of the VM before the handler runs: with
// memory where the backend can (so a revert resumes the guest as it was),
// else of the disks. A snapshot that cannot be taken refuses the call
// before it runs (nothing fails open). The snapshot's name goes into the
// result (text and structuredContent, with the call id that `vmgate undo`
// takes) and, with its identity as the backend gives it, into the call's
// outcome record; it belongs to the call's grant (catalog/snapowners.go: it counts
// against the grant's bounds, and the oldest are pruned first) and is
// deleted once its retention is over.
//
// The retention lives in the name itself, vmgate-undo-<expiry>-<call>
// (the expiry in Unix seconds, base 36; the call id's first 12 characters,
// lowercase), so nothing but the backend has to remember it: after a
// restart the first reaper pass lists the snapshots of every VM whose
// backend has them and picks up the undo snapshots it finds. A name whose
// expiry lies beyond the longest retention (policy.MaxSnapshotRetention)
// was not made by the server and is never treated as its own. No grant can
// make such a name (catalog/snapowners.go), and `vmgate undo` trusts the audit log,
// not the name (undo_operator.go). Concurrency: undoKeeper's maps are
// guarded by its mutex, never held across I/O.

// undoPrefix starts every undo snapshot's name.
const undoPrefix = "vmgate-undo-"

// undoCallChars is how much of the call id the name keeps.
const undoCallChars = 12

// undoName is the name of the undo snapshot of call id, kept until expires.
func undoName(callID string, expires time.Time) string {
	id := strings.ToLower(callID)
	if len(id) > undoCallChars {
		id = id[:undoCallChars]
	}
	return undoPrefix + strconv.FormatInt(expires.Unix(), 36) + "-" + id
}

// parseUndoName returns the expiry and call id prefix of an undo
// snapshot's name; ok is false for any other name.
func parseUndoName(name string) (expires time.Time, call string, ok bool) {
	rest, found := strings.CutPrefix(name, undoPrefix)
	if !found {
		return time.Time{}, "", false
	}
	exp, call, found := strings.Cut(rest, "-")
	if !found || call == "" || len(call) > undoCallChars || strings.ContainsAny(call, "-_") {
		return time.Time{}, "", false
	}
	secs, err := strconv.ParseInt(exp, 36, 64)
	if err != nil || secs <= 0 {
		return time.Time{}, "", false
	}
	return time.Unix(secs, 0), call, true
}

// wantsUndo reports whether c is a call its snapshot_before applies to:
// one whose arguments say it can destroy guest state (catalog.Undoable).
func (c *call) wantsUndo() bool {
	return c.snapshot != nil && c.Driver != nil && catalog.UndoApplies(c.Args)
}

// undoSlack is how far past the longest retention an undo name's expiry
// may lie (clock steps, the time between a call's decision and its
// snapshot) and still be the server's.
const undoSlack = 15 * time.Minute

// undoExpiryOK reports whether expiry exp, read from a name, is one the
// server could have written at ref: never beyond the longest retention.
func undoExpiryOK(exp, ref time.Time) bool {
	return exp.Sub(ref) <= policy.MaxSnapshotRetention+undoSlack
}

// undoEntry is one undo snapshot the server knows of.
type undoEntry struct {
	VM   string `json:"vm"`
	Name string `json:"snapshot"`
	// ID and Taken are the snapshot's identity and time as the backend
	// gave them (empty and zero for one found by a sweep).
	ID      string    `json:"snapshot_id,omitempty"`
	Taken   time.Time `json:"snapshot_taken,omitzero"`
	Expires time.Time `json:"expires"`
}

// undoKeeper remembers the undo snapshots and deletes them when they
// expire.
type undoKeeper struct {
	s *Server

	mu    sync.Mutex
	byKey map[string]undoEntry // vm + "\x00" + name
	swept bool                 // the first full listing was done
}

func newUndoKeeper(s *Server) *undoKeeper {
	return &undoKeeper{s: s, byKey: map[string]undoEntry{}}
}

func (k *undoKeeper) add(e undoEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.byKey[e.VM+"\x00"+e.Name] = e
}

func (k *undoKeeper) forget(e undoEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.byKey, e.VM+"\x00"+e.Name)
}

// forgetPruned forgets the undo snapshot name of vm, which the snapshot
// owners pruned to keep a grant within its bounds.
func (k *undoKeeper) forgetPruned(vm, name string) { k.forget(undoEntry{VM: vm, Name: name}) }

// undoFailure is the result of a call whose undo snapshot could not be
// taken or kept: tag, why, and that the call did not run.
func undoFailure(tag, why string) *catalog.Result {
	r := catalog.Failure(tag, "the policy wants a snapshot before this call, and "+why+"; the call did not run", true)
	return &r
}

// takeUndo takes c's undo snapshot within its grant's bounds and records
// it. It returns a result when the call must not run.
func (s *Server) takeUndo(c *call) *catalog.Result {
	sn, ok := hypervisor.AsSnapshotter(c.Driver)
	if !ok {
		r := catalog.Failure(TagBackend, fmt.Sprintf("the policy wants a snapshot before %s (%s), and backend %q cannot take snapshots; the call did not run", c.Tool, c.snapshot.Rule, c.Backend), true)
		return &r
	}
	owners := s.env.Snapshots
	unlock, err := owners.Lock(c.Ctx, c.VM)
	if err != nil {
		return undoFailure(TagTimedOut, err.Error())
	}
	defer unlock()
	expires := s.now().Add(c.snapshot.Retention)
	req := hypervisor.SnapshotRequest{
		Name:        undoName(c.ID, expires),
		Description: fmt.Sprintf("vmgate: before %s, call %s of grant %s; kept until %s", c.Tool, c.ID, c.Grant.Name, expires.UTC().Format(time.RFC3339)),
		Memory:      sn.SnapshotModes().Memory,
	}
	rules := c.Rules.Snapshots
	var b catalog.SnapBudget
	if catalog.Bounded(rules) {
		var r *catalog.Result
		if b, r = owners.Budget(&c.Call, sn); r != nil {
			return undoFailure(r.Tag, r.Text)
		}
		if why := owners.PruneFor(&c.Call, sn, &b, rules, req.Memory); why != "" {
			if !req.Memory || !sn.SnapshotModes().DiskOnly || b.Over(rules, false) != "" {
				return undoFailure(TagDenied, "it does not fit the grant's snapshot bounds of "+c.VM+" ("+why+"; only the grant's undo snapshots are pruned)")
			}
			req.Memory = false // disks only fit
		}
	}
	snap, r := s.createUndo(c, sn, req)
	if r != nil {
		return r
	}
	return s.keepUndo(c, sn, &b, snap, expires)
}

// createUndo takes the snapshot req asks for, of the disks only when the
// VM has no memory to save (a stopped one).
func (s *Server) createUndo(c *call, sn hypervisor.Snapshotter, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, *catalog.Result) {
	snap, err := sn.SnapshotCreate(c.Ctx, c.Name, req)
	if errors.Is(err, hypervisor.ErrSnapshotMemory) && sn.SnapshotModes().DiskOnly {
		req.Memory = false // a stopped VM: its disks are all there is
		snap, err = sn.SnapshotCreate(c.Ctx, c.Name, req)
	}
	if err != nil {
		r := catalog.SnapshotFailure(&c.Call, req.Name, err)
		r.Tag, r.NoEffect = TagBackend, true
		r.Text = "the policy wants a snapshot before this call, and it could not be taken (" + r.Text + "); the call did not run"
		return snap, &r
	}
	return snap, nil
}

// keepUndo checks the snapshot just taken against the grant's size bound,
// records its owner and remembers it; a snapshot that cannot be kept is
// deleted again and the call does not run.
func (s *Server) keepUndo(c *call, sn hypervisor.Snapshotter, b *catalog.SnapBudget, snap hypervisor.Snapshot, expires time.Time) *catalog.Result {
	owners := s.env.Snapshots
	why := ""
	switch {
	case snap.ID == "":
		why = fmt.Sprintf("backend %q gives snapshots no identity, so vmgate undo could never verify it", c.Backend)
	case catalog.Bounded(c.Rules.Snapshots):
		if w := owners.FitsAfter(&c.Call, sn, b, c.Rules.Snapshots, snap, true); w != "" {
			why = "it does not fit the grant's snapshot bounds of " + c.VM + " (" + w + ")"
		}
	}
	e := undoEntry{VM: c.VM, Name: snap.Name, ID: snap.ID, Taken: snap.CreatedAt, Expires: expires}
	if e.Taken.IsZero() {
		e.Taken = s.now()
	}
	if why == "" {
		if err := owners.Put(c.Ctx, &c.Call, snap, e.Expires); err != nil {
			why = "its owner could not be recorded (" + catalog.BackendReason(err.Error()) + ")"
		}
	}
	if why != "" {
		return undoFailure(TagBackend, why+owners.DropTaken(&c.Call, sn, snap.Name))
	}
	c.undo = &e
	s.undo.add(e)
	s.log.Info("server: undo snapshot taken", "call", c.ID, "vm", c.VM, "snapshot", snap.Name, "id", snap.ID, "expires", expires)
	return nil
}

// withUndo adds c's undo snapshot to r: its name, when it was taken, when
// it expires and the call id vmgate undo takes.
func (c *call) withUndo(r catalog.Result) catalog.Result {
	if c.undo == nil {
		return r
	}
	u := c.undo
	if m, ok := r.Structured.(map[string]any); ok {
		m["undo_snapshot"] = u.Name
		m["undo_call"] = c.ID
		m["undo_taken"] = u.Taken.UTC().Format(time.RFC3339Nano)
		m["undo_expires"] = u.Expires.UTC().Format(time.RFC3339)
	}
	r.Text += fmt.Sprintf("\nundo: snapshot %s of %s was taken first, at %s, and is kept until %s (an operator reverts the VM to it with vmgate undo %s)",
		u.Name, u.VM, u.Taken.UTC().Format(time.RFC3339), u.Expires.UTC().Format(time.RFC3339), c.ID)
	return r
}

// reap deletes the undo snapshots past their expiry. The first pass lists
// every VM's snapshots to find those taken before a restart.
func (k *undoKeeper) reap(ctx context.Context) []error {
	var errs []error
	if !k.isSwept() {
		errs = append(errs, k.sweep(ctx)...)
	}
	now := k.s.now()
	k.mu.Lock()
	var due []undoEntry
	for _, e := range k.byKey {
		if !now.Before(e.Expires) {
			due = append(due, e)
		}
	}
	k.mu.Unlock()
	for _, e := range due {
		if err := k.delete(ctx, e); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func (k *undoKeeper) isSwept() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.swept
}

// delete removes an expired undo snapshot; one already gone is forgotten.
func (k *undoKeeper) delete(ctx context.Context, e undoEntry) error {
	backend, name, _ := strings.Cut(e.VM, "/")
	sn, ok := hypervisor.AsSnapshotter(k.s.backends[backend])
	if !ok {
		k.forget(e)
		return nil
	}
	err := sn.SnapshotDelete(ctx, name, e.Name)
	if err != nil && !errors.Is(err, hypervisor.ErrSnapshotNotFound) && !errors.Is(err, hypervisor.ErrUnknownVM) {
		k.s.log.Warn("server: undo snapshot: delete failed; retried on the next pass", "vm", e.VM, "snapshot", e.Name, "err", err)
		return fmt.Errorf("server: undo: delete %s of %s: %w", e.Name, e.VM, err)
	}
	k.forget(e)
	k.s.env.Snapshots.Forget(ctx, e.VM, e.Name)
	k.s.log.Info("server: undo snapshot expired and deleted", "vm", e.VM, "snapshot", e.Name)
	return nil
}

// sweep lists the snapshots of every VM whose backend has snapshots and
// remembers the undo snapshots among them.
func (k *undoKeeper) sweep(ctx context.Context) []error {
	var errs []error
	for backend, d := range k.s.backends {
		sn, ok := hypervisor.AsSnapshotter(d)
		if !ok {
			continue
		}
		vms, err := d.ListVMs(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("server: undo: list VMs of %s: %w", backend, err))
			continue
		}
		for _, vm := range vms {
			list, err := sn.SnapshotList(ctx, vm.Name)
			if err != nil {
				continue // a stopped or vanished VM: the next sweep after a restart tries again
			}
			for _, s := range list {
				if exp, _, ok := parseUndoName(s.Name); ok && undoExpiryOK(exp, k.s.now()) {
					k.add(undoEntry{VM: backend + "/" + vm.Name, Name: s.Name, Expires: exp})
				}
			}
		}
	}
	if len(errs) == 0 {
		k.mu.Lock()
		k.swept = true
		k.mu.Unlock()
	}
	return errs
}
