package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"
)

// TestSnapOwnersLocksPruned: the per-VM turns of 1,000 VMs leave nothing
// behind once released (a fleet's VMs come and go), a VM's turn is still
// one at a time, and a waiter whose context ends gets a reason and holds
// nothing.
func TestSnapOwnersLocksPruned(t *testing.T) {
	o := NewSnapOwners(nil, time.Now, slog.New(slog.DiscardHandler), nil)
	ctx := context.Background()
	for i := range 1000 {
		unlock, err := o.Lock(ctx, fmt.Sprintf("fleet/vm%05d", i))
		if err != nil {
			t.Fatal(err)
		}
		unlock()
	}
	if n := o.locks.Len(); n != 0 {
		t.Errorf("turns kept after 1,000 VMs = %d; want 0", n)
	}
	unlock, err := o.Lock(ctx, "lab/vm1")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	if _, err := o.Lock(short, "lab/vm1"); !errors.Is(err, context.DeadlineExceeded) || err.Error() != "waiting for another snapshot of lab/vm1: context deadline exceeded" {
		t.Errorf("Lock of a held VM = %v; want a deadline error naming the VM", err)
	}
	unlock()
	if n := o.locks.Len(); n != 0 {
		t.Errorf("turns kept at the end = %d; want 0", n)
	}
}
