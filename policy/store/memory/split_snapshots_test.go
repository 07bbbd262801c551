package memory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/storetest"
)

// snapshotsApprovals is an approval store (a memory Store) that also keeps
// snapshot records, standing in for bbolt.
type snapshotsApprovals struct {
	*Store
	*Snapshots
}

func (s snapshotsApprovals) Close() error { s.Snapshots.Close(); return s.Store.Close() }

func TestSplitSnapshots(t *testing.T) {
	storetest.RunSnapshots(t, func(t *testing.T) storetest.SnapshotStore {
		s, err := NewSplit(snapshotsApprovals{New(), NewSnapshots()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestSplitWithoutSnapshots: an approval store without snapshot records
// makes every call fail closed.
func TestSplitWithoutSnapshots(t *testing.T) {
	s, err := NewSplit(New())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	r := store.SnapshotRecord{VM: "lab/vm1", Name: "s", ID: "x", Grant: "g", Created: time.Unix(1, 0)}
	if err := s.PutSnapshot(ctx, r); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("PutSnapshot = %v; want ErrUnavailable", err)
	}
	if _, err := s.ListSnapshots(ctx, ""); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ListSnapshots = %v; want ErrUnavailable", err)
	}
}
