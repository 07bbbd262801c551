package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// isClientError reports whether err is a verdict or a caller's mistake
// rather than the store failing: a full counter, a bad argument, a
// duplicate id, an unknown or no longer pending approval.
func isClientError(err error) bool {
	var le *store.LimitedError
	var qe *store.QuotaError
	return errors.As(err, &le) || errors.As(err, &qe) || errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrDuplicate) ||
		errors.Is(err, store.ErrUnknownApproval) || errors.Is(err, store.ErrNotPending) ||
		errors.Is(err, store.ErrUnknownSession) || errors.Is(err, store.ErrUnknownLease) || errors.Is(err, store.ErrStaleLease) ||
		errors.Is(err, store.ErrUnknownSnapshot) ||
		errors.Is(err, context.Canceled)
}

// Store wraps s in a store.Store that counts its failures in
// vmgate_store_errors_total. The optional parts s keeps (store.Sessions,
// store.Leases, store.Snapshots) the wrapper keeps too, counted the same
// way, so that whoever asks the wrapper for one finds it as on s. Other
// optional methods of s (Restore, …) are not carried over: wrap the store
// after restoring it.
func (m *Metrics) Store(s store.Store) store.Store {
	c := &countingStore{m: m, next: s}
	ss, hasSessions := s.(store.Sessions)
	ls, hasLeases := s.(store.Leases)
	sn, hasSnaps := s.(store.Snapshots)
	cs := &countingSessions{m: m, next: ss}
	cl := &countingLeases{m: m, next: ls}
	cn := &countingSnapshots{m: m, next: sn}
	switch {
	case hasSessions && hasLeases && hasSnaps:
		return struct {
			*countingStore
			*countingSessions
			*countingLeases
			*countingSnapshots
		}{c, cs, cl, cn}
	case hasSessions && hasLeases:
		return struct {
			*countingStore
			*countingSessions
			*countingLeases
		}{c, cs, cl}
	case hasSessions && hasSnaps:
		return struct {
			*countingStore
			*countingSessions
			*countingSnapshots
		}{c, cs, cn}
	case hasLeases && hasSnaps:
		return struct {
			*countingStore
			*countingLeases
			*countingSnapshots
		}{c, cl, cn}
	case hasSessions:
		return struct {
			*countingStore
			*countingSessions
		}{c, cs}
	case hasLeases:
		return struct {
			*countingStore
			*countingLeases
		}{c, cl}
	case hasSnaps:
		return struct {
			*countingStore
			*countingSnapshots
		}{c, cn}
	}
	return c
}

// countingSessions counts the failures of a session store.
type countingSessions struct {
	m    *Metrics
	next store.Sessions
}

var _ store.Sessions = (*countingSessions)(nil)

func (s *countingSessions) CreateSession(ctx context.Context, sess store.Session) error {
	return s.m.counted("create_session", s.next.CreateSession(ctx, sess))
}

func (s *countingSessions) GetSession(ctx context.Context, id string) (store.Session, error) {
	sess, err := s.next.GetSession(ctx, id)
	return sess, s.m.counted("get_session", err)
}

func (s *countingSessions) ListSessions(ctx context.Context, grant, vm string) ([]store.Session, error) {
	l, err := s.next.ListSessions(ctx, grant, vm)
	return l, s.m.counted("list_sessions", err)
}

func (s *countingSessions) TouchSession(ctx context.Context, id string, now time.Time) error {
	return s.m.counted("touch_session", s.next.TouchSession(ctx, id, now))
}

func (s *countingSessions) DeleteSession(ctx context.Context, id string, now time.Time) (store.Session, error) {
	sess, err := s.next.DeleteSession(ctx, id, now)
	return sess, s.m.counted("delete_session", err)
}

type countingStore struct {
	m    *Metrics
	next store.Store
}

var _ store.Store = (*countingStore)(nil)

func (s *countingStore) ReserveAll(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	return s.m.counted("reserve", s.next.ReserveAll(ctx, id, now, counters))
}

func (s *countingStore) Refund(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	return s.m.counted("refund", s.next.Refund(ctx, id, now, counters))
}

func (s *countingStore) CreateApproval(ctx context.Context, a store.Approval) error {
	return s.m.counted("create_approval", s.next.CreateApproval(ctx, a))
}

func (s *countingStore) GetApproval(ctx context.Context, id string) (store.Approval, error) {
	a, err := s.next.GetApproval(ctx, id)
	return a, s.m.counted("get_approval", err)
}

func (s *countingStore) ListApprovals(ctx context.Context, now time.Time) ([]store.Approval, error) {
	l, err := s.next.ListApprovals(ctx, now)
	return l, s.m.counted("list_approvals", err)
}

func (s *countingStore) DecideApproval(ctx context.Context, id string, grant bool, by, reason string, now time.Time) (store.Approval, error) {
	a, err := s.next.DecideApproval(ctx, id, grant, by, reason, now)
	return a, s.m.counted("decide_approval", err)
}

func (s *countingStore) ConsumeApproval(ctx context.Context, grant, tool, digest string, now time.Time) (store.Approval, bool, error) {
	a, ok, err := s.next.ConsumeApproval(ctx, grant, tool, digest, now)
	return a, ok, s.m.counted("consume_approval", err)
}

func (s *countingStore) Close() error { return s.next.Close() }

// countingLeases counts the failures of a lease store.
type countingLeases struct {
	m    *Metrics
	next store.Leases
}

var _ store.Leases = (*countingLeases)(nil)

func (s *countingLeases) AcquireLease(ctx context.Context, l store.Lease) error {
	return s.m.counted("acquire_lease", s.next.AcquireLease(ctx, l))
}

func (s *countingLeases) GetLease(ctx context.Context, id string) (store.Lease, error) {
	l, err := s.next.GetLease(ctx, id)
	return l, s.m.counted("get_lease", err)
}

func (s *countingLeases) ListLeases(ctx context.Context) ([]store.Lease, error) {
	l, err := s.next.ListLeases(ctx)
	return l, s.m.counted("list_leases", err)
}

func (s *countingLeases) UpdateLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	l, err := s.next.UpdateLease(ctx, l)
	return l, s.m.counted("update_lease", err)
}

func (s *countingLeases) ReleaseLease(ctx context.Context, id string) error {
	return s.m.counted("release_lease", s.next.ReleaseLease(ctx, id))
}

// countingSnapshots counts the failures of a snapshot owner store.
type countingSnapshots struct {
	m    *Metrics
	next store.Snapshots
}

var _ store.Snapshots = (*countingSnapshots)(nil)

func (s *countingSnapshots) PutSnapshot(ctx context.Context, r store.SnapshotRecord) error {
	return s.m.counted("put_snapshot", s.next.PutSnapshot(ctx, r))
}

func (s *countingSnapshots) GetSnapshot(ctx context.Context, vm, name string) (store.SnapshotRecord, error) {
	r, err := s.next.GetSnapshot(ctx, vm, name)
	return r, s.m.counted("get_snapshot", err)
}

func (s *countingSnapshots) ListSnapshots(ctx context.Context, vm string) ([]store.SnapshotRecord, error) {
	l, err := s.next.ListSnapshots(ctx, vm)
	return l, s.m.counted("list_snapshots", err)
}

func (s *countingSnapshots) DeleteSnapshot(ctx context.Context, vm, name string) error {
	return s.m.counted("delete_snapshot", s.next.DeleteSnapshot(ctx, vm, name))
}
