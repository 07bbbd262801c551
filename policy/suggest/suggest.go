package suggest

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vmgate/vmgate/policy"
)

// Options configure Collect and Suggest. The zero value of each tuning
// knob takes its default.
type Options struct {
	Grant        string    // whose calls; "" for the one grant the log holds
	Since, Until time.Time // the period; zero: unbounded
	// OnlyAllowed keeps only the calls the policy in force allowed (in
	// shadow mode: would have allowed); else every call that ran.
	OnlyAllowed bool
	// Defaults fills in the arguments a call left out, as the server's
	// conditions see them (tools.ArgsWithDefaults).
	Defaults func(tool string, args map[string]any) map[string]any
	// Tools is the server's catalogue: it says which tools are destructive
	// and which arguments a tool takes (those no call sent are denied).
	// A tool of the log that is not in it is left out. nil: no catalogue.
	Tools []Tool
	// Source names the log in the document's comment.
	Source string

	Headroom  float64       // limits and numeric bounds: the peak seen times this; default 2
	Window    time.Duration // the rate limits' window; default a minute
	MaxIn     int           // the largest set an "in" condition lists; default 16
	MaxShapes int           // the most shapes a regex condition lists; default 8
	// ApproveRare puts a destructive tool behind an operator's approval
	// when it was called at most this many times; default 2, -1: never.
	// Only evidence that covers RarePeriod or more can call a tool rare.
	ApproveRare int
	RarePeriod  time.Duration // default 24 h
}

func (o *Options) fill() {
	if o.Headroom <= 1 {
		o.Headroom = 2
	}
	if o.Window <= 0 {
		o.Window = time.Minute
	}
	if o.MaxIn <= 0 {
		o.MaxIn = 16
	}
	if o.MaxShapes <= 0 {
		o.MaxShapes = 8
	}
	if o.ApproveRare == 0 {
		o.ApproveRare = 2
	}
	if o.RarePeriod <= 0 {
		o.RarePeriod = 24 * time.Hour
	}
}

// Result is a suggested policy.
type Result struct {
	Document []byte   // the policy document, JSON, ending in a newline
	Notes    []string // what got no condition, and why; what was left out
}

// ErrNoCalls is returned when the evidence holds no call.
var ErrNoCalls = errors.New("no call to learn from")

// Suggest writes the tightest policy that allows every call of ev (see the
// package doc), and checks that it does.
func Suggest(ev *Evidence, o Options) (*Result, error) {
	o.fill()
	if len(ev.Calls) == 0 {
		return nil, fmt.Errorf("suggest: grant %q: %w (%s)", ev.Grant, ErrNoCalls, skippedWords(ev.Skipped))
	}
	catalogue := map[string]*Tool{}
	for i := range o.Tools {
		catalogue[o.Tools[i].Name] = &o.Tools[i]
	}
	byTool := map[string][]*Call{}
	var res Result
	var all []time.Time
	for i := range ev.Calls {
		c := &ev.Calls[i]
		if o.Tools != nil && catalogue[c.Tool] == nil {
			res.Notes = append(res.Notes, fmt.Sprintf("call %s: tool %s is no tool of this server: left out", c.ID, c.Tool))
			continue
		}
		byTool[c.Tool] = append(byTool[c.Tool], c)
		all = append(all, c.Time)
	}
	doc := document{Version: "1", Default: "deny", Tools: map[string]*toolRule{}}
	doc.Why = fmt.Sprintf("suggested by vmgate policy suggest from %s for grant %s: %s from %s to %s",
		orDash(o.Source), ev.Grant, callsWord(len(ev.Calls)), stamp(ev.First), stamp(ev.Last))
	if len(ev.Skipped) > 0 {
		doc.Why += "; not evidence: " + skippedWords(ev.Skipped)
	}
	doc.AllTools = &allTools{Limits: []limitJSON{rateLimit("all_calls", all, &o)}}
	rare := ev.Last.Sub(ev.First) >= o.RarePeriod
	for name, calls := range byTool {
		rule, notes := toolRuleOf(name, calls, catalogue[name], rare, &o)
		doc.Tools[name] = rule
		res.Notes = append(res.Notes, notes...)
	}
	var err error
	if res.Document, err = doc.encode(); err != nil {
		return nil, fmt.Errorf("suggest: %w", err)
	}
	if err := check(res.Document, ev.Grant, byTool); err != nil {
		return nil, err
	}
	slices.Sort(res.Notes)
	return &res, nil
}

// document is the suggested policy (encode.go writes it).
type document struct {
	Version, Why, Default string
	AllTools              *allTools
	Tools                 map[string]*toolRule
}

type allTools struct {
	Limits []limitJSON
}

type toolRule struct {
	Why, Action     string
	Require, DenyIf []condition
	Limits          []limitJSON
}

