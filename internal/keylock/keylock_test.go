package keylock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// TestExclusive: one holder per key at a time, keys independent; the map
// is empty once every holder unlocked.
func TestExclusive(t *testing.T) {
	var m Map
	var held [4]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			k := i % 4
			unlock, err := m.Lock(context.Background(), fmt.Sprint("vm", k))
			if err != nil {
				errs <- err
				return
			}
			if n := held[k].Add(1); n != 1 {
				errs <- fmt.Errorf("key vm%d held %d times at once", k, n)
			}
			held[k].Add(-1)
			unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := m.Len(); n != 0 {
		t.Errorf("Len after every unlock = %d; want 0 (entries pruned)", n)
	}
}

// TestPruned: 1,000 keys locked and unlocked one after the other leave no
// entry; a waiter whose context ends holds nothing and leaves none; a
// second unlock does nothing.
func TestPruned(t *testing.T) {
	var m Map
	for i := range 1000 {
		unlock, err := m.Lock(context.Background(), fmt.Sprint("lab/vm", i))
		if err != nil {
			t.Fatal(err)
		}
		unlock()
		unlock()
	}
	if n := m.Len(); n != 0 {
		t.Errorf("Len after 1,000 keys = %d; want 0", n)
	}
	unlock, err := m.Lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Lock(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Errorf("Lock of a held key with an ended context = %v; want context.Canceled", err)
	}
	if n := m.Len(); n != 1 {
		t.Errorf("Len with a held and a given-up waiter = %d; want 1", n)
	}
	unlock()
	if n := m.Len(); n != 0 {
		t.Errorf("Len at the end = %d; want 0", n)
	}
	again, err := m.Lock(context.Background(), "a")
	if err != nil {
		t.Fatalf("Lock after unlock = %v", err)
	}
	again()
}
