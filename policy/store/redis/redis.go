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
//
// # Sentinel and what a failover costs
//
// OpenSentinel finds the primary through Redis Sentinel (go-redis's
// failover client): every new connection asks a Sentinel for the primary,
// and a switch Sentinel announces closes the connections to the old one, so
// a store follows a failover without a restart. While the primary is down
// and no replica is promoted yet, calls fail at once (the dial is refused,
// or the Sentinels still name the dead primary) and the caller denies.
//
// Redis replicates asynchronously: a write the primary acknowledged can be
// missing from the replica Sentinel promotes. A lost reservation would let
// the limit be exceeded by one call, a lost consumption would let an
// approval run twice. So through Sentinel every write that lets a call run
// or that an operator relies on waits for a replica: the write and WAIT 1
// go in one pipeline on one connection (WAIT covers that connection's
// writes), or WAIT follows EXEC on a transaction's connection. That is
// ReserveAll, CreateApproval, DecideApproval, ConsumeApproval, the session
// writes (TouchSession too: it shares their transaction) and the lease
// writes. When no replica acknowledges within Options.AckTimeout
// (DefaultAckTimeout) the call fails with store.ErrUnavailable wrapping
// errNotReplicated, and the caller denies: fail closed. A refused
// reservation is taken back at once (best effort); other writes stay on
// the primary (an approval stays consumed unused, a lease is left to the
// reaper, a grant the operator was told failed can still be used once
// after a later write there is acknowledged): a failover can only cost
// calls that were refused, never allow one that was not counted. Sentinel promotes the replica with the largest
// replication offset, so with one replica or more a write one replica
// acknowledged survives the loss of the primary (unless that replica is
// lost too, or was cut off for longer than Sentinel accepts of a
// candidate): the overshoot a failover may cause is zero, and an approval
// consumed before it stays consumed. A primary cut off by a partition gets
// no acknowledgement either, so what it is still sent is refused.
//
// The price: a write waits for the replica's acknowledgement, one more
// exchange between the primary and its replica in the same round trip (on
// loopback, on a busy 2-core machine, the median reservation took 29-152
// µs more, BenchmarkAck: less than the one shared fsync a counted call
// already waits for), and while no replica is connected (the only one is
// down, or is being resynchronised after a failover) every such call is
// refused. Run two replicas to keep serving through the loss of one
// server.
//
// Refund and the rewriting of ended approvals do not wait: losing one in a
// failover is conservative (a reservation counts again, arguments are
// dropped at the next listing). A primary restarted empty (no
// persistence) before Sentinel failed it over would be taken back with no
// data at all; WAIT cannot help there (README: "Running several
// replicas").
package redis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
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

// DefaultAckTimeout is how long a write through Sentinel waits for a
// replica's acknowledgement when Options.AckTimeout is zero. A replica on
// a LAN acknowledges in well under a millisecond; the timeout bounds how
// long a call waits when none does, and leaves room for a replica starved
// of the CPU for a moment (a busy host, a fork) without refusing calls.
const DefaultAckTimeout = 250 * time.Millisecond

// errNotReplicated: WAIT returned before a replica acknowledged the write.
var errNotReplicated = errors.New("no replica acknowledged the write")

// Options configure Open.
type Options struct {
	// Prefix is prepended to every key; DefaultPrefix when empty. Replicas
	// sharing budgets use the same prefix; separate deployments on one
	// server use different ones.
	Prefix string
	// Timeout bounds every call (including waiting for a connection);
	// DefaultTimeout when zero (plus AckTimeout through Sentinel).
	Timeout time.Duration
	// AckTimeout bounds the wait for a replica's acknowledgement of a
	// write through Sentinel; DefaultAckTimeout when zero.
	AckTimeout time.Duration
}

// Sentinel says where Redis Sentinel watches the primary.
type Sentinel struct {
	// Master is the name the Sentinels monitor the primary under.
	Master string
	// Addrs are Sentinels' host:port addresses (a seed: the others are
	// discovered).
	Addrs []string
	// Password authenticates to the Redis servers (AUTH); "" for none.
	Password string
	// SentinelPassword authenticates to the Sentinels; "" for none.
	SentinelPassword string
}

