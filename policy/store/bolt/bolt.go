// Package bolt is the embedded store.Store: counters and approvals in one
// bbolt file in the state directory.
//
// # Durability and the fsync budget
//
// The gate may spend at most one synchronous fsync per call, and the audit
// log already spends it on the decision record, which names the counters the
// call reserved. bbolt fsyncs every commit, so a bbolt reservation plus an
// fsync'd audit record would be two fsyncs in series. The server therefore
// opens this store with Options{NoSync: true}: every commit still reaches the
// page cache with write(2), so a crash of the process (SIGKILL, panic) loses
// nothing, while a power loss or kernel crash can lose the last commits.
// Those are rebuilt at start from the audit log: for each decision record
// newer than the window the server calls Restore, which is idempotent by the
// reservation id and inserts a past reservation without checking Max. The
// audit log is the write-ahead log; this file is its fast, mostly-durable
// index. NoSync: false (one fsync per commit) remains available for callers
// without an audit log.
//
// # Layout
//
// Bucket "counters" holds a bucket per counter key. In it:
//
//	"t" ‖ at (8 bytes, big-endian, sign bit flipped) ‖ id → ""   time order
//	"i" ‖ id → at                                               Refund, duplicates
//	"mn" → live entry count (8 bytes)                           no scan to count
//	"mw" → window length in ns (8 bytes)                        sweeping idle keys
//
// Bucket "approvals" maps an approval id to its JSON. Every ReserveAll is
// one bbolt Update transaction: it prunes, checks every counter, then adds to
// all, so it is all or none; bbolt runs one writer at a time, which is what
// makes concurrent reservations exact (and bounds throughput: see the
// benchmarks).
package bolt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/internal/rules"
)

var _ store.Store = (*Store)(nil)

var (
	bucketCounters  = []byte("counters")
	bucketApprovals = []byte("approvals")
	keyCount        = []byte("mn")
	keyWindow       = []byte("mw")
)

// sweepEvery is how many reservations pass between sweeps of idle keys.
const sweepEvery = 4096

// Options configure Open.
type Options struct {
	// NoSync skips bbolt's fsync on commit (see the package doc): the server
	// sets it and rebuilds lost reservations from the audit log.
	NoSync bool
	// LockTimeout bounds the wait for the file lock another process holds;
	// zero means one second.
	LockTimeout time.Duration
}

// Store is a bbolt-backed store.Store, safe for concurrent use.
type Store struct {
	db *bbolt.DB
	// reservations counts ReserveAll commits, to sweep idle keys now and then.
	reservations atomic.Uint64
}

// Open opens (creating it with mode 0600 if needed) the store file at path.
func Open(path string, opts Options) (*Store, error) {
	if path == "" {
		return nil, fmt.Errorf("bolt: open: %w: empty path", store.ErrInvalid)
	}
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: timeout, NoSync: opts.NoSync, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType})
	if err != nil {
		return nil, fmt.Errorf("bolt: open %s: %w: %w", path, store.ErrUnavailable, err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{bucketCounters, bucketApprovals} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("bolt: open %s: %w: %w", path, store.ErrUnavailable, err)
	}
	return &Store{db: db}, nil
}

// Close closes the file. Later calls fail with store.ErrUnavailable.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("bolt: close: %w", err)
	}
	return nil
}

// update runs fn in a write transaction. Errors fn returns on purpose
// (*LimitedError, ErrDuplicate, ErrNotPending, ErrUnknownApproval,
// ErrUnknownSession) pass through; every other failure wraps
// store.ErrUnavailable.
func (s *Store) update(ctx context.Context, op string, fn func(tx *bbolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	var mine error
	err := s.db.Update(func(tx *bbolt.Tx) error {
		// The writer lock may have taken a while: the caller may be gone.
		if err := ctx.Err(); err != nil {
			return err
		}
		mine = fn(tx)
		return mine
	})
	return s.wrap(op, err, mine)
}

func (s *Store) view(ctx context.Context, op string, fn func(tx *bbolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
	}
	var mine error
	err := s.db.View(func(tx *bbolt.Tx) error {
		mine = fn(tx)
		return mine
	})
	return s.wrap(op, err, mine)
}

func (s *Store) wrap(op string, err, mine error) error {
	if err == nil {
		return nil
	}
	var le *store.LimitedError
	if mine != nil && errors.Is(err, mine) && (errors.As(mine, &le) || errors.Is(mine, store.ErrDuplicate) ||
		errors.Is(mine, store.ErrNotPending) || errors.Is(mine, store.ErrUnknownApproval) || errors.Is(mine, store.ErrUnknownSession)) {
		if le != nil {
			return le
		}
		return fmt.Errorf("bolt: %s: %w", op, mine)
	}
	return fmt.Errorf("bolt: %s: %w: %w", op, store.ErrUnavailable, err)
}

// timeKey orders int64 unix nanoseconds as bytes (sign bit flipped).
func timeBytes(at int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(at)^(1<<63))
	return b[:]
}

