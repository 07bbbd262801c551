package bolt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Leases = (*Store)(nil)

// bucketLeases maps a lease id to its JSON. It is created on first use, so
// files written before leases existed open unchanged. Leases are few (a
// quota bounds them), so AcquireLease reads them all in its transaction
// and counts every quota from them: the quota is the leases themselves,
// with no separate count to drift from them. bbolt runs one writer at a
// time, which makes concurrent acquisitions exact.
//
// A lease is written with the store's own commit (fsync unless NoSync):
// unlike a counter reservation it cannot be rebuilt from the audit log,
// since the log does not say whether the VM was deleted since. vm_create
// thus waits for a second fsync besides its audit record's; it boots a
// VM, which takes seconds, so the fsync (about 0.3 ms) is lost in it.
var bucketLeases = []byte("leases")

// leaseUpdate runs fn in a write transaction on the leases bucket.
// ErrDuplicate, ErrUnknownLease, ErrStaleLease, ErrInvalid and a
// *QuotaError from fn pass through; every other failure wraps
// store.ErrUnavailable.
func (s *Store) leaseUpdate(ctx context.Context, op string, fn func(b *bbolt.Bucket) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	var mine error
	err := s.db.Update(func(tx *bbolt.Tx) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(bucketLeases)
		if err != nil {
			return err
		}
		mine = fn(b)
		return mine
	})
	return leaseWrap(op, err, mine)
}

func (s *Store) leaseView(ctx context.Context, op string, fn func(b *bbolt.Bucket) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	var mine error
	err := s.db.View(func(tx *bbolt.Tx) error {
		mine = fn(tx.Bucket(bucketLeases))
		return mine
	})
	return leaseWrap(op, err, mine)
}

func leaseWrap(op string, err, mine error) error {
	if err == nil {
		return nil
	}
	var qe *store.QuotaError
	if mine != nil && errors.Is(err, mine) {
		if errors.As(mine, &qe) {
			return qe
		}
		for _, e := range []error{store.ErrDuplicate, store.ErrUnknownLease, store.ErrStaleLease, store.ErrInvalid} {
			if errors.Is(mine, e) {
				return fmt.Errorf("bolt: %s: %w", op, mine)
			}
		}
	}
	return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
}

func getLease(b *bbolt.Bucket, id string) (store.Lease, error) {
	var v []byte
	if b != nil {
		v = b.Get([]byte(id))
	}
	if v == nil {
		return store.Lease{}, fmt.Errorf("lease %q: %w", id, store.ErrUnknownLease)
	}
	var l store.Lease
	if err := json.Unmarshal(v, &l); err != nil {
		return store.Lease{}, fmt.Errorf("lease %q: decode: %w", id, err)
	}
	return l, nil
}

func allLeases(b *bbolt.Bucket) ([]store.Lease, error) {
	out := []store.Lease{}
	if b == nil {
		return out, nil
	}
	err := b.ForEach(func(k, v []byte) error {
		var l store.Lease
		if err := json.Unmarshal(v, &l); err != nil {
			return fmt.Errorf("lease %q: decode: %w", k, err)
		}
		out = append(out, l)
		return nil
	})
	store.SortLeases(out)
	return out, err
}

func putLease(b *bbolt.Bucket, l store.Lease) error {
	v, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return b.Put([]byte(l.ID), v)
}

// AcquireLease implements store.Leases in one write transaction.
func (s *Store) AcquireLease(ctx context.Context, l store.Lease) error {
	l, err := store.ValidateLease(l)
	if err != nil {
		return fmt.Errorf("bolt: acquire lease: %w", err)
	}
	return s.leaseUpdate(ctx, "acquire lease", func(b *bbolt.Bucket) error {
		held, err := allLeases(b)
		if err != nil {
			return err
		}
		if err := store.QuotaRoom(held, l); err != nil {
			return err
		}
		return putLease(b, l)
	})
}

// GetLease implements store.Leases.
func (s *Store) GetLease(ctx context.Context, id string) (store.Lease, error) {
	if err := store.ValidateLeaseID(id); err != nil {
		return store.Lease{}, fmt.Errorf("bolt: get lease: %w", err)
	}
	var l store.Lease
	err := s.leaseView(ctx, "get lease", func(b *bbolt.Bucket) error {
		var err error
		l, err = getLease(b, id)
		return err
	})
	return l, err
}

// ListLeases implements store.Leases.
func (s *Store) ListLeases(ctx context.Context) ([]store.Lease, error) {
	var out []store.Lease
	err := s.leaseView(ctx, "list leases", func(b *bbolt.Bucket) error {
		var err error
		out, err = allLeases(b)
		return err
	})
	return out, err
}

// UpdateLease implements store.Leases.
func (s *Store) UpdateLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	if err := store.ValidateLeaseID(l.ID); err != nil {
		return store.Lease{}, fmt.Errorf("bolt: update lease: %w", err)
	}
	var next store.Lease
	err := s.leaseUpdate(ctx, "update lease", func(b *bbolt.Bucket) error {
		old, err := getLease(b, l.ID)
		if err != nil {
			return err
		}
		if next, err = store.CheckLeaseUpdate(old, l); err != nil {
			return err
		}
		return putLease(b, next)
	})
	return next, err
}

// ReleaseLease implements store.Leases.
func (s *Store) ReleaseLease(ctx context.Context, id string) error {
	if err := store.ValidateLeaseID(id); err != nil {
		return fmt.Errorf("bolt: release lease: %w", err)
	}
	return s.leaseUpdate(ctx, "release lease", func(b *bbolt.Bucket) error {
		if b.Get([]byte(id)) == nil {
			return fmt.Errorf("lease %q: %w", id, store.ErrUnknownLease)
		}
		return b.Delete([]byte(id))
	})
}
