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
)

// Undo snapshots. When a call's decision carries a policy.SnapshotBefore
// (the tool's snapshot_before block) and the call is one that can destroy
// guest state (vm_power stop or reset, destroy_session, vm_agent_exec),
// the server takes a snapshot of the VM before the handler runs: with
// memory where the backend can (so a revert resumes the guest as it was),
// else of the disks. A snapshot that cannot be taken refuses the call
// before it runs (nothing fails open). The snapshot's name goes into the
// result and the call's outcome record; it is deleted once its retention
// is over.
//
// The retention lives in the name itself, vmgate-undo-<expiry>-<call>
// (the expiry in Unix seconds, base 36; the call id's first 12 characters,
// lowercase), so nothing but the backend has to remember it: after a
// restart the first reaper pass lists the snapshots of every VM whose
// backend has them and picks up the undo snapshots it finds. Concurrency:
// undoKeeper's maps are guarded by its mutex, never held across I/O.

// undoPrefix starts every undo snapshot's name.
const undoPrefix = "vmgate-undo-"

// undoCallChars is how much of the call id the name keeps.
const undoCallChars = 12

// undoGrace is added to the deadline of a call that takes an undo snapshot.
var undoGrace = 10 * time.Minute

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

// wantsUndo reports whether c is a call its snapshot_before applies to.
func (c *call) wantsUndo() bool {
	if c.snapshot == nil || c.driver == nil {
		return false
	}
	switch c.spec.name {
	case "vm_power":
		a, ok := c.args.(*powerArgs)
		return ok && (a.Action == string(hypervisor.PowerStop) || a.Action == string(hypervisor.PowerReset))
	case "destroy_session", "vm_agent_exec":
		return true
	}
	return false
}

// undoEntry is one undo snapshot the server knows of.
type undoEntry struct {
	VM      string    `json:"vm"`
	Name    string    `json:"snapshot"`
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

// find returns the undo snapshot of call id callID (full or its prefix).
func (k *undoKeeper) find(callID string) (undoEntry, bool) {
	_, short, ok := parseUndoName(undoName(callID, time.Unix(1, 0)))
	if !ok {
		return undoEntry{}, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, e := range k.byKey {
		if _, c, _ := parseUndoName(e.Name); c == short {
			return e, true
		}
	}
	return undoEntry{}, false
}

// takeUndo takes c's undo snapshot. It returns a result when the call
// must not run.
func (s *Server) takeUndo(c *call) *result {
	sn, ok := hypervisor.AsSnapshotter(c.driver)
	if !ok {
		r := failure(TagBackend, fmt.Sprintf("the policy wants a snapshot before %s (%s), and backend %q cannot take snapshots; the call did not run", c.spec.name, c.snapshot.Rule, c.backend), true)
		return &r
	}
	expires := s.now().Add(c.snapshot.Retention)
	req := hypervisor.SnapshotRequest{
		Name:        undoName(c.id, expires),
		Description: fmt.Sprintf("vmgate: before %s, call %s of grant %s; kept until %s", c.spec.name, c.id, c.grant.Name, expires.UTC().Format(time.RFC3339)),
		Memory:      sn.SnapshotModes().Memory,
	}
	_, err := sn.SnapshotCreate(c.ctx, c.name, req)
	if errors.Is(err, hypervisor.ErrSnapshotMemory) && sn.SnapshotModes().DiskOnly {
		req.Memory = false // a stopped VM: its disks are all there is
		_, err = sn.SnapshotCreate(c.ctx, c.name, req)
	}
	if err != nil {
		r := snapshotFailure(c, req.Name, err)
		r.tag, r.noEffect = TagBackend, true
		r.text = "the policy wants a snapshot before this call, and it could not be taken (" + r.text + "); the call did not run"
		return &r
	}
	c.undo = &undoEntry{VM: c.vm, Name: req.Name, Expires: expires}
	s.undo.add(*c.undo)
	s.log.Info("server: undo snapshot taken", "call", c.id, "vm", c.vm, "snapshot", req.Name, "expires", expires)
	return nil
}

// withUndo adds c's undo snapshot to r.
func (c *call) withUndo(r result) result {
	if c.undo == nil {
		return r
	}
	u := c.undo
	if m, ok := r.structured.(map[string]any); ok {
		m["undo_snapshot"] = u.Name
		m["undo_expires"] = u.Expires.UTC().Format(time.RFC3339)
	}
	r.text += fmt.Sprintf("\nundo: snapshot %s of %s was taken first and is kept until %s (snapshot_revert to it, or an operator runs vmgate undo %s)",
		u.Name, u.VM, u.Expires.UTC().Format(time.RFC3339), c.id)
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
				if exp, _, ok := parseUndoName(s.Name); ok {
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
