package memory

import (
	"context"
	"fmt"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Snapshots = (*Snapshots)(nil)

// Snapshots is an in-memory store.Snapshots (tests, and servers whose
// store keeps no snapshot records of its own; nothing survives the
// process). The guard's mu guards m. Safe for concurrent use.
type Snapshots struct {
	guard
	m map[string]store.SnapshotRecord // by store.SnapshotKey
}

// NewSnapshots returns an empty snapshot register.
func NewSnapshots() *Snapshots { return &Snapshots{m: make(map[string]store.SnapshotRecord)} }

// PutSnapshot implements store.Snapshots.
func (s *Snapshots) PutSnapshot(ctx context.Context, r store.SnapshotRecord) error {
	r, err := store.ValidateSnapshotRecord(r)
	if err != nil {
		return fmt.Errorf("memory: put snapshot: %w", err)
	}
	if err := s.lockLive(ctx, "put snapshot"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.m[store.SnapshotKey(r.VM, r.Name)] = r
	return nil
}

// GetSnapshot implements store.Snapshots.
func (s *Snapshots) GetSnapshot(ctx context.Context, vm, name string) (store.SnapshotRecord, error) {
	if err := store.ValidateSnapshotRef(vm, name); err != nil {
		return store.SnapshotRecord{}, fmt.Errorf("memory: get snapshot: %w", err)
	}
	if err := s.lockLive(ctx, "get snapshot"); err != nil {
		return store.SnapshotRecord{}, err
	}
	defer s.mu.Unlock()
	r, ok := s.m[store.SnapshotKey(vm, name)]
	if !ok {
		return store.SnapshotRecord{}, fmt.Errorf("memory: get snapshot %q of %q: %w", name, vm, store.ErrUnknownSnapshot)
	}
	return r, nil
}

// ListSnapshots implements store.Snapshots.
func (s *Snapshots) ListSnapshots(ctx context.Context, vm string) ([]store.SnapshotRecord, error) {
	if err := s.lockLive(ctx, "list snapshots"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := []store.SnapshotRecord{}
	for _, r := range s.m {
		if vm == "" || r.VM == vm {
			out = append(out, r)
		}
	}
	store.SortSnapshotRecords(out)
	return out, nil
}

// DeleteSnapshot implements store.Snapshots.
func (s *Snapshots) DeleteSnapshot(ctx context.Context, vm, name string) error {
	if err := store.ValidateSnapshotRef(vm, name); err != nil {
		return fmt.Errorf("memory: delete snapshot: %w", err)
	}
	if err := s.lockLive(ctx, "delete snapshot"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	k := store.SnapshotKey(vm, name)
	if _, ok := s.m[k]; !ok {
		return fmt.Errorf("memory: delete snapshot %q of %q: %w", name, vm, store.ErrUnknownSnapshot)
	}
	delete(s.m, k)
	return nil
}
