package lease

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// countingStore counts the lease reads that cost a store round trip and
// can fail them.
type countingStore struct {
	*memory.Store
	lists, gets atomic.Int64
	down        atomic.Bool
}

var errDown = errors.New("store down")

func (c *countingStore) ListLeases(ctx context.Context) ([]store.Lease, error) {
	c.lists.Add(1)
	if c.down.Load() {
		return nil, errDown
	}
	return c.Store.ListLeases(ctx)
}

func (c *countingStore) GetLease(ctx context.Context, id string) (store.Lease, error) {
	c.gets.Add(1)
	if c.down.Load() {
		return store.Lease{}, errDown
	}
	return c.Store.GetLease(ctx, id)
}

// countedLeases is testLeases over a countingStore, with template
// "small" (VMs named small-…) on backend lab.
func countedLeases(t *testing.T) (*testLeases, *countingStore) {
	tl := newTestLeases(t)
	cs := &countingStore{Store: tl.store}
	tl.Keeper.store = cs
	tl.templates = map[string]*config.Template{"small": {Name: "small", Backend: "lab"}}
	return tl, cs
}

// otherReplicaLease stores a live lease of grant for name as another
// replica would: this server's index does not know it.
func otherReplicaLease(t *testing.T, tl *testLeases, name, grant string) store.Lease {
	t.Helper()
	l, err := store.ValidateLease(store.Lease{ID: newLeaseID(), Name: name, Grant: grant, Template: "small", TTL: time.Hour,
		Created: *tl.clock, Until: tl.clock.Add(time.Minute), Holder: "call-elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.store.AcquireLease(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestViewFromIndex: once the index is loaded, list_vms's view answers
// from it with no store read per listing: another grant's created VM is
// hidden, its creator sees it with the lease's state and end; only a VM
// named like a template's VMs that the index does not know makes the
// view read the store, once.
func TestViewFromIndex(t *testing.T) {
	tl, cs := countedLeases(t)
	ctx := context.Background()
	tl.Reap(ctx) // loads the index
	l, err := tl.Create(ctx, createReq("small-a"))
	if err != nil {
		t.Fatal(err)
	}
	cs.lists.Store(0)
	cs.gets.Store(0)
	bob, alice := tl.View(ctx, "bob"), tl.View(ctx, "alice")
	if bob.Shows("lab", "lab/small-a") || !alice.Shows("lab", "lab/small-a") {
		t.Errorf("Shows(lab/small-a) = bob %v, alice %v; want hidden from bob, shown to its creator alice", bob.Shows("lab", "lab/small-a"), alice.Shows("lab", "lab/small-a"))
	}
	if !bob.Shows("lab", "lab/vm1") || !bob.Shows("other", "other/small-a") {
		t.Error("Shows of VMs nobody created = false; want true")
	}
	want := Info{CreatedBy: "alice", Template: "small", Lease: "live", LeaseEnds: l.Expires.UTC().Format(time.RFC3339)}
	if got := alice.Info("lab/small-a"); got == nil || *got != want {
		t.Errorf("Info(lab/small-a) = %+v; want %+v", got, want)
	}
	if got := alice.Info("lab/vm1"); got != nil {
		t.Errorf("Info(lab/vm1) = %+v; want nil", got)
	}
	if n, g := cs.lists.Load(), cs.gets.Load(); n+g != 0 {
		t.Errorf("store reads for a listing served by the index: %d lists, %d gets; want none", n, g)
	}
	otherReplicaLease(t, tl, "lab/small-z", "carol")
	w := tl.View(ctx, "bob")
	if w.Shows("lab", "lab/small-z") {
		t.Error("Shows(lab/small-z), another replica's VM of carol, to bob = true; want false")
	}
	if !w.Shows("lab", "lab/small-y") || w.Shows("lab", "lab/small-a") {
		t.Error("after the store read: small-y (nobody's) hidden or small-a (alice's) shown to bob")
	}
	if n := cs.lists.Load(); n != 1 {
		t.Errorf("store lists for two unknown template-named VMs in one view = %d; want 1", n)
	}
}

// TestViewStoreDown: before the index is loaded the view reads the store;
// when it does not answer, VMs of backends that make VMs are left out and
// the view says why.
func TestViewStoreDown(t *testing.T) {
	tl, cs := countedLeases(t)
	ctx := context.Background()
	cs.down.Store(true)
	w := tl.View(ctx, "bob")
	if !errors.Is(w.Err, errDown) || w.Shows("lab", "lab/vm1") || !w.Shows("other", "other/vm1") {
		t.Errorf("view with the store down: err %v, lab/vm1 %v, other/vm1 %v; want the store's error, lab's VMs left out, other's shown",
			w.Err, w.Shows("lab", "lab/vm1"), w.Shows("other", "other/vm1"))
	}
	cs.down.Store(false)
	otherReplicaLease(t, tl, "lab/small-z", "carol")
	w = tl.View(ctx, "bob")
	if w.Err != nil || w.Shows("lab", "lab/small-z") || !w.Shows("lab", "lab/vm1") {
		t.Errorf("view before the index is loaded: err %v; want carol's small-z hidden from bob, lab/vm1 shown", w.Err)
	}
	if got := tl.View(ctx, "carol").Info("lab/small-z"); got == nil || got.CreatedBy != "carol" || got.Lease != "creating" {
		t.Errorf("Info(lab/small-z) from the store = %+v; want carol's, creating", got)
	}
	var nilKeeper *Keeper
	if w := nilKeeper.View(ctx, "bob"); !w.Shows("lab", "lab/x") || w.Info("lab/x") != nil {
		t.Error("a nil Keeper's view hides or marks a VM")
	}
}

// TestFindByLeaseID: vm_delete's Find reads a VM the index knows by its
// lease's id (no listing of every lease); a VM it does not know, or whose
// lease another replica replaced, is found by listing.
func TestFindByLeaseID(t *testing.T) {
	tl, cs := countedLeases(t)
	ctx := context.Background()
	tl.Reap(ctx)
	l, err := tl.Create(ctx, createReq("small-a"))
	if err != nil {
		t.Fatal(err)
	}
	cs.lists.Store(0)
	if got, ok, err := tl.Find(ctx, "lab/small-a"); err != nil || !ok || got.ID != l.ID || cs.lists.Load() != 0 || cs.gets.Load() != 1 {
		t.Errorf("Find(lab/small-a) = %v, %v, %v after %d lists, %d gets; want its lease by one get", got.ID, ok, err, cs.lists.Load(), cs.gets.Load())
	}
	// Another replica deleted it and made a new one under the name.
	if err := tl.store.ReleaseLease(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	nl := otherReplicaLease(t, tl, "lab/small-a", "carol")
	if got, ok, err := tl.Find(ctx, "lab/small-a"); err != nil || !ok || got.ID != nl.ID {
		t.Errorf("Find(lab/small-a) after another replica replaced its lease = %v, %v, %v; want the new lease %s", got.ID, ok, err, nl.ID)
	}
	if _, ok, err := tl.Find(ctx, "lab/small-none"); ok || err != nil {
		t.Errorf("Find(lab/small-none) = %v, %v; want not found", ok, err)
	}
	cs.down.Store(true)
	if _, _, err := tl.Find(ctx, "lab/small-a"); !errors.Is(err, errDown) {
		t.Errorf("Find with the store down = %v; want its error", err)
	}
}
