package policy

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// Engine is a compiled policy document. It is immutable after Parse, so
// any number of goroutines may call its methods concurrently.
type Engine struct {
	name        string
	fingerprint string
	def         Verdict           // Allow or Deny
	shadow      bool              // top-level mode: the mode of hidden and unlisted tools, and the default of listed ones
	hidden      map[string]string // hidden tool → its pointer ("/hide/0")
	tools       map[string]*toolRule
	allLimits   []limit
	sandbox     *sandboxRule    // the top-level sandbox block; nil without one
	snapshots   *snapshotLimits // the top-level snapshots block; nil without one
	names       []string        // every tool the document names, sorted
	mentions    []mention       // where the document names each tool, in document order
}

type toolRule struct {
	name       string
	ptr        string // "/tools/<name>"
	action     Verdict
	actionPtr  string // "/tools/<name>/action", or ptr when action is implicit
	reason     string // as written, may be empty
	denyReason string // reason, or a generated one
	shadow     bool
	require    []condition
	denyIf     []condition
	approval   *ApprovalSpec // set exactly when action is Approve
	limits     []limit
	sandbox    *sandboxRule // create_session's or vm_agent_exec's own sandbox block; nil without one
	// maxTimeoutS is vm_agent_exec's max_timeout_s; 0 without one.
	maxTimeoutS int64
	files       *FileRules    // a file tool's own files block; nil without one
	snapshot    *snapshotRule // the snapshot_before block; nil without one
	keepFiles   time.Duration // destroy_session's keep_files; 0 without one
	lease       *LeaseSpec    // QuotaTool's lease block; nil without one
	// snapOthers is the tool's snapshots block's others (snapshot.go), at
	// snapOthersPtr.
	snapOthers    bool
	snapOthersPtr string
}

type limit struct {
	name   string
	window time.Duration // 0 for a quota
	max    int64
	scope  uint8 // scopeGrant | scopeSession | scopeVM | scopeTemplate; 0 is global
	ptr    string
	quota  bool     // "kind": "quota" (quota.go)
	weight []string // a quota's weight path after "args."; nil: weight 1
}

func (l *limit) kind() string {
	if l.quota {
		return "quota"
	}
	return "rate limit"
}

func (l *limit) weightPath() string {
	if l.weight == nil {
		return ""
	}
	return "args." + strings.Join(l.weight, ".")
}

// Step is one step of an evaluation, reported by Explain.
type Step struct {
	Name   string // "hide", "listed", "action", "require[0]", "deny_if[1]", "approval", "limits"
	Rule   string // the JSON pointer the step looked at
	Result string // "pass", "deny", "approve", "skip", "fired", "not fired"
	Detail string
}

// Name is the file name the Engine was parsed from.
func (e *Engine) Name() string { return e.name }

// Fingerprint is the SHA-256 of the document, in lowercase hex.
func (e *Engine) Fingerprint() string { return e.fingerprint }

// Tools lists every tool name the document mentions (in tools or hide),
// sorted, so the caller can reject names it does not know.
func (e *Engine) Tools() []string { return slices.Clone(e.names) }

// Visible reports whether tool belongs in tools/list: hidden tools never
// do; listed tools always do (a denied tool stays visible so the agent
// learns why); unlisted tools do only when the default is allow.
func (e *Engine) Visible(tool string) bool {
	if _, hidden := e.hidden[tool]; hidden {
		return false
	}
	if _, listed := e.tools[tool]; listed {
		return true
	}
	return e.def == Allow
}

// Decide evaluates call: hide → unlisted tool under the default → action →
// require → deny_if → approval → limits (the tool's and all_tools'). The
// Decision lists the counters to reserve; Decide never returns RateLimited
// (see Decision.Limited). A limit scoped by session denies a call without
// a session: counting such calls in a shared "no session" budget would be
// a surprise, and skipping the limit would fail open.
func (e *Engine) Decide(call Call) Decision {
	return e.decide(&call, nil)
}

// Explain is Decide that also reports the steps of the evaluation.
func (e *Engine) Explain(call Call) (Decision, []Step) {
	var steps []Step
	d := e.decide(&call, &steps)
	return d, steps
}

// step records one step; callers check tr != nil first so that Decide
// builds none of the strings.
func step(tr *[]Step, name, rule, result, detail string) {
	*tr = append(*tr, Step{Name: name, Rule: rule, Result: result, Detail: detail})
}

