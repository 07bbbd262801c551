package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Sessions = (*Store)(nil)

// Sessions: a JSON string per session (Prefix + "s:" + id) and a set of
// all ids (Prefix + "si"). A deleted session's key expires
// store.SessionRetention after the deletion (wall clock); ids whose key
// expired leave the set the next time ListSessions sees them. Touch and
// Delete are optimistic WATCH/MULTI transactions like DecideApproval.

func (s *Store) sessionKey(id string) string { return s.prefix + "s:" + id }
func (s *Store) sessionIDsKey() string       { return s.prefix + "si" }

// createSessionScript: KEYS session, ids set; ARGV json, id.
var createSessionScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
`)

// CreateSession implements store.Sessions.
func (s *Store) CreateSession(ctx context.Context, sess store.Session) error {
	sess, err := store.ValidateSession(sess)
	if err != nil {
		return fmt.Errorf("redis: create session: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return unavailable("create session", err)
	}
	v, err := json.Marshal(sess)
	if err != nil {
		return fmt.Errorf("redis: create session: %w", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	created, err := createSessionScript.Run(ctx, s.client, []string{s.sessionKey(sess.ID), s.sessionIDsKey()}, v, sess.ID).Int64()
	if err != nil {
		return unavailable("create session", err)
	}
	if created == 0 {
		return fmt.Errorf("redis: create session: %w: session %q", store.ErrDuplicate, sess.ID)
	}
	return nil
}

func decodeSession(id, v string) (store.Session, error) {
	var sess store.Session
	if err := json.Unmarshal([]byte(v), &sess); err != nil {
		return sess, fmt.Errorf("%w: session %q: decode: %w", store.ErrUnavailable, id, err)
	}
	return sess, nil
}

// getSession reads session id with c (a client or a transaction).
func (s *Store) getSession(ctx context.Context, c goredis.Cmdable, id string) (store.Session, error) {
	v, err := c.Get(ctx, s.sessionKey(id)).Result()
	if errors.Is(err, goredis.Nil) {
		return store.Session{}, fmt.Errorf("session: %w", store.ErrUnknownSession)
	}
	if err != nil {
		return store.Session{}, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return decodeSession(id, v)
}

// GetSession implements store.Sessions.
func (s *Store) GetSession(ctx context.Context, id string) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("redis: get session: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Session{}, unavailable("get session", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	sess, err := s.getSession(ctx, s.client, id)
	if err != nil {
		return store.Session{}, fmt.Errorf("redis: get session: %w", err)
	}
	return sess, nil
}

// ListSessions implements store.Sessions.
func (s *Store) ListSessions(ctx context.Context, grant, vm string) ([]store.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, unavailable("list sessions", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	ids, err := s.client.SMembers(ctx, s.sessionIDsKey()).Result()
	if err != nil {
		return nil, unavailable("list sessions", err)
	}
	out := []store.Session{}
	if len(ids) == 0 {
		return out, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.sessionKey(id)
	}
	vals, err := s.client.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, unavailable("list sessions", err)
	}
	var gone []any
	for i, v := range vals {
		str, ok := v.(string)
		if !ok {
			gone = append(gone, ids[i])
			continue
		}
		sess, err := decodeSession(ids[i], str)
		if err != nil {
			return nil, fmt.Errorf("redis: list sessions: %w", err)
		}
		if sess.Deleted.IsZero() && (grant == "" || sess.Grant == grant) && (vm == "" || sess.VM == vm) {
			out = append(out, sess)
		}
	}
	if len(gone) > 0 {
		if err := s.client.SRem(ctx, s.sessionIDsKey(), gone...).Err(); err != nil {
			return nil, unavailable("list sessions", err)
		}
	}
	store.SortSessions(out)
	return out, nil
}

// updateSession applies fn to session id under WATCH. fn returns the new
// value and whether to write it (with keep as the key's expiry, 0: none).
func (s *Store) updateSession(ctx context.Context, op, id string, fn func(store.Session) (store.Session, bool, time.Duration, error)) (store.Session, error) {
	if err := ctx.Err(); err != nil {
		return store.Session{}, unavailable(op, err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	key := s.sessionKey(id)
	for range maxTxAttempts {
		var before store.Session
		err := s.client.Watch(ctx, func(tx *goredis.Tx) error {
			sess, err := s.getSession(ctx, tx, id)
			if err != nil {
				return err
			}
			before = sess
			next, write, keep, err := fn(sess)
			if err != nil || !write {
				return err
			}
			v, err := json.Marshal(next)
			if err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
				if keep > 0 {
					p.Set(ctx, key, v, keep)
				} else {
					p.Set(ctx, key, v, goredis.KeepTTL)
				}
				return nil
			})
			return err
		}, key)
		switch {
		case errors.Is(err, goredis.TxFailedErr):
			continue
		case errors.Is(err, store.ErrUnknownSession), errors.Is(err, store.ErrUnavailable):
			return store.Session{}, fmt.Errorf("redis: %s: %w", op, err)
		case err != nil:
			return store.Session{}, unavailable(op, err)
		}
		return before, nil
	}
	return store.Session{}, unavailable(op, fmt.Errorf("%d conflicting transactions on session %q", maxTxAttempts, id))
}

// TouchSession implements store.Sessions.
func (s *Store) TouchSession(ctx context.Context, id string, now time.Time) error {
	if err := store.ValidateSessionID(id); err != nil {
		return fmt.Errorf("redis: touch session: %w", err)
	}
	_, err := s.updateSession(ctx, "touch session", id, func(sess store.Session) (store.Session, bool, time.Duration, error) {
		if !sess.Deleted.IsZero() {
			return sess, false, 0, fmt.Errorf("session: %w", store.ErrUnknownSession)
		}
		if !now.After(sess.LastUsed) {
			return sess, false, 0, nil
		}
		sess.LastUsed = now
		return sess, true, 0, nil
	})
	return err
}

// DeleteSession implements store.Sessions.
func (s *Store) DeleteSession(ctx context.Context, id string, now time.Time) (store.Session, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Session{}, fmt.Errorf("redis: delete session: %w", err)
	}
	if now.IsZero() {
		return store.Session{}, fmt.Errorf("redis: delete session: %w: no deletion time", store.ErrInvalid)
	}
	return s.updateSession(ctx, "delete session", id, func(sess store.Session) (store.Session, bool, time.Duration, error) {
		if !sess.Deleted.IsZero() {
			return sess, false, 0, nil
		}
		sess.Deleted = now
		return sess, true, store.SessionRetention, nil
	})
}
