package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// testLeases is a Keeper over a memory store and a fake "lab" backend,
// with a clock the test moves.
type testLeases struct {
	*Keeper
	fake  *hypervisortest.Creator
	store *memory.Store
	clock *time.Time
}

func newTestLeases(t *testing.T) *testLeases {
	t.Helper()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tl := &testLeases{fake: &hypervisortest.Creator{}, store: memory.New(), clock: &now}
	tl.Keeper = &Keeper{
		store: tl.store,
		creator: func(b string) (hypervisor.Creator, bool) {
			return tl.fake, b == "lab"
		},
		now:        func() time.Time { return *tl.clock },
		log:        slog.New(slog.DiscardHandler),
		holder:     "reaper@test",
		createHold: CreateDeadline + time.Minute,
		deleteHold: DeleteDeadline + time.Minute,
		every:      time.Hour,
		warned:     map[string]time.Time{},
	}
	return tl
}

func (tl *testLeases) advance(d time.Duration) { *tl.clock = tl.clock.Add(d) }

var vmsQuota = policy.Quota{Key: "vms|grant=5:alice", Name: "vms", Max: 2, Weight: 1, Rule: "/tools/vm_create/limits/0"}

func createReq(name string) CreateRequest {
	return CreateRequest{Backend: "lab", Name: name, Grant: "alice", Template: "small", CallID: "call-" + name,
		MemoryMB: 256, CPUs: 1, TTL: 10 * time.Minute, Quotas: []policy.Quota{vmsQuota}}
}

func TestLeaseCreateAndExpire(t *testing.T) {
	tl := newTestLeases(t)
	var ended []string
	tl.onEnd = func(l store.Lease) { ended = append(ended, l.Grant+" "+l.VM+" "+string(l.State)) }
	ctx := context.Background()
	start := *tl.clock
	l, err := tl.Create(ctx, createReq("a"))
	if err != nil {
		t.Fatalf("create(a) = %v", err)
	}
	if l.State != store.LeaseLive || l.VM != "lab/a" || !l.Expires.Equal(start.Add(10*time.Minute)) {
		t.Errorf("create(a) lease = %+v; want live, lab/a, expiring in 10 min", l)
	}
	if _, err := tl.Create(ctx, createReq("b")); err != nil {
		t.Fatal(err)
	}
	var qe *store.QuotaError
	if _, err := tl.Create(ctx, createReq("c")); !errors.As(err, &qe) || qe.Used != 2 {
		t.Fatalf("create(c) over the quota = %v; want a QuotaError with 2 held", err)
	}
	if got := tl.fake.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("VMs after a refused third = %v; want [a b] (nothing made for c)", got)
	}
	// Nothing is due before the expiry; at it, both go.
	tl.advance(10*time.Minute - time.Second)
	if rep := tl.Reap(ctx); len(rep.Deleted)+len(rep.Errors) != 0 || len(ended) != 0 {
		t.Errorf("reap before expiry = %+v, told %q; want nothing", rep, ended)
	}
	tl.advance(time.Second)
	if rep := tl.Reap(ctx); len(rep.Deleted) != 2 || len(rep.Errors) != 0 {
		t.Errorf("reap at expiry = %+v; want a and b deleted", rep)
	}
	// OnEnd (the server, which tells the grant's sessions) hears of each.
	slices.Sort(ended)
	if want := []string{"alice lab/a live", "alice lab/b live"}; !slices.Equal(ended, want) {
		t.Errorf("OnEnd told of %q; want %q", ended, want)
	}
	if got := tl.fake.Names(); len(got) != 0 {
		t.Errorf("VMs after the reaper = %v; want none", got)
	}
	if list, _ := tl.store.ListLeases(ctx); len(list) != 0 {
		t.Errorf("leases after the reaper = %v; want none", list)
	}
	if _, err := tl.Create(ctx, createReq("c")); err != nil {
		t.Errorf("create(c) after the reaper freed the quota = %v", err)
	}
}

func TestLeaseCreateFailure(t *testing.T) {
	tl := newTestLeases(t)
	ctx := context.Background()
	// The driver fails after making something: the mark finds it.
	tl.fake.CreateFunc = func(req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
		tl.fake.Put(req.Name, req.Mark)
		return hypervisor.CreatedVM{}, fmt.Errorf("boot: %w", hypervisor.ErrTimeout)
	}
	if _, err := tl.Create(ctx, createReq("a")); !errors.Is(err, hypervisor.ErrTimeout) {
		t.Fatalf("create = %v; want the driver's ErrTimeout", err)
	}
	if got := tl.fake.Names(); len(got) != 0 {
		t.Errorf("VMs after a failed create = %v; want what it left deleted", got)
	}
	if list, _ := tl.store.ListLeases(ctx); len(list) != 0 {
		t.Errorf("leases after a failed create = %+v; want the quota released", list)
	}
	// A failed create whose cleanup fails too leaves a deleting lease that
	// the reaper finishes once its hold ends.
	tl.fake.DeleteFunc = func(hypervisor.DeleteRequest) error { return fmt.Errorf("fake: %w: disk busy", hypervisor.ErrBackend) }
	if _, err := tl.Create(ctx, createReq("b")); err == nil {
		t.Fatal("create(b) = nil; want the driver's error")
	}
	list, _ := tl.store.ListLeases(ctx)
	if len(list) != 1 || list[0].State != store.LeaseDeleting {
		t.Fatalf("leases after a failed cleanup = %+v; want one deleting", list)
	}
	tl.fake.DeleteFunc = nil
	if rep := tl.Reap(ctx); len(rep.Deleted) != 0 {
		t.Errorf("reap while the cleanup's hold lasts = %+v; want nothing", rep)
	}
	tl.advance(DeleteDeadline + time.Minute)
	if rep := tl.Reap(ctx); len(rep.Deleted) != 1 || len(rep.Errors) != 0 {
		t.Errorf("reap after the hold = %+v; want b deleted", rep)
	}
	if got := tl.fake.Names(); len(got) != 0 {
		t.Errorf("VMs at the end = %v; want none", got)
	}
}