func (e *Engine) decide(call *Call, tr *[]Step) Decision {
	if call.Tool == "" || call.Grant == "" {
		if tr != nil {
			step(tr, "call", "", "deny", "the call has no tool or no grant")
		}
		return Decision{Verdict: Deny, Reason: "the call names no tool or no grant", Shadow: e.shadow}
	}
	if ptr, hidden := e.hidden[call.Tool]; hidden {
		if tr != nil {
			step(tr, "hide", ptr, "deny", "the tool is hidden")
		}
		return Decision{Verdict: Deny, Rule: ptr, Reason: "tool " + call.Tool + " is hidden by the policy", Shadow: e.shadow}
	}
	if tr != nil {
		step(tr, "hide", "/hide", "pass", "the tool is not hidden")
	}
	t, listed := e.tools[call.Tool]
	if !listed {
		return e.decideUnlisted(call, tr)
	}
	if tr != nil {
		step(tr, "listed", t.ptr, "pass", "the tool is listed")
	}
	if t.action == Deny {
		if tr != nil {
			step(tr, "action", t.actionPtr, "deny", "the action is deny")
		}
		return Decision{Verdict: Deny, Rule: t.actionPtr, Reason: t.denyReason, Shadow: t.shadow}
	}
	if tr != nil {
		step(tr, "action", t.actionPtr, "pass", "the action is "+t.action.String())
	}
	if d, refused := t.conditions(call, tr); refused {
		return d
	}
	sb, deny := e.checkSandbox(t, call, t.shadow, tr)
	if deny != nil {
		return *deny
	}
	if deny := t.checkTimeout(call, tr); deny != nil {
		return *deny
	}
	d := t.verdict(tr)
	d.Sandbox = sb
	d.MaxTimeoutS = t.maxTimeoutS
	d.Files = fileRulesFor(t, call.Tool)
	d.Snapshot = t.snapshot.snapshotFor(call, tr)
	d.Snapshots = snapshotRulesFor(e.snapshots, t, call.Tool)
	d.KeepFiles = t.keepFiles
	if call.Tool == QuotaTool {
		lease := DefaultLease()
		if t.lease != nil {
			lease = *t.lease
		}
		d.Lease = &lease
	}
	return e.withLimits(d, t.limits, call, tr)
}

// decideUnlisted decides a call of a tool the policy does not list: the
// default, with the top-level blocks and limits.
func (e *Engine) decideUnlisted(call *Call, tr *[]Step) Decision {
	if e.def != Allow {
		if tr != nil {
			step(tr, "listed", "/default", "deny", "the tool is not listed and the default is deny")
		}
		return Decision{Verdict: Deny, Rule: "/default", Reason: "tool " + call.Tool + " is not allowed by the policy (not listed; the default is deny)", Shadow: e.shadow}
	}
	if tr != nil {
		step(tr, "listed", "/default", "pass", "the tool is not listed and the default is allow")
	}
	d := Decision{Verdict: Allow, Rule: "/default", Shadow: e.shadow}
	sb, deny := e.checkSandbox(nil, call, d.Shadow, tr)
	if deny != nil {
		return *deny
	}
	d.Sandbox = sb
	d.Files = fileRulesFor(nil, call.Tool)
	d.Snapshots = snapshotRulesFor(e.snapshots, nil, call.Tool)
	if call.Tool == QuotaTool {
		lease := DefaultLease()
		d.Lease = &lease
	}
	return e.withLimits(d, nil, call, tr)
}

// conditions evaluates t's require and deny_if against call: the Deny of
// the first that refuses it (refused), if one does.
func (t *toolRule) conditions(call *Call, tr *[]Step) (d Decision, refused bool) {
	for i := range t.require {
		c := &t.require[i]
		if !c.eval(call) {
			if tr != nil {
				step(tr, "require["+strconv.Itoa(i)+"]", c.ptr, "deny", c.src+": not met")
			}
			return Decision{Verdict: Deny, Rule: c.ptr, Reason: t.condReason(c, "requirement not met: "), Shadow: t.shadow}, true
		}
		if tr != nil {
			step(tr, "require["+strconv.Itoa(i)+"]", c.ptr, "pass", c.src+": met")
		}
	}
	for i := range t.denyIf {
		c := &t.denyIf[i]
		if c.eval(call) {
			if tr != nil {
				step(tr, "deny_if["+strconv.Itoa(i)+"]", c.ptr, "deny", c.src+": fired")
			}
			return Decision{Verdict: Deny, Rule: c.ptr, Reason: t.condReason(c, "denied because "), Shadow: t.shadow}, true
		}
		if tr != nil {
			step(tr, "deny_if["+strconv.Itoa(i)+"]", c.ptr, "pass", c.src+": not fired")
		}
	}
	return Decision{}, false
}

