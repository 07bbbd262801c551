package lease

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy/store"
)

// TestReapBoundedConcurrency: 20 leases that end together are deleted
// reapPerBackend at a time on their backend (never more at once), each
// VM once, every lease released; the report lists them all.
func TestReapBoundedConcurrency(t *testing.T) {
	tl := newTestLeases(t)
	ctx := context.Background()
	const n = 20
	for i := range n {
		req := createReq(fmt.Sprintf("vm%02d", i))
		req.Quotas = nil
		if _, err := tl.Create(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	inFlight, most := 0, 0
	arrived := make(chan struct{}, n)
	release := make(chan struct{})
	tl.fake.DeleteFunc = func(req hypervisor.DeleteRequest) error {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		arrived <- struct{}{}
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
		tl.fake.Remove(req.Name)
		return nil
	}
	tl.advance(time.Hour)
	done := make(chan Report)
	go func() { done <- tl.Reap(ctx) }()
	for range reapPerBackend { // the first reapPerBackend deletions run at once
		<-arrived
	}
	close(release)
	rep := <-done
	if most != reapPerBackend {
		t.Errorf("deletions at once = %d; want %d", most, reapPerBackend)
	}
	if len(rep.Deleted) != n || len(rep.Errors) != 0 || len(tl.fake.Deletes()) != n {
		t.Errorf("reap = %d deleted, errors %v, %d DeleteVM calls; want %d, none, %d", len(rep.Deleted), rep.Errors, len(tl.fake.Deletes()), n, n)
	}
	if list, _ := tl.store.ListLeases(ctx); len(list) != 0 {
		t.Errorf("leases after the reap = %d; want none", len(list))
	}
	if w := tl.View(ctx, "bob"); w.Info("lab/vm00") != nil {
		t.Error("the owner index still knows a reaped VM")
	}
}

// TestReapWarnsOfEndingLeases: a live lease is told of once, when its
// expiry comes within EndingWarning (a fifth of its 10 minutes: 2 min),
// with the time left; not before, not again on the next pass, and no
// more once its VM is deleted.
func TestReapWarnsOfEndingLeases(t *testing.T) {
	tl := newTestLeases(t)
	tl.every = DefaultLeaseReapEvery // the window is at least one pass
	ctx := context.Background()
	var warned []string
	tl.onEnding = func(l store.Lease, left time.Duration) {
		warned = append(warned, fmt.Sprintf("%s %s %v", l.Grant, l.VM, left))
	}
	tl.onEnd = func(store.Lease) {}
	if _, err := tl.Create(ctx, createReq("a")); err != nil {
		t.Fatal(err)
	}
	tl.fake.DeleteFunc = func(req hypervisor.DeleteRequest) error { tl.fake.Remove(req.Name); return nil }
	steps := []struct {
		advance time.Duration
		want    []string
	}{
		{7 * time.Minute, nil},                            // 3 min left
		{90 * time.Second, []string{"alice lab/a 1m30s"}}, // 1m30s left: told
		{30 * time.Second, []string{"alice lab/a 1m30s"}}, // told once
		{2 * time.Minute, []string{"alice lab/a 1m30s"}},  // expired: deleted, not told
		{0, []string{"alice lab/a 1m30s"}},                // gone: nothing to tell
	}
	for i, st := range steps {
		tl.advance(st.advance)
		tl.Reap(ctx)
		if fmt.Sprint(warned) != fmt.Sprint(st.want) {
			t.Errorf("step %d: OnEnding calls = %q; want %q", i, warned, st.want)
		}
	}
	if len(tl.warned) != 0 {
		t.Errorf("warned after the lease ended = %v; want it forgotten", tl.warned)
	}
}

// TestEndingWarning: a fifth of the lease, at most five minutes.
func TestEndingWarning(t *testing.T) {
	for _, tt := range []struct{ ttl, want time.Duration }{
		{10 * time.Minute, 2 * time.Minute}, {time.Hour, 5 * time.Minute}, {0, 5 * time.Minute}, {time.Minute, 12 * time.Second},
	} {
		if got := EndingWarning(store.Lease{TTL: tt.ttl}); got != tt.want {
			t.Errorf("EndingWarning(ttl %v) = %v; want %v", tt.ttl, got, tt.want)
		}
	}
}
