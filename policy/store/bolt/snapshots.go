package bolt

import (
	"context"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Snapshots = (*Store)(nil)

// bucketSnapshots maps store.SnapshotKey(vm, name) to a snapshot record's
// JSON. It is created on first use, so files written before snapshot
// records existed open unchanged. Records are few (bounded by the
// policies' snapshot bounds and the undo retention), so a scan lists them.
var bucketSnapshots = []byte("snapshots")

var snapshotRecords = recordKind{bucket: bucketSnapshots, what: "snapshot record", unknown: store.ErrUnknownSnapshot}

// PutSnapshot implements store.Snapshots.
func (s *Store) PutSnapshot(ctx context.Context, r store.SnapshotRecord) error {
	r, err := store.ValidateSnapshotRecord(r)
	if err != nil {
		return fmt.Errorf("bolt: put snapshot: %w", err)
	}
	return s.updateRecords(ctx, "put snapshot", snapshotRecords, func(b *bbolt.Bucket) error {
		return putRecord(b, store.SnapshotKey(r.VM, r.Name), r)
	})
}

// GetSnapshot implements store.Snapshots.
func (s *Store) GetSnapshot(ctx context.Context, vm, name string) (store.SnapshotRecord, error) {
	if err := store.ValidateSnapshotRef(vm, name); err != nil {
		return store.SnapshotRecord{}, fmt.Errorf("bolt: get snapshot: %w", err)
	}
	return readRecord[store.SnapshotRecord](ctx, s, "get snapshot", snapshotRecords, store.SnapshotKey(vm, name))
}

// ListSnapshots implements store.Snapshots.
func (s *Store) ListSnapshots(ctx context.Context, vm string) ([]store.SnapshotRecord, error) {
	out := []store.SnapshotRecord{}
	err := s.viewRecords(ctx, "list snapshots", snapshotRecords, func(b *bbolt.Bucket) error {
		return eachRecord(snapshotRecords, b, func(_ []byte, r store.SnapshotRecord) error {
			if vm == "" || r.VM == vm {
				out = append(out, r)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	store.SortSnapshotRecords(out)
	return out, nil
}

// DeleteSnapshot implements store.Snapshots.
func (s *Store) DeleteSnapshot(ctx context.Context, vm, name string) error {
	if err := store.ValidateSnapshotRef(vm, name); err != nil {
		return fmt.Errorf("bolt: delete snapshot: %w", err)
	}
	key := store.SnapshotKey(vm, name)
	return s.updateRecords(ctx, "delete snapshot", snapshotRecords, func(b *bbolt.Bucket) error {
		if b.Get([]byte(key)) == nil {
			return fmt.Errorf("snapshot %q of %q: %w", name, vm, store.ErrUnknownSnapshot)
		}
		return b.Delete([]byte(key))
	})
}
