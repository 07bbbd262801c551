// Package redis is the store.Store for several vmgate replicas: counters and
// approvals in one Redis server, exact across processes.
//
// Counters: a sorted set per counter key (Options.Prefix + "c:" + key),
// member = reservation id, score = reservation time in microseconds since
// the Unix epoch (Redis scores are doubles: microseconds stay exact until the
// year 2255, nanoseconds would not). One Lua script per ReserveAll prunes
// every key (ZREMRANGEBYSCORE), checks every key (ZCARD), and only then adds
// to all (ZADD) and sets each key to expire when its newest entry leaves the
// window: Redis runs a script atomically, so a reservation is all or none and
// concurrent reservations from any number of processes are exact. The caller
// passes now (virtual clocks in tests; replicas should run NTP); entries
// later than now count too, so a lagging clock never exceeds Max.
//
// Approvals: JSON strings (Prefix + "a:" + id) that expire Retention after
// they end, a set of all ids and a set per binding (grant, tool, digest).
// An approval that ended is rewritten without its full arguments (a
// compare-and-set script) when approvals are next listed or created.
// Decide and Consume are optimistic WATCH/MULTI transactions: of two
// concurrent consumers, the second one's EXEC fails and it re-reads the
// approval, now consumed.
//
// Every call runs under Options.Timeout, is never retried by the client (a
// retried script could reserve twice), and any Redis error or timeout
// returns an error wrapping store.ErrUnavailable: the caller denies. Redis
// Cluster is not supported (the keys of one reservation would live in
// different slots).
package redis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/internal/rules"
)

var _ store.Store = (*Store)(nil)

// DefaultTimeout bounds each call when Options.Timeout is zero.
const DefaultTimeout = 500 * time.Millisecond

// DefaultPrefix is the key prefix when Options.Prefix is empty.
const DefaultPrefix = "vmgate:"

// Options configure Open.
type Options struct {
	// Prefix is prepended to every key; DefaultPrefix when empty. Replicas
	// sharing budgets use the same prefix; separate deployments on one
	// server use different ones.
	Prefix string
	// Timeout bounds every call (including waiting for a connection);
	// DefaultTimeout when zero.
	Timeout time.Duration
}

// Store is a Redis-backed store.Store, safe for concurrent use.
type Store struct {
	client  *goredis.Client
	prefix  string
	timeout time.Duration
}

// Open connects to the server at url ("redis://[user:pass@]host:port/db",
// "rediss://" for TLS, "unix://path"). It does not wait for the server:
// a server that is down makes calls fail with store.ErrUnavailable until it
// is back.
func Open(url string, opts Options) (*Store, error) {
	o, err := goredis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis: open: %w: %w", store.ErrInvalid, err)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("redis: open: %w: negative timeout %v", store.ErrInvalid, opts.Timeout)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	o.MaxRetries = -1 // a retried script could reserve twice
	o.DialTimeout = opts.Timeout
	o.ReadTimeout = opts.Timeout
	o.WriteTimeout = opts.Timeout
	o.PoolTimeout = opts.Timeout
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.DialerRetries = 1 // a dial that fails reports at once; the caller denies
	return &Store{client: goredis.NewClient(o), prefix: opts.Prefix, timeout: opts.Timeout}, nil
}

// Close closes the connections.
func (s *Store) Close() error {
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("redis: close: %w", err)
	}
	return nil
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// unavailable wraps a Redis failure.
func unavailable(op string, err error) error {
	return fmt.Errorf("redis: %s: %w: %w", op, store.ErrUnavailable, err)
}

func micros(t time.Time) int64 { return t.UnixMicro() }

// reserveScript: KEYS are the counter keys; ARGV[1] now (µs), ARGV[2] the
// id, then window (µs) and max per key. Returns {0} when reserved, {1, i,
// retry µs} when key i is full, {2, i} when key i already holds id.
var reserveScript = goredis.NewScript(`
local now = tonumber(ARGV[1])
local id = ARGV[2]
for i = 1, #KEYS do
  local w = tonumber(ARGV[1 + 2*i])
  local max = tonumber(ARGV[2 + 2*i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - w)
  if redis.call('ZSCORE', KEYS[i], id) then
    return {2, i}
  end
  local n = redis.call('ZCARD', KEYS[i])
  if n >= max then
    local retry = w
    if max > 0 then
      local e = redis.call('ZRANGE', KEYS[i], n - max, n - max, 'WITHSCORES')
      retry = tonumber(e[2]) + w - now
      if retry < 1 then retry = 1 end
    end
    return {1, i, retry}
  end
end
for i = 1, #KEYS do
  local w = tonumber(ARGV[1 + 2*i])
  redis.call('ZADD', KEYS[i], now, id)
  local newest = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
  local ttl = math.ceil((tonumber(newest[2]) + w - now) / 1000) + 1
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return {0}
`)

