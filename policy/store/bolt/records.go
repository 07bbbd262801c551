package bolt

import (
	"context"
	"encoding/json"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/vmgate/vmgate/policy/store"
)

// Approvals and sessions are both JSON records keyed by id, a bucket per
// kind; these helpers are the one copy of reading, writing, listing,
// creating and purging them.

// recordKind is one kind of record.
type recordKind struct {
	bucket  []byte
	what    string // "approval", "session": for messages
	unknown error  // the error of an id the bucket does not hold
}

var (
	approvalRecords = recordKind{bucket: bucketApprovals, what: "approval", unknown: store.ErrUnknownApproval}
	sessionRecords  = recordKind{bucket: bucketSessions, what: "session", unknown: store.ErrUnknownSession}
)

// getRecord reads record id of b (nil: an empty bucket).
func getRecord[T any](k recordKind, b *bbolt.Bucket, id string) (T, error) {
	var v T
	var raw []byte
	if b != nil {
		raw = b.Get([]byte(id))
	}
	if raw == nil {
		return v, fmt.Errorf("%s %q: %w", k.what, id, k.unknown)
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("%s %q: decode: %w", k.what, id, err)
	}
	return v, nil
}

// readRecord is operation op reading record id of kind k in a read
// transaction.
func readRecord[T any](ctx context.Context, s *Store, op string, k recordKind, id string) (T, error) {
	var v T
	err := s.viewRecords(ctx, op, k, func(b *bbolt.Bucket) error {
		var err error
		v, err = getRecord[T](k, b, id)
		return err
	})
	return v, err
}

// putRecord writes v as record id of b.
func putRecord(b *bbolt.Bucket, id string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(id), raw)
}

// eachRecord calls fn with every record of b (nil: none), in id order.
func eachRecord[T any](k recordKind, b *bbolt.Bucket, fn func(id []byte, v T) error) error {
	if b == nil {
		return nil
	}
	return b.ForEach(func(id, raw []byte) error {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("%s %q: decode: %w", k.what, id, err)
		}
		return fn(id, v)
	})
}

// createRecord adds v as the new record id of b, after purging the records
// for which stale is true; an id b holds already is store.ErrDuplicate. It
// runs inside the caller's update transaction.
func createRecord[T any](k recordKind, b *bbolt.Bucket, id string, v T, stale func(T) bool) error {
	if b.Get([]byte(id)) != nil {
		return fmt.Errorf("%w: %s %q", store.ErrDuplicate, k.what, id)
	}
	if err := purge(k, b, stale); err != nil {
		return err
	}
	return putRecord(b, id, v)
}

// purge deletes the records of b for which stale is true.
func purge[T any](k recordKind, b *bbolt.Bucket, stale func(T) bool) error {
	var keys [][]byte
	err := eachRecord(k, b, func(id []byte, old T) error {
		if stale(old) {
			keys = append(keys, id)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, id := range keys {
		if err := b.Delete(id); err != nil {
			return err
		}
	}
	return nil
}

// updateRecords runs fn in a write transaction on k's bucket, created when
// missing (so a file written before the kind existed opens unchanged).
func (s *Store) updateRecords(ctx context.Context, op string, k recordKind, fn func(b *bbolt.Bucket) error) error {
	return s.update(ctx, op, func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(k.bucket)
		if err != nil {
			return err
		}
		return fn(b)
	})
}

// viewRecords runs fn in a read transaction on k's bucket (nil when the
// bucket was never created).
func (s *Store) viewRecords(ctx context.Context, op string, k recordKind, fn func(b *bbolt.Bucket) error) error {
	return s.view(ctx, op, func(tx *bbolt.Tx) error { return fn(tx.Bucket(k.bucket)) })
}
