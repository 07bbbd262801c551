package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/vmgate/vmgate/policy/store"
)

// Approvals and sessions are both JSON strings keyed by id with a set of
// all ids; these helpers are the one copy of creating, reading, listing and
// updating them.

// recordKind is one kind of record.
type recordKind struct {
	what    string // "approval", "session": for messages
	infix   string // the record key is Prefix + infix + id
	ids     string // the set of all ids is Prefix + ids
	unknown error  // the error of an id Redis does not hold
}

var (
	approvalRecords = recordKind{what: "approval", infix: "a:", ids: "ai", unknown: store.ErrUnknownApproval}
	sessionRecords  = recordKind{what: "session", infix: "s:", ids: "si", unknown: store.ErrUnknownSession}
)

func (s *Store) recordKey(k recordKind, id string) string { return s.prefix + k.infix + id }
func (s *Store) idsKey(k recordKind) string               { return s.prefix + k.ids }

// createScript: KEYS the record, then the sets its id joins; ARGV json,
// id, expiry in ms ("" for none). Returns 0 when the record exists.
var createScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
for i = 2, #KEYS do
  redis.call('SADD', KEYS[i], ARGV[2])
end
return 1
`)

// createRecord stores v as the new record id of kind k, in k's ids set and
// the extra sets, expiring after keep (0: never); an id Redis holds
// already is store.ErrDuplicate. prepare, when set, runs first under the
// same timeout (approvals scrub the ones that ended).
func (s *Store) createRecord(ctx context.Context, op string, k recordKind, id string, v any, keep time.Duration, prepare func(context.Context) error, sets ...string) error {
	if err := ctx.Err(); err != nil {
		return unavailable(op, err)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("redis: %s: %w", op, err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if prepare != nil {
		if err := prepare(ctx); err != nil {
			return unavailable(op, err)
		}
	}
	px := ""
	if keep > 0 {
		px = strconv.FormatInt(keep.Milliseconds(), 10)
	}
	keys := append([]string{s.recordKey(k, id), s.idsKey(k)}, sets...)
	cmd, ack := s.script(ctx, createScript, keys, raw, id, px)
	created, err := cmd.Int64()
	if err != nil {
		return unavailable(op, err)
	}
	if created == 0 {
		return fmt.Errorf("redis: %s: %w: %s %q", op, store.ErrDuplicate, k.what, id)
	}
	if ack != nil {
		return unavailable(op, ack)
	}
	return nil
}

func decodeRecord[T any](k recordKind, id, raw string) (T, error) {
	var v T
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return v, fmt.Errorf("%s %q: decode: %w", k.what, id, err)
	}
	return v, nil
}

// getRecord reads record id of kind k with c (a client or a transaction).
func getRecord[T any](ctx context.Context, s *Store, c goredis.Cmdable, k recordKind, id string) (T, error) {
	raw, err := c.Get(ctx, s.recordKey(k, id)).Result()
	if errors.Is(err, goredis.Nil) {
		var zero T
		return zero, fmt.Errorf("%s %q: %w", k.what, id, k.unknown)
	}
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	v, err := decodeRecord[T](k, id, raw)
	if err != nil {
		return v, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return v, nil
}

// readRecord is operation op reading record id of kind k, under the
// store's timeout.
func readRecord[T any](ctx context.Context, s *Store, op string, k recordKind, id string) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, unavailable(op, err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	v, err := getRecord[T](ctx, s, s.client, k, id)
	if err != nil {
		return zero, fmt.Errorf("redis: %s: %w", op, err)
	}
	return v, nil
}

// members reads the records of kind k whose ids set holds, each with its
// stored JSON, dropping from the set the ids whose record has expired out
// of Redis.
func members[T any](ctx context.Context, s *Store, k recordKind, set string) ([]T, []string, error) {
	ids, err := s.client.SMembers(ctx, set).Result()
	if err != nil || len(ids) == 0 {
		return nil, nil, err
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.recordKey(k, id)
	}
	vals, err := s.client.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, nil, err
	}
	out := make([]T, 0, len(ids))
	raws := make([]string, 0, len(ids))
	var gone []any
	for i, v := range vals {
		raw, ok := v.(string)
		if !ok {
			gone = append(gone, ids[i])
			continue
		}
		rec, err := decodeRecord[T](k, ids[i], raw)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, rec)
		raws = append(raws, raw)
	}
	if len(gone) > 0 {
		if err := s.client.SRem(ctx, set, gone...).Err(); err != nil {
			return nil, nil, err
		}
	}
	return out, raws, nil
}

// maxTxAttempts bounds optimistic transaction retries under contention.
const maxTxAttempts = 50

// errConflicts: every attempt of an optimistic transaction met another writer.
var errConflicts = errors.New("conflicting transactions")

// watch runs attempt under WATCH key, again while another writer
// changes key before attempt's EXEC.
func (s *Store) watch(ctx context.Context, key string, attempt func(tx *goredis.Tx) error) error {
	for range maxTxAttempts {
		err := s.client.Watch(ctx, attempt, key)
		if !errors.Is(err, goredis.TxFailedErr) {
			return err
		}
	}
	return fmt.Errorf("%w: %d on %q", errConflicts, maxTxAttempts, key)
}

// updateRecord applies fn to record id of kind k under WATCH: fn gets the
// record and returns the value to write (write false: nothing) and its
// expiry (0: the key keeps its own). An error of fn aborts; k.unknown and
// fn's store sentinels in pass keep their meaning.
func updateRecord[T any](ctx context.Context, s *Store, op string, k recordKind, id string, fn func(T) (next T, write bool, keep time.Duration, err error), pass ...error) error {
	if err := ctx.Err(); err != nil {
		return unavailable(op, err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	key := s.recordKey(k, id)
	err := s.watch(ctx, key, func(tx *goredis.Tx) error {
		v, err := getRecord[T](ctx, s, tx, k, id)
		if err != nil {
			return err
		}
		next, write, keep, err := fn(v)
		if err != nil || !write {
			return err
		}
		return s.setRecord(ctx, tx, key, next, keep)
	})
	if err != nil {
		return txError(op, err, append(pass, k.unknown)...)
	}
	return nil
}

// setRecord writes v as record key in tx, expiring after keep (0: the
// key's expiry stays as it was), and waits for a replica to acknowledge it
// when the store does.
func (s *Store) setRecord(ctx context.Context, tx *goredis.Tx, key string, v any, keep time.Duration) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = tx.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		if keep > 0 {
			p.Set(ctx, key, raw, keep)
		} else {
			p.Set(ctx, key, raw, goredis.KeepTTL)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.ackOn(ctx, tx)
}

// txError is the error of operation op from err, the outcome of watch:
// the sentinels in pass (and store.ErrUnavailable) keep their meaning,
// anything else is Redis failing.
func txError(op string, err error, pass ...error) error {
	if errors.Is(err, store.ErrUnavailable) {
		return fmt.Errorf("redis: %s: %w", op, err)
	}
	for _, p := range pass {
		if errors.Is(err, p) {
			return fmt.Errorf("redis: %s: %w", op, err)
		}
	}
	return unavailable(op, err)
}
