package memory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// Split is a store.Store whose counters are a memory Store and whose
// approvals are another store's: what `vmgate serve` runs with `store:
// bolt` (see the package doc for why). It is safe for
// concurrent use as far as both halves are.
type Split struct {
	counters  *Store
	approvals store.Store
}

var _ store.Store = (*Split)(nil)

// NewSplit returns a Split over a new, empty memory Store for counters and
// approvals for approvals. Close closes both.
func NewSplit(approvals store.Store) (*Split, error) {
	if approvals == nil {
		return nil, errors.New("memory: new split: no approval store")
	}
	return &Split{counters: New(), approvals: approvals}, nil
}

// ReserveAll implements store.Counters in memory.
func (s *Split) ReserveAll(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	return s.counters.ReserveAll(ctx, id, now, counters)
}

// Refund implements store.Counters in memory.
func (s *Split) Refund(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	return s.counters.Refund(ctx, id, now, counters)
}

// Restore rebuilds a reservation from the audit log (see Store.Restore).
func (s *Split) Restore(ctx context.Context, id string, at time.Time, counters []policy.Counter) error {
	return s.counters.Restore(ctx, id, at, counters)
}

// CreateApproval implements store.Approvals with the approval store.
func (s *Split) CreateApproval(ctx context.Context, a store.Approval) error {
	return s.approvals.CreateApproval(ctx, a)
}

// GetApproval implements store.Approvals with the approval store.
func (s *Split) GetApproval(ctx context.Context, id string) (store.Approval, error) {
	return s.approvals.GetApproval(ctx, id)
}

// ListApprovals implements store.Approvals with the approval store.
func (s *Split) ListApprovals(ctx context.Context, now time.Time) ([]store.Approval, error) {
	return s.approvals.ListApprovals(ctx, now)
}

// DecideApproval implements store.Approvals with the approval store.
func (s *Split) DecideApproval(ctx context.Context, id string, grant bool, by, reason string, now time.Time) (store.Approval, error) {
	return s.approvals.DecideApproval(ctx, id, grant, by, reason, now)
}

// ConsumeApproval implements store.Approvals with the approval store.
func (s *Split) ConsumeApproval(ctx context.Context, grant, tool, digest string, now time.Time) (store.Approval, bool, error) {
	return s.approvals.ConsumeApproval(ctx, grant, tool, digest, now)
}

// Close closes the counters and the approval store.
func (s *Split) Close() error {
	s.counters.Close()
	if err := s.approvals.Close(); err != nil {
		return fmt.Errorf("memory: close split: %w", err)
	}
	return nil
}
