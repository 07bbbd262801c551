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

// maxStateEntries bounds a stateCache: when it is full, the answers past
// their TTL are swept out, and only when too few were is it emptied.
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
// at most the TTL late. A change made through vmgate does not wait: a
// call that changes a VM from the hypervisor's side (Power, a snapshot's
// create, revert and delete, CreateVM, DeleteVM) empties the cache before
// and after it runs; a call that runs in a guest (Run, ExecStart,
// FileWrite) forgets that VM's status and the list, before and after, and
// keeps the other VMs' statuses (whatever it does to its own guest is
// that guest changing itself: it cannot change another VM's state). Only
// successful answers are kept. Entries belong to the plugin process that
// gave them: a restarted plugin answers afresh.
//
// In a fleet (a thousand VMs) it stays flat: one entry per VM polled within
// the TTL and one for the list, at most maxStateEntries, swept of expired
// entries when full; a lookup is a map access, a hit copies nothing
// through ListVMsShared and allocates nothing through Status, and
// invalidating one VM does not touch the others.
//
// gen is bumped by every invalidation, whole or of one VM; an answer
// fetched across one (the fetch began before it ended) is not stored.
// mu guards everything.
type stateCache struct {
	ttl time.Duration // <= 0: nothing is cached

	mu      sync.Mutex
	gen     uint64
	entries map[cacheKey]stateEntry
}

// cacheKey is an answer's key: the list, or one VM's status. A struct, so
// a lookup builds no string.
type cacheKey struct {
	list bool
	vm   string // the status of vm when !list
}

// listKey is the key of ListVMs' answer.
var listKey = cacheKey{list: true}

func statusKey(vm string) cacheKey { return cacheKey{vm: vm} }

type stateEntry struct {
	inst *instance // the plugin process that answered
	at   time.Time
	v    any
}

func newStateCache(ttl time.Duration) *stateCache {
	return &stateCache{ttl: ttl, entries: map[cacheKey]stateEntry{}}
}

// lookup returns the fresh answer inst gave for key, and otherwise the
// generation a fetch must quote to store its answer.
func (c *stateCache) lookup(inst *instance, key cacheKey) (v any, ok bool, gen uint64) {
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
func (c *stateCache) store(inst *instance, key cacheKey, gen uint64, v any, at time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if _, replaces := c.entries[key]; !replaces && len(c.entries) >= maxStateEntries {
		c.sweepLocked(inst)
	}
	c.entries[key] = stateEntry{inst: inst, at: at, v: v}
}

// sweepLocked makes room in a full cache: it drops the answers past their
// TTL or of another plugin process, and empties the cache when that freed
// less than a quarter of it (more VMs polled within one TTL than it
// holds: each sweep would then cost a pass for a few entries).
func (c *stateCache) sweepLocked(inst *instance) {
	now := time.Now()
	for k, e := range c.entries {
		if e.inst != inst || now.Sub(e.at) >= c.ttl {
			delete(c.entries, k)
		}
	}
	if len(c.entries) > maxStateEntries*3/4 {
		clear(c.entries)
	}
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

// invalidateVM forgets vm's status and the list (which shows vm's state)
// and refuses every answer being fetched.
func (c *stateCache) invalidateVM(vm string) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.entries, listKey)
	delete(c.entries, statusKey(vm))
}

// len is the number of answers kept (tests).
func (c *stateCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// cachedCall is call for a read whose answer the cache may give or keep
// (copied out with clone, so callers never share it; nil clone shares it:
// the caller must not change it).
func cachedCall[T any](s *Supervisor, ctx context.Context, key cacheKey, clone func(T) T, fn func(remote) (T, error)) (T, error) {
	inst, err := s.get(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	if clone == nil {
		clone = same[T]
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

// changing runs a call that can change a VM from the hypervisor's side
// with the cache emptied before and after it.
func changing[T any](s *Supervisor, ctx context.Context, fn func(remote) (T, error)) (T, error) {
	s.cache.invalidate()
	defer s.cache.invalidate()
	return call(s, ctx, fn)
}

// inGuest runs a call that runs in vm's guest with vm's status and the
// list forgotten before and after it.
func inGuest[T any](s *Supervisor, ctx context.Context, vm string, fn func(remote) (T, error)) (T, error) {
	s.cache.invalidateVM(vm)
	defer s.cache.invalidateVM(vm)
	return call(s, ctx, fn)
}

func cloneVMs(vms []hypervisor.VM) []hypervisor.VM { return slices.Clone(vms) }

func same[T any](v T) T { return v }
