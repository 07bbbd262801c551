// Package suggest writes the tightest policy that would have allowed what
// a grant did: the calls its audit log records (`vmgate policy suggest`).
//
// The evidence is the calls of one grant in a period that ran: allowed,
// let through by an approval, or recorded by a policy in shadow mode
// (which decides, records what enforcement would have done, and allows);
// with Options.OnlyAllowed, only those the policy in force allowed (so a
// shadow policy's would-be denials stay denied). Calls refused before the
// policy decided (invalid arguments, unknown VMs) and calls the policy
// refused are not evidence of anything the grant needs.
//
// From it, Suggest writes a document that lists only the tools used; per
// argument, the narrowest condition that covers every value seen (infer.go);
// a rate limit per tool and one over all tools at the peak seen in any
// window times a headroom; and approval for destructive tools used rarely
// over a long enough period. Every rule carries a "_why" comment (keys that
// start with "_" are comments to the policy parser) with its evidence. The
// document parses, and Suggest checks that it allows every call of the
// evidence before returning it.
//
// The audit log keeps stdin, env values and file content only as digests:
// no condition is ever suggested on their values, only on whether they
// were sent at all.
package suggest

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
)

// Tool is what Suggest knows of a tool of the server's catalogue.
type Tool struct {
	Name        string
	Args        []string // every argument the tool takes
	Destructive bool
}

// Call is one call of the evidence: what the policy saw of it.
type Call struct {
	ID   string
	Time time.Time
	Tool string
	VM   string
	// Args are the arguments as logged (secrets as digests), with the
	// tool's defaults filled in (Options.Defaults), as conditions see them.
	Args map[string]any
	// Decision is the recorded decision: allow, or what a shadow policy
	// would have done (Shadow), or approve for a call an approval let
	// through.
	Decision string
	Shadow   bool
}

// Evidence is what Collect read.
type Evidence struct {
	Grant       string
	Calls       []Call         // in log order
	First, Last time.Time      // of the calls
	Skipped     map[string]int // records left out, by why
	// Grants are the grants with calls in the period (when Collect was
	// asked for none and found several).
	Grants []string
}

// ErrGrant is returned by Collect when no grant was given and the log
// holds the calls of several.
var ErrGrant = errors.New("the log holds the calls of several grants")

// Collect reads the calls of o.Grant between o.Since and o.Until from the
// log in r. An empty grant means the one grant the log holds calls of.
// o.Defaults, when set, fills in the arguments a call left out.
func Collect(r io.Reader, o Options) (*Evidence, error) {
	grant := o.Grant
	var decisions []audit.Record
	ran := map[string]bool{} // call ids with an outcome record
	f := audit.Filter{Grant: grant, Since: o.Since, Until: o.Until}
	_, err := audit.Search(r, f, func(m *audit.Match) error {
		switch m.Record.Kind {
		case audit.KindDecision:
			decisions = append(decisions, m.Record)
		case audit.KindOutcome:
			ran[m.Record.CallID] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("suggest: %w", err)
	}
	ev := &Evidence{Grant: grant, Skipped: map[string]int{}}
	grants := map[string]bool{}
	seen := map[string]bool{}
	for i := range decisions {
		rec := &decisions[i]
		if seen[rec.CallID] {
			continue // a later record of the same call (a client's answer)
		}
		seen[rec.CallID] = true
		if why := skip(rec, ran[rec.CallID], o.OnlyAllowed); why != "" {
			ev.Skipped[why]++
			continue
		}
		grants[rec.Grant] = true
		args := rec.Args
		if args == nil {
			args = map[string]any{}
		}
		if o.Defaults != nil {
			args = o.Defaults(rec.Tool, args)
		}
		ev.Calls = append(ev.Calls, Call{ID: rec.CallID, Time: rec.Time, Tool: rec.Tool, VM: rec.VM, Args: args, Decision: rec.Decision, Shadow: rec.Shadow})
	}
	if grant == "" && len(grants) > 1 {
		for g := range grants {
			ev.Grants = append(ev.Grants, g)
		}
		slices.Sort(ev.Grants)
		return ev, fmt.Errorf("suggest: %w (%v): a policy is one grant's; choose one", ErrGrant, ev.Grants)
	}
	if grant == "" {
		for g := range grants {
			ev.Grant = g
		}
	}
	if len(ev.Calls) > 0 {
		ev.First, ev.Last = ev.Calls[0].Time, ev.Calls[0].Time
		for _, c := range ev.Calls {
			ev.First, ev.Last = minTime(ev.First, c.Time), maxTime(ev.Last, c.Time)
		}
	}
	return ev, nil
}

// skip says why a decision record is not evidence ("" when it is).
func skip(rec *audit.Record, hasOutcome, onlyAllowed bool) string {
	switch {
	case rec.Transport == "operator":
		return "an operator's record (approval, undo)"
	case rec.Tool == "":
		return "a malformed call"
	case rec.Decision == "allow":
		return ""
	case rec.Decision == "invalid" || rec.Decision == "unknown_vm" || rec.Decision == "error":
		return "refused before the policy decided (" + rec.Decision + ")"
	case rec.Shadow && onlyAllowed:
		return "a shadow policy would have refused it (" + rec.Decision + ")"
	case rec.Shadow:
		return ""
	case rec.Decision == "approve" && hasOutcome:
		return ""
	case rec.Decision == "approve":
		return "parked for an approval"
	}
	return "refused by the policy (" + rec.Decision + ")"
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
