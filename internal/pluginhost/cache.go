package pluginhost

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// DefaultStateTTL is Options.StateTTL when unset.
const DefaultStateTTL = time.Second

// maxStateEntries bounds a stateCache; past it the cache starts over.
const maxStateEntries = 4096

// stateCache keeps a plugin's recent ListVMs and Status answers for the
// state TTL, so that an agent polling list_vms or vm_status costs no plugin
// round trip while the answer is fresh (the performance budget of docs/design.md:
// "one driver call for list_vms or vm_status, or none when a short-lived
// cache answers"). It lives in the Supervisor because the round trip it
// saves is the plugin boundary; a driver running in process answers as fast
// as the cache would.
//
// What it may serve stale, and for how long: a VM's state changed outside
// vmgate (a guest that powered itself off, a VM started by hand) shows up
// at most the TTL late. A change made through vmgate does not wait: every
// call that can change a guest or a VM (Power, Run, ExecStart, FileWrite,
// a snapshot's create, revert and delete) empties the cache before and
// after it runs, and only successful answers
// are kept. Entries belong to the plugin process that gave them: a
// restarted plugin answers afresh.
//
// gen is bumped by every invalidation; an answer fetched across one (the
// fetch began before it ended) is not stored. mu guards everything.
type stateCache struct {
	ttl time.Duration // <= 0: nothing is cached

	mu      sync.Mutex
	gen     uint64
	entries map[string]stateEntry
}

type stateEntry struct {
	inst *instance // the plugin process that answered
	at   time.Time
	v    any
}

func newStateCache(ttl time.Duration) *stateCache {
	return &stateCache{ttl: ttl, entries: map[string]stateEntry{}}
}

// lookup returns the fresh answer inst gave for key, and otherwise the
// generation a fetch must quote to store its answer.
func (c *stateCache) lookup(inst *instance, key string) (v any, ok bool, gen uint64) {
	if c.ttl <= 0 {
		return nil, false, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, found := c.entries[key]
	if found && e.inst == inst && time.Since(e.at) < c.ttl {
		return e.v, true, c.gen
	}
	return nil, false, c.gen
}

// store keeps v for key unless the cache was invalidated since gen.
func (c *stateCache) store(inst *instance, key string, gen uint64, v any, at time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.entries) >= maxStateEntries {
		clear(c.entries)
	}
	c.entries[key] = stateEntry{inst: inst, at: at, v: v}
}

// invalidate forgets every answer and refuses the ones being fetched.
func (c *stateCache) invalidate() {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.entries)
}

// cachedCall is call for a read whose answer the cache may give or keep
// (copied out with clone, so callers never share it).
func cachedCall[T any](s *Supervisor, ctx context.Context, key string, clone func(T) T, fn func(remote) (T, error)) (T, error) {
	inst, err := s.get(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	v, ok, gen := s.cache.lookup(inst, key)
	if ok {
		return clone(v.(T)), nil
	}
	asked := time.Now()
	res, err := fn(inst.drv)
	if err != nil {
		return res, s.classify(ctx, inst, err)
	}
	s.cache.store(inst, key, gen, clone(res), asked)
	return res, nil
}

// changing runs a call that can change a guest or a VM with the cache
// emptied before and after it.
func changing[T any](s *Supervisor, ctx context.Context, fn func(remote) (T, error)) (T, error) {
	s.cache.invalidate()
	defer s.cache.invalidate()
	return call(s, ctx, fn)
}

func cloneVMs(vms []hypervisor.VM) []hypervisor.VM { return slices.Clone(vms) }

func sameStatus(st hypervisor.Status) hypervisor.Status { return st }
