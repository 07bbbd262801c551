package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Sessions = (*Sessions)(nil)

// Sessions is an in-memory store.Sessions (tests, and servers whose store
// keeps no sessions of its own; nothing survives the process). The guard's
// mu guards m. Safe for concurrent use.
type Sessions struct {
	guard
	m map[string]store.Session
}

// NewSessions returns an empty session registry.
func NewSessions() *Sessions { return &Sessions{m: make(map[string]store.Session)} }

// CreateSession implements store.Sessions.
func (s *Sessions) CreateSession(ctx context.Context, sess store.Session) error {
	sess, err := store.ValidateSession(sess)
	if err != nil {
		return fmt.Errorf("memory: create session: %w", err)
	}
	if err := s.lockLive(ctx, "create session"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, dup := s.m[sess.ID]; dup {
		return fmt.Errorf("memory: create session: %w: session %q", store.ErrDuplicate, sess.ID)
	}
	for id, old := range s.m {
		if !old.Deleted.IsZero() && sess.Created.Sub(old.Deleted) > store.SessionRetention {
			delete(s.m, id)
		}
	}
	s.m[sess.ID] = sess
	return nil
}

// GetSession implements store.Sessions.
func (s *Sessions) GetSession(ctx context.Context, id string) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("memory: get session: %w", err)
	}
	if err := s.lockLive(ctx, "get session"); err != nil {
		return store.Session{}, err
	}
	defer s.mu.Unlock()
	sess, ok := s.m[id]
	if !ok {
		return store.Session{}, fmt.Errorf("memory: get session: %w", store.ErrUnknownSession)
	}
	return sess, nil
}

// ListSessions implements store.Sessions.
func (s *Sessions) ListSessions(ctx context.Context, grant, vm string) ([]store.Session, error) {
	if err := s.lockLive(ctx, "list sessions"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := []store.Session{}
	for _, sess := range s.m {
		if sess.Deleted.IsZero() && (grant == "" || sess.Grant == grant) && (vm == "" || sess.VM == vm) {
			out = append(out, sess)
		}
	}
	store.SortSessions(out)
	return out, nil
}

// TouchSession implements store.Sessions.
func (s *Sessions) TouchSession(ctx context.Context, id string, now time.Time) error {
	if err := store.ValidateSessionID(id); err != nil {
		return fmt.Errorf("memory: touch session: %w", err)
	}
	if err := s.lockLive(ctx, "touch session"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	sess, ok := s.m[id]
	if !ok || !sess.Deleted.IsZero() {
		return fmt.Errorf("memory: touch session: %w", store.ErrUnknownSession)
	}
	if now.After(sess.LastUsed) {
		sess.LastUsed = now
		s.m[id] = sess
	}
	return nil
}

// DeleteSession implements store.Sessions.
func (s *Sessions) DeleteSession(ctx context.Context, id string, now time.Time) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("memory: delete session: %w", err)
	}
	if now.IsZero() {
		return store.Session{}, fmt.Errorf("memory: delete session: %w: no deletion time", store.ErrInvalid)
	}
	if err := s.lockLive(ctx, "delete session"); err != nil {
		return store.Session{}, err
	}
	defer s.mu.Unlock()
	sess, ok := s.m[id]
	if !ok {
		return store.Session{}, fmt.Errorf("memory: delete session: %w", store.ErrUnknownSession)
	}
	if sess.Deleted.IsZero() {
		d := sess
		d.Deleted = now
		s.m[id] = d
	}
	return sess, nil
}
