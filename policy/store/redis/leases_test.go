package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestLeases(t *testing.T) {
	addr, _, _ := redistest.Start(t)
	storetest.RunLeases(t, func(t *testing.T) storetest.LeaseStore { return openTest(t, addr) })
}

// TestLeasesAcrossReplicas: two stores on one server with one prefix (two
// replicas) share every lease and quota: what one acquires the other sees
// and is refused by, and what one releases the other may take.
func TestLeasesAcrossReplicas(t *testing.T) {
	addr, _, _ := redistest.Start(t)
	ctx := context.Background()
	a := openTest(t, addr)
	defer a.Close()
	b, err := Open("redis://"+addr, Options{Prefix: a.prefix, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q := storetest.Quota("vms|global", 1, 1)
	if err := a.AcquireLease(ctx, storetest.NewLease("l1", "lab/vm1", 0, q)); err != nil {
		t.Fatal(err)
	}
	var qe *store.QuotaError
	if err := b.AcquireLease(ctx, storetest.NewLease("l2", "lab/vm2", time.Second, q)); !errors.As(err, &qe) || len(qe.Holders) != 1 || qe.Holders[0].ID != "l1" {
		t.Fatalf("replica b AcquireLease = %v; want the quota held by a's l1", err)
	}
	got, err := b.GetLease(ctx, "l1")
	if err != nil {
		t.Fatal(err)
	}
	got.State, got.Until, got.Holder = store.LeaseDeleting, got.Until.Add(time.Hour), "b"
	if _, err := b.UpdateLease(ctx, got); err != nil {
		t.Fatalf("replica b UpdateLease = %v", err)
	}
	if err := b.ReleaseLease(ctx, "l1"); err != nil {
		t.Fatal(err)
	}
	if err := a.AcquireLease(ctx, storetest.NewLease("l2", "lab/vm2", time.Second, q)); err != nil {
		t.Errorf("replica a AcquireLease after b released = %v; want nil", err)
	}
}