// verdict is the Allow, or the Approve with its approval, of a call of t
// that passed its conditions.
func (t *toolRule) verdict(tr *[]Step) Decision {
	if t.action != Approve {
		if tr != nil {
			step(tr, "approval", t.actionPtr, "skip", "no approval needed")
		}
		return Decision{Verdict: Allow, Rule: t.ptr, Shadow: t.shadow}
	}
	a := *t.approval
	d := Decision{Verdict: Approve, Rule: t.actionPtr, Reason: t.reason, Approval: &a, Shadow: t.shadow}
	if d.Reason == "" {
		d.Reason = "tool " + t.name + " needs approval (" + a.Channel + ")"
	}
	if tr != nil {
		step(tr, "approval", t.actionPtr, "approve", "channel "+a.Channel+", ttl "+a.TTL.String())
	}
	return d
}

// checkSandbox returns the sandbox of a create_session call (nil for other
// tools), or the Deny of one that asks for a looser sandbox than the
// policy's: create_session's own block (t), else the top-level one, else
// the default.
func (e *Engine) checkSandbox(t *toolRule, call *Call, shadow bool, tr *[]Step) (*Sandbox, *Decision) {
	switch call.Tool {
	case SandboxTool:
	case ExecTool:
		return e.checkExecSandbox(t, call, shadow, tr)
	default:
		return nil, nil
	}
	return e.ceiling(t).decideSandbox(call, shadow, tr)
}

// ceiling is the sandbox block that bounds t's calls: t's own, else the
// top-level one, else the default.
func (e *Engine) ceiling(t *toolRule) *sandboxRule {
	switch {
	case t != nil && t.sandbox != nil:
		return t.sandbox
	case e.sandbox != nil:
		return e.sandbox
	}
	return &defaultSandbox
}

// decideSandbox is the call's sandbox argument over r, or the Deny of one
// looser than r.
func (r *sandboxRule) decideSandbox(call *Call, shadow bool, tr *[]Step) (*Sandbox, *Decision) {
	sb, why := r.sandboxFor(call.Args)
	if why == "" {
		if tr != nil {
			step(tr, "sandbox", r.ptr, "pass", "within the policy's sandbox")
		}
		return &sb, nil
	}
	if r.ptr == "" {
		why += " (the policy has no sandbox block, so the default applies: net none, user session, no extra paths, cgroup best effort)"
	}
	if tr != nil {
		step(tr, "sandbox", r.ptr, "deny", why)
	}
	return nil, &Decision{Verdict: Deny, Rule: r.ptr, Reason: why, Shadow: shadow, Sandbox: &sb}
}

func (t *toolRule) condReason(c *condition, prefix string) string {
	if t.reason != "" {
		return t.reason
	}
	return prefix + c.src
}

