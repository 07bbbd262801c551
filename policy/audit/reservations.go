package audit

import (
	"strconv"
	"time"

	"github.com/vmgate/vmgate/policy"
)

// Reservation is one counter reservation the log says is still live: the
// counters (those whose window has not passed by now) reserved under id at
// At.
type Reservation struct {
	ID       string
	At       time.Time
	Counters []policy.Counter
}

// advanceState is an advance record as Reservations reads the log.
type advanceState struct {
	end      time.Time // the end of its validity: where lost units are restored
	counters []policy.Counter
	units    int64
	used     int64 // decision records naming it
	ended    bool  // its end record was seen
}

// Reservations reads the log at path (a chain that does not verify is an
// error; see Read) and returns the reservations still inside their windows
// at now, for a server to rebuild its counters from:
//   - every decision record's counters, at the record's time, unless its
//     outcome says refunded;
//   - for every advance (KindAdvance) without its end record, the units no
//     decision record naming it accounts for, at the end of its validity
//     (the latest time a call whose record a power loss took could have
//     reserved), under the ids "ADVANCE/N".
//
// A log that does not exist holds none (the error wraps os.ErrNotExist).
func Reservations(path string, now time.Time) ([]Reservation, error) {
	pending := map[string]Reservation{}
	var order []string
	advances := map[string]*advanceState{}
	err := Read(path, func(r Record) error {
		switch r.Kind {
		case KindDecision:
			if a := advances[r.Advance]; a != nil {
				a.used++
			}
			if cs := live(r.Counters, r.Time, now); len(cs) > 0 {
				if _, seen := pending[r.CallID]; !seen {
					order = append(order, r.CallID)
				}
				pending[r.CallID] = Reservation{ID: r.CallID, At: r.Time, Counters: cs}
			}
		case KindOutcome:
			if r.Refunded {
				delete(pending, r.CallID)
			}
		case KindAdvance:
			advances[r.CallID] = &advanceState{end: r.Time.Add(time.Duration(r.ValidMS) * time.Millisecond), counters: r.Counters, units: r.Units}
		case KindAdvanceEnd:
			if a := advances[r.CallID]; a != nil {
				a.ended = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]Reservation, 0, len(pending))
	for _, id := range order {
		if p, ok := pending[id]; ok {
			out = append(out, p)
			delete(pending, id) // a call id seen twice is restored once
		}
	}
	return append(out, lostUnits(advances, now)...), nil
}

// lostUnits are the reservations of the advances whose end the log does
// not hold: units that calls may have used with records a power loss took.
func lostUnits(advances map[string]*advanceState, now time.Time) []Reservation {
	var out []Reservation
	for id, a := range advances {
		if a.ended {
			continue
		}
		cs := live(a.counters, a.end, now)
		if len(cs) == 0 {
			continue
		}
		for i := a.used; i < a.units; i++ {
			out = append(out, Reservation{ID: id + "/" + strconv.FormatInt(i, 10), At: a.end, Counters: cs})
		}
	}
	return out
}

// live returns the counters of a reservation made at at whose window has
// not passed by now.
func live(counters []policy.Counter, at, now time.Time) []policy.Counter {
	var cs []policy.Counter
	for _, c := range counters {
		if at.Add(c.Window).After(now) {
			cs = append(cs, c)
		}
	}
	return cs
}
