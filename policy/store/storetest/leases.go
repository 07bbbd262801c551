package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// LeaseStore is what RunLeases tests: a store.Leases that can be closed.
type LeaseStore interface {
	store.Leases
	Close() error
}

// RunLeases runs the lease suite: life cycle and compare-and-swap updates,
// quotas held exactly (all or none, weights, release giving units back,
// 200 concurrent acquisitions against a quota of 3), one lease per VM,
// hostile ids and keys, bad input that changes nothing and cancelled
// contexts. newStore is called once per subtest and must return an empty
// store.
func RunLeases(t *testing.T, newStore func(t *testing.T) LeaseStore) {
	tests := []struct {
		name string
		fn   func(*testing.T, LeaseStore)
	}{
		{"LifeCycle", testLeaseLifeCycle},
		{"Update", testLeaseUpdate},
		{"Quota", testLeaseQuota},
		{"AllOrNone", testLeaseAllOrNone},
		{"Weights", testLeaseWeights},
		{"OnePerVM", testLeaseOnePerVM},
		{"Concurrent", testLeaseConcurrent},
		{"HostileIDs", testLeaseHostileIDs},
		{"BadInput", testLeaseBadInput},
		{"Cancelled", testLeaseCancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tt.fn(t, s)
		})
	}
}

// NewLease is a valid lease as AcquireLease takes it, for the VM name,
// holding qs.
func NewLease(id, name string, created time.Duration, qs ...policy.Quota) store.Lease {
	call := "call-" + id[:min(len(id), 32)]
	return store.Lease{ID: id, Name: name, Grant: "alice", Template: "small", CallID: call,
		MemoryMB: 256, CPUs: 1, TTL: 10 * time.Minute, Quotas: qs,
		Created: at(created), Until: at(created + 5*time.Minute), Holder: call}
}

// Quota is a quota of max units of which the lease holds weight.
func Quota(key string, max, weight int64) policy.Quota {
	return policy.Quota{Key: key, Name: "n_" + key, Max: max, Weight: weight, Rule: "/tools/vm_create/limits/0"}
}

func sameLease(a, b store.Lease) bool {
	return a.ID == b.ID && a.Name == b.Name && a.VM == b.VM && a.Grant == b.Grant && a.Template == b.Template && a.CallID == b.CallID &&
		a.MemoryMB == b.MemoryMB && a.CPUs == b.CPUs && a.TTL == b.TTL && slices.Equal(a.Quotas, b.Quotas) &&
		a.State == b.State && a.Created.Equal(b.Created) && a.Expires.Equal(b.Expires) && a.Until.Equal(b.Until) &&
		a.Holder == b.Holder && a.Rev == b.Rev
}

func leaseIDs(ls []store.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.ID
	}
	return out
}

func mustAcquire(t *testing.T, s store.Leases, l store.Lease) {
	t.Helper()
	if err := s.AcquireLease(context.Background(), l); err != nil {
		t.Fatalf("AcquireLease(%.40q) = %.300v; want nil", l.ID, err)
	}
}

func mustList(t *testing.T, s store.Leases) []store.Lease {
	t.Helper()
	ls, err := s.ListLeases(context.Background())
	if err != nil {
		t.Fatalf("ListLeases = %v; want nil", err)
	}
	return ls
}

// wantQuotaFull checks that err is a *QuotaError for key with used units
// held by the leases holders.
func wantQuotaFull(t *testing.T, what string, err error, key string, used int64, holders ...string) {
	t.Helper()
	var qe *store.QuotaError
	if !errors.As(err, &qe) {
		t.Fatalf("%s = %v; want *store.QuotaError", what, err)
	}
	if qe.Quota.Key != key || qe.Used != used {
		t.Errorf("%s: QuotaError{%q, used %d}; want {%q, used %d}", what, qe.Quota.Key, qe.Used, key, used)
	}
	got := leaseIDs(qe.Holders)
	slices.Sort(got)
	slices.Sort(holders)
	if !slices.Equal(got, holders) {
		t.Errorf("%s: holders = %v; want %v", what, got, holders)
	}
}

