package memory

import (
	"context"
	"fmt"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Leases = (*Split)(nil)

// leaseStore is the approval store as a store.Leases: leases live where
// approvals and sessions do (bbolt with fsync under `vmgate serve`). A
// lease must outlive a crash on its own: the quota it holds is the lease
// itself, and the VM it names must still be deleted when it runs out.
func (s *Split) leaseStore(op string) (store.Leases, error) {
	ls, ok := s.approvals.(store.Leases)
	if !ok {
		return nil, fmt.Errorf("memory: %s: %w: the approval store %T keeps no leases", op, store.ErrUnavailable, s.approvals)
	}
	return ls, nil
}

// AcquireLease implements store.Leases with the approval store.
func (s *Split) AcquireLease(ctx context.Context, l store.Lease) error {
	ls, err := s.leaseStore("acquire lease")
	if err != nil {
		return err
	}
	return ls.AcquireLease(ctx, l)
}

// GetLease implements store.Leases with the approval store.
func (s *Split) GetLease(ctx context.Context, id string) (store.Lease, error) {
	ls, err := s.leaseStore("get lease")
	if err != nil {
		return store.Lease{}, err
	}
	return ls.GetLease(ctx, id)
}

// ListLeases implements store.Leases with the approval store.
func (s *Split) ListLeases(ctx context.Context) ([]store.Lease, error) {
	ls, err := s.leaseStore("list leases")
	if err != nil {
		return nil, err
	}
	return ls.ListLeases(ctx)
}

// UpdateLease implements store.Leases with the approval store.
func (s *Split) UpdateLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	ls, err := s.leaseStore("update lease")
	if err != nil {
		return store.Lease{}, err
	}
	return ls.UpdateLease(ctx, l)
}

// ReleaseLease implements store.Leases with the approval store.
func (s *Split) ReleaseLease(ctx context.Context, id string) error {
	ls, err := s.leaseStore("release lease")
	if err != nil {
		return err
	}
	return ls.ReleaseLease(ctx, id)
}
