package server

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
)

// Advances: durable reservations made ahead of the calls that use them.
//
// A read-only call that reserves a counter (the built-in policy's
// all_calls puts one on every call) needs its reservation to survive a
// power loss: the counters are rebuilt from the audit log at start, and a
// reservation the log lost would let a restarted server exceed the limit.
// It does not need its own decision record to be durable before it runs:
// nothing in a guest changes. So instead of one fsync per call, the
// server makes an advance durable first, one record that holds Units
// reservations of those counters for ValidMS (one shared fsync), and the
// next Units calls with the same counters, within that time, each take one
// of them and write their decision records (naming the advance) without
// waiting for an fsync (written to the file before dispatch: a crash of
// the process loses none).
//
// At start (cmd/vmgate restoreCounters) every decision record is restored
// as before; an advance without its end record (KindAdvanceEnd, written
// once every call that used it has its decision record in the file) also
// restores the units no surviving decision record accounts for, at the end
// of its validity, the latest time a lost call could have reserved. So a
// power loss can lose a read-only call's decision record, never a
// reservation: the limits hold across it, and the counters after a crash
// may be stricter than they need be by at most the unused units of the
// advances that were open (each at most 1/advanceShare of a counter's
// budget), for one window.
//
// Calls that can change a guest, consume an approval or run under any
// verdict but a plain allow take no advance: they wait for the fsync of
// their own decision record (shared by concurrent calls), as before.

const (
	// advanceLife is how long after its record an advance may be used.
	advanceLife = time.Second
	// maxAdvanceUnits bounds the calls one advance covers.
	maxAdvanceUnits = 32
	// advanceShare: one advance holds at most 1/advanceShare of the
	// budget of each counter it covers; a counter too small for two units
	// gets no advance.
	advanceShare = 20
)

// advanceUnits is how many calls one advance for counters may cover: 0
// when they get none.
func advanceUnits(counters []policy.Counter) int64 {
	n := int64(maxAdvanceUnits)
	for _, c := range counters {
		n = min(n, c.Max/advanceShare)
	}
	if n < 2 {
		return 0
	}
	return n
}

// advance is one block of reservations made durable ahead of its calls.
// id, units, until, counters and ready are set when it is made; err is set
// before ready is closed; taken, writing and retired are guarded by
// advanceSet.mu.
type advance struct {
	id       string
	units    int64
	until    time.Time
	counters []policy.Counter
	ready    chan struct{}
	err      error

	taken   int64 // units handed out
	writing int64 // units handed out whose decision record is not written yet
	retired bool  // no unit is handed out any more
	ended   bool  // its end record was handed to the log
}

// advanceSet holds the advances open for use, one per set of counters.
// It is safe for concurrent use.
type advanceSet struct {
	mu   sync.Mutex
	open map[string]*advance // by counterSig
}

// counterSig identifies a set of counters as an advance covers them: their
// keys and windows, in the decision's order.
func counterSig(counters []policy.Counter) string {
	var b strings.Builder
	for _, c := range counters {
		b.WriteString(c.Key)
		b.WriteByte(0)
		b.WriteString(strconv.FormatInt(int64(c.Window), 10))
		b.WriteByte(0)
	}
	return b.String()
}

// take hands out one unit of the open advance for counters usable at now,
// or opens a new one (fresh: the caller must make it durable and call
// made). ended is an advance retired by this call whose end record the
// caller must write.
func (as *advanceSet) take(counters []policy.Counter, units int64, now time.Time) (a *advance, fresh bool, ended *advance) {
	sig := counterSig(counters)
	as.mu.Lock()
	defer as.mu.Unlock()
	if a = as.open[sig]; a != nil {
		if a.err == nil && a.taken < a.units && now.Before(a.until) {
			a.taken++
			a.writing++
			if a.taken == a.units {
				ended = as.retireLocked(sig, a)
			}
			return a, false, ended
		}
		ended = as.retireLocked(sig, a)
	}
	if as.open == nil {
		as.open = map[string]*advance{}
	}
	a = &advance{id: "adv-" + rand.Text(), units: units, until: now.Add(advanceLife), counters: counters,
		ready: make(chan struct{}), taken: 1, writing: 1}
	as.open[sig] = a
	return a, true, ended
}

// retireLocked stops handing out a's units and returns it when its end
// record is due now (no unit's decision record is still being written).
func (as *advanceSet) retireLocked(sig string, a *advance) *advance {
	if as.open[sig] == a {
		delete(as.open, sig)
	}
	a.retired = true
	return as.endDueLocked(a)
}

func (as *advanceSet) endDueLocked(a *advance) *advance {
	if a.retired && a.writing == 0 && a.err == nil && !a.ended {
		a.ended = true
		return a
	}
	return nil
}

// made records the outcome of making a fresh advance durable.
func (as *advanceSet) made(a *advance, err error) {
	as.mu.Lock()
	a.err = err
	if err != nil {
		as.retireLocked(counterSig(a.counters), a)
	}
	as.mu.Unlock()
	close(a.ready)
}

// written says that one unit's decision record was written (or failed);
// it returns a when its end record is due now.
func (as *advanceSet) written(a *advance) *advance {
	as.mu.Lock()
	defer as.mu.Unlock()
	a.writing--
	return as.endDueLocked(a)
}

// retireAll retires every open advance (the server is closing) and
// returns those whose end records are due.
func (as *advanceSet) retireAll() []*advance {
	as.mu.Lock()
	defer as.mu.Unlock()
	var due []*advance
	for sig, a := range as.open {
		if e := as.retireLocked(sig, a); e != nil {
			due = append(due, e)
		}
	}
	return due
}

// appendAdvanced writes the decision record of a read-only call that
// reserved counters, under an advance (see above), with w. It falls back to
// a durable Append when the counters are too small for an advance.
func (s *Server) appendAdvanced(ctx context.Context, w writtenAppender, rec audit.Record) error {
	units := advanceUnits(rec.Counters)
	if units == 0 {
		_, err := s.audit.Append(ctx, rec)
		return err
	}
	a, fresh, ended := s.advances.take(rec.Counters, units, rec.Time)
	s.endAdvance(ended)
	if fresh {
		s.advances.made(a, s.makeAdvance(ctx, a))
	} else {
		select {
		case <-a.ready:
		case <-ctx.Done():
			s.endAdvance(s.advances.written(a))
			return ctx.Err()
		}
	}
	if a.err != nil {
		s.endAdvance(s.advances.written(a))
		return a.err
	}
	rec.Advance = a.id
	_, err := w.AppendWritten(ctx, rec)
	s.endAdvance(s.advances.written(a))
	return err
}

// makeAdvance appends a's record and returns once it is durable.
func (s *Server) makeAdvance(ctx context.Context, a *advance) error {
	start := a.until.Add(-advanceLife)
	_, err := s.audit.Append(ctx, audit.Record{Kind: audit.KindAdvance, Time: start, CallID: a.id,
		Counters: a.counters, Units: a.units, ValidMS: advanceLife.Milliseconds()})
	return err
}

// endAdvance writes a's end record (nil: nothing to do): every call that
// used it has its decision record in the file before this one.
func (s *Server) endAdvance(a *advance) {
	if a == nil {
		return
	}
	as := &s.advances
	as.mu.Lock()
	used := a.taken
	as.mu.Unlock()
	if err := s.audit.AppendLazy(context.Background(), audit.Record{Kind: audit.KindAdvanceEnd, CallID: a.id, Units: used}); err != nil {
		s.log.Warn("server: audit: end of an advance not recorded (a restart will hold its unused units for a window)", "advance", a.id, "err", err)
	}
}
