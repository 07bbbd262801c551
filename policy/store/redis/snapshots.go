package redis

import (
	"context"
	"encoding/json"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Snapshots = (*Store)(nil)

// Snapshot records: a JSON string per record (Prefix + "n:" +
// store.SnapshotKey(vm, name)) and a set of all keys (Prefix + "ni"). A
// put is SET and SADD in one MULTI/EXEC, a delete DEL and SREM: each is
// atomic, and the last writer of a key wins (the server writes a key only
// right after the backend made or deleted that snapshot).

var snapshotRecords = recordKind{what: "snapshot record", infix: "n:", ids: "ni", unknown: store.ErrUnknownSnapshot}

// PutSnapshot implements store.Snapshots.
func (s *Store) PutSnapshot(ctx context.Context, r store.SnapshotRecord) error {
	r, err := store.ValidateSnapshotRecord(r)
	if err != nil {
		return fmt.Errorf("redis: put snapshot: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return unavailable("put snapshot", err)
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("redis: put snapshot: %w", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	key := store.SnapshotKey(r.VM, r.Name)
	_, err = s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Set(ctx, s.recordKey(snapshotRecords, key), raw, 0)
		p.SAdd(ctx, s.idsKey(snapshotRecords), key)
		return nil
	})
	if err != nil {
		return unavailable("put snapshot", err)
	}
	return nil
}

// GetSnapshot implements store.Snapshots.
func (s *Store) GetSnapshot(ctx context.Context, vm, name string) (store.SnapshotRecord, error) {
	if err := store.ValidateSnapshotRef(vm, name); err != nil {
		return store.SnapshotRecord{}, fmt.Errorf("redis: get snapshot: %w", err)
	}
	return readRecord[store.SnapshotRecord](ctx, s, "get snapshot", snapshotRecords, store.SnapshotKey(vm, name))
}

// ListSnapshots implements store.Snapshots.
func (s *Store) ListSnapshots(ctx context.Context, vm string) ([]store.SnapshotRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, unavailable("list snapshots", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	list, _, err := members[store.SnapshotRecord](ctx, s, snapshotRecords, s.idsKey(snapshotRecords))
	if err != nil {
		return nil, unavailable("list snapshots", err)
	}
	out := []store.SnapshotRecord{}
	for _, r := range list {
		if vm == "" || r.VM == vm {
			out = append(out, r)
		}
	}
	store.SortSnapshotRecords(out)
	return out, nil
}

// DeleteSnapshot implements store.Snapshots.
func (s *Store) DeleteSnapshot(ctx context.Context, vm, name string) error {
	if err := store.ValidateSnapshotRef(vm, name); err != nil {
		return fmt.Errorf("redis: delete snapshot: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return unavailable("delete snapshot", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	key := store.SnapshotKey(vm, name)
	var del *goredis.IntCmd
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		del = p.Del(ctx, s.recordKey(snapshotRecords, key))
		p.SRem(ctx, s.idsKey(snapshotRecords), key)
		return nil
	})
	if err != nil {
		return unavailable("delete snapshot", err)
	}
	if del.Val() == 0 {
		return fmt.Errorf("redis: delete snapshot %q of %q: %w", name, vm, store.ErrUnknownSnapshot)
	}
	return nil
}
