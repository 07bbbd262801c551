package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/keylock"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// Snapshots belong to the grant that made them. When snapshot_create or
// an undo snapshot (server/undo.go) succeeds, the server records the owner in the
// store (store.Snapshots: bbolt, Redis or memory, like sessions), with the
// snapshot's identity as the backend gave it. A snapshot is a grant's
// when the record of its VM and name names the identity the snapshot has
// now; any other (no record, or a record of a snapshot since made anew
// under the name outside vmgate) was made outside vmgate. Why the store and
// not the audit log: replicas share the store, the server asks on every
// snapshot call (the log would be read whole each time), and a record has
// to go when its snapshot is deleted.
//
// snapshot_list shows every snapshot with its owner. snapshot_revert and
// snapshot_delete act on the grant's own snapshots; another grant's, or
// one made outside vmgate, only when the tool's policy says "snapshots":
// {"others": true} ([POLICY DENIED] naming the owner otherwise). Names
// starting with vmgate-undo (any case, '-' or '_') are the server's alone:
// every snapshot tool but snapshot_list refuses them before the policy
// sees the call.
//
// The policy's top-level snapshots block bounds a grant's snapshots of a
// VM in number and total size (as the backend reports sizes). Before a
// snapshot is taken the server counts the grant's snapshots of the VM and
// estimates the new one's size as that of the VM's largest memory snapshot
// (or 0 without one, or for a disk-only snapshot); after, it checks the
// real size. snapshot_create beyond a bound is refused (without memory
// when memory alone broke the size bound, the call did not ask for it and
// the backend can); an undo snapshot first prunes the grant's oldest undo
// snapshots of the VM, then falls back to disks only, and refuses the call
// when it still does not fit. Snapshot-taking calls on one VM take turns
// in this server (SnapOwners.Lock), so two of them cannot both pass a count; across
// replicas a bound may be passed by the calls in flight at once.

// undoPrefixFold is the server's namespace, lower case with '-' for '_'.
const undoPrefixFold = "vmgate-undo"

// ReservedSnapshotName reports whether name is in the server's namespace
// (an undo snapshot's, in any case, with '-' or '_').
func ReservedSnapshotName(name string) bool {
	return strings.HasPrefix(strings.ReplaceAll(strings.ToLower(name), "_", "-"), undoPrefixFold)
}

// CheckSnapshotNameFree refuses a name in the server's namespace.
func CheckSnapshotNameFree(name string) error {
	if !ReservedSnapshotName(name) {
		return nil
	}
	return fmt.Errorf("snapshot name %q: names starting with %q (in any case, with '-' or '_') belong to the server's undo snapshots, "+
		"which no grant creates, reverts or deletes: choose another name; an operator reverts a call's undo snapshot with vmgate undo CALL_ID",
		Truncate(name, 64), undoPrefixFold)
}

// SnapOwners keeps the owner records and the per-VM turns. A VM's lock is
// held across the snapshot calls it guards, and forgotten once nobody holds
// or waits for it (a fleet's VMs come and go). It is safe for concurrent
// use.
type SnapOwners struct {
	// Store keeps the owner records.
	Store store.Snapshots
	now   func() time.Time
	log   *slog.Logger
	// pruned is told of every undo snapshot pruned (the gate forgets it).
	pruned func(vm, name string)
	locks  keylock.Map
}

// NewSnapOwners keeps owner records in st; pruned (may be nil) is told of
// every undo snapshot PruneFor deletes.
func NewSnapOwners(st store.Snapshots, now func() time.Time, log *slog.Logger, pruned func(vm, name string)) *SnapOwners {
	if pruned == nil {
		pruned = func(vm, name string) {}
	}
	return &SnapOwners{Store: st, now: now, log: log, pruned: pruned}
}

// Lock takes vm's turn for snapshot-taking calls, or fails when ctx ends
// first; the caller calls the returned unlock.
func (o *SnapOwners) Lock(ctx context.Context, vm string) (func(), error) {
	unlock, err := o.locks.Lock(ctx, vm)
	if err != nil {
		return nil, fmt.Errorf("waiting for another snapshot of %s: %w", vm, err)
	}
	return unlock, nil
}

// owner returns the record of sn on vm and whether it names sn as it is
// now (owned false: made outside vmgate, or a stale record).
func (o *SnapOwners) owner(ctx context.Context, vm string, sn hypervisor.Snapshot) (store.SnapshotRecord, bool, error) {
	r, err := o.Store.GetSnapshot(ctx, vm, sn.Name)
	if errors.Is(err, store.ErrUnknownSnapshot) {
		return store.SnapshotRecord{}, false, nil
	}
	if err != nil {
		return store.SnapshotRecord{}, false, err
	}
	return r, sn.ID != "" && r.ID == sn.ID, nil
}

