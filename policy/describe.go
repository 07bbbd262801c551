package policy

import (
	"slices"
	"time"
)

// A compiled policy, described. Tools that compare policies (`vmgate
// policy diff`) or explain them read an Engine through Describe rather
// than through the document's JSON, so they see what the engine decides
// with: defaults filled in (an approval's channel and ttl, a tool's
// mode), comment keys gone, one entry per tool.

// Summary is what an Engine decides with, tool by tool.
type Summary struct {
	Default Verdict // Allow or Deny: the verdict of a tool not listed
	Shadow  bool    // the top-level mode is shadow
	Hidden  []string
	// AllTools are the limits of all_tools, which every call reserves.
	AllTools []LimitSummary
	// Sandbox says the document has a top-level sandbox block.
	Sandbox bool
	Tools   map[string]ToolSummary
}

// ToolSummary is one listed tool's rule.
type ToolSummary struct {
	Action   Verdict // Allow, Deny or Approve
	Shadow   bool
	Reason   string
	Require  []ConditionSummary
	DenyIf   []ConditionSummary
	Approval *ApprovalSpec // set exactly when Action is Approve
	Limits   []LimitSummary
	// Sandbox, Files, Lease: the tool has its own block of that name.
	Sandbox, Files, Lease bool
	// SnapshotBefore: the tool has a snapshot_before block.
	SnapshotBefore bool
	KeepFiles      time.Duration
	// MaxTimeoutS is vm_agent_exec's max_timeout_s (0: none).
	MaxTimeoutS int64
}

// ConditionSummary is one condition of require or deny_if.
type ConditionSummary struct {
	Path string
	Op   string // eq, neq, in, …
	// Value is a string, float64 or bool (eq, neq, contains), a list of
	// them (in, not_in), a float64 (lt, lte, gt, gte), the pattern (regex,
	// glob), nil (exists).
	Value any
	// Src is the condition as the engine quotes it in reasons:
	// `args.signal in ["TERM"]`.
	Src string
}

// LimitSummary is one rate limit or quota.
type LimitSummary struct {
	Counter string
	Quota   bool
	Window  time.Duration // 0 for a quota
	Max     int64
	// Scope lists the scopes in key order (grant, session, vm, template);
	// empty for global.
	Scope []string
	// Weight is a quota's weight path ("args.memory_mb"); "" for weight 1.
	Weight string
}

// Describe returns what e decides with.
func (e *Engine) Describe() Summary {
	s := Summary{Default: e.def, Shadow: e.shadow, Sandbox: e.sandbox != nil, Tools: make(map[string]ToolSummary, len(e.tools))}
	for name := range e.hidden {
		s.Hidden = append(s.Hidden, name)
	}
	slices.Sort(s.Hidden)
	s.AllTools = describeLimits(e.allLimits)
	for name, t := range e.tools {
		ts := ToolSummary{
			Action: t.action, Shadow: t.shadow, Reason: t.reason,
			Require: describeConditions(t.require), DenyIf: describeConditions(t.denyIf),
			Limits:  describeLimits(t.limits),
			Sandbox: t.sandbox != nil, Files: t.files != nil, Lease: t.lease != nil,
			SnapshotBefore: t.snapshot != nil, KeepFiles: t.keepFiles, MaxTimeoutS: t.maxTimeoutS,
		}
		if t.approval != nil {
			a := *t.approval
			ts.Approval = &a
		}
		s.Tools[name] = ts
	}
	return s
}

func describeConditions(cs []condition) []ConditionSummary {
	if len(cs) == 0 {
		return nil
	}
	out := make([]ConditionSummary, len(cs))
	for i := range cs {
		c := &cs[i]
		out[i] = ConditionSummary{Path: c.path, Op: c.opName(), Value: c.value(), Src: c.src}
	}
	return out
}

func (c *condition) opName() string {
	for name, o := range opNames {
		if o == c.op {
			return name
		}
	}
	return ""
}

func (c *condition) value() any {
	switch c.op {
	case opEq, opNeq, opContains:
		return c.val
	case opIn, opNotIn:
		return slices.Clone(c.set)
	case opLt, opLte, opGt, opGte:
		return c.num
	case opRegex, opNotRegex:
		return c.re.String()
	case opGlob, opNotGlob:
		return c.glob
	}
	return nil
}

func describeLimits(ls []limit) []LimitSummary {
	if len(ls) == 0 {
		return nil
	}
	out := make([]LimitSummary, len(ls))
	for i := range ls {
		l := &ls[i]
		out[i] = LimitSummary{Counter: l.name, Quota: l.quota, Window: l.window, Max: l.max, Weight: l.weightPath()}
		for _, p := range [...]struct {
			bit  uint8
			name string
		}{{scopeGrant, "grant"}, {scopeSession, "session"}, {scopeVM, "vm"}, {scopeTemplate, "template"}} {
			if l.scope&p.bit != 0 {
				out[i].Scope = append(out[i].Scope, p.name)
			}
		}
	}
	return out
}

// WindowName is a limit's window as a document writes it: "second",
// "minute", "hour", "day", or a duration ("10m0s").
func WindowName(d time.Duration) string {
	switch d {
	case time.Second:
		return "second"
	case time.Minute:
		return "minute"
	case time.Hour:
		return "hour"
	case 24 * time.Hour:
		return "day"
	}
	return d.String()
}
