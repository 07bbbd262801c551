package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// fakeCreator is a hypervisor.Creator whose behaviour the test sets; it
// records what it was asked and keeps the VMs it made by name with their
// marks.
type fakeCreator struct {
	mu      sync.Mutex
	vms     map[string]string // name -> mark
	create  func(req hypervisor.CreateRequest) (hypervisor.CreatedVM, error)
	delete  func(req hypervisor.DeleteRequest) error
	deletes []hypervisor.DeleteRequest
}

func newFakeCreator() *fakeCreator { return &fakeCreator{vms: map[string]string{}} }

func (f *fakeCreator) CreateVM(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
	if f.create != nil {
		return f.create(req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vms[req.Name] = req.Mark
	return hypervisor.CreatedVM{Name: req.Name}, nil
}

func (f *fakeCreator) DeleteVM(ctx context.Context, req hypervisor.DeleteRequest) error {
	f.mu.Lock()
	f.deletes = append(f.deletes, req)
	f.mu.Unlock()
	if f.delete != nil {
		return f.delete(req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	mark, ok := f.vms[req.Name]
	switch {
	case !ok:
		return fmt.Errorf("fake: %w", hypervisor.ErrUnknownVM)
	case mark != req.Mark:
		return fmt.Errorf("fake: %w", hypervisor.ErrNotCreated)
	}
	delete(f.vms, req.Name)
	return nil
}

func (f *fakeCreator) names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.vms {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// testLeases is a vmLeases over a memory store and a fake "lab" backend,
// with a clock the test moves.
type testLeases struct {
	*vmLeases
	fake  *fakeCreator
	store *memory.Store
	clock *time.Time
}

func newTestLeases(t *testing.T) *testLeases {
	t.Helper()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tl := &testLeases{fake: newFakeCreator(), store: memory.New(), clock: &now}
	tl.vmLeases = &vmLeases{
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
	}
	return tl
}

func (tl *testLeases) advance(d time.Duration) { *tl.clock = tl.clock.Add(d) }

var vmsQuota = policy.Quota{Key: "vms|grant=5:alice", Name: "vms", Max: 2, Weight: 1, Rule: "/tools/vm_create/limits/0"}

func createReq(name string) createRequest {
	return createRequest{backend: "lab", name: name, grant: "alice", template: "small", callID: "call-" + name,
		memoryMB: 256, cpus: 1, ttl: 10 * time.Minute, quotas: []policy.Quota{vmsQuota}}
}

func TestLeaseCreateAndExpire(t *testing.T) {
	tl := newTestLeases(t)
	ctx := context.Background()
	start := *tl.clock
	l, err := tl.create(ctx, createReq("a"))
	if err != nil {
		t.Fatalf("create(a) = %v", err)
	}
	if l.State != store.LeaseLive || l.VM != "lab/a" || !l.Expires.Equal(start.Add(10*time.Minute)) {
		t.Errorf("create(a) lease = %+v; want live, lab/a, expiring in 10 min", l)
	}
	if _, err := tl.create(ctx, createReq("b")); err != nil {
		t.Fatal(err)
	}
	var qe *store.QuotaError
	if _, err := tl.create(ctx, createReq("c")); !errors.As(err, &qe) || qe.Used != 2 {
		t.Fatalf("create(c) over the quota = %v; want a QuotaError with 2 held", err)
	}
	if got := tl.fake.names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("VMs after a refused third = %v; want [a b] (nothing made for c)", got)
	}
	// Nothing is due before the expiry; at it, both go.
	tl.advance(10*time.Minute - time.Second)
	if rep := tl.reap(ctx); len(rep.Deleted)+len(rep.Errors) != 0 {
		t.Errorf("reap before expiry = %+v; want nothing", rep)
	}
	tl.advance(time.Second)
	if rep := tl.reap(ctx); len(rep.Deleted) != 2 || len(rep.Errors) != 0 {
		t.Errorf("reap at expiry = %+v; want a and b deleted", rep)
	}
	if got := tl.fake.names(); len(got) != 0 {
		t.Errorf("VMs after the reaper = %v; want none", got)
	}
	if list, _ := tl.store.ListLeases(ctx); len(list) != 0 {
		t.Errorf("leases after the reaper = %v; want none", list)
	}
	if _, err := tl.create(ctx, createReq("c")); err != nil {
		t.Errorf("create(c) after the reaper freed the quota = %v", err)
	}
}

func TestLeaseCreateFailure(t *testing.T) {
	tl := newTestLeases(t)
	ctx := context.Background()
	// The driver fails after making something: the mark finds it.
	tl.fake.create = func(req hypervisor.CreateRequest) (hypervisor.CreatedVM, error) {
		tl.fake.mu.Lock()
		tl.fake.vms[req.Name] = req.Mark
		tl.fake.mu.Unlock()
		return hypervisor.CreatedVM{}, fmt.Errorf("boot: %w", hypervisor.ErrTimeout)
	}
	if _, err := tl.create(ctx, createReq("a")); !errors.Is(err, hypervisor.ErrTimeout) {
		t.Fatalf("create = %v; want the driver's ErrTimeout", err)
	}
	if got := tl.fake.names(); len(got) != 0 {
		t.Errorf("VMs after a failed create = %v; want what it left deleted", got)
	}
	if list, _ := tl.store.ListLeases(ctx); len(list) != 0 {
		t.Errorf("leases after a failed create = %+v; want the quota released", list)
	}
	// A failed create whose cleanup fails too leaves a deleting lease that
	// the reaper finishes once its hold ends.
	tl.fake.delete = func(hypervisor.DeleteRequest) error { return fmt.Errorf("fake: %w: disk busy", hypervisor.ErrBackend) }
	if _, err := tl.create(ctx, createReq("b")); err == nil {
		t.Fatal("create(b) = nil; want the driver's error")
	}
	list, _ := tl.store.ListLeases(ctx)
	if len(list) != 1 || list[0].State != store.LeaseDeleting {
		t.Fatalf("leases after a failed cleanup = %+v; want one deleting", list)
	}
	tl.fake.delete = nil
	if rep := tl.reap(ctx); len(rep.Deleted) != 0 {
		t.Errorf("reap while the cleanup's hold lasts = %+v; want nothing", rep)
	}
	tl.advance(DeleteDeadline + time.Minute)
	if rep := tl.reap(ctx); len(rep.Deleted) != 1 || len(rep.Errors) != 0 {
		t.Errorf("reap after the hold = %+v; want b deleted", rep)
	}
	if got := tl.fake.names(); len(got) != 0 {
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
	tl.fake.vms["a"] = l.ID // the VM got made before the crash
	tl.advance(tl.createHold - time.Second)
	if rep := tl.reap(ctx); len(rep.Deleted) != 0 {
		t.Errorf("reap while the creating call may still run = %+v; want nothing", rep)
	}
	tl.advance(time.Second)
	if rep := tl.reap(ctx); len(rep.Deleted) != 1 {
		t.Errorf("reap after the hold = %+v; want lab/a deleted", rep)
	}
	if d := tl.fake.deletes; len(d) != 1 || d[0] != (hypervisor.DeleteRequest{Name: "a", Mark: l.ID}) {
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
	l, err := tl.create(ctx, createReq("a"))
	if err != nil {
		t.Fatal(err)
	}
	tl.fake.vms["a"] = "SOMEONE-ELSES-MARK" // replaced behind vmgate's back
	if err := tl.deleteLease(ctx, l, "call-x"); err != nil {
		t.Fatalf("deleteLease = %v; want the lease released", err)
	}
	if got := tl.fake.names(); !slices.Equal(got, []string{"a"}) {
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
	l, err := tl.create(ctx, createReq("a"))
	if err != nil {
		t.Fatal(err)
	}
	block := make(chan struct{})
	tl.fake.delete = func(req hypervisor.DeleteRequest) error {
		<-block
		tl.fake.mu.Lock()
		delete(tl.fake.vms, req.Name)
		tl.fake.mu.Unlock()
		return nil
	}
	errs := make(chan error, 8)
	for i := range 8 {
		go func() { errs <- tl.deleteLease(ctx, l, fmt.Sprint("call-", i)) }()
	}
	// Seven lose the race (stale revision) and return at once.
	busy := 0
	for range 7 {
		if err := <-errs; errors.Is(err, errLeaseBusy) {
			busy++
		} else {
			t.Errorf("a losing deleter got %v; want errLeaseBusy", err)
		}
	}
	close(block)
	if err := <-errs; err != nil {
		t.Errorf("the winning deleter got %v", err)
	}
	if n := len(tl.fake.deletes); n != 1 || busy != 7 {
		t.Errorf("DeleteVM called %d times, %d busy; want 1 and 7", n, busy)
	}
	if found, ok, _ := tl.find(ctx, "lab/a"); ok {
		t.Errorf("find(lab/a) after delete = %+v; want none", found)
	}
}

func TestLeaseUnknownBackend(t *testing.T) {
	tl := newTestLeases(t)
	req := createReq("a")
	req.backend = "pve"
	if _, err := tl.create(context.Background(), req); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("create on a backend without Creator = %v; want ErrNotSupported", err)
	}
	if list, _ := tl.store.ListLeases(context.Background()); len(list) != 0 {
		t.Errorf("leases = %+v; want none", list)
	}
}
