// Package replay decides the calls an audit log records again with a
// candidate policy (`vmgate policy test --replay audit.log NEW`) and
// reports every call whose decision would change.
//
// It runs on a virtual clock: each call is decided at its recorded time
// and reserves the candidate's counters in a memory store at that time,
// so limits are evaluated as they would have been; a call whose outcome
// record says its reservations were refunded is refunded again. A call
// the candidate wants approved reserves its counters when the recorded
// call went through with an approval (the operator is assumed to approve
// it again). Calls the server refused before any policy decided (invalid
// arguments, unknown VMs) and the operator's own records are not
// replayed. The log keeps stdin, env values and file content as digests:
// a condition on those sees the digest.
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// Options select the calls replayed.
type Options struct {
	Grant        string    // only this grant's calls; "" for every grant's
	Since, Until time.Time // zero: unbounded
	// Defaults fills in the arguments a call left out, as the server's
	// conditions see them (tools.ArgsWithDefaults).
	Defaults func(tool string, args map[string]any) map[string]any
}

// Verdict is a decision and whether the call went through with it.
type Verdict struct {
	Decision string `json:"decision"` // allow, deny, approve, rate_limited
	Shadow   bool   `json:"shadow"`   // decided in shadow mode: recorded, not enforced
	Through  bool   `json:"through"`  // the call ran (or would run)
}

func (v Verdict) String() string {
	s := v.Decision
	if v.Shadow {
		s += " (shadow)"
	}
	return s
}

// Change is a call whose decision the candidate changes.
type Change struct {
	CallID    string    `json:"call_id"`
	Time      time.Time `json:"time"`
	Grant     string    `json:"grant"`
	Tool      string    `json:"tool"`
	VM        string    `json:"vm,omitempty"`
	Recorded  Verdict   `json:"recorded"`
	Candidate Verdict   `json:"candidate"`
	Rule      string    `json:"rule,omitempty"`   // the candidate's rule
	Reason    string    `json:"reason,omitempty"` // the candidate's reason
}

// Result is what a replay found.
type Result struct {
	Replayed int            `json:"replayed"`
	Skipped  map[string]int `json:"skipped"` // records not replayed, by why
	Changes  []Change       `json:"changes"`
	// Stopped counts the calls that went through and the candidate would
	// refuse (or park for an approval); Started the refused ones it would
	// let through.
	Stopped int `json:"stopped"`
	Started int `json:"started"`
}

