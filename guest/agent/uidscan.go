//go:build linux

package agent

import (
	"maps"
	"sync"
	"time"
)

// idsScanKept is how long the resident helper reuses one scan of the ids
// live processes run with (idsInUse: /proc/*/status of every process,
// about 100 ms per session create on an emulated guest with a hundred
// processes, the largest step of a create). Reusing it is sound because
// every id a session holds is in its metadata (allocateIDLocked's taken,
// read afresh under the lock each time), and a destroy kills a session's
// processes before it removes its metadata: a number the scan found free
// is not one of our sessions' processes' later on. The scan is there for
// any other process with a number in the range; such a process is found
// at most this late.
const idsScanKept = time.Second

// idsScan is the resident helper's last scan. mu guards it.
type idsScan struct {
	mu      sync.Mutex
	at      time.Time
	base, n int
	busy    map[int]bool
}

// idsInUseKept is a.idsInUse(base, n), from the last scan while it is
// younger than idsScanKept. The caller may change the map it gets.
func (r *resident) idsInUseKept(a *Agent, base, n int) map[int]bool {
	s := &r.ids
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy == nil || s.base != base || s.n != n || time.Since(s.at) >= idsScanKept {
		s.busy, s.at, s.base, s.n = a.idsInUse(base, n), time.Now(), base, n
	}
	return maps.Clone(s.busy)
}
