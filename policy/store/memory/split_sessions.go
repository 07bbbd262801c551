package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Sessions = (*Split)(nil)

// sessionStore is the approval store as a store.Sessions: sessions live where
// approvals do (bbolt with fsync under `vmgate serve`), since like them they
// must survive a restart and the audit log does not hold their state.
func (s *Split) sessionStore(op string) (store.Sessions, error) {
	ss, ok := s.approvals.(store.Sessions)
	if !ok {
		return nil, fmt.Errorf("memory: %s: %w: the approval store %T keeps no sessions", op, store.ErrUnavailable, s.approvals)
	}
	return ss, nil
}

// CreateSession implements store.Sessions with the approval store.
func (s *Split) CreateSession(ctx context.Context, sess store.Session) error {
	ss, err := s.sessionStore("create session")
	if err != nil {
		return err
	}
	return ss.CreateSession(ctx, sess)
}

// GetSession implements store.Sessions with the approval store.
func (s *Split) GetSession(ctx context.Context, id string) (store.Session, error) {
	ss, err := s.sessionStore("get session")
	if err != nil {
		return store.Session{}, err
	}
	return ss.GetSession(ctx, id)
}

// ListSessions implements store.Sessions with the approval store.
func (s *Split) ListSessions(ctx context.Context, grant, vm string) ([]store.Session, error) {
	ss, err := s.sessionStore("list sessions")
	if err != nil {
		return nil, err
	}
	return ss.ListSessions(ctx, grant, vm)
}

// TouchSession implements store.Sessions with the approval store.
func (s *Split) TouchSession(ctx context.Context, id string, now time.Time) error {
	ss, err := s.sessionStore("touch session")
	if err != nil {
		return err
	}
	return ss.TouchSession(ctx, id, now)
}

// DeleteSession implements store.Sessions with the approval store.
func (s *Split) DeleteSession(ctx context.Context, id string, now time.Time) (store.Session, error) {
	ss, err := s.sessionStore("delete session")
	if err != nil {
		return store.Session{}, err
	}
	return ss.DeleteSession(ctx, id, now)
}