func testLeaseLifeCycle(t *testing.T, s LeaseStore) {
	ctx := context.Background()
	in := NewLease("l1", "lab/vm1", 0, Quota("vms|grant=5:alice", 2, 1))
	in.Created = in.Created.In(time.FixedZone("x", 3600)) // stored in UTC
	mustAcquire(t, s, in)
	want := in
	want.State, want.Rev, want.Created = store.LeaseCreating, 1, in.Created.UTC()
	got, err := s.GetLease(ctx, "l1")
	if err != nil || !sameLease(got, want) {
		t.Fatalf("GetLease(l1) = %+v, %v; want %+v", got, err, want)
	}
	if got.Created.Location() != time.UTC {
		t.Errorf("GetLease(l1).Created in %v; want UTC", got.Created.Location())
	}
	if ls := mustList(t, s); len(ls) != 1 || !sameLease(ls[0], want) {
		t.Errorf("ListLeases = %+v; want [%+v]", ls, want)
	}
	// Changing what GetLease returned changes nothing stored.
	got.Quotas[0].Weight = 99
	if again, _ := s.GetLease(ctx, "l1"); again.Quotas[0].Weight != 1 {
		t.Errorf("GetLease after changing a returned lease: weight %d; want 1", again.Quotas[0].Weight)
	}
	live := want
	live.State, live.Expires, live.Until, live.Holder = store.LeaseLive, at(20*time.Minute), time.Time{}, ""
	live.VM = "lab/vm1" // the id the backend gave, set once
	next, err := s.UpdateLease(ctx, live)
	if err != nil {
		t.Fatalf("UpdateLease(live) = %v; want nil", err)
	}
	live.Rev = 2
	if !sameLease(next, live) {
		t.Errorf("UpdateLease(live) = %+v; want %+v", next, live)
	}
	if got, _ := s.GetLease(ctx, "l1"); !sameLease(got, live) {
		t.Errorf("GetLease after update = %+v; want %+v", got, live)
	}
	if !live.Due(at(20*time.Minute)) || live.Due(at(20*time.Minute-time.Nanosecond)) {
		t.Errorf("Due around Expires is wrong for %+v", live)
	}
	if err := s.ReleaseLease(ctx, "l1"); err != nil {
		t.Fatalf("ReleaseLease(l1) = %v; want nil", err)
	}
	if _, err := s.GetLease(ctx, "l1"); !errors.Is(err, store.ErrUnknownLease) {
		t.Errorf("GetLease after release = %v; want ErrUnknownLease", err)
	}
	if err := s.ReleaseLease(ctx, "l1"); !errors.Is(err, store.ErrUnknownLease) {
		t.Errorf("ReleaseLease twice = %v; want ErrUnknownLease", err)
	}
	if _, err := s.UpdateLease(ctx, live); !errors.Is(err, store.ErrUnknownLease) {
		t.Errorf("UpdateLease after release = %v; want ErrUnknownLease", err)
	}
	if ls := mustList(t, s); len(ls) != 0 {
		t.Errorf("ListLeases after release = %v; want none", leaseIDs(ls))
	}
	// Released quota units are free again, and the VM may be leased anew.
	mustAcquire(t, s, NewLease("l2", "lab/vm1", time.Minute, Quota("vms|grant=5:alice", 1, 1)))
}

func testLeaseUpdate(t *testing.T, s LeaseStore) {
	ctx := context.Background()
	mustAcquire(t, s, NewLease("l1", "lab/vm1", 0, Quota("q", 5, 1)))
	cur, _ := s.GetLease(ctx, "l1")
	del := cur
	del.State, del.Until, del.Holder = store.LeaseDeleting, at(time.Hour), "reaper-1"
	del.VM = "lab/vm1" // unset until now: may be set once
	if _, err := s.UpdateLease(ctx, del); err != nil {
		t.Fatalf("UpdateLease(deleting) = %v; want nil", err)
	}
	// A second writer that read revision 1 loses: one holder at a time.
	other := cur
	other.State, other.Until, other.Holder = store.LeaseDeleting, at(time.Hour), "reaper-2"
	if _, err := s.UpdateLease(ctx, other); !errors.Is(err, store.ErrStaleLease) {
		t.Errorf("UpdateLease at a stale revision = %v; want ErrStaleLease", err)
	}
	if got, _ := s.GetLease(ctx, "l1"); got.Holder != "reaper-1" || got.Rev != 2 {
		t.Errorf("lease after a stale update: holder %q rev %d; want reaper-1, 2", got.Holder, got.Rev)
	}
	cur, _ = s.GetLease(ctx, "l1")
	bad := []struct {
		name string
		edit func(*store.Lease)
	}{
		{"name", func(l *store.Lease) { l.Name = "lab/other" }},
		{"vm once set", func(l *store.Lease) { l.VM = "lab/other" }},
		{"grant", func(l *store.Lease) { l.Grant = "mallory" }},
		{"template", func(l *store.Lease) { l.Template = "big" }},
		{"memory", func(l *store.Lease) { l.MemoryMB = 1 }},
		{"ttl", func(l *store.Lease) { l.TTL = time.Hour }},
		{"created", func(l *store.Lease) { l.Created = at(time.Hour) }},
		{"quotas", func(l *store.Lease) { l.Quotas = []policy.Quota{Quota("q", 5, 0)} }},
		{"no quotas", func(l *store.Lease) { l.Quotas = nil }},
		{"unknown state", func(l *store.Lease) { l.State = "zombie" }},
		{"live without expiry", func(l *store.Lease) { l.State, l.Expires = store.LeaseLive, time.Time{} }},
		{"deleting without until", func(l *store.Lease) { l.State, l.Until = store.LeaseDeleting, time.Time{} }},
		{"huge holder", func(l *store.Lease) { l.Holder = strings.Repeat("h", store.MaxKeyLen+1) }},
	}
	for _, b := range bad {
		l := cur
		l.Quotas = slices.Clone(cur.Quotas)
		b.edit(&l)
		if _, err := s.UpdateLease(ctx, l); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("UpdateLease(changed %s) = %v; want ErrInvalid", b.name, err)
		}
	}
	if got, _ := s.GetLease(ctx, "l1"); !sameLease(got, cur) {
		t.Errorf("lease after refused updates = %+v; want %+v unchanged", got, cur)
	}
	if _, err := s.UpdateLease(ctx, store.Lease{ID: "nope", Rev: 1, State: store.LeaseLive, Expires: at(0)}); !errors.Is(err, store.ErrUnknownLease) {
		t.Errorf("UpdateLease(unknown) = %v; want ErrUnknownLease", err)
	}
}

