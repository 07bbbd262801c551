package policy

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// vm_agent_exec's own rules: its one-shot sandbox and its timeout cap.
//
//	"vm_agent_exec": {
//	  "sandbox": { "require": true, "net": "none", "fs": { "write": ["/srv/out"] } },
//	  "max_timeout_s": 7200
//	}
//
// A vm_agent_exec call may give a sandbox argument (create_session's
// shape): its command then runs alone in a sandbox of its own, bounded by
// the policy's sandbox as a create_session call is (the tool's block, else
// the top-level one, else the default). With "require": true every command
// of the grant runs sandboxed: in a session (whose sandbox create_session
// decided), in the sandbox the call asks for, or, when it asks for none,
// in the loosest the policy allows (Decision.Sandbox). A block that
// requires a sandbox cannot let it run as root (user "root").
//
// max_timeout_s (1 to MaxExecTimeoutS) is the largest timeout_s the
// grant's commands may ask for; a call over it is denied. Without it the
// server's own cap applies (limits.max_timeout_s, 600 s by default).

// MaxExecTimeoutS is the largest max_timeout_s: a day.
const MaxExecTimeoutS = 24 * 60 * 60

// execSandbox compiles vm_agent_exec's sandbox block: a sandbox block
// with require.
func (b *builder) execSandbox(n *node, l loc) *sandboxRule {
	r := &sandboxRule{sb: defaultSandbox.sb.clone(), ptr: l.ptr}
	m := parseSandbox(&nodeValue{b: b, n: n, l: l}, &r.sb, "require")
	v, ok := m["require"].(*nodeValue)
	if !ok {
		return r
	}
	if v.n.kind != kindBool {
		v.fail("want true or false, got %s", v.n.kind)
		return r
	}
	r.require = v.n.b
	if r.require && r.sb.User == "root" {
		v.fail("require is true but user is \"root\": a required sandbox must not run commands as root (user \"session\")")
	}
	return r
}

// maxTimeout reads vm_agent_exec's max_timeout_s.
func (b *builder) maxTimeout(tool string, n *node, l loc) int64 {
	if tool != ExecTool {
		b.errorf(n.off, l.path, "max_timeout_s belongs on %s, not on %s", ExecTool, tool)
		return 0
	}
	x, ok := b.integer(n, l)
	if !ok {
		return 0
	}
	if x < 1 || x > MaxExecTimeoutS {
		b.errorf(n.off, l.path, "max_timeout_s %d is out of range (want 1 to %d)", x, MaxExecTimeoutS)
		return 0
	}
	return x
}

// checkExecSandbox is checkSandbox for vm_agent_exec: nil for a command
// in a session (its sandbox is the session's) and for one that asks for
// none where none is required; the call's sandbox over the ceiling when
// it asks for one; the ceiling itself when one is required.
func (e *Engine) checkExecSandbox(t *toolRule, call *Call, shadow bool, tr *[]Step) (*Sandbox, *Decision) {
	r := e.ceiling(t)
	if _, ok := call.Args["session"]; ok {
		if tr != nil && r.require {
			step(tr, "sandbox", r.ptr, "pass", "a sandbox is required: the command runs in its session's")
		}
		return nil, nil
	}
	if raw, ok := call.Args["sandbox"]; ok && raw != nil {
		return r.decideSandbox(call, shadow, tr)
	}
	if !r.require {
		return nil, nil
	}
	sb := r.sb.clone()
	if tr != nil {
		step(tr, "sandbox", r.ptr, "pass", "a sandbox is required: the command runs in the policy's")
	}
	return &sb, nil
}

// checkTimeout denies a vm_agent_exec call whose timeout_s is over t's
// max_timeout_s.
func (t *toolRule) checkTimeout(call *Call, tr *[]Step) *Decision {
	if t.maxTimeoutS == 0 {
		return nil
	}
	ptr := t.ptr + "/max_timeout_s"
	secs, ok := wholeNumber(call.Args["timeout_s"])
	if !ok || secs <= t.maxTimeoutS {
		if tr != nil {
			step(tr, "max_timeout_s", ptr, "pass", "timeout_s within "+strconv.FormatInt(t.maxTimeoutS, 10)+" s")
		}
		return nil
	}
	why := fmt.Sprintf("timeout_s %d is over the policy's cap of %d s (max_timeout_s)", secs, t.maxTimeoutS)
	if tr != nil {
		step(tr, "max_timeout_s", ptr, "deny", why)
	}
	return &Decision{Verdict: Deny, Rule: ptr, Reason: why, Shadow: t.shadow}
}

// wholeNumber is a decoded JSON number as an int64 (false for anything
// else, or a fraction).
func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case json.Number:
		x, err := n.Int64()
		return x, err == nil
	case int64:
		return n, true
	case int:
		return int64(n), true
	}
	f, ok := number(v)
	if !ok || f != float64(int64(f)) {
		return 0, false
	}
	return int64(f), true
}
