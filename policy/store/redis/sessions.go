package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Sessions = (*Store)(nil)

// Sessions: a JSON string per session (Prefix + "s:" + id) and a set of
// all ids (Prefix + "si"). A deleted session's key expires
// store.SessionRetention after the deletion (wall clock); ids whose key
// expired leave the set the next time ListSessions sees them. Touch and
// Delete are optimistic WATCH/MULTI transactions like DecideApproval.

// CreateSession implements store.Sessions.
func (s *Store) CreateSession(ctx context.Context, sess store.Session) error {
	sess, err := store.ValidateSession(sess)
	if err != nil {
		return fmt.Errorf("redis: create session: %w", err)
	}
	return s.createRecord(ctx, "create session", sessionRecords, sess.ID, sess, 0, nil)
}

// GetSession implements store.Sessions.
func (s *Store) GetSession(ctx context.Context, id string) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("redis: get session: %w", err)
	}
	return readRecord[store.Session](ctx, s, "get session", sessionRecords, id)
}

// ListSessions implements store.Sessions.
func (s *Store) ListSessions(ctx context.Context, grant, vm string) ([]store.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, unavailable("list sessions", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	list, _, err := members[store.Session](ctx, s, sessionRecords, s.idsKey(sessionRecords))
	if err != nil {
		return nil, unavailable("list sessions", err)
	}
	out := []store.Session{}
	for _, sess := range list {
		if sess.Deleted.IsZero() && (grant == "" || sess.Grant == grant) && (vm == "" || sess.VM == vm) {
			out = append(out, sess)
		}
	}
	store.SortSessions(out)
	return out, nil
}

// TouchSession implements store.Sessions.
func (s *Store) TouchSession(ctx context.Context, id string, now time.Time) error {
	if err := store.ValidateSessionID(id); err != nil {
		return fmt.Errorf("redis: touch session: %w", err)
	}
	return updateRecord(ctx, s, "touch session", sessionRecords, id, func(sess store.Session) (store.Session, bool, time.Duration, error) {
		if !sess.Deleted.IsZero() {
			return sess, false, 0, fmt.Errorf("session: %w", store.ErrUnknownSession)
		}
		if !now.After(sess.LastUsed) {
			return sess, false, 0, nil
		}
		sess.LastUsed = now
		return sess, true, 0, nil
	})
}

// DeleteSession implements store.Sessions.
func (s *Store) DeleteSession(ctx context.Context, id string, now time.Time) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("redis: delete session: %w", err)
	}
	if now.IsZero() {
		return store.Session{}, fmt.Errorf("redis: delete session: %w: no deletion time", store.ErrInvalid)
	}
	var before store.Session
	err := updateRecord(ctx, s, "delete session", sessionRecords, id, func(sess store.Session) (store.Session, bool, time.Duration, error) {
		before = sess
		if !sess.Deleted.IsZero() {
			return sess, false, 0, nil
		}
		sess.Deleted = now
		return sess, true, store.SessionRetention, nil
	})
	if err != nil {
		return store.Session{}, err
	}
	return before, nil
}