func testLeaseQuota(t *testing.T, s LeaseStore) {
	ctx := context.Background()
	q := Quota("vms|grant=5:alice", 2, 1)
	mustAcquire(t, s, NewLease("a", "lab/a", 0, q))
	mustAcquire(t, s, NewLease("b", "lab/b", time.Second, q))
	err := s.AcquireLease(ctx, NewLease("c", "lab/c", 2*time.Second, q))
	wantQuotaFull(t, "AcquireLease(third of 2)", err, q.Key, 2, "a", "b")
	if _, err := s.GetLease(ctx, "c"); !errors.Is(err, store.ErrUnknownLease) {
		t.Errorf("GetLease(refused c) = %v; want ErrUnknownLease", err)
	}
	// Another grant's quota is another key.
	mustAcquire(t, s, NewLease("d", "lab/d", 3*time.Second, Quota("vms|grant=3:bob", 2, 1)))
	// Updating a lease keeps its units; releasing gives them back.
	cur, _ := s.GetLease(ctx, "a")
	cur.State, cur.Expires = store.LeaseLive, at(time.Hour)
	if _, err := s.UpdateLease(ctx, cur); err != nil {
		t.Fatal(err)
	}
	wantQuotaFull(t, "AcquireLease(after update)", s.AcquireLease(ctx, NewLease("c", "lab/c", 4*time.Second, q)), q.Key, 2, "a", "b")
	if err := s.ReleaseLease(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, NewLease("c", "lab/c", 5*time.Second, q))
	if got := leaseIDs(mustList(t, s)); !slices.Equal(got, []string{"b", "d", "c"}) {
		t.Errorf("ListLeases = %v; want [b d c] (oldest first)", got)
	}
}

func testLeaseAllOrNone(t *testing.T, s LeaseStore) {
	ctx := context.Background()
	full, roomy := Quota("full", 1, 1), Quota("roomy", 3, 1)
	mustAcquire(t, s, NewLease("f", "lab/f", 0, full))
	err := s.AcquireLease(ctx, NewLease("x", "lab/x", time.Second, roomy, full))
	wantQuotaFull(t, "AcquireLease(roomy, full)", err, "full", 1, "f")
	// roomy kept all three units: nothing of the refused lease stayed.
	for i := range 3 {
		mustAcquire(t, s, NewLease(fmt.Sprint("r", i), fmt.Sprint("lab/r", i), time.Duration(i+2)*time.Second, roomy))
	}
	wantQuotaFull(t, "AcquireLease(fourth of roomy)", s.AcquireLease(ctx, NewLease("r3", "lab/r3", time.Minute, roomy)), "roomy", 3, "r0", "r1", "r2")
	// A lease that holds no quota always fits.
	mustAcquire(t, s, NewLease("free", "lab/free", time.Minute))
}

