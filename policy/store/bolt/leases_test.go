package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

func TestLeases(t *testing.T) {
	storetest.RunLeases(t, func(t *testing.T) storetest.LeaseStore {
		s, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{})
		if err != nil {
			t.Fatalf("Open = %v", err)
		}
		return s
	})
}

// TestLeasesSurviveReopen: a lease and the quota it holds outlive the
// process that acquired it (the server restarts; the VM must still be
// deleted when its lease ends).
func TestLeasesSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	q := storetest.Quota("vms|grant=5:alice", 1, 1)
	l := storetest.NewLease("l1", "lab/vm1", 0, q)
	if err := s.AcquireLease(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.GetLease(ctx, "l1")
	if err != nil || got.Name != "lab/vm1" || got.State != store.LeaseCreating || !got.Until.Equal(l.Until) {
		t.Errorf("GetLease after reopen = %+v, %v; want the creating lease of lab/vm1", got, err)
	}
	err = s.AcquireLease(ctx, storetest.NewLease("l2", "lab/vm2", time.Second, q))
	var qe *store.QuotaError
	if !errors.As(err, &qe) || qe.Used != 1 {
		t.Errorf("AcquireLease after reopen = %v; want the quota still held by l1", err)
	}
}