func bytesTime(b []byte) int64 { return int64(binary.BigEndian.Uint64(b) ^ (1 << 63)) }

func entryKey(at int64, id string) []byte {
	k := make([]byte, 0, 9+len(id))
	k = append(k, 't')
	k = append(k, timeBytes(at)...)
	return append(k, id...)
}

func idKey(id string) []byte { return append([]byte{'i'}, id...) }

func u64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func putU64(b *bbolt.Bucket, k []byte, v uint64) error {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], v)
	return b.Put(k, buf[:])
}

// prune deletes the entries at or before at-window and returns the live count.
func prune(b *bbolt.Bucket, at, window int64) (uint64, error) {
	n := u64(b.Get(keyCount))
	cut := at - window
	var dead [][]byte
	c := b.Cursor()
	for k, _ := c.Seek([]byte{'t'}); k != nil && k[0] == 't' && bytesTime(k[1:9]) <= cut; k, _ = c.Next() {
		dead = append(dead, k)
	}
	if len(dead) == 0 {
		return n, nil
	}
	for _, k := range dead {
		if err := b.Delete(k); err != nil {
			return 0, err
		}
		if err := b.Delete(idKey(string(k[9:]))); err != nil {
			return 0, err
		}
	}
	n -= min(n, uint64(len(dead)))
	return n, putU64(b, keyCount, n)
}

// retryAfter is when the entry that must leave for a unit to free up leaves.
func retryAfter(b *bbolt.Bucket, n uint64, at int64, c policy.Counter) time.Duration {
	if c.Max == 0 || n < uint64(c.Max) {
		return c.Window
	}
	skip := n - uint64(c.Max)
	cur := b.Cursor()
	k, _ := cur.Seek([]byte{'t'})
	for ; skip > 0 && k != nil; skip-- {
		k, _ = cur.Next()
	}
	if k == nil || k[0] != 't' {
		return c.Window
	}
	d := time.Duration(bytesTime(k[1:9]) + int64(c.Window) - at)
	if d <= 0 {
		d = 1
	}
	return d
}

// insert adds the reservation id at at to b.
func insert(b *bbolt.Bucket, at int64, id string, window time.Duration) error {
	if err := b.Put(entryKey(at, id), nil); err != nil {
		return err
	}
	if err := b.Put(idKey(id), timeBytes(at)); err != nil {
		return err
	}
	if err := putU64(b, keyWindow, uint64(window)); err != nil {
		return err
	}
	return putU64(b, keyCount, u64(b.Get(keyCount))+1)
}

// ReserveAll implements store.Counters in one write transaction.
func (s *Store) ReserveAll(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	if err := rules.Counters(id, counters); err != nil {
		return fmt.Errorf("bolt: reserve: %w", err)
	}
	if len(counters) == 0 {
		return nil
	}
	at := now.UnixNano()
	sweep := s.reservations.Add(1)%sweepEvery == 0
	return s.update(ctx, "reserve", func(tx *bbolt.Tx) error {
		root := tx.Bucket(bucketCounters)
		for _, c := range counters {
			b := root.Bucket([]byte(c.Key))
			if b == nil {
				if c.Max == 0 {
					return &store.LimitedError{Counter: c, RetryAfter: c.Window}
				}
				continue
			}
			n, err := prune(b, at, int64(c.Window))
			if err != nil {
				return err
			}
			if b.Get(idKey(id)) != nil {
				return fmt.Errorf("%w: %q in counter %q", store.ErrDuplicate, id, c.Key)
			}
			if n >= uint64(c.Max) {
				return &store.LimitedError{Counter: c, RetryAfter: retryAfter(b, n, at, c)}
			}
		}
		for _, c := range counters {
			b, err := root.CreateBucketIfNotExists([]byte(c.Key))
			if err != nil {
				return err
			}
			if err := insert(b, at, id, c.Window); err != nil {
				return err
			}
		}
		if sweep {
			return sweepIdle(root, at)
		}
		return nil
	})
}