// withLimits adds the counters of the tool's limits and all_tools' limits
// to d, and the tool's quotas. A counter key listed twice (the same counter
// and scope in both) is reserved once; so is a quota key.
func (e *Engine) withLimits(d Decision, own []limit, call *Call, tr *[]Step) Decision {
	n := len(own) + len(e.allLimits)
	if n == 0 {
		if tr != nil {
			step(tr, "limits", "", "pass", "no limits apply")
		}
		return d
	}
	d.Counters = make([]Counter, 0, n)
	for _, group := range [2][]limit{own, e.allLimits} {
		for i := range group {
			l := &group[i]
			if l.quota {
				q, why := l.quotaOf(call)
				if why != "" {
					if tr != nil {
						step(tr, "limits", l.ptr, "deny", why)
					}
					return Decision{Verdict: Deny, Rule: l.ptr, Reason: why, Shadow: d.Shadow}
				}
				if !slices.ContainsFunc(d.Quotas, func(o Quota) bool { return o.Key == q.Key }) {
					d.Quotas = append(d.Quotas, q)
				}
				continue
			}
			if l.scope&scopeSession != 0 && call.Session == "" {
				if tr != nil {
					step(tr, "limits", l.ptr, "deny", "limit "+l.name+" is scoped by session and the call has no session")
				}
				return Decision{Verdict: Deny, Rule: l.ptr, Reason: "limit " + l.name + " is scoped by session and the call has no session", Shadow: d.Shadow}
			}
			key := l.key(call)
			dup := false
			for _, c := range d.Counters {
				if c.Key == key {
					dup = true
					break
				}
			}
			if !dup {
				d.Counters = append(d.Counters, Counter{Key: key, Name: l.name, Window: l.window, Max: l.max, Rule: l.ptr})
			}
		}
	}
	if len(d.Counters) == 0 {
		d.Counters = nil
	}
	if tr != nil {
		keys := make([]string, 0, len(d.Counters)+len(d.Quotas))
		for _, c := range d.Counters {
			keys = append(keys, c.Key)
		}
		for _, q := range d.Quotas {
			keys = append(keys, q.Key+" (quota, "+strconv.FormatInt(q.Weight, 10)+" of "+strconv.FormatInt(q.Max, 10)+")")
		}
		step(tr, "limits", "", "pass", "to reserve: "+strings.Join(keys, ", "))
	}
	return d
}

// key is the counter key of l for call: the counter name, then for each
// scope in the fixed order grant, session, vm, template:
// "|<scope>=<len>:<value>" (template is args.template, a quota's scope).
// Values are user data; the length prefix makes the encoding unambiguous,
// so two different combinations never share a key. A call without a VM
// has the empty VM ("|vm=0:"). A global limit's key is its name.
func (l *limit) key(call *Call) string {
	if l.scope == 0 {
		return l.name
	}
	size := len(l.name)
	template, _ := call.Args["template"].(string)
	for _, p := range [...]struct {
		bit uint8
		v   string
	}{{scopeGrant, call.Grant}, {scopeSession, call.Session}, {scopeVM, call.VM}, {scopeTemplate, template}} {
		if l.scope&p.bit != 0 {
			size += 12 + len(p.v) + 20
		}
	}
	var b strings.Builder
	b.Grow(size)
	b.WriteString(l.name)
	add := func(label, v string) {
		b.WriteString(label)
		var nb [20]byte
		b.Write(strconv.AppendInt(nb[:0], int64(len(v)), 10))
		b.WriteByte(':')
		b.WriteString(v)
	}
	if l.scope&scopeGrant != 0 {
		add("|grant=", call.Grant)
	}
	if l.scope&scopeSession != 0 {
		add("|session=", call.Session)
	}
	if l.scope&scopeVM != 0 {
		add("|vm=", call.VM)
	}
	if l.scope&scopeTemplate != 0 {
		add("|template=", template)
	}
	return b.String()
}

// scopeLabels are the scope parts of a counter key (limit.key), in words.
var scopeLabels = []struct{ part, word string }{{"|grant=", "grant"}, {"|session=", "session"}, {"|vm=", "vm"}, {"|template=", "template"}}

// CounterLabel is a counter's key (Counter.Key) in words for people:
// "exec_per_vm|grant=5:alice|vm=7:lab/vm1" is "exec_per_vm (grant alice,
// vm lab/vm1)". A key it cannot read stays as it is.
func CounterLabel(key string) string {
	name, rest, scoped := strings.Cut(key, "|")
	if !scoped {
		return key
	}
	rest = "|" + rest
	var parts []string
	for rest != "" {
		word, v, tail, ok := nextScope(rest)
		if !ok {
			return key
		}
		if v == "" || strings.ContainsAny(v, " ,()") {
			v = strconv.Quote(v)
		}
		parts = append(parts, word+" "+v)
		rest = tail
	}
	return name + " (" + strings.Join(parts, ", ") + ")"
}

// nextScope reads the first scope part of s ("|vm=7:lab/vm1…"): its word,
// its value and what follows.
func nextScope(s string) (word, value, rest string, ok bool) {
	for _, l := range scopeLabels {
		after, found := strings.CutPrefix(s, l.part)
		if !found {
			continue
		}
		n, v, found := strings.Cut(after, ":")
		size, err := strconv.Atoi(n)
		if !found || err != nil || size < 0 || size > len(v) {
			return "", "", "", false
		}
		return l.word, v[:size], v[size:], true
	}
	return "", "", "", false
}
