// Package keylock is a lock per key (a VM id) whose entries live only
// while someone holds or waits for them: a map of per-VM locks stays as
// large as the VMs in use at the moment, not every VM ever named (a fleet's
// VMs come and go: vm_create, vm_delete).
//
// A Map is safe for concurrent use; its zero value is ready. Its mutex is
// never held while a caller waits for a key.
package keylock

import (
	"context"
	"sync"
)

// Map holds one lock per key.
type Map struct {
	mu sync.Mutex
	m  map[string]*entry
}

// entry is one key's lock and how many hold or wait for it.
type entry struct {
	ch   chan struct{} // holds a token while the key is locked
	refs int
}

// Lock takes key's lock, waiting for its holder, and returns its unlock
// (call it once); it fails with ctx's error when ctx ends first, holding
// nothing.
func (m *Map) Lock(ctx context.Context, key string) (unlock func(), err error) {
	e := m.ref(key)
	select {
	case e.ch <- struct{}{}:
		var once sync.Once
		return func() {
			once.Do(func() {
				<-e.ch
				m.unref(key, e)
			})
		}, nil
	case <-ctx.Done():
		m.unref(key, e)
		return nil, ctx.Err()
	}
}

// ref returns key's entry, made when nobody holds or waits for it, with
// one more reference.
func (m *Map) ref(key string) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[string]*entry{}
	}
	e := m.m[key]
	if e == nil {
		e = &entry{ch: make(chan struct{}, 1)}
		m.m[key] = e
	}
	e.refs++
	return e
}

// unref drops a reference to key's entry e, and the entry with the last.
func (m *Map) unref(key string, e *entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(m.m, key)
	}
}

// Len is the number of keys held or waited for.
func (m *Map) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}
