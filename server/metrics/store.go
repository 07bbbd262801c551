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
	return errors.As(err, &le) || errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrDuplicate) ||
		errors.Is(err, store.ErrUnknownApproval) || errors.Is(err, store.ErrNotPending) ||
		errors.Is(err, store.ErrUnknownSession) ||
		errors.Is(err, context.Canceled)
}

// Store wraps s in a store.Store that counts its failures in
// vmgate_store_errors_total. When s also keeps sessions (store.Sessions),
// so does the wrapper, counting those too. Other optional methods of s
// (Restore, …) are not carried over: wrap the store after restoring it.
func (m *Metrics) Store(s store.Store) store.Store {
	c := &countingStore{m: m, next: s}
	if ss, ok := s.(store.Sessions); ok {
		return &countingSessionStore{countingStore: c, sessions: ss}
	}
	return c
}

// countingSessionStore is a countingStore over a store that keeps sessions.
type countingSessionStore struct {
	*countingStore
	sessions store.Sessions
}

var _ store.Sessions = (*countingSessionStore)(nil)

func (s *countingSessionStore) CreateSession(ctx context.Context, sess store.Session) error {
	return s.m.counted("create_session", s.sessions.CreateSession(ctx, sess))
}

func (s *countingSessionStore) GetSession(ctx context.Context, id string) (store.Session, error) {
	sess, err := s.sessions.GetSession(ctx, id)
	return sess, s.m.counted("get_session", err)
}

func (s *countingSessionStore) ListSessions(ctx context.Context, grant, vm string) ([]store.Session, error) {
	l, err := s.sessions.ListSessions(ctx, grant, vm)
	return l, s.m.counted("list_sessions", err)
}

func (s *countingSessionStore) TouchSession(ctx context.Context, id string, now time.Time) error {
	return s.m.counted("touch_session", s.sessions.TouchSession(ctx, id, now))
}

func (s *countingSessionStore) DeleteSession(ctx context.Context, id string, now time.Time) (store.Session, error) {
	sess, err := s.sessions.DeleteSession(ctx, id, now)
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