// Put records c's grant as the owner of snap; undoExpires is when an undo
// snapshot expires (zero: snap is no undo snapshot).
func (o *SnapOwners) Put(ctx context.Context, c *Call, snap hypervisor.Snapshot, undoExpires time.Time) error {
	r := store.SnapshotRecord{VM: c.VM, Name: snap.Name, ID: snap.ID, Grant: c.Grant.Name, CallID: c.ID,
		Created: snap.CreatedAt, Memory: snap.Memory, SizeBytes: snap.SizeBytes}
	if r.Created.IsZero() {
		r.Created = o.now()
	}
	if !undoExpires.IsZero() {
		r.Undo, r.Expires = true, undoExpires
	}
	if r.ID == "" {
		return fmt.Errorf("backend gave snapshot %q no identity, so it cannot be owned", snap.Name)
	}
	return o.Store.PutSnapshot(ctx, r)
}

// Forget drops vm's record of name (one already gone is fine).
func (o *SnapOwners) Forget(ctx context.Context, vm, name string) {
	if err := o.Store.DeleteSnapshot(ctx, vm, name); err != nil && !errors.Is(err, store.ErrUnknownSnapshot) {
		o.log.Warn("server: snapshot owner record not removed", "vm", vm, "snapshot", name, "err", err)
	}
}

// ownerText says whose sn is, for messages.
func ownerText(r store.SnapshotRecord, owned bool) string {
	if owned {
		return "belongs to grant " + r.Grant
	}
	return "was not made through vmgate (no owner is recorded for it as it is now)"
}

// MayTouch refuses c (snapshot_revert or snapshot_delete) on sn unless sn
// is c's grant's or the policy lets the tool act on others' snapshots.
func (o *SnapOwners) MayTouch(c *Call, sn hypervisor.Snapshot) *Result {
	r, owned, err := o.owner(c.Ctx, c.VM, sn)
	if err != nil {
		res := Failure(TagDenied, "the snapshot owner records cannot be read, so the call is refused (the store: "+BackendReason(err.Error())+")", true)
		res.Detail = err.Error()
		return &res
	}
	if owned && r.Grant == c.Grant.Name || c.Rules.Snapshots.Others {
		return nil
	}
	res := Failure(TagDenied, fmt.Sprintf("%s: snapshot %q %s; this grant's policy lets %s act on its own snapshots only "+
		"(\"snapshots\": {\"others\": true} on %s lets it act on others' and on ones made outside vmgate)",
		c.VM, sn.Name, ownerText(r, owned), c.Tool, c.Tool), true)
	return &res
}

// SnapBudget is what c's grant's snapshots of a VM hold.
type SnapBudget struct {
	count, bytes int64
	// undo are the grant's undo snapshots there, oldest first (what may
	// be pruned), with their sizes now.
	undo []hypervisor.Snapshot
	// estimate is the size of a new memory snapshot: the largest the
	// backend reports for the VM's memory snapshots.
	estimate int64
}

// budget counts c's grant's snapshots of its VM in list (the backend's),
// dropping records whose snapshot is gone or was made anew.
func (o *SnapOwners) budget(ctx context.Context, c *Call, list []hypervisor.Snapshot) (SnapBudget, error) {
	var b SnapBudget
	byName := make(map[string]hypervisor.Snapshot, len(list))
	for _, sn := range list {
		byName[sn.Name] = sn
		if sn.Memory {
			b.estimate = max(b.estimate, sn.SizeBytes)
		}
	}
	recs, err := o.Store.ListSnapshots(ctx, c.VM)
	if err != nil {
		return b, err
	}
	for _, r := range recs {
		sn, ok := byName[r.Name]
		if !ok || sn.ID != r.ID {
			o.Forget(ctx, r.VM, r.Name) // gone, or made anew outside vmgate: no one's
			continue
		}
		if r.Grant != c.Grant.Name {
			continue
		}
		b.count++
		b.bytes += sn.SizeBytes
		if r.Undo {
			b.undo = append(b.undo, sn)
		}
	}
	return b, nil
}

