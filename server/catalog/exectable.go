package catalog

import (
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
)

// ExecTable remembers commands started with wait: false. Ids are minted
// here (random; a job's is its random id in the guest) and bound to the
// grant and VM that started the command.
// The zero value is ready; it is safe for concurrent use.
type ExecTable struct {
	mu sync.Mutex // guards m
	m  map[string]ExecEntry
}

// ExecEntry is one command started with wait: false.
type ExecEntry struct {
	grant, vm string
	// Handle is the driver's handle of the command (none for a job).
	Handle hypervisor.ExecHandle
	// Job is the resident helper's job id of a command in a session or a
	// sandbox of its own; "" for the driver's command.
	Job string
	// Session is the job's session ("" for a one-shot sandbox's).
	Session string
	created time.Time
}

const (
	maxExecs   = 4096
	execMaxAge = 24 * time.Hour
)

// Add records h, started by grant on vm at now, and returns its new id.
func (t *ExecTable) Add(grant, vm string, h hypervisor.ExecHandle, now time.Time) (string, error) {
	id := "x" + rand.Text()
	return id, t.put(id, ExecEntry{grant: grant, vm: vm, Handle: h, created: now})
}

// AddJob records job, a job of vm's resident helper started by grant at
// now (in session, "" for a one-shot sandbox), under its id JobExecID(job):
// the id names the job in the guest, so that a restarted server, whose
// table is empty, finds it again (wire.ValidateJobID: 96 random bits).
func (t *ExecTable) AddJob(grant, vm, job, session string, now time.Time) (string, error) {
	if wire.ValidateJobID(job) != nil {
		return "", fmt.Errorf("job id %q is not one of the resident helper's", job)
	}
	id := JobExecID(job)
	return id, t.put(id, ExecEntry{grant: grant, vm: vm, Job: job, Session: session, created: now})
}

// JobExecID is the exec_id of the resident helper's job.
func JobExecID(job string) string { return "j" + job }

// JobOf is the job id an exec_id names, when it names one.
func JobOf(execID string) (string, bool) {
	job, ok := strings.CutPrefix(execID, "j")
	return job, ok && wire.ValidateJobID(job) == nil
}

func (t *ExecTable) put(id string, e ExecEntry) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]ExecEntry)
	}
	if len(t.m) >= maxExecs {
		for id, old := range t.m {
			if e.created.Sub(old.created) > execMaxAge {
				delete(t.m, id)
			}
		}
		if len(t.m) >= maxExecs {
			return errors.New("too many commands nobody polled")
		}
	}
	t.m[id] = e
	return nil
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
