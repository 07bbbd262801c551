// Package memory is an in-process store.Store: exact sliding windows kept as
// the timestamps of their live reservations, and approvals in a map. It
// backs tests and `vmgate policy test`; nothing survives the process.
//
// Windows are exact: a counter's key holds the time and id of every
// reservation made in the last Window, a reservation at now counts every
// entry later than now-Window (including entries later than now, which a
// caller with a clock slightly ahead may have made), so there are never more
// than Max reservations in any Window-long interval. Entries at or before
// now-Window are pruned on every use of the key, and keys nobody used for a
// whole window are swept every sweepEvery reservations.
//
// # The server's counters live here, not in bbolt
//
// The budget of docs/design.md allows one synchronous fsync per call, and the audit
// log spends it on the decision record, which names every counter the call
// reserved. A bbolt commit per call is over that budget even with NoSync:
// on the 2-core build machine (ext4 on a virtual disk shared with other
// VMs, load average 4–7) it costs 7 pwrite(2) per call, and its dirty pages
// ride in the journal commit of the audit log's fsync. Measured with
// server/bench_test.go (bare mcp-go server vs the gate, same no-op call):
//
//	                        no fsync, in process   stdio, fsync always   HTTP 8 clients, fsync always
//	                        (BenchmarkGateGated)   p50 (BenchmarkE2E)    calls/s of bare (BenchmarkE2E)
//	bbolt NoSync counters   143–173 µs, 261 allocs 340–354 µs            0.17–0.25×
//	memory counters (Split)  38–42 µs, 140 allocs  249–336 µs            0.35–0.52×
//	bare mcp-go, no gate     15–33 µs,  80 allocs   31–45 µs             1×
//
// An in-memory reservation costs about a microsecond. So with `store: bolt`
// (the default) `vmgate serve` keeps counters in memory (Split) and treats
// the audit log as their write-ahead log: the decision record, fsynced
// before dispatch, carries the reservations, and at start the server
// rebuilds the counters from the decision records still inside their
// windows, skipping calls whose outcome says refunded (Restore). A crash
// loses no reservation the log acknowledged; an outcome lost with a crash
// leaves its refund unapplied, which errs on the side of the limit.
// Approvals stay in bbolt (with fsync): operators create and decide them
// rarely, they must survive restarts on their own, and the log does not
// hold their state. Redis is not split: with replicas it is the shared
// source of truth, and one replica's audit log knows only its own calls.
package memory

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/internal/rules"
)

var _ store.Store = (*Store)(nil)

// sweepEvery is how many reservations pass between sweeps of idle keys.
const sweepEvery = 1024

// Store is an in-memory store.Store. It is safe for concurrent use: one
// mutex makes every ReserveAll check all its counters and add to all of
// them as one step.
type Store struct {
	mu sync.Mutex // mu guards everything below.
	// windows maps a counter key to its live reservations.
	windows map[string]*window
	// approvals maps an approval id to the approval.
	approvals map[string]store.Approval
	// leases maps a lease id to the lease (leases.go).
	leases map[string]store.Lease
	// sinceSweep counts reservations since the last sweep of idle keys.
	sinceSweep int
	closed     bool
}

// window is the live reservations of one counter key, oldest first.
type window struct {
	entries []entry
	ids     map[string]int64 // reservation id -> at (unix ns)
	length  int64            // the window length last used with this key, ns
}

type entry struct {
	at int64 // unix ns
	id string
}

// New returns an empty store.
func New() *Store {
	return &Store{windows: make(map[string]*window), approvals: make(map[string]store.Approval), leases: make(map[string]store.Lease)}
}

