// Package diff says, in words, which calls one policy allows and another
// does not (`vmgate policy diff OLD NEW`): tool by tool, what each decides
// (allowed, denied, needs approval, hidden), the conditions one has and
// the other does not, limits tightened, loosened, added or gone, and what
// else differs (mode, approval, sandbox, files, undo blocks). It compares
// what the engines decide with (policy.Engine.Describe), not the JSON:
// comments, key order and defaults written out change nothing.
package diff

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/policy"
)

// Effect is which way a change goes for the calls NEW allows.
type Effect int

// The effects.
const (
	Tighter Effect = iota // NEW allows fewer calls
	Looser                // NEW allows more calls
	Other                 // neither: what agents see, how approvals work
)

// Mark is the effect's sign in a listing: "-" fewer calls, "+" more, "~".
func (e Effect) Mark() string { return [...]string{"-", "+", "~"}[e] }

// Change is one difference.
type Change struct {
	Tool   string // "" for what applies to every tool
	Effect Effect
	Text   string // in words, OLD and NEW named as such
}

// Compare lists the differences between old and new for the tools named
// in either and in catalogue (the server's tools, which a default applies
// to), tool by tool in name order, the document-wide ones first.
func Compare(old, new policy.Summary, catalogue []string) []Change {
	var out []Change
	out = append(out, documentChanges(old, new)...)
	names := slices.Clone(catalogue)
	for _, s := range []policy.Summary{old, new} {
		names = append(names, s.Hidden...)
		for n := range s.Tools {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var unlisted []string // in neither document, only the mode differs
	var tools []Change
	for _, name := range slices.Compact(names) {
		o, n := view(old, name), view(new, name)
		if !o.listed && !n.listed && !o.hidden && !n.hidden && o.verdict == n.verdict && o.rule.Shadow != n.rule.Shadow && (o.restricts() || n.restricts()) {
			unlisted = append(unlisted, name)
			continue
		}
		tools = append(tools, toolChanges(name, o, n)...)
	}
	if len(unlisted) > 0 {
		// The same verdict on both sides (the same default): only the
		// mode differs.
		shadow, enforcing, e := "OLD", "NEW", Tighter
		if new.Shadow {
			shadow, enforcing, e = "NEW", "OLD", Looser
		}
		words := view(old, unlisted[0]).words()
		out = append(out, Change{Effect: e, Text: fmt.Sprintf("the %d tools neither lists (%s): %s runs them in shadow mode, so every call goes through (it would say: it %s); %s %s",
			len(unlisted), strings.Join(unlisted, ", "), shadow, words, enforcing, words)})
	}
	return append(out, tools...)
}

func documentChanges(old, new policy.Summary) []Change {
	var out []Change
	if old.Default != new.Default {
		e := Tighter
		if new.Default == policy.Allow {
			e = Looser
		}
		out = append(out, Change{Effect: e, Text: fmt.Sprintf("default: OLD %s the tools it does not list, NEW %s them", verb(old.Default), verb(new.Default))})
	}
	if old.Shadow != new.Shadow {
		out = append(out, Change{Effect: modeEffect(old.Shadow), Text: "mode: OLD " + modeWords(old.Shadow) + ", NEW " + modeWords(new.Shadow)})
	}
	out = append(out, limitChanges("", "every call", old.AllTools, new.AllTools)...)
	if old.Sandbox != new.Sandbox {
		out = append(out, Change{Effect: Other, Text: "sandbox: " + presence("OLD", "NEW", old.Sandbox, "a top-level sandbox block") + " (the default sandbox applies without one)"})
	}
	return out
}

func verb(v policy.Verdict) string {
	if v == policy.Allow {
		return "allows"
	}
	return "denies"
}

func modeWords(shadow bool) string {
	if shadow {
		return "is in shadow mode (it decides and records, and lets every call through)"
	}
	return "enforces its decisions"
}

// modeEffect: going from shadow to enforce lets fewer calls through.
func modeEffect(oldShadow bool) Effect {
	if oldShadow {
		return Tighter
	}
	return Looser
}

func presence(a, b string, has bool, what string) string {
	if has {
		return a + " has " + what + ", " + b + " does not"
	}
	return b + " has " + what + ", " + a + " does not"
}

// state is what a policy does with a tool.
type state struct {
	verdict policy.Verdict // Allow, Deny or Approve
	hidden  bool
	listed  bool
	why     string // for a denial: how
	rule    policy.ToolSummary
	all     []policy.LimitSummary // all_tools limits, which every call of the tool reserves
}

func view(s policy.Summary, name string) state {
	if slices.Contains(s.Hidden, name) {
		st := state{verdict: policy.Deny, hidden: true, why: "hidden: not in tools/list"}
		st.rule.Shadow = s.Shadow
		return st
	}
	t, ok := s.Tools[name]
	if !ok {
		st := state{verdict: s.Default, why: "not listed; the default is deny", all: s.AllTools}
		st.rule.Shadow = s.Shadow
		return st
	}
	st := state{verdict: t.Action, listed: true, rule: t, all: s.AllTools}
	if t.Action == policy.Deny {
		st.why = "action deny"
		if t.Reason != "" {
			st.why += ": " + t.Reason
		}
	}
	return st
}

func (s state) words() string {
	switch {
	case s.verdict == policy.Deny:
		return "denies every call (" + s.why + ")"
	case s.verdict == policy.Approve:
		return "needs an operator's approval for each call"
	case !s.listed:
		return "allows it (not listed; the default is allow)"
	}
	return "allows it"
}

// restricts reports whether s lets fewer than every call through when
// enforced: a denial, an approval, a condition or a limit.
func (s state) restricts() bool {
	return s.verdict != policy.Allow || len(s.rule.Require)+len(s.rule.DenyIf)+len(s.rule.Limits)+len(s.all) > 0
}

// shadowChange is the change of a tool one policy runs in shadow mode
// (every call goes through, what enforcement would do is recorded) and
// the other enforces, when the enforcing one holds any call back.
func shadowChange(name string, o, n state) []Change {
	if o.rule.Shadow == n.rule.Shadow {
		return nil
	}
	shadow, enforcing, e := "OLD", "NEW", Tighter
	s, en := o, n
	if n.rule.Shadow {
		shadow, enforcing, e = "NEW", "OLD", Looser
		s, en = n, o
	}
	if !en.restricts() {
		return nil
	}
	return []Change{{Tool: name, Effect: e, Text: fmt.Sprintf("%s runs it in shadow mode: every call goes through (%s would say: it %s); %s enforces: it %s%s%s",
		shadow, shadow, s.words(), enforcing, en.words(), conditionsWord(en.rule), limitsWord(en))}}
}

func limitsWord(s state) string {
	if n := len(s.rule.Limits) + len(s.all); n > 0 && s.verdict != policy.Deny {
		return fmt.Sprintf(", within %d limit(s)", n)
	}
	return ""
}

// toolChanges compares what two policies do with one tool.
func toolChanges(name string, o, n state) []Change {
	out := shadowChange(name, o, n)
	add := func(e Effect, format string, args ...any) {
		out = append(out, Change{Tool: name, Effect: e, Text: fmt.Sprintf(format, args...)})
	}
	switch {
	case o.verdict == policy.Deny && n.verdict == policy.Deny:
		if o.hidden != n.hidden {
			add(Other, "OLD %s, NEW %s: both deny every call, and only %s shows it in tools/list",
				o.words(), n.words(), map[bool]string{true: "OLD", false: "NEW"}[n.hidden])
		}
		return out
	case o.verdict == policy.Deny:
		add(Looser, "OLD %s; NEW %s%s", o.words(), n.words(), conditionsWord(n.rule))
		return append(out, allowedWhen(name, n)...)
	case n.verdict == policy.Deny:
		add(Tighter, "OLD %s%s; NEW %s", o.words(), conditionsWord(o.rule), n.words())
		return out
	case o.verdict != n.verdict && n.verdict == policy.Approve:
		add(Tighter, "OLD allows calls without an approval; NEW needs an operator's approval for each")
	case o.verdict != n.verdict:
		add(Looser, "OLD needs an operator's approval for each call; NEW allows them without one")
	case o.verdict == policy.Approve && !sameApproval(o.rule.Approval, n.rule.Approval):
		add(Other, "approval: OLD %s, NEW %s", approvalWords(o.rule.Approval), approvalWords(n.rule.Approval))
	}
	out = append(out, conditionChanges(name, "require", o.rule.Require, n.rule.Require)...)
	out = append(out, conditionChanges(name, "deny_if", o.rule.DenyIf, n.rule.DenyIf)...)
	out = append(out, limitChanges(name, "its calls", o.rule.Limits, n.rule.Limits)...)
	out = append(out, blockChanges(name, o.rule, n.rule)...)
	return out
}

// allowedWhen lists what holds back the calls of a tool NEW lets through
// and OLD denied: its conditions and limits, one a line.
func allowedWhen(name string, n state) []Change {
	var out []Change
	for _, c := range n.rule.Require {
		out = append(out, Change{Tool: name, Effect: Other, Text: "NEW lets it through only when " + condText(c)})
	}
	for _, c := range n.rule.DenyIf {
		out = append(out, Change{Tool: name, Effect: Other, Text: "NEW refuses it when " + condText(c)})
	}
	for _, l := range n.rule.Limits {
		out = append(out, Change{Tool: name, Effect: Other, Text: "NEW limits its calls to " + limitWords(l)})
	}
	return out
}

func conditionsWord(t policy.ToolSummary) string {
	n := len(t.Require) + len(t.DenyIf)
	switch n {
	case 0:
		return ""
	case 1:
		return " (under 1 condition)"
	}
	return fmt.Sprintf(" (under %d conditions)", n)
}

func sameApproval(a, b *policy.ApprovalSpec) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func approvalWords(a *policy.ApprovalSpec) string {
	if a == nil {
		return "none"
	}
	return fmt.Sprintf("through the %s, valid %s", map[string]string{"operator": "operator", "client": "client's user"}[a.Channel], a.TTL)
}

// blockChanges are the tool blocks one has and the other does not.
func blockChanges(name string, o, n policy.ToolSummary) []Change {
	var out []Change
	for _, b := range []struct {
		what     string
		old, new bool
		without  string
	}{
		{"a sandbox block", o.Sandbox, n.Sandbox, "the top-level or default sandbox applies"},
		{"a files block", o.Files, n.Files, "the default file rules apply: no symlink followed"},
		{"a lease block", o.Lease, n.Lease, "the default lease applies"},
		{"snapshot_before (an undo snapshot before each call)", o.SnapshotBefore, n.SnapshotBefore, "no undo snapshot"},
	} {
		if b.old != b.new {
			out = append(out, Change{Tool: name, Effect: Other, Text: presence("OLD", "NEW", b.old, b.what) + " (without it: " + b.without + ")"})
		}
	}
	if o.MaxTimeoutS != n.MaxTimeoutS {
		words := func(s int64) string {
			if s == 0 {
				return "none (the server's cap)"
			}
			return fmt.Sprintf("%d s", s)
		}
		// Between two caps NEW denies fewer or more timeouts; to or from
		// none the server's cap, which the policy does not know, decides.
		e := Other
		switch {
		case o.MaxTimeoutS == 0 || n.MaxTimeoutS == 0:
		case n.MaxTimeoutS > o.MaxTimeoutS:
			e = Looser
		default:
			e = Tighter
		}
		out = append(out, Change{Tool: name, Effect: e, Text: fmt.Sprintf("max_timeout_s: OLD %s, NEW %s", words(o.MaxTimeoutS), words(n.MaxTimeoutS))})
	}
	if o.KeepFiles != n.KeepFiles {
		out = append(out, Change{Tool: name, Effect: Other, Text: fmt.Sprintf("keep_files: OLD %s, NEW %s", keepWords(o.KeepFiles), keepWords(n.KeepFiles))})
	}
	return out
}

func keepWords(d time.Duration) string {
	if d == 0 {
		return "removes a destroyed session's files"
	}
	return "keeps a destroyed session's files " + d.String()
}

// conditionChanges compares one list (require or deny_if) of conditions.
func conditionChanges(tool, list string, old, new []policy.ConditionSummary) []Change {
	var out []Change
	paired := map[int]bool{}
	for _, n := range new {
		if i := slices.IndexFunc(old, func(o policy.ConditionSummary) bool { return sameCondition(o, n) }); i >= 0 {
			paired[i] = true
			continue
		}
		i := slices.IndexFunc(old, func(o policy.ConditionSummary) bool { return o.Path == n.Path && o.Op == n.Op })
		if i >= 0 && !paired[i] {
			paired[i] = true
			out = append(out, changedCondition(tool, list, old[i], n))
			continue
		}
		// A condition more, in require or deny_if, denies more.
		out = append(out, Change{Tool: tool, Effect: Tighter, Text: conditionWords("NEW", "OLD", list, n)})
	}
	for i, o := range old {
		if !paired[i] {
			out = append(out, Change{Tool: tool, Effect: Looser, Text: conditionWords("OLD", "NEW", list, o)})
		}
	}
	return out
}

func conditionWords(has, lacks, list string, c policy.ConditionSummary) string {
	if list == "require" {
		return fmt.Sprintf("%s requires %s, %s does not: %s denies the calls where it does not hold", has, condText(c), lacks, has)
	}
	return fmt.Sprintf("%s denies calls where %s, %s does not", has, condText(c), lacks)
}

// condText is a condition on one line, however the document spread it.
func condText(c policy.ConditionSummary) string {
	if c.Op == "exists" {
		return c.Path + " exists"
	}
	return c.Path + " " + c.Op + " " + jsonOf(c.Value)
}

func sameCondition(a, b policy.ConditionSummary) bool {
	return a.Path == b.Path && a.Op == b.Op && jsonOf(a.Value) == jsonOf(b.Value)
}

// jsonOf is v as compact JSON, "<", ">" and "&" as themselves.
func jsonOf(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return strings.TrimSuffix(b.String(), "\n")
}

// changedCondition words a condition whose value changed, saying which
// way for sets and bounds.
func changedCondition(tool, list string, o, n policy.ConditionSummary) Change {
	c := Change{Tool: tool, Effect: Other, Text: fmt.Sprintf("%s %s: OLD %s, NEW %s", list, o.Path, condText(o), condText(n))}
	denies := list == "deny_if"
	switch o.Op {
	case "in", "not_in":
		ov, nv := o.Value.([]any), n.Value.([]any)
		gone, added := setMinus(ov, nv), setMinus(nv, ov)
		// For require in / deny_if not_in, the set is what is allowed.
		allowedSet := (o.Op == "in") != denies
		switch {
		case len(added) == 0 && len(gone) > 0:
			c.Effect = map[bool]Effect{true: Tighter, false: Looser}[allowedSet]
		case len(gone) == 0 && len(added) > 0:
			c.Effect = map[bool]Effect{true: Looser, false: Tighter}[allowedSet]
		}
		c.Text += fmt.Sprintf(" (NEW drops %s, adds %s)", listWords(gone), listWords(added))
	case "lt", "lte", "gt", "gte":
		ov, nv := o.Value.(float64), n.Value.(float64)
		upper := o.Op == "lt" || o.Op == "lte" // an upper bound of what holds
		if ov != nv {
			// A bound that holds for fewer values allows fewer calls in
			// require, more in deny_if.
			fewer := (nv < ov) == upper
			c.Effect = map[bool]Effect{true: Tighter, false: Looser}[fewer != denies]
		}
	}
	return c
}

func setMinus(a, b []any) []string {
	var out []string
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y any) bool { return jsonOf(x) == jsonOf(y) }) {
			out = append(out, jsonOf(x))
		}
	}
	return out
}