// Replay decides the calls of the log in r again with eng.
func Replay(ctx context.Context, r io.Reader, eng *policy.Engine, o Options) (*Result, error) {
	rp := &replayer{ctx: ctx, eng: eng, o: o, st: memory.New(), reserved: map[string][]policy.Counter{},
		res: &Result{Skipped: map[string]int{}}, seen: map[string]bool{}}
	ran := map[string]bool{}
	var recs []audit.Record
	_, err := audit.Search(r, audit.Filter{Grant: o.Grant, Since: o.Since, Until: o.Until}, func(m *audit.Match) error {
		if m.Record.Kind == audit.KindOutcome {
			ran[m.Record.CallID] = true
		}
		if m.Record.Kind == audit.KindDecision || m.Record.Kind == audit.KindOutcome && m.Record.Refunded {
			recs = append(recs, m.Record)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	for i := range recs {
		if err := rp.record(&recs[i], ran[recs[i].CallID]); err != nil {
			return nil, err
		}
	}
	return rp.res, nil
}

// replayer is one replay's state.
type replayer struct {
	ctx      context.Context
	eng      *policy.Engine
	o        Options
	st       *memory.Store
	reserved map[string][]policy.Counter // by call id
	seen     map[string]bool             // call ids decided
	res      *Result
}

func (rp *replayer) record(rec *audit.Record, hasOutcome bool) error {
	if rec.Kind == audit.KindOutcome {
		// Refunded: the call failed before any side effect.
		if cs := rp.reserved[rec.CallID]; cs != nil {
			if err := rp.st.Refund(rp.ctx, rec.CallID, rec.Time, cs); err != nil {
				return fmt.Errorf("replay: refund of %s: %w", rec.CallID, err)
			}
			delete(rp.reserved, rec.CallID)
		}
		return nil
	}
	if why := notReplayed(rec); why != "" {
		rp.res.Skipped[why]++
		return nil
	}
	if rp.seen[rec.CallID] {
		return nil // a later record of the same call (a client's answer)
	}
	rp.seen[rec.CallID] = true
	rp.res.Replayed++
	recorded := recordedVerdict(rec, hasOutcome)
	cand, d, err := rp.decide(rec, recorded)
	if err != nil {
		return err
	}
	// In or out of shadow mode, an allow is an allow; a refusal that is no
	// longer only recorded changes whether the call goes through.
	if cand.Decision == recorded.Decision && cand.Through == recorded.Through {
		return nil
	}
	switch {
	case recorded.Through && !cand.Through:
		rp.res.Stopped++
	case !recorded.Through && cand.Through:
		rp.res.Started++
	}
	rp.res.Changes = append(rp.res.Changes, Change{CallID: rec.CallID, Time: rec.Time, Grant: rec.Grant, Tool: rec.Tool, VM: rec.VM,
		Recorded: recorded, Candidate: cand, Rule: d.Rule, Reason: d.Reason})
	return nil
}

// notReplayed says why a decision record is not replayed ("" when it is).
func notReplayed(rec *audit.Record) string {
	switch {
	case rec.Transport == "operator":
		return "an operator's record (approval, undo)"
	case rec.Tool == "":
		return "a malformed call"
	case rec.Decision == "invalid", rec.Decision == "unknown_vm", rec.Decision == "error":
		return "refused before the policy decided (" + rec.Decision + ")"
	}
	return ""
}

// recordedVerdict is what the policy in force decided, and whether the
// call went through. A deny with an approval id is an operator's denial
// of an approval the policy asked for.
func recordedVerdict(rec *audit.Record, hasOutcome bool) Verdict {
	v := Verdict{Decision: rec.Decision, Shadow: rec.Shadow}
	if rec.Decision == "deny" && rec.ApprovalID != "" && !rec.Shadow {
		v.Decision = "approve"
	}
	v.Through = rec.Shadow || rec.Decision == "allow" || rec.Decision == "approve" && hasOutcome
	return v
}

// decide decides rec's call with the candidate at the recorded time and
// reserves its counters.
func (rp *replayer) decide(rec *audit.Record, recorded Verdict) (Verdict, policy.Decision, error) {
	args := rec.Args
	if args == nil {
		args = map[string]any{}
	}
	if rp.o.Defaults != nil {
		args = rp.o.Defaults(rec.Tool, args)
	}
	session, _ := args["session"].(string)
	d := rp.eng.Decide(policy.Call{Grant: rec.Grant, Transport: rec.Transport, Tool: rec.Tool, VM: rec.VM, Session: session, Args: args})
	reserve := d.Verdict == policy.Allow || d.Verdict == policy.Approve && recorded.Through && recorded.Decision == "approve"
	if reserve && len(d.Counters) > 0 {
		err := rp.st.ReserveAll(rp.ctx, rec.CallID, rec.Time, d.Counters)
		var le *store.LimitedError
		switch {
		case err == nil:
			rp.reserved[rec.CallID] = d.Counters
		case errors.As(err, &le):
			d = d.Limited(le.Counter, le.RetryAfter)
		default:
			return Verdict{}, d, fmt.Errorf("replay: %s: store: %w", rec.CallID, err)
		}
	}
	v := Verdict{Decision: d.Verdict.String(), Shadow: d.Shadow}
	v.Through = d.Shadow || d.Verdict == policy.Allow || d.Verdict == policy.Approve && recorded.Through && recorded.Decision == "approve"
	return v, d, nil
}
