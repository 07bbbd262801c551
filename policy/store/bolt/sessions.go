package bolt

import (
	"context"
	"fmt"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Sessions = (*Store)(nil)

// bucketSessions maps a session id to its JSON. It is created on first use,
// so files written before sessions existed open unchanged. Sessions are few
// and change rarely (create, touch, delete), so a scan lists them.
var bucketSessions = []byte("sessions")

// CreateSession implements store.Sessions. It also purges tombstones older
// than store.SessionRetention.
func (s *Store) CreateSession(ctx context.Context, sess store.Session) error {
	sess, err := store.ValidateSession(sess)
	if err != nil {
		return fmt.Errorf("bolt: create session: %w", err)
	}
	return s.updateRecords(ctx, "create session", sessionRecords, func(b *bbolt.Bucket) error {
		return createRecord(sessionRecords, b, sess.ID, sess, func(old store.Session) bool {
			return !old.Deleted.IsZero() && sess.Created.Sub(old.Deleted) > store.SessionRetention
		})
	})
}

// GetSession implements store.Sessions.
func (s *Store) GetSession(ctx context.Context, id string) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("bolt: get session: %w", err)
	}
	return readRecord[store.Session](ctx, s, "get session", sessionRecords, id)
}

// ListSessions implements store.Sessions.
func (s *Store) ListSessions(ctx context.Context, grant, vm string) ([]store.Session, error) {
	out := []store.Session{}
	err := s.viewRecords(ctx, "list sessions", sessionRecords, func(b *bbolt.Bucket) error {
		return eachRecord(sessionRecords, b, func(_ []byte, sess store.Session) error {
			if sess.Deleted.IsZero() && (grant == "" || sess.Grant == grant) && (vm == "" || sess.VM == vm) {
				out = append(out, sess)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	store.SortSessions(out)
	return out, nil
}

// TouchSession implements store.Sessions.
func (s *Store) TouchSession(ctx context.Context, id string, now time.Time) error {
	if err := store.ValidateSessionID(id); err != nil {
		return fmt.Errorf("bolt: touch session: %w", err)
	}
	return s.updateRecords(ctx, "touch session", sessionRecords, func(b *bbolt.Bucket) error {
		sess, err := getRecord[store.Session](sessionRecords, b, id)
		if err != nil {
			return err
		}
		if !sess.Deleted.IsZero() {
			return fmt.Errorf("session: %w", store.ErrUnknownSession)
		}
		if !now.After(sess.LastUsed) {
			return nil
		}
		sess.LastUsed = now
		return putRecord(b, sess.ID, sess)
	})
}

// DeleteSession implements store.Sessions.
func (s *Store) DeleteSession(ctx context.Context, id string, now time.Time) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("bolt: delete session: %w", err)
	}
	if now.IsZero() {
		return store.Session{}, fmt.Errorf("bolt: delete session: %w: no deletion time", store.ErrInvalid)
	}
	var before store.Session
	err := s.updateRecords(ctx, "delete session", sessionRecords, func(b *bbolt.Bucket) error {
		sess, err := getRecord[store.Session](sessionRecords, b, id)
		if err != nil {
			return err
		}
		before = sess
		if !sess.Deleted.IsZero() {
			return nil
		}
		sess.Deleted = now
		return putRecord(b, sess.ID, sess)
	})
	return before, err
}