func listWords(vs []string) string {
	if len(vs) == 0 {
		return "nothing"
	}
	return strings.Join(vs, ", ")
}

// limitChanges compares two lists of limits on what (a tool's calls, or
// every call). Limits pair by counter name, then by window and scope.
func limitChanges(tool, what string, old, new []policy.LimitSummary) []Change {
	var out []Change
	usedOld := make([]bool, len(old))
	pair := func(n policy.LimitSummary, same func(o policy.LimitSummary) bool) int {
		for i, o := range old {
			if !usedOld[i] && same(o) {
				usedOld[i] = true
				return i
			}
		}
		return -1
	}
	var unpaired []policy.LimitSummary
	var pairs [][2]policy.LimitSummary
	for _, n := range new {
		i := pair(n, func(o policy.LimitSummary) bool { return o.Counter == n.Counter && o.Quota == n.Quota })
		if i < 0 {
			i = pair(n, func(o policy.LimitSummary) bool {
				return o.Quota == n.Quota && o.Window == n.Window && slices.Equal(o.Scope, n.Scope)
			})
		}
		if i < 0 {
			i = pair(n, func(o policy.LimitSummary) bool { return o.Quota == n.Quota && o.Window == n.Window })
		}
		if i < 0 {
			unpaired = append(unpaired, n)
			continue
		}
		pairs = append(pairs, [2]policy.LimitSummary{old[i], n})
	}
	for _, p := range pairs {
		if c, ok := changedLimit(p[0], p[1]); ok {
			c.Tool, c.Text = tool, what+": "+c.Text
			out = append(out, c)
		}
	}
	for _, n := range unpaired {
		out = append(out, Change{Tool: tool, Effect: Tighter, Text: fmt.Sprintf("NEW limits %s to %s; OLD has no such limit", what, limitWords(n))})
	}
	for i, o := range old {
		if !usedOld[i] {
			out = append(out, Change{Tool: tool, Effect: Looser, Text: fmt.Sprintf("OLD limits %s to %s; NEW has no such limit", what, limitWords(o))})
		}
	}
	return out
}