// ReserveAll implements store.Counters.
func (s *Store) ReserveAll(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	if err := rules.Counters(id, counters); err != nil {
		return fmt.Errorf("memory: reserve: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: reserve: %w: %w", store.ErrUnavailable, err)
	}
	at := now.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memory: reserve: %w: store is closed", store.ErrUnavailable)
	}
	for _, c := range counters {
		w := s.windows[c.Key]
		if w == nil {
			if c.Max == 0 {
				return &store.LimitedError{Counter: c, RetryAfter: c.Window}
			}
			continue
		}
		w.pruneLocked(at, int64(c.Window))
		if _, dup := w.ids[id]; dup {
			return fmt.Errorf("memory: reserve: %w: %q in counter %q", store.ErrDuplicate, id, c.Key)
		}
		if n := int64(len(w.entries)); n >= c.Max {
			return &store.LimitedError{Counter: c, RetryAfter: w.retryAfterLocked(at, c)}
		}
	}
	if len(counters) == 0 {
		return nil
	}
	for _, c := range counters {
		w := s.windows[c.Key]
		if w == nil {
			w = &window{ids: make(map[string]int64)}
			s.windows[c.Key] = w
		}
		w.length = int64(c.Window)
		w.insertLocked(at, id)
	}
	s.sinceSweep++
	if s.sinceSweep >= sweepEvery {
		s.sweepLocked(at)
	}
	return nil
}

// Refund implements store.Counters.
func (s *Store) Refund(ctx context.Context, id string, now time.Time, counters []policy.Counter) error {
	if err := rules.Counters(id, counters); err != nil {
		return fmt.Errorf("memory: refund: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: refund: %w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memory: refund: %w: store is closed", store.ErrUnavailable)
	}
	for _, c := range counters {
		if w := s.windows[c.Key]; w != nil {
			w.removeLocked(id)
			if len(w.entries) == 0 {
				delete(s.windows, c.Key)
			}
		}
	}
	return nil
}

// Restore inserts the past reservation id made at at into counters without
// checking Max (the call already happened). It is idempotent by id: a
// counter that already holds id is left alone. A server that keeps its
// counters here calls it at start for every audit decision record still
// inside its counters' windows (see Split). Refunded reservations must not
// be restored.
func (s *Store) Restore(ctx context.Context, id string, at time.Time, counters []policy.Counter) error {
	if err := rules.Counters(id, counters); err != nil {
		return fmt.Errorf("memory: restore: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: restore: %w: %w", store.ErrUnavailable, err)
	}
	ns := at.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memory: restore: %w: store is closed", store.ErrUnavailable)
	}
	for _, c := range counters {
		w := s.windows[c.Key]
		if w == nil {
			w = &window{ids: make(map[string]int64)}
			s.windows[c.Key] = w
		}
		if _, dup := w.ids[id]; dup {
			continue
		}
		w.length = max(w.length, int64(c.Window))
		w.insertLocked(ns, id)
	}
	return nil
}

// pruneLocked drops the entries at or before at-length.
func (w *window) pruneLocked(at, length int64) {
	cut := at - length
	i := 0
	for i < len(w.entries) && w.entries[i].at <= cut {
		delete(w.ids, w.entries[i].id)
		i++
	}
	if i > 0 {
		// Reslicing keeps pruning O(pruned); the backing array's dead head
		// is reclaimed when append reallocates.
		clear(w.entries[:i])
		w.entries = w.entries[i:]
	}
}

// retryAfterLocked is how long after at the count drops below c.Max: when
// the entry that must leave for that leaves the window. With Max 0 nothing
// ever fits; the caller is told to wait a whole window.
func (w *window) retryAfterLocked(at int64, c policy.Counter) time.Duration {
	n := int64(len(w.entries))
	if c.Max == 0 || n < c.Max {
		return c.Window
	}
	d := time.Duration(w.entries[n-c.Max].at + int64(c.Window) - at)
	if d <= 0 {
		d = 1
	}
	return d
}

func (w *window) insertLocked(at int64, id string) {
	// Usually at is the newest; a caller whose clock lags inserts earlier.
	i := sort.Search(len(w.entries), func(i int) bool { return w.entries[i].at > at })
	w.entries = slices.Insert(w.entries, i, entry{at: at, id: id})
	w.ids[id] = at
}

func (w *window) removeLocked(id string) {
	at, ok := w.ids[id]
	if !ok {
		return
	}
	delete(w.ids, id)
	i := sort.Search(len(w.entries), func(i int) bool { return w.entries[i].at >= at })
	for ; i < len(w.entries) && w.entries[i].at == at; i++ {
		if w.entries[i].id == id {
			w.entries = slices.Delete(w.entries, i, i+1)
			return
		}
	}
}

// sweepLocked drops every key whose newest entry has left its window.
func (s *Store) sweepLocked(at int64) {
	s.sinceSweep = 0
	for k, w := range s.windows {
		if n := len(w.entries); n == 0 || w.entries[n-1].at <= at-w.length {
			delete(s.windows, k)
		}
	}
}

