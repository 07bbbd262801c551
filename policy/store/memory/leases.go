package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Leases = (*Store)(nil)

// lockLeases takes mu after checking ctx; the caller unlocks on success.
func (s *Store) lockLeases(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("memory: %s: %w: store is closed", op, store.ErrUnavailable)
	}
	return nil
}

// cloneLease copies l's quotas: a caller changing a returned lease must
// not change the stored one.
func cloneLease(l store.Lease) store.Lease {
	l.Quotas = slices.Clone(l.Quotas)
	return l
}

func (s *Store) leaseListLocked() []store.Lease {
	out := make([]store.Lease, 0, len(s.leases))
	for _, l := range s.leases {
		out = append(out, cloneLease(l))
	}
	store.SortLeases(out)
	return out
}

// AcquireLease implements store.Leases: the quotas are checked against
// every lease under the store's one mutex.
func (s *Store) AcquireLease(ctx context.Context, l store.Lease) error {
	l, err := store.ValidateLease(l)
	if err != nil {
		return fmt.Errorf("memory: acquire lease: %w", err)
	}
	if err := s.lockLeases(ctx, "acquire lease"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := store.QuotaRoom(s.leaseListLocked(), l); err != nil {
		var qe *store.QuotaError
		if errors.As(err, &qe) {
			return qe
		}
		return fmt.Errorf("memory: acquire lease: %w", err)
	}
	s.leases[l.ID] = l
	return nil
}

// GetLease implements store.Leases.
func (s *Store) GetLease(ctx context.Context, id string) (store.Lease, error) {
	if err := store.ValidateLeaseID(id); err != nil {
		return store.Lease{}, fmt.Errorf("memory: get lease: %w", err)
	}
	if err := s.lockLeases(ctx, "get lease"); err != nil {
		return store.Lease{}, err
	}
	defer s.mu.Unlock()
	l, ok := s.leases[id]
	if !ok {
		return store.Lease{}, fmt.Errorf("memory: get lease %q: %w", id, store.ErrUnknownLease)
	}
	return cloneLease(l), nil
}

// ListLeases implements store.Leases.
func (s *Store) ListLeases(ctx context.Context) ([]store.Lease, error) {
	if err := s.lockLeases(ctx, "list leases"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.leaseListLocked(), nil
}

// UpdateLease implements store.Leases.
func (s *Store) UpdateLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	if err := store.ValidateLeaseID(l.ID); err != nil {
		return store.Lease{}, fmt.Errorf("memory: update lease: %w", err)
	}
	if err := s.lockLeases(ctx, "update lease"); err != nil {
		return store.Lease{}, err
	}
	defer s.mu.Unlock()
	old, ok := s.leases[l.ID]
	if !ok {
		return store.Lease{}, fmt.Errorf("memory: update lease %q: %w", l.ID, store.ErrUnknownLease)
	}
	next, err := store.CheckLeaseUpdate(old, l)
	if err != nil {
		return store.Lease{}, fmt.Errorf("memory: update lease: %w", err)
	}
	s.leases[l.ID] = next
	return cloneLease(next), nil
}

// ReleaseLease implements store.Leases.
func (s *Store) ReleaseLease(ctx context.Context, id string) error {
	if err := store.ValidateLeaseID(id); err != nil {
		return fmt.Errorf("memory: release lease: %w", err)
	}
	if err := s.lockLeases(ctx, "release lease"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, ok := s.leases[id]; !ok {
		return fmt.Errorf("memory: release lease %q: %w", id, store.ErrUnknownLease)
	}
	delete(s.leases, id)
	return nil
}