func limitWords(l policy.LimitSummary) string {
	scope := "in all"
	if len(l.Scope) > 0 {
		scope = "per " + strings.Join(l.Scope, " and ")
	}
	if l.Quota {
		w := ""
		if l.Weight != "" {
			w = " weighed by " + l.Weight
		}
		return fmt.Sprintf("%d at once%s %s (quota %s)", l.Max, w, scope, l.Counter)
	}
	return fmt.Sprintf("%d %s %s (counter %s)", l.Max, windowWords(l.Window), scope, l.Counter)
}

// windowWords is "a minute", "in any 10m0s".
func windowWords(d time.Duration) string {
	switch w := policy.WindowName(d); w {
	case "second", "minute", "day":
		return "a " + w
	case "hour":
		return "an hour"
	default:
		return "in any " + w
	}
}

// changedLimit words a pair of limits that differ: tighter when NEW allows
// no more in a window and no faster a rate, looser the other way round.
func changedLimit(o, n policy.LimitSummary) (Change, bool) {
	if o.Max == n.Max && o.Window == n.Window && slices.Equal(o.Scope, n.Scope) && o.Weight == n.Weight {
		return Change{}, false
	}
	c := Change{Effect: Other}
	verb := "changed"
	// A scope that is a subset of the other's keys a coarser budget (per
	// grant covers every VM of the grant; global covers all).
	coarser := !slices.ContainsFunc(n.Scope, func(s string) bool { return !slices.Contains(o.Scope, s) })
	finer := !slices.ContainsFunc(o.Scope, func(s string) bool { return !slices.Contains(n.Scope, s) })
	if o.Weight == n.Weight {
		oldRate := float64(o.Max) / max(o.Window.Seconds(), 1)
		newRate := float64(n.Max) / max(n.Window.Seconds(), 1)
		switch {
		case coarser && n.Max <= o.Max && newRate <= oldRate:
			c.Effect, verb = Tighter, "tightened"
		case finer && n.Max >= o.Max && newRate >= oldRate:
			c.Effect, verb = Looser, "loosened"
		}
	}
	c.Text = fmt.Sprintf("limit %s from %s (OLD) to %s (NEW)", verb, limitWords(o), limitWords(n))
	return c, true
}

// Write prints changes as Compare returns them: the document-wide ones,
// then each tool's name and its changes, one a line, marked "-" (NEW
// allows fewer calls), "+" (more) or "~" (neither).
func Write(w io.Writer, changes []Change) error {
	tool := "\x00"
	for _, c := range changes {
		if c.Tool != tool {
			tool = c.Tool
			name := tool
			if name == "" {
				name = "every tool"
			}
			if _, err := fmt.Fprintln(w, name); err != nil {
				return err
			}
		}
		if _, err := fmt.Fprintf(w, "  %s %s\n", c.Effect.Mark(), c.Text); err != nil {
			return err
		}
	}
	return nil
}