func testLeaseWeights(t *testing.T, s LeaseStore) {
	ctx := context.Background()
	mem := func(w int64) policy.Quota { return Quota("memory|grant=5:alice", 1024, w) }
	mustAcquire(t, s, NewLease("a", "lab/a", 0, mem(512)))
	mustAcquire(t, s, NewLease("b", "lab/b", time.Second, mem(256)))
	wantQuotaFull(t, "AcquireLease(257 more of 1024 with 768 held)", s.AcquireLease(ctx, NewLease("c", "lab/c", 2*time.Second, mem(257))), "memory|grant=5:alice", 768, "a", "b")
	mustAcquire(t, s, NewLease("c", "lab/c", 3*time.Second, mem(256)))
	mustAcquire(t, s, NewLease("zero", "lab/zero", 4*time.Second, mem(0))) // weight 0 fits a full quota
	wantQuotaFull(t, "AcquireLease(1 more of a full 1024)", s.AcquireLease(ctx, NewLease("d", "lab/d", 5*time.Second, mem(1))), "memory|grant=5:alice", 1024, "a", "b", "c", "zero")
	if err := s.ReleaseLease(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, NewLease("d", "lab/d", 6*time.Second, mem(512)))
	wantQuotaFull(t, "AcquireLease(after refill)", s.AcquireLease(ctx, NewLease("e", "lab/e", 7*time.Second, mem(1))), "memory|grant=5:alice", 1024, "b", "c", "zero", "d")
	// A weight over the whole quota never fits, even an empty one.
	wantQuotaFull(t, "AcquireLease(weight over max)", s.AcquireLease(ctx, NewLease("big", "lab/big", 8*time.Second, Quota("other", 10, 11))), "other", 0)
}

func testLeaseOnePerVM(t *testing.T, s LeaseStore) {
	ctx := context.Background()
	q := Quota("q", 10, 1)
	mustAcquire(t, s, NewLease("a", "lab/vm", 0, q))
	if err := s.AcquireLease(ctx, NewLease("a", "lab/other", time.Second, q)); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("AcquireLease(same id) = %v; want ErrDuplicate", err)
	}
	if err := s.AcquireLease(ctx, NewLease("b", "lab/vm", time.Second, q)); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("AcquireLease(same VM) = %v; want ErrDuplicate", err)
	}
	if got := leaseIDs(mustList(t, s)); !slices.Equal(got, []string{"a"}) {
		t.Errorf("ListLeases after duplicates = %v; want [a]", got)
	}
	// The refused duplicates held no units: nine more fit.
	for i := range 9 {
		mustAcquire(t, s, NewLease(fmt.Sprint("n", i), fmt.Sprint("lab/n", i), time.Minute, q))
	}
	if err := s.ReleaseLease(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, NewLease("b", "lab/vm", 2*time.Minute, q))
}

func testLeaseConcurrent(t *testing.T, s LeaseStore) {
	q := Quota("vms|global", 3, 1)
	const n = 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	var granted []string
	var other []error
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprint("c", i)
			err := s.AcquireLease(context.Background(), NewLease(id, "lab/"+id, time.Duration(i)*time.Millisecond, q))
			var qe *store.QuotaError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				granted = append(granted, id)
			case !errors.As(err, &qe):
				other = append(other, err)
			}
		})
	}
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("%d acquisitions failed otherwise than by the quota; first: %v", len(other), other[0])
	}
	if len(granted) != 3 {
		t.Fatalf("%d concurrent acquisitions against a quota of 3 granted %d; want exactly 3", n, len(granted))
	}
	got := leaseIDs(mustList(t, s))
	slices.Sort(got)
	slices.Sort(granted)
	if !slices.Equal(got, granted) {
		t.Errorf("ListLeases = %v; want the granted %v", got, granted)
	}
}

func testLeaseHostileIDs(t *testing.T, s LeaseStore) {
	ctx := context.Background()
	for i, id := range []string{"a\x00b", "é|ü:{}", "l:x", "*", strings.Repeat("k", store.MaxKeyLen), "lv:lab/x", " "} {
		vm := fmt.Sprintf("lab/%d\x00%s", i, id[:min(len(id), 100)])
		q := Quota(id[:min(len(id), 4000)]+"|grant=1:x", 1, 1)
		l := NewLease(id, vm, time.Duration(i)*time.Second, q)
		mustAcquire(t, s, l)
		got, err := s.GetLease(ctx, id)
		if err != nil || got.Name != vm || got.Quotas[0].Key != q.Key {
			t.Errorf("GetLease(%q) = %+v, %v; want vm %q quota %q", id, got, err, vm, q.Key)
		}
		wantQuotaFull(t, fmt.Sprintf("AcquireLease(second on quota %q)", q.Key), s.AcquireLease(ctx, NewLease(fmt.Sprint("second-", i), vm+"2", time.Hour, q)), q.Key, 1, id)
	}
	if n := len(mustList(t, s)); n != 7 {
		t.Errorf("ListLeases has %d leases; want 7", n)
	}
}