type limitJSON struct {
	Counter string `json:"counter"`
	Window  string `json:"window"`
	Max     int64  `json:"max"`
	Scope   string `json:"scope"`
	Why     string `json:"_why"`
}

// toolRuleOf is the rule of one tool from its calls.
func toolRuleOf(name string, calls []*Call, t *Tool, rareCounts bool, o *Options) (*toolRule, []string) {
	first, last := calls[0].Time, calls[0].Time
	approved := 0
	for _, c := range calls {
		first, last = minTime(first, c.Time), maxTime(last, c.Time)
		if c.Decision == "approve" && !c.Shadow {
			approved++
		}
	}
	rule := &toolRule{Why: fmt.Sprintf("%s from %s to %s", callsWord(len(calls)), stamp(first), stamp(last))}
	switch {
	case approved == len(calls):
		rule.Action = "approve"
		rule.Why += "; every one of them needed an approval"
	case t != nil && t.Destructive && rareCounts && o.ApproveRare > 0 && len(calls) <= o.ApproveRare:
		rule.Action = "approve"
		rule.Why += fmt.Sprintf("; destructive and rare (at most %d calls), so an operator approves each", o.ApproveRare)
	}
	var notes []string
	sent := map[string]bool{}
	for _, f := range gather(calls) {
		sent[f.path] = true
		req, deny, note := f.conditions(len(calls), o)
		rule.Require = append(rule.Require, req...)
		rule.DenyIf = append(rule.DenyIf, deny...)
		if note != "" {
			notes = append(notes, name+": "+note)
		}
	}
	if t != nil {
		for _, a := range t.Args {
			if a != "vm" && !sent["args."+a] {
				rule.DenyIf = append(rule.DenyIf, condition{Path: "args." + a, Op: "exists", Why: "never sent in " + callsWord(len(calls))})
			}
		}
	}
	times := make([]time.Time, len(calls))
	for i, c := range calls {
		times[i] = c.Time
	}
	rule.Limits = []limitJSON{rateLimit(name+"_rate", times, o)}
	return rule, notes
}

// rateLimit is a limit of counter at the peak of times in any window
// times the headroom.
func rateLimit(counter string, times []time.Time, o *Options) limitJSON {
	peak, at := peakRate(times, o.Window)
	limit := int64(math.Ceil(float64(peak) * o.Headroom))
	return limitJSON{Counter: counter, Window: policy.WindowName(o.Window), Max: max(limit, 1), Scope: "grant",
		Why: fmt.Sprintf("peak %s in any %s (from %s), ×%s headroom", callsWord(peak), policy.WindowName(o.Window), stamp(at), fmtNum(o.Headroom))}
}

// peakRate is the most times within any window-long interval, and where
// that interval starts.
func peakRate(times []time.Time, window time.Duration) (int, time.Time) {
	ts := slices.Clone(times)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	peak, at := 0, time.Time{}
	for i, j := 0, 0; j < len(ts); j++ {
		for ts[j].Sub(ts[i]) >= window {
			i++
		}
		if n := j - i + 1; n > peak {
			peak, at = n, ts[i]
		}
	}
	return peak, at
}

// check parses doc and decides every call of the evidence with it: each
// must be allowed (or approved, where the tool needs an approval).
func check(doc []byte, grant string, byTool map[string][]*Call) error {
	e, err := policy.Parse("suggested.json", doc)
	if err != nil {
		return fmt.Errorf("suggest: the suggested policy does not parse (a bug): %w", err)
	}
	names := make([]string, 0, len(byTool))
	for n := range byTool {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, c := range byTool[name] {
			session, _ := c.Args["session"].(string)
			d := e.Decide(policy.Call{Grant: grant, Tool: c.Tool, VM: c.VM, Session: session, Args: c.Args})
			if d.Verdict != policy.Allow && d.Verdict != policy.Approve {
				return fmt.Errorf("suggest: the suggested policy does not allow call %s (%s): %s at %s (a bug)", c.ID, c.Tool, d.Reason, d.Rule)
			}
		}
	}
	return nil
}

// callsWord is "1 call", "2 calls".
func callsWord(n int) string {
	if n == 1 {
		return "1 call"
	}
	return fmt.Sprintf("%d calls", n)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// skippedWords says what was left out, most first.
func skippedWords(skipped map[string]int) string {
	if len(skipped) == 0 {
		return "nothing left out"
	}
	whys := make([]string, 0, len(skipped))
	for w := range skipped {
		whys = append(whys, w)
	}
	slices.SortFunc(whys, func(a, b string) int {
		if skipped[a] != skipped[b] {
			return skipped[b] - skipped[a]
		}
		return strings.Compare(a, b)
	})
	for i, w := range whys {
		whys[i] = fmt.Sprintf("%d %s", skipped[w], w)
	}
	return strings.Join(whys, ", ")
}