// sweepIdle drops every counter bucket whose newest entry left its window.
func sweepIdle(root *bbolt.Bucket, at int64) error {
	var idle [][]byte
	err := root.ForEachBucket(func(name []byte) error {
		b := root.Bucket(name)
		window := int64(u64(b.Get(keyWindow)))
		c := b.Cursor()
		k, _ := c.Seek([]byte{'u'})
		if k == nil {
			k, _ = c.Last()
		} else {
			k, _ = c.Prev()
		}
		for k != nil && k[0] != 't' {
			k, _ = c.Prev()
		}
		if k == nil || bytesTime(k[1:9]) <= at-window {
			idle = append(idle, name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, name := range idle {
		if err := root.DeleteBucket(name); err != nil {
			return err
		}
	}
	return nil
}

// Refund implements store.Counters.
func (s *Store) Refund(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	if err := rules.Counters(id, counters); err != nil {
		return fmt.Errorf("bolt: refund: %w", err)
	}
	return s.update(ctx, "refund", func(tx *bbolt.Tx) error {
		root := tx.Bucket(bucketCounters)
		for _, c := range counters {
			b := root.Bucket([]byte(c.Key))
			if b == nil {
				continue
			}
			v := b.Get(idKey(id))
			if len(v) != 8 {
				continue
			}
			if err := b.Delete(entryKey(bytesTime(v), id)); err != nil {
				return err
			}
			if err := b.Delete(idKey(id)); err != nil {
				return err
			}
			n := u64(b.Get(keyCount))
			if err := putU64(b, keyCount, n-min(n, 1)); err != nil {
				return err
			}
		}
		return nil
	})
}

// Restore inserts the past reservation id made at at into counters without
// checking Max (the call already happened). It is idempotent by id: a
// counter that already holds id is left alone. The server calls it at start
// for each audit decision record younger than its counters' windows, to
// rebuild what a power loss took from a NoSync file. Refunded reservations
// must not be restored (their outcome record says they were refunded).
func (s *Store) Restore(ctx context.Context, id string, at time.Time, counters []policy.Counter) error {
	if err := rules.Counters(id, counters); err != nil {
		return fmt.Errorf("bolt: restore: %w", err)
	}
	ns := at.UnixNano()
	return s.update(ctx, "restore", func(tx *bbolt.Tx) error {
		root := tx.Bucket(bucketCounters)
		for _, c := range counters {
			b, err := root.CreateBucketIfNotExists([]byte(c.Key))
			if err != nil {
				return err
			}
			if b.Get(idKey(id)) != nil {
				continue
			}
			if err := insert(b, ns, id, c.Window); err != nil {
				return err
			}
		}
		return nil
	})
}

// Reservation is one live reservation of a counter key.
type Reservation struct {
	ID string
	At time.Time
}

// Reservations lists the reservations key holds, oldest first, including
// ones that have left the window but were not pruned yet. For diagnostics
// and tests.
func (s *Store) Reservations(ctx context.Context, key string) ([]Reservation, error) {
	var out []Reservation
	err := s.view(ctx, "reservations", func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketCounters).Bucket([]byte(key))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, _ := c.Seek([]byte{'t'}); k != nil && k[0] == 't'; k, _ = c.Next() {
			out = append(out, Reservation{ID: string(k[9:]), At: time.Unix(0, bytesTime(k[1:9])).UTC()})
		}
		return nil
	})
	return out, err
}

// CreateApproval implements store.Approvals. It also deletes approvals that
// ended more than rules.Retention before a.Created.
func (s *Store) CreateApproval(ctx context.Context, a store.Approval) error {
	a, err := rules.NewApproval(a)
	if err != nil {
		return fmt.Errorf("bolt: create approval: %w", err)
	}
	return s.updateRecords(ctx, "create approval", approvalRecords, func(b *bbolt.Bucket) error {
		// One transaction: a duplicate id undoes the scrub too.
		if err := scrub(b, a.Created, nil); err != nil {
			return err
		}
		return createRecord(approvalRecords, b, a.ID, a, func(old store.Approval) bool { return rules.Stale(old, a.Created) })
	})
}

// scrub rewrites the approvals of b that ended by now without their full
// arguments (only ids, when given). It runs inside the caller's update
// transaction.
func scrub(b *bbolt.Bucket, now time.Time, ids []string) error {
	var todo []store.Approval
	check := func(_ []byte, a store.Approval) error {
		if kept, changed := rules.Scrubbed(a, now); changed {
			todo = append(todo, kept)
		}
		return nil
	}
	if ids == nil {
		if err := eachRecord(approvalRecords, b, check); err != nil {
			return err
		}
	}
	for _, id := range ids {
		a, err := getRecord[store.Approval](approvalRecords, b, id)
		if errors.Is(err, store.ErrUnknownApproval) {
			continue
		}
		if err != nil {
			return err
		}
		_ = check(nil, a)
	}
	for _, a := range todo {
		if err := putRecord(b, a.ID, a); err != nil {
			return err
		}
	}
	return nil
}

// GetApproval implements store.Approvals: the approval as stored.
func (s *Store) GetApproval(ctx context.Context, id string) (store.Approval, error) {
	if err := rules.ID(id); err != nil {
		return store.Approval{}, fmt.Errorf("bolt: get approval: %w", err)
	}
	return readRecord[store.Approval](ctx, s, "get approval", approvalRecords, id)
}

// ListApprovals implements store.Approvals: every approval as it stands at
// now, oldest first. Approvals that ended with their full arguments still
// stored are rewritten without them (a write transaction, only then).
func (s *Store) ListApprovals(ctx context.Context, now time.Time) ([]store.Approval, error) {
	var (
		out   []store.Approval
		ended []string
	)
	err := s.viewRecords(ctx, "list approvals", approvalRecords, func(b *bbolt.Bucket) error {
		return eachRecord(approvalRecords, b, func(_ []byte, a store.Approval) error {
			if _, changed := rules.Scrubbed(a, now); changed {
				ended = append(ended, a.ID)
			}
			out = append(out, rules.AsOf(a, now))
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	if len(ended) > 0 {
		if err := s.updateRecords(ctx, "scrub approvals", approvalRecords, func(b *bbolt.Bucket) error {
			return scrub(b, now, ended)
		}); err != nil {
			return nil, err
		}
	}
	rules.Sort(out)
	return out, nil
}

// DecideApproval implements store.Approvals.
func (s *Store) DecideApproval(ctx context.Context, id string, grant bool, by, reason string, now time.Time) (store.Approval, error) {
	if err := rules.ID(id); err != nil {
		return store.Approval{}, fmt.Errorf("bolt: decide approval: %w", err)
	}
	if by == "" {
		_, _, err := rules.Decide(store.Approval{ID: id}, grant, by, reason, now)
		return store.Approval{}, fmt.Errorf("bolt: decide approval: %w", err)
	}
	var out store.Approval
	var notPending error
	err := s.updateRecords(ctx, "decide approval", approvalRecords, func(b *bbolt.Bucket) error {
		a, err := getRecord[store.Approval](approvalRecords, b, id)
		if err != nil {
			return err
		}
		a, changed, derr := rules.Decide(a, grant, by, reason, now)
		out = a
		if changed {
			if err := putRecord(b, a.ID, a); err != nil {
				return err
			}
		}
		// Keep the expired state: report ErrNotPending after the commit.
		notPending = derr
		return nil
	})
	if err != nil {
		return out, err
	}
	if notPending != nil {
		return out, fmt.Errorf("bolt: decide approval: %w", notPending)
	}
	return out, nil
}

// ConsumeApproval implements store.Approvals in one write transaction, so
// of concurrent consumers exactly one gets a given approval. Of several
// matching approvals, the oldest is consumed.
func (s *Store) ConsumeApproval(ctx context.Context, grant, tool, digest string, now time.Time) (store.Approval, bool, error) {
	if err := rules.Binding(grant, tool, digest); err != nil {
		return store.Approval{}, false, fmt.Errorf("bolt: consume approval: %w", err)
	}
	var (
		best  store.Approval
		found bool
	)
	err := s.updateRecords(ctx, "consume approval", approvalRecords, func(b *bbolt.Bucket) error {
		found = false
		err := eachRecord(approvalRecords, b, func(_ []byte, a store.Approval) error {
			if rules.Consumable(a, grant, tool, digest, now) && (!found || rules.Less(a, best)) {
				best, found = a, true
			}
			return nil
		})
		if err != nil || !found {
			return err
		}
		best = rules.Consume(best)
		return putRecord(b, best.ID, best)
	})
	if err != nil || !found {
		return store.Approval{}, false, err
	}
	return best, true, nil
}