// CreateApproval implements store.Approvals. It also deletes approvals that
// ended more than rules.Retention before a.Created.
func (s *Store) CreateApproval(ctx context.Context, a store.Approval) error {
	a, err := rules.NewApproval(a)
	if err != nil {
		return fmt.Errorf("memory: create approval: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: create approval: %w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("memory: create approval: %w: store is closed", store.ErrUnavailable)
	}
	if _, dup := s.approvals[a.ID]; dup {
		return fmt.Errorf("memory: create approval: %w: %q", store.ErrDuplicate, a.ID)
	}
	for id, old := range s.approvals {
		if rules.Stale(old, a.Created) {
			delete(s.approvals, id)
		} else if kept, changed := rules.Scrubbed(old, a.Created); changed {
			s.approvals[id] = kept
		}
	}
	s.approvals[a.ID] = a
	return nil
}

// GetApproval implements store.Approvals. It returns the approval as
// stored; ListApprovals shows expiry.
func (s *Store) GetApproval(ctx context.Context, id string) (store.Approval, error) {
	if err := rules.ID(id); err != nil {
		return store.Approval{}, fmt.Errorf("memory: get approval: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Approval{}, fmt.Errorf("memory: get approval: %w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.Approval{}, fmt.Errorf("memory: get approval: %w: store is closed", store.ErrUnavailable)
	}
	a, ok := s.approvals[id]
	if !ok {
		return store.Approval{}, fmt.Errorf("memory: get approval %q: %w", id, store.ErrUnknownApproval)
	}
	return a, nil
}

// ListApprovals implements store.Approvals: every approval as it stands at
// now, oldest first.
func (s *Store) ListApprovals(ctx context.Context, now time.Time) ([]store.Approval, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory: list approvals: %w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("memory: list approvals: %w: store is closed", store.ErrUnavailable)
	}
	out := make([]store.Approval, 0, len(s.approvals))
	for id, a := range s.approvals {
		if kept, changed := rules.Scrubbed(a, now); changed {
			s.approvals[id] = kept
		}
		out = append(out, rules.AsOf(a, now))
	}
	rules.Sort(out)
	return out, nil
}

// DecideApproval implements store.Approvals.
func (s *Store) DecideApproval(ctx context.Context, id string, grant bool, by, reason string, now time.Time) (store.Approval, error) {
	if err := rules.ID(id); err != nil {
		return store.Approval{}, fmt.Errorf("memory: decide approval: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Approval{}, fmt.Errorf("memory: decide approval: %w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.Approval{}, fmt.Errorf("memory: decide approval: %w: store is closed", store.ErrUnavailable)
	}
	a, ok := s.approvals[id]
	if !ok {
		return store.Approval{}, fmt.Errorf("memory: decide approval %q: %w", id, store.ErrUnknownApproval)
	}
	a, changed, err := rules.Decide(a, grant, by, reason, now)
	if changed {
		s.approvals[id] = a
	}
	if err != nil {
		return a, fmt.Errorf("memory: decide approval: %w", err)
	}
	return a, nil
}

// ConsumeApproval implements store.Approvals. Of several matching
// approvals, the oldest is consumed.
func (s *Store) ConsumeApproval(ctx context.Context, grant, tool, digest string, now time.Time) (store.Approval, bool, error) {
	if err := rules.Binding(grant, tool, digest); err != nil {
		return store.Approval{}, false, fmt.Errorf("memory: consume approval: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Approval{}, false, fmt.Errorf("memory: consume approval: %w: %w", store.ErrUnavailable, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.Approval{}, false, fmt.Errorf("memory: consume approval: %w: store is closed", store.ErrUnavailable)
	}
	var best *store.Approval
	for _, a := range s.approvals {
		if rules.Consumable(a, grant, tool, digest, now) && (best == nil || rules.Less(a, *best)) {
			a := a
			best = &a
		}
	}
	if best == nil {
		return store.Approval{}, false, nil
	}
	a := rules.Consume(*best)
	s.approvals[a.ID] = a
	return a, true, nil
}

// Close implements store.Store. Later calls fail with store.ErrUnavailable.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
