package lease

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
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