// TestLeaseCrashWhileCreating: a server that died while a VM was being
// made leaves a creating lease; once its hold ends the reaper (of a new
// server on the same store) deletes the VM by the name asked for and the
// mark, and frees the quota.
func TestLeaseCrashWhileCreating(t *testing.T) {
	tl := newTestLeases(t)
	ctx := context.Background()
	l, err := store.ValidateLease(store.Lease{ID: newLeaseID(), Name: "lab/a", Grant: "alice", Template: "small",
		TTL: time.Minute, Quotas: []policy.Quota{vmsQuota}, Created: *tl.clock, Until: tl.clock.Add(tl.createHold), Holder: "call-dead"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.store.AcquireLease(ctx, l); err != nil {
		t.Fatal(err)
	}
	tl.fake.Put("a", l.ID) // the VM got made before the crash
	tl.advance(tl.createHold - time.Second)
	if rep := tl.Reap(ctx); len(rep.Deleted) != 0 {
		t.Errorf("reap while the creating call may still run = %+v; want nothing", rep)
	}
	tl.advance(time.Second)
	if rep := tl.Reap(ctx); len(rep.Deleted) != 1 {
		t.Errorf("reap after the hold = %+v; want lab/a deleted", rep)
	}
	if d := tl.fake.Deletes(); len(d) != 1 || d[0] != (hypervisor.DeleteRequest{Name: "a", Mark: l.ID}) {
		t.Errorf("DeleteVM calls = %+v; want one for a with the lease's mark", d)
	}
	if list, _ := tl.store.ListLeases(ctx); len(list) != 0 {
		t.Errorf("leases = %+v; want none", list)
	}
}

// TestLeaseNotOurs: a VM by the lease's name without its mark is never
// deleted; the lease is released.
func TestLeaseNotOurs(t *testing.T) {
	tl := newTestLeases(t)
	ctx := context.Background()
	l, err := tl.Create(ctx, createReq("a"))
	if err != nil {
		t.Fatal(err)
	}
	tl.fake.Put("a", "SOMEONE-ELSES-MARK") // replaced behind vmgate's back
	if err := tl.deleteLease(ctx, l, "call-x"); err != nil {
		t.Fatalf("deleteLease = %v; want the lease released", err)
	}
	if got := tl.fake.Names(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("VMs = %v; want the stranger's a kept", got)
	}
	if list, _ := tl.store.ListLeases(ctx); len(list) != 0 {
		t.Errorf("leases = %+v; want none", list)
	}
}

// TestLeaseOneDeleter: of concurrent deleters of one lease, one deletes
// and the others learn it is being deleted; the driver deletes once.
func TestLeaseOneDeleter(t *testing.T) {
	tl := newTestLeases(t)
	ctx := context.Background()
	l, err := tl.Create(ctx, createReq("a"))
	if err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	tl.fake.DeleteFunc = func(req hypervisor.DeleteRequest) error {
		<-block
		tl.fake.Remove(req.Name)
		return nil
	}
	errs := make(chan error, 8)
	for i := range 8 {
		go func() { errs <- tl.deleteLease(ctx, l, fmt.Sprint("call-", i)) }()
	}
	// Seven lose the race (stale revision) and return at once.
	busy := 0
	for range 7 {
		if err := <-errs; errors.Is(err, ErrBusy) {
			busy++
		} else {
			t.Errorf("a losing deleter got %v; want ErrBusy", err)
		}
	}
	close(block)
	if err := <-errs; err != nil {
		t.Errorf("the winning deleter got %v", err)
	}
	if n := len(tl.fake.Deletes()); n != 1 || busy != 7 {
		t.Errorf("DeleteVM called %d times, %d busy; want 1 and 7", n, busy)
	}
	if found, ok, _ := tl.Find(ctx, "lab/a"); ok {
		t.Errorf("find(lab/a) after delete = %+v; want none", found)
	}
}

func TestLeaseUnknownBackend(t *testing.T) {
	tl := newTestLeases(t)
	req := createReq("a")
	req.Backend = "pve"
	if _, err := tl.Create(context.Background(), req); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("create on a backend without Creator = %v; want ErrNotSupported", err)
	}
	if list, _ := tl.store.ListLeases(context.Background()); len(list) != 0 {
		t.Errorf("leases = %+v; want none", list)
	}
}
