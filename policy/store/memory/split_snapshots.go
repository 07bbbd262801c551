package memory

import (
	"context"
	"fmt"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Snapshots = (*Split)(nil)

// snapshotStore is the approval store as a store.Snapshots: snapshot
// records live where approvals and sessions do (bbolt with fsync under
// `vmgate serve`), since they must survive a restart.
func (s *Split) snapshotStore(op string) (store.Snapshots, error) {
	ss, ok := s.approvals.(store.Snapshots)
	if !ok {
		return nil, fmt.Errorf("memory: %s: %w: the approval store %T keeps no snapshot records", op, store.ErrUnavailable, s.approvals)
	}
	return ss, nil
}

// PutSnapshot implements store.Snapshots with the approval store.
func (s *Split) PutSnapshot(ctx context.Context, r store.SnapshotRecord) error {
	ss, err := s.snapshotStore("put snapshot")
	if err != nil {
		return err
	}
	return ss.PutSnapshot(ctx, r)
}

// GetSnapshot implements store.Snapshots with the approval store.
func (s *Split) GetSnapshot(ctx context.Context, vm, name string) (store.SnapshotRecord, error) {
	ss, err := s.snapshotStore("get snapshot")
	if err != nil {
		return store.SnapshotRecord{}, err
	}
	return ss.GetSnapshot(ctx, vm, name)
}

// ListSnapshots implements store.Snapshots with the approval store.
func (s *Split) ListSnapshots(ctx context.Context, vm string) ([]store.SnapshotRecord, error) {
	ss, err := s.snapshotStore("list snapshots")
	if err != nil {
		return nil, err
	}
	return ss.ListSnapshots(ctx, vm)
}

// DeleteSnapshot implements store.Snapshots with the approval store.
func (s *Split) DeleteSnapshot(ctx context.Context, vm, name string) error {
	ss, err := s.snapshotStore("delete snapshot")
	if err != nil {
		return err
	}
	return ss.DeleteSnapshot(ctx, vm, name)
}