func testLeaseBadInput(t *testing.T, s LeaseStore) {
	ctx := context.Background()
	long := strings.Repeat("x", store.MaxKeyLen+1)
	bad := []struct {
		name string
		edit func(*store.Lease)
	}{
		{"empty id", func(l *store.Lease) { l.ID = "" }},
		{"long id", func(l *store.Lease) { l.ID = long }},
		{"empty name", func(l *store.Lease) { l.Name = "" }},
		{"long vm", func(l *store.Lease) { l.VM = long }},
		{"empty grant", func(l *store.Lease) { l.Grant = "" }},
		{"empty template", func(l *store.Lease) { l.Template = "" }},
		{"long call id", func(l *store.Lease) { l.CallID = long }},
		{"negative memory", func(l *store.Lease) { l.MemoryMB = -1 }},
		{"zero ttl", func(l *store.Lease) { l.TTL = 0 }},
		{"live", func(l *store.Lease) { l.State = store.LeaseLive }},
		{"no created", func(l *store.Lease) { l.Created = time.Time{} }},
		{"no until", func(l *store.Lease) { l.Until = time.Time{} }},
		{"until before created", func(l *store.Lease) { l.Until = l.Created.Add(-time.Second) }},
		{"expires set", func(l *store.Lease) { l.Expires = l.Created.Add(time.Hour) }},
		{"empty quota key", func(l *store.Lease) { l.Quotas = []policy.Quota{Quota("", 1, 1)} }},
		{"long quota key", func(l *store.Lease) { l.Quotas = []policy.Quota{Quota(long, 1, 1)} }},
		{"negative weight", func(l *store.Lease) { l.Quotas = []policy.Quota{Quota("q", 1, -1)} }},
		{"negative max", func(l *store.Lease) { l.Quotas = []policy.Quota{Quota("q", -1, 0)} }},
		{"quota twice", func(l *store.Lease) { l.Quotas = []policy.Quota{Quota("q", 2, 1), Quota("q", 2, 1)} }},
		{"too many quotas", func(l *store.Lease) {
			for i := range store.MaxLeaseQuotas + 1 {
				l.Quotas = append(l.Quotas, Quota(fmt.Sprint("q", i), 9, 1))
			}
		}},
	}
	for _, b := range bad {
		l := NewLease("id", "lab/vm", 0, Quota("q", 1, 1))
		b.edit(&l)
		if err := s.AcquireLease(ctx, l); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("AcquireLease(%s) = %v; want ErrInvalid", b.name, err)
		}
	}
	if ls := mustList(t, s); len(ls) != 0 {
		t.Errorf("ListLeases after bad input = %v; want none", leaseIDs(ls))
	}
	// Nothing of the refused leases holds q.
	mustAcquire(t, s, NewLease("ok", "lab/vm", 0, Quota("q", 1, 1)))
	for _, id := range []string{"", long} {
		if _, err := s.GetLease(ctx, id); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("GetLease(%d bytes) = %v; want ErrInvalid", len(id), err)
		}
		if err := s.ReleaseLease(ctx, id); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ReleaseLease(%d bytes) = %v; want ErrInvalid", len(id), err)
		}
	}
}

func testLeaseCancelled(t *testing.T, s LeaseStore) {
	mustAcquire(t, s, NewLease("keep", "lab/keep", 0, Quota("q", 1, 1)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cur, _ := s.GetLease(context.Background(), "keep")
	live := cur
	live.State, live.Expires = store.LeaseLive, at(time.Hour)
	calls := map[string]func() error{
		"AcquireLease": func() error { return s.AcquireLease(ctx, NewLease("new", "lab/new", 0)) },
		"GetLease":     func() error { _, err := s.GetLease(ctx, "keep"); return err },
		"ListLeases":   func() error { _, err := s.ListLeases(ctx); return err },
		"UpdateLease":  func() error { _, err := s.UpdateLease(ctx, live); return err },
		"ReleaseLease": func() error { return s.ReleaseLease(ctx, "keep") },
	}
	for name, fn := range calls {
		if err := fn(); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s(cancelled) = %v; want ErrUnavailable", name, err)
		}
	}
	if got := leaseIDs(mustList(t, s)); !slices.Equal(got, []string{"keep"}) {
		t.Errorf("ListLeases after cancelled calls = %v; want [keep]", got)
	}
	if got, _ := s.GetLease(context.Background(), "keep"); !sameLease(got, cur) {
		t.Errorf("lease after cancelled calls = %+v; want %+v", got, cur)
	}
}