// Over says why one more snapshot (with memory or not) breaks rules'
// bounds, "" when it fits.
func (b *SnapBudget) Over(rules policy.SnapshotRules, memory bool) string {
	add := int64(0)
	if memory {
		add = b.estimate
	}
	switch {
	case rules.MaxCount > 0 && b.count+1 > rules.MaxCount:
		return fmt.Sprintf("the grant has %d snapshots of the VM, the most its policy allows (%s: max_count %d)", b.count, rules.Rule, rules.MaxCount)
	case rules.MaxBytes > 0 && b.bytes+add > rules.MaxBytes:
		return fmt.Sprintf("the grant's snapshots of the VM hold %s and a new one would add about %s, beyond its policy's bound (%s: max_mb %d)",
			sizeMiB(b.bytes), sizeMiB(add), rules.Rule, rules.MaxBytes>>20)
	}
	return ""
}

// sizeMiB is n bytes in MiB, for messages.
func sizeMiB(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// PruneFor deletes the grant's oldest undo snapshots of c's VM until one
// more (with memory or not) fits rules, or none is left to prune; it
// returns why it still does not fit ("" when it does).
func (o *SnapOwners) PruneFor(c *Call, sn hypervisor.Snapshotter, b *SnapBudget, rules policy.SnapshotRules, memory bool) string {
	for {
		why := b.Over(rules, memory)
		if why == "" || len(b.undo) == 0 {
			return why
		}
		old := b.undo[0]
		err := sn.SnapshotDelete(c.Ctx, c.Name, old.Name)
		if err != nil && !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
			o.log.Warn("server: pruning an undo snapshot failed", "vm", c.VM, "snapshot", old.Name, "err", err)
			return why + "; pruning the oldest undo snapshot " + old.Name + " failed: " + BackendReason(err.Error())
		}
		o.Forget(c.Ctx, c.VM, old.Name)
		o.pruned(c.VM, old.Name)
		o.log.Info("server: undo snapshot pruned to stay within the grant's bounds", "vm", c.VM, "snapshot", old.Name, "grant", c.Grant.Name)
		b.count--
		b.bytes -= old.SizeBytes
		b.undo = b.undo[1:]
	}
}

// FitsAfter checks the snapshot just taken against the size bound; over
// it, the grant's older undo snapshots are pruned when prune is set. It
// returns why the snapshot does not fit ("" when it does).
func (o *SnapOwners) FitsAfter(c *Call, sn hypervisor.Snapshotter, b *SnapBudget, rules policy.SnapshotRules, taken hypervisor.Snapshot, prune bool) string {
	if rules.MaxBytes <= 0 || b.bytes+taken.SizeBytes <= rules.MaxBytes {
		return ""
	}
	if prune {
		// The count fitted before; what one more of exactly this size
		// needs is now the question.
		b.estimate = taken.SizeBytes
		if o.PruneFor(c, sn, b, rules, true) == "" {
			return ""
		}
	}
	return fmt.Sprintf("the new snapshot holds %s and with it the grant's snapshots of the VM would hold %s, beyond its policy's bound (%s: max_mb %d)",
		sizeMiB(taken.SizeBytes), sizeMiB(b.bytes+taken.SizeBytes), rules.Rule, rules.MaxBytes>>20)
}

// Bounded reports whether rules bound anything (else no budget is needed).
func Bounded(rules policy.SnapshotRules) bool { return rules.MaxCount > 0 || rules.MaxBytes > 0 }

// Budget lists c's VM's snapshots and counts its grant's; the result is
// set when either could not be read (nothing happened).
func (o *SnapOwners) Budget(c *Call, sn hypervisor.Snapshotter) (SnapBudget, *Result) {
	list, err := sn.SnapshotList(c.Ctx, c.Name)
	if err != nil {
		r := SnapshotFailure(c, "", err)
		r.NoEffect = true
		return SnapBudget{}, &r
	}
	b, err := o.budget(c.Ctx, c, list)
	if err != nil {
		r := Failure(TagDenied, "the snapshot owner records cannot be read, so the grant's snapshot bounds cannot be checked and the call is refused (the store: "+BackendReason(err.Error())+")", true)
		r.Detail = err.Error()
		return SnapBudget{}, &r
	}
	return b, nil
}

// DropTaken deletes a snapshot the server just took and cannot keep, and
// says how that went (to end a message with).
func (o *SnapOwners) DropTaken(c *Call, sn hypervisor.Snapshotter, name string) string {
	if err := sn.SnapshotDelete(c.Ctx, c.Name, name); err != nil && !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		o.log.Error("server: a snapshot that cannot be kept was not deleted", "vm", c.VM, "snapshot", name, "err", err)
		return "; deleting it again failed too (" + BackendReason(err.Error()) + "): snapshot_delete it"
	}
	return "; it was deleted again"
}
