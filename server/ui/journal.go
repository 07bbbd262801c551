package ui

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
)

// maxRecent is how many decision records the page keeps to filter and show.
const maxRecent = 2000

// maxChunk bounds one read of the log's new bytes.
const maxChunk = 8 << 20

// journal follows the audit log: it reads the bytes appended since its last
// look, keeps the most recent decision records and rebuilds the counters'
// live reservations from them the way `vmgate serve` does at start (decision
// records carry their reservations, outcome records say refunded), so the
// page shows what the store holds without asking it.
type journal struct {
	path string

	// mu guards everything below.
	mu      sync.Mutex
	off     int64          // bytes of the log consumed (up to the last newline)
	dev     uint64         // identity of the file read, to notice a replaced log
	recent  []audit.Record // decision records, oldest first, at most maxRecent
	keys    map[string]*counterState
	calls   map[string]callRes // call id -> its reservations, for refunds
	lastErr error
}

type counterState struct {
	window time.Duration
	max    int64
	res    []reservation // oldest first
}

type reservation struct {
	call string
	at   time.Time
}

type callRes struct {
	keys []string
	end  time.Time // when the last of its reservations leaves its window
}

// CounterView is one counter as the page shows it.
type CounterView struct {
	Key     string
	Label   string // Key in words (policy.CounterLabel)
	Window  time.Duration
	Max     int64
	Used    int64
	FreesAt time.Time // when the oldest live reservation leaves the window (zero if none)
}

func newJournal(path string) *journal {
	return &journal{path: path, keys: map[string]*counterState{}, calls: map[string]callRes{}}
}

// refresh reads what was appended to the log since the last call.
func (j *journal) refresh() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.refreshLocked()
	j.lastErr = err
	return err
}

func (j *journal) refreshLocked() error {
	f, err := os.Open(j.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // no call yet
	}
	if err != nil {
		return fmt.Errorf("ui: audit log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("ui: audit log: %w", err)
	}
	id := fileID(fi)
	if fi.Size() < j.off || id != j.dev {
		// Truncated or replaced: start over.
		j.off, j.dev = 0, id
		j.recent, j.keys, j.calls = nil, map[string]*counterState{}, map[string]callRes{}
	}
	for j.off < fi.Size() {
		n := min(fi.Size()-j.off, maxChunk)
		buf := make([]byte, n)
		if _, err := f.ReadAt(buf, j.off); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("ui: audit log: %w", err)
		}
		last := bytes.LastIndexByte(buf, '\n')
		if last < 0 {
			if n == maxChunk {
				j.off += n // a line longer than any record: skip it
				continue
			}
			return nil // a line still being written
		}
		for line := range bytes.SplitSeq(buf[:last], []byte{'\n'}) {
			var rec audit.Record
			if len(line) == 0 || json.Unmarshal(line, &rec) != nil {
				continue // a torn line; audit verify reports it
			}
			j.applyLocked(rec)
		}
		j.off += int64(last + 1)
	}
	return nil
}

func (j *journal) applyLocked(rec audit.Record) {
	switch rec.Kind {
	case audit.KindDecision:
		rec.Args = nil // the page shows arguments of pending approvals, from the store
		if len(j.recent) == maxRecent {
			j.recent = slices.Delete(j.recent, 0, maxRecent/4)
		}
		j.recent = append(j.recent, rec)
		if len(rec.Counters) == 0 {
			return
		}
		cr := callRes{}
		for _, c := range rec.Counters {
			w := c.Window
			st := j.keys[c.Key]
			if st == nil {
				st = &counterState{}
				j.keys[c.Key] = st
			}
			st.window, st.max = w, c.Max // the latest policy's limit
			st.res = append(st.res, reservation{call: rec.CallID, at: rec.Time})
			cr.keys = append(cr.keys, c.Key)
			cr.end = maxTime(cr.end, rec.Time.Add(w))
		}
		j.calls[rec.CallID] = cr
	case audit.KindOutcome:
		if !rec.Refunded {
			return
		}
		cr, ok := j.calls[rec.CallID]
		if !ok {
			return
		}
		delete(j.calls, rec.CallID)
		for _, k := range cr.keys {
			if st := j.keys[k]; st != nil {
				st.res = slices.DeleteFunc(st.res, func(r reservation) bool { return r.call == rec.CallID })
			}
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Filter selects decision records; empty fields match everything.
type Filter struct {
	Grant, Tool, VM string
}

func (f Filter) match(r audit.Record) bool {
	return (f.Grant == "" || r.Grant == f.Grant) && (f.Tool == "" || r.Tool == f.Tool) && (f.VM == "" || r.VM == f.VM)
}

// decisions returns up to limit matching decision records, newest first,
// and the distinct grants, tools and VMs of every kept record (for the
// filter menus).
func (j *journal) decisions(f Filter, limit int) (out []audit.Record, grants, tools, vms []string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	seen := [3]map[string]bool{{}, {}, {}}
	for i := len(j.recent) - 1; i >= 0; i-- {
		r := j.recent[i]
		for k, v := range [3]string{r.Grant, r.Tool, r.VM} {
			if v != "" {
				seen[k][v] = true
			}
		}
		if len(out) < limit && f.match(r) {
			out = append(out, r)
		}
	}
	sorted := func(m map[string]bool) []string {
		s := make([]string, 0, len(m))
		for k := range m {
			s = append(s, k)
		}
		slices.Sort(s)
		return s
	}
	return out, sorted(seen[0]), sorted(seen[1]), sorted(seen[2])
}

// counters returns every counter with a live reservation at now, sorted by
// key, and forgets the ones that have none.
func (j *journal) counters(now time.Time) []CounterView {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []CounterView
	for k, st := range j.keys {
		cut := now.Add(-st.window)
		st.res = slices.DeleteFunc(st.res, func(r reservation) bool { return !r.at.After(cut) })
		if len(st.res) == 0 {
			delete(j.keys, k)
			continue
		}
		oldest := st.res[0].at
		for _, r := range st.res[1:] {
			if r.at.Before(oldest) {
				oldest = r.at
			}
		}
		out = append(out, CounterView{Key: k, Label: policy.CounterLabel(k), Window: st.window, Max: st.max, Used: int64(len(st.res)), FreesAt: oldest.Add(st.window)})
	}
	for id, cr := range j.calls {
		if !cr.end.After(now) {
			delete(j.calls, id)
		}
	}
	slices.SortFunc(out, func(a, b CounterView) int {
		if a.Key < b.Key {
			return -1
		}
		if a.Key > b.Key {
			return 1
		}
		return 0
	})
	return out
}
