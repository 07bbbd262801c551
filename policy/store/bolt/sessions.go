package bolt

import (
	"context"
	"encoding/json"
	"errors"
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

// sessionUpdate runs fn in a write transaction on the sessions bucket.
// ErrDuplicate and ErrUnknownSession from fn pass through; every other
// failure wraps store.ErrUnavailable.
func (s *Store) sessionUpdate(ctx context.Context, op string, fn func(b *bbolt.Bucket) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	var mine error
	err := s.db.Update(func(tx *bbolt.Tx) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(bucketSessions)
		if err != nil {
			return err
		}
		mine = fn(b)
		return mine
	})
	return sessionWrap(op, err, mine)
}

func (s *Store) sessionView(ctx context.Context, op string, fn func(b *bbolt.Bucket) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	var mine error
	err := s.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketSessions)
		if b == nil {
			mine = fn(nil)
		} else {
			mine = fn(b)
		}
		return mine
	})
	return sessionWrap(op, err, mine)
}

func sessionWrap(op string, err, mine error) error {
	if err == nil {
		return nil
	}
	if mine != nil && errors.Is(err, mine) && (errors.Is(mine, store.ErrDuplicate) || errors.Is(mine, store.ErrUnknownSession)) {
		return fmt.Errorf("bolt: %s: %w", op, mine)
	}
	return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
}

func getSession(b *bbolt.Bucket, id string) (store.Session, error) {
	var v []byte
	if b != nil {
		v = b.Get([]byte(id))
	}
	if v == nil {
		return store.Session{}, fmt.Errorf("session: %w", store.ErrUnknownSession)
	}
	var sess store.Session
	if err := json.Unmarshal(v, &sess); err != nil {
		return store.Session{}, fmt.Errorf("session %q: decode: %w", id, err)
	}
	return sess, nil
}

func putSession(b *bbolt.Bucket, sess store.Session) error {
	v, err := json.Marshal(sess)
	if err != nil {
		return err
	}
	return b.Put([]byte(sess.ID), v)
}

// CreateSession implements store.Sessions. It also purges tombstones older
// than store.SessionRetention.
func (s *Store) CreateSession(ctx context.Context, sess store.Session) error {
	sess, err := store.ValidateSession(sess)
	if err != nil {
		return fmt.Errorf("bolt: create session: %w", err)
	}
	return s.sessionUpdate(ctx, "create session", func(b *bbolt.Bucket) error {
		if b.Get([]byte(sess.ID)) != nil {
			return fmt.Errorf("%w: session %q", store.ErrDuplicate, sess.ID)
		}
		stale := func(old store.Session) bool {
			return !old.Deleted.IsZero() && sess.Created.Sub(old.Deleted) > store.SessionRetention
		}
		if err := purge(b, "session", stale); err != nil {
			return err
		}
		return putSession(b, sess)
	})
}

// GetSession implements store.Sessions.
func (s *Store) GetSession(ctx context.Context, id string) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("bolt: get session: %w", err)
	}
	var sess store.Session
	err := s.sessionView(ctx, "get session", func(b *bbolt.Bucket) error {
		var err error
		sess, err = getSession(b, id)
		return err
	})
	return sess, err
}

// ListSessions implements store.Sessions.
func (s *Store) ListSessions(ctx context.Context, grant, vm string) ([]store.Session, error) {
	out := []store.Session{}
	err := s.sessionView(ctx, "list sessions", func(b *bbolt.Bucket) error {
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			var sess store.Session
			if err := json.Unmarshal(v, &sess); err != nil {
				return fmt.Errorf("session %q: decode: %w", k, err)
			}
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
	return s.sessionUpdate(ctx, "touch session", func(b *bbolt.Bucket) error {
		sess, err := getSession(b, id)
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
		return putSession(b, sess)
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
	err := s.sessionUpdate(ctx, "delete session", func(b *bbolt.Bucket) error {
		sess, err := getSession(b, id)
		if err != nil {
			return err
		}
		before = sess
		if !sess.Deleted.IsZero() {
			return nil
		}
		sess.Deleted = now
		return putSession(b, sess)
	})
	return before, err
}
