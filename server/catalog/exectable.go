package catalog

import (
	"crypto/rand"
	"errors"
	"sync"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// ExecTable remembers commands started with wait: false. Ids are minted
// here (random) and bound to the grant and VM that started the command.
// The zero value is ready; it is safe for concurrent use.
type ExecTable struct {
	mu sync.Mutex // guards m
	m  map[string]ExecEntry
}

// ExecEntry is one command started with wait: false.
type ExecEntry struct {
	grant, vm string
	// Handle is the driver's handle of the command.
	Handle  hypervisor.ExecHandle
	created time.Time
}

const (
	maxExecs   = 4096
	execMaxAge = 24 * time.Hour
)

// Add records h, started by grant on vm at now, and returns its new id.
func (t *ExecTable) Add(grant, vm string, h hypervisor.ExecHandle, now time.Time) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]ExecEntry)
	}
	if len(t.m) >= maxExecs {
		for id, e := range t.m {
			if now.Sub(e.created) > execMaxAge {
				delete(t.m, id)
			}
		}
		if len(t.m) >= maxExecs {
			return "", errors.New("too many commands nobody polled")
		}
	}
	id := "x" + rand.Text()
	t.m[id] = ExecEntry{grant: grant, vm: vm, Handle: h, created: now}
	return id, nil
}

// Get finds id for grant and vm; another grant's id does not exist.
func (t *ExecTable) Get(id, grant, vm string) (ExecEntry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.m[id]
	if !ok || e.grant != grant || e.vm != vm {
		return ExecEntry{}, false
	}
	return e, true
}

// Remove forgets id.
func (t *ExecTable) Remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, id)
}