// Store is a Redis-backed store.Store, safe for concurrent use.
type Store struct {
	client  *goredis.Client
	prefix  string
	timeout time.Duration
	// acks is how many replicas must acknowledge a write (0: none, the
	// single-server store; 1 through Sentinel), within ackTimeout.
	acks       int
	ackTimeout time.Duration
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
	if err := opts.fill(0); err != nil {
		return nil, fmt.Errorf("redis: open: %w", err)
	}
	o.MaxRetries = -1 // a retried script could reserve twice
	o.DialTimeout = opts.Timeout
	o.ReadTimeout = opts.Timeout
	o.WriteTimeout = opts.Timeout
	o.PoolTimeout = opts.Timeout
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.DialerRetries = 1 // a dial that fails reports at once; the caller denies
	routeLogs()
	return &Store{client: goredis.NewClient(o), prefix: opts.Prefix, timeout: opts.Timeout}, nil
}

// OpenSentinel connects to the primary the Sentinels at sn.Addrs monitor
// as sn.Master, and follows it through failovers. Every write that lets a
// call run waits for one replica's acknowledgement (the package doc says
// why). Like Open it does not wait for the servers.
func OpenSentinel(sn Sentinel, opts Options) (*Store, error) {
	if sn.Master == "" || len(sn.Addrs) == 0 {
		return nil, fmt.Errorf("redis: open sentinel: %w: a master name and at least one Sentinel address are required", store.ErrInvalid)
	}
	if err := opts.fill(1); err != nil {
		return nil, fmt.Errorf("redis: open sentinel: %w", err)
	}
	routeLogs()
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:       sn.Master,
		SentinelAddrs:    slices.Clone(sn.Addrs),
		Password:         sn.Password,
		SentinelPassword: sn.SentinelPassword,
		MaxRetries:       -1, // a retried script could reserve twice
		DialTimeout:      opts.Timeout,
		ReadTimeout:      opts.Timeout,
		WriteTimeout:     opts.Timeout,
		PoolTimeout:      opts.Timeout,
		// A dial that fails reports at once; the caller denies.
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
	})
	return &Store{client: c, prefix: opts.Prefix, timeout: opts.Timeout, acks: 1, ackTimeout: opts.AckTimeout}, nil
}

// routeLogs sends go-redis's own messages (the Sentinels it picks, the
// primary it switches to, dials that fail) to slog instead of its default
// logger, once per process.
var routeLogs = sync.OnceFunc(func() { goredis.SetLogger(slogLogger{}) })

// slogLogger is go-redis's logger interface over slog.
type slogLogger struct{}

func (slogLogger) Printf(ctx context.Context, format string, v ...any) {
	slog.InfoContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// fill checks o and sets its defaults; acks is how many replicas a write
// waits for (the ack timeout counts into the call's timeout).
func (o *Options) fill(acks int) error {
	if o.Timeout < 0 || o.AckTimeout < 0 {
		return fmt.Errorf("%w: negative timeout %v or ack timeout %v", store.ErrInvalid, o.Timeout, o.AckTimeout)
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = DefaultAckTimeout
	}
	if o.AckTimeout%time.Millisecond != 0 {
		return fmt.Errorf("%w: ack timeout %v is not a whole number of milliseconds (Redis WAIT counts them)", store.ErrInvalid, o.AckTimeout)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
		if acks > 0 {
			o.Timeout += o.AckTimeout
		}
	}
	if acks > 0 && o.AckTimeout >= o.Timeout {
		return fmt.Errorf("%w: ack timeout %v is not below the timeout %v", store.ErrInvalid, o.AckTimeout, o.Timeout)
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	return nil
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
	cmd, ack := s.script(ctx, reserveScript, keys, args...)
	res, err := cmd.Int64Slice()
	if err != nil {
		return unavailable("reserve", err)
	}
	switch {
	case len(res) == 1 && res[0] == 0 && ack != nil:
		// The call is refused: take the reservation back, best effort (if
		// the refund is lost instead, the reservation counts: conservative).
		_ = s.zrem(ctx, id, keys)
		return unavailable("reserve", ack)
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
	keys := make([]string, len(counters))
	for i, c := range counters {
		keys[i] = s.counterKey(c.Key)
	}
	if err := s.zrem(ctx, id, keys); err != nil {
		return unavailable("refund", err)
	}
	return nil
}

// zrem removes reservation id from the counter keys, in one transaction.
// It does not wait for a replica: a refund a failover loses makes the
// counter stricter, never looser.
func (s *Store) zrem(ctx context.Context, id string, keys []string) error {
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		for _, k := range keys {
			p.ZRem(ctx, k, id)
		}
		return nil
	})
	return err
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
			if err := s.setRecord(ctx, tx, key, out, 0); err != nil {
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
