package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
)

// windowSlack: the decision record carries the reservation time itself
// (the gate sets it), so the check is exact but for the Redis store, which
// keeps reservation times in whole microseconds. A limit is reported broken
// when max+1 reservations fall within window-slack.
const windowSlack = time.Microsecond

// readLogs reads every record of the logs, in order.
func readLogs(paths ...string) ([]audit.Record, error) {
	var recs []audit.Record
	for _, p := range paths {
		if err := audit.Read(p, func(r audit.Record) error {
			recs = append(recs, r)
			return nil
		}); err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
	}
	return recs, nil
}

// reservation is one counter reservation found in a log.
type reservation struct {
	at   time.Time
	call string
}

// limitReport is what checkLimits found.
type limitReport struct {
	keys         int      // counter keys seen
	reservations int      // reservations still counted (not refunded)
	violations   []string // windows that held more than max
	tightest     time.Duration
}

// checkLimits recomputes every counter from the decision records of recs:
// for each key, the reservation times of calls not refunded, sorted; any
// max+1 of them must span at least the window (less windowSlack).
func checkLimits(recs []audit.Record) limitReport {
	refunded := map[string]bool{}
	for _, r := range recs {
		if r.Kind == audit.KindOutcome && r.Refunded {
			refunded[r.CallID] = true
		}
	}
	type key struct {
		name   string
		window time.Duration
		max    int64
	}
	byKey := map[key][]reservation{}
	for _, r := range recs {
		if r.Kind != audit.KindDecision || refunded[r.CallID] {
			continue
		}
		for _, c := range r.Counters {
			k := key{c.Key, c.Window, c.Max}
			byKey[k] = append(byKey[k], reservation{r.Time, r.CallID})
		}
	}
	rep := limitReport{keys: len(byKey), tightest: -1}
	for k, rs := range byKey {
		rep.reservations += len(rs)
		slices.SortFunc(rs, func(a, b reservation) int { return a.at.Compare(b.at) })
		m := int(k.max)
		for i := 0; i+m < len(rs); i++ {
			span := rs[i+m].at.Sub(rs[i].at)
			if rep.tightest < 0 || span-k.window < rep.tightest {
				rep.tightest = span - k.window
			}
			if span < k.window-windowSlack {
				rep.violations = append(rep.violations, fmt.Sprintf("counter %s (max %d per %v): %d reservations within %v, from %s (call %s) to %s (call %s)",
					k.name, k.max, k.window, m+1, span, rs[i].at.Format(time.RFC3339Nano), rs[i].call, rs[i+m].at.Format(time.RFC3339Nano), rs[i+m].call))
				break
			}
		}
	}
	return rep
}

// pairReport is what checkPairs found.
type pairReport struct {
	allowed  int      // decision records that let a call run
	outcomes int      // outcome records
	missing  []string // allowed calls without an outcome
	orphans  []string // outcomes without a decision
	dupes    []string // call ids with more than one decision or outcome
}

// checkPairs matches decision and outcome records by call id: every call
// the gate allowed (decision "allow") has exactly one outcome, and every
// outcome has a decision.
func checkPairs(recs []audit.Record) pairReport {
	dec := map[string]audit.Record{}
	out := map[string]int{}
	var rep pairReport
	for _, r := range recs {
		switch r.Kind {
		case audit.KindDecision:
			if _, dup := dec[r.CallID]; dup {
				rep.dupes = append(rep.dupes, "decision "+r.CallID)
			}
			dec[r.CallID] = r
		case audit.KindOutcome:
			out[r.CallID]++
			rep.outcomes++
			if out[r.CallID] > 1 {
				rep.dupes = append(rep.dupes, "outcome "+r.CallID)
			}
		}
	}
	for id, d := range dec {
		if d.Decision == "allow" {
			rep.allowed++
			if out[id] == 0 {
				rep.missing = append(rep.missing, fmt.Sprintf("%s (%s %s at %s)", id, d.Tool, d.VM, d.Time.Format(time.RFC3339Nano)))
			}
		}
	}
	for id := range out {
		if _, ok := dec[id]; !ok {
			rep.orphans = append(rep.orphans, id)
		}
	}
	slices.Sort(rep.missing)
	return rep
}

// decisions counts decision records by decision.
func decisions(recs []audit.Record) map[string]int {
	n := map[string]int{}
	for _, r := range recs {
		if r.Kind == audit.KindDecision {
			n[r.Decision]++
		}
	}
	return n
}

// verifyLog runs `vmgate audit verify` and returns its output; a failure
// (exit status or a first line that is not "ok" after warnings) is an error.
func verifyLog(path string, keyFile string) (string, error) {
	args := []string{"audit", "verify", path}
	if keyFile != "" {
		args = append(args, "--key", keyFile)
	}
	out, err := runVMGate(args...)
	if err != nil {
		return out, fmt.Errorf("vmgate audit verify %s: %v: %s", path, err, out)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "warning:") {
			continue
		}
		if !strings.HasPrefix(l, "ok:") {
			return out, fmt.Errorf("vmgate audit verify %s: %q; want ok", path, out)
		}
	}
	return out, nil
}