func (s *Store) counterKey(k string) string { return s.prefix + "c:" + k }

// ReserveAll implements store.Counters with one Lua script.
func (s *Store) ReserveAll(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	if err := rules.Counters(id, counters); err != nil {
		return fmt.Errorf("redis: reserve: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return unavailable("reserve", err)
	}
	if len(counters) == 0 {
		return nil
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	keys := make([]string, len(counters))
	args := make([]any, 2, 2+2*len(counters))
	args[0], args[1] = micros(now), id
	for i, c := range counters {
		keys[i] = s.counterKey(c.Key)
		w := c.Window.Microseconds()
		if w < 1 {
			w = 1
		}
		args = append(args, w, c.Max)
	}
	res, err := reserveScript.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		return unavailable("reserve", err)
	}
	switch {
	case len(res) == 1 && res[0] == 0:
		return nil
	case len(res) == 3 && res[0] == 1 && res[1] >= 1 && int(res[1]) <= len(counters):
		return &store.LimitedError{Counter: counters[res[1]-1], RetryAfter: time.Duration(res[2]) * time.Microsecond}
	case len(res) == 2 && res[0] == 2 && res[1] >= 1 && int(res[1]) <= len(counters):
		return fmt.Errorf("redis: reserve: %w: %q in counter %q", store.ErrDuplicate, id, counters[res[1]-1].Key)
	}
	return unavailable("reserve", fmt.Errorf("unexpected script reply %v", res))
}

// Refund implements store.Counters.
func (s *Store) Refund(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	if err := rules.Counters(id, counters); err != nil {
		return fmt.Errorf("redis: refund: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return unavailable("refund", err)
	}
	if len(counters) == 0 {
		return nil
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		for _, c := range counters {
			p.ZRem(ctx, s.counterKey(c.Key), id)
		}
		return nil
	})
	if err != nil {
		return unavailable("refund", err)
	}
	return nil
}

// bindingKey names the set of approval ids bound to grant, tool, digest.
func (s *Store) bindingKey(grant, tool, digest string) string {
	h := sha256.New()
	for _, p := range []string{grant, tool, digest} {
		h.Write([]byte(strconv.Itoa(len(p)) + ":" + p))
	}
	return s.prefix + "ab:" + hex.EncodeToString(h.Sum(nil))
}

// keep is how long Redis keeps a (it expires Retention after it ends).
func keep(a store.Approval, now time.Time) time.Duration {
	d := a.Expires.Sub(now) + rules.Retention
	if d < time.Second {
		d = time.Second
	}
	return d
}

// CreateApproval implements store.Approvals. Approvals that ended lose
// their full arguments first, as the other stores do on create.
func (s *Store) CreateApproval(ctx context.Context, a store.Approval) error {
	a, err := rules.NewApproval(a)
	if err != nil {
		return fmt.Errorf("redis: create approval: %w", err)
	}
	scrubEnded := func(ctx context.Context) error {
		as, raw, err := members[store.Approval](ctx, s, approvalRecords, s.idsKey(approvalRecords))
		if err != nil {
			return err
		}
		return s.scrub(ctx, as, raw, a.Created)
	}
	return s.createRecord(ctx, "create approval", approvalRecords, a.ID, a, keep(a, a.Created), scrubEnded, s.bindingKey(a.Grant, a.Tool, a.Digest))
}

// GetApproval implements store.Approvals: the approval as stored.
func (s *Store) GetApproval(ctx context.Context, id string) (store.Approval, error) {
	if err := rules.ID(id); err != nil {
		return store.Approval{}, fmt.Errorf("redis: get approval: %w", err)
	}
	return readRecord[store.Approval](ctx, s, "get approval", approvalRecords, id)
}

// scrubScript: KEYS approval; ARGV the JSON read, the JSON to write. It
// rewrites the approval (keeping its expiry) only if nobody changed it
// since it was read.
var scrubScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1
`)

// scrub rewrites the approvals (read as raw) that ended by now without
// their full arguments.
func (s *Store) scrub(ctx context.Context, as []store.Approval, raw []string, now time.Time) error {
	for i, a := range as {
		kept, changed := rules.Scrubbed(a, now)
		if !changed {
			continue
		}
		v, err := json.Marshal(kept)
		if err != nil {
			return err
		}
		if err := scrubScript.Run(ctx, s.client, []string{s.recordKey(approvalRecords, a.ID)}, raw[i], v).Err(); err != nil {
			return err
		}
	}
	return nil
}

// ListApprovals implements store.Approvals: every approval as it stands at
// now, oldest first.
func (s *Store) ListApprovals(ctx context.Context, now time.Time) ([]store.Approval, error) {
	if err := ctx.Err(); err != nil {
		return nil, unavailable("list approvals", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	as, raw, err := members[store.Approval](ctx, s, approvalRecords, s.idsKey(approvalRecords))
	if err != nil {
		return nil, unavailable("list approvals", err)
	}
	if err := s.scrub(ctx, as, raw, now); err != nil {
		return nil, unavailable("list approvals", err)
	}
	for i := range as {
		as[i] = rules.AsOf(as[i], now)
	}
	rules.Sort(as)
	if as == nil {
		as = []store.Approval{}
	}
	return as, nil
}

// DecideApproval implements store.Approvals with WATCH/MULTI.
func (s *Store) DecideApproval(ctx context.Context, id string, grant bool, by, reason string, now time.Time) (store.Approval, error) {
	if err := rules.ID(id); err != nil {
		return store.Approval{}, fmt.Errorf("redis: decide approval: %w", err)
	}
	if by == "" {
		_, _, err := rules.Decide(store.Approval{ID: id}, grant, by, reason, now)
		return store.Approval{}, fmt.Errorf("redis: decide approval: %w", err)
	}
	var (
		out  store.Approval
		derr error
	)
	err := updateRecord(ctx, s, "decide approval", approvalRecords, id, func(a store.Approval) (store.Approval, bool, time.Duration, error) {
		var changed bool
		out, changed, derr = rules.Decide(a, grant, by, reason, now)
		return out, changed, keep(out, now), nil
	})
	if err != nil {
		return store.Approval{}, err
	}
	if derr != nil {
		return out, fmt.Errorf("redis: decide approval: %w", derr)
	}
	return out, nil
}

// ConsumeApproval implements store.Approvals: the oldest matching approval
// is consumed under WATCH, so of concurrent consumers exactly one gets it.
func (s *Store) ConsumeApproval(ctx context.Context, grant, tool, digest string, now time.Time) (store.Approval, bool, error) {
	if err := rules.Binding(grant, tool, digest); err != nil {
		return store.Approval{}, false, fmt.Errorf("redis: consume approval: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Approval{}, false, unavailable("consume approval", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	for range maxTxAttempts {
		as, _, err := members[store.Approval](ctx, s, approvalRecords, s.bindingKey(grant, tool, digest))
		if err != nil {
			return store.Approval{}, false, unavailable("consume approval", err)
		}
		rules.Sort(as)
		var pick *store.Approval
		for i := range as {
			if rules.Consumable(as[i], grant, tool, digest, now) {
				pick = &as[i]
				break
			}
		}
		if pick == nil {
			return store.Approval{}, false, nil
		}
		key := s.recordKey(approvalRecords, pick.ID)
		var (
			out store.Approval
			won bool
		)
		err = s.watch(ctx, key, func(tx *goredis.Tx) error {
			won = false
			a, err := getRecord[store.Approval](ctx, s, tx, approvalRecords, pick.ID)
			if errors.Is(err, store.ErrUnknownApproval) {
				return nil // expired out of Redis meanwhile: look again
			}
			if err != nil {
				return err
			}
			if !rules.Consumable(a, grant, tool, digest, now) {
				return nil // taken meanwhile: look again
			}
			out = rules.Consume(a)
			if err := setRecord(ctx, tx, key, out, 0); err != nil {
				return err
			}
			won = true
			return nil
		})
		switch {
		case err != nil:
			return store.Approval{}, false, txError("consume approval", err)
		case won:
			return out, true, nil
		}
	}
	return store.Approval{}, false, unavailable("consume approval", fmt.Errorf("%w: %d", errConflicts, maxTxAttempts))
}
