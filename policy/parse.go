package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on values inside a document.
const (
	maxNameLen    = 128           // tool and counter names
	maxReasonLen  = 1024          // reason strings
	maxPatternLen = 1024          // regex and glob patterns
	maxSetLen     = 1024          // elements of an in / not_in list
	maxMax        = 1_000_000_000 // the largest limit max
	maxWindow     = 7 * 24 * time.Hour
	maxTTL        = 7 * 24 * time.Hour
	defaultTTL    = 15 * time.Minute
)

// Parse reads a policy document and compiles it into an Engine. name is the
// file name used in error messages. On failure the error is an Errors list
// naming every problem found (up to MaxErrors) and the Engine is nil.
func Parse(name string, data []byte) (*Engine, error) {
	b := &builder{file: name, data: data, counters: map[string]*limit{}}
	if len(data) > MaxDocumentSize {
		b.errorf(0, "", "document is %d bytes; the limit is %d", len(data), MaxDocumentSize)
		return nil, b.errs
	}
	if !utf8.Valid(data) {
		off := 0
		for off < len(data) {
			r, size := utf8.DecodeRune(data[off:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			off += size
		}
		b.errorf(off, "", "document is not valid UTF-8")
		return nil, b.errs
	}
	root, err := parseJSON(data)
	if err != nil {
		se := err.(*syntaxError)
		b.errorf(se.off, "", "%s", se.msg)
		return nil, b.errs
	}
	e := b.engine(root)
	if len(b.errs) > 0 {
		return nil, b.errs
	}
	sum := sha256.Sum256(data)
	e.name = name
	e.fingerprint = hex.EncodeToString(sum[:])
	return e, nil
}

// builder turns the node tree into an Engine, collecting errors.
type builder struct {
	file     string
	data     []byte
	errs     Errors
	counters map[string]*limit // counter name → its first definition
}

func (b *builder) errorf(off int, path, format string, args ...any) {
	if len(b.errs) > MaxErrors {
		return
	}
	line, col := lineCol(b.data, off)
	if len(b.errs) == MaxErrors {
		b.errs = append(b.errs, &Error{File: b.file, Line: line, Col: col, Msg: "too many errors"})
		return
	}
	b.errs = append(b.errs, &Error{File: b.file, Line: line, Col: col, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// loc is where a value is: its JSON path for messages and its JSON pointer
// for rules.
type loc struct {
	path string
	ptr  string
}

func (l loc) key(k string) loc {
	p := l.path
	if isIdent(k) {
		if p != "" {
			p += "."
		}
		p += k
	} else {
		p += "[" + strconv.Quote(k) + "]"
	}
	return loc{path: p, ptr: l.ptr + "/" + escapePointer(k)}
}

func (l loc) index(i int) loc {
	return loc{path: l.path + "[" + strconv.Itoa(i) + "]", ptr: l.ptr + "/" + strconv.Itoa(i)}
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// escapePointer escapes one RFC 6901 reference token.
func escapePointer(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

// object checks that n is an object whose keys are all in known, and
// returns its members by key. A key that starts with "_" is a comment
// (`"_why": "seen 40 times"`, which `vmgate policy suggest` writes): any
// JSON value, ignored, in every object whose keys are field names (not in
// tools, whose keys are tool names).
func (b *builder) object(n *node, l loc, known ...string) (map[string]*node, bool) {
	if n.kind != kindObject {
		b.errorf(n.off, l.path, "want an object, got %s", n.kind)
		return nil, false
	}
	m := make(map[string]*node, len(n.keys))
	for i, k := range n.keys {
		if slices.Contains(known, k) {
			m[k] = n.vals[i]
			continue
		}
		if strings.HasPrefix(k, "_") {
			continue
		}
		for _, f := range known {
			if strings.EqualFold(f, k) {
				b.errorf(n.keyOffs[i], l.key(k).path, "unknown field %q (field names are case-sensitive: did you mean %q?)", k, f)
				goto next
			}
		}
		b.errorf(n.keyOffs[i], l.key(k).path, "unknown field %q (known: %s)", k, strings.Join(known, ", "))
	next:
	}
	return m, true
}

func (b *builder) required(obj *node, m map[string]*node, l loc, field string) (*node, bool) {
	v, ok := m[field]
	if !ok {
		b.errorf(obj.off, l.key(field).path, "required field is missing")
	}
	return v, ok
}

func (b *builder) str(n *node, l loc) (string, bool) {
	if n.kind != kindString {
		b.errorf(n.off, l.path, "want a string, got %s", n.kind)
		return "", false
	}
	return n.str, true
}

// name checks a tool or counter name: 1 to 128 of [A-Za-z0-9_.-] (the MCP
// tool name alphabet; counter names also allow ':').
func (b *builder) name(s string, off int, l loc, what string, extra string) bool {
	if s == "" || len(s) > maxNameLen {
		b.errorf(off, l.path, "%s name must be 1 to %d characters, got %d", what, maxNameLen, len(s))
		return false
	}
	for _, c := range s {
		if !(c == '_' || c == '-' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(extra, c)) {
			b.errorf(off, l.path, "%s name %q has the character %q (allowed: letters, digits, _ - .%s)", what, s, c, extra)
			return false
		}
	}
	return true
}

func (b *builder) engine(root *node) *Engine {
	e := &Engine{tools: map[string]*toolRule{}, hidden: map[string]string{}}
	top := loc{}
	m, ok := b.object(root, top, "version", "default", "mode", "hide", "all_tools", "sandbox", "snapshots", "tools")
	if !ok {
		return e
	}
	if v, ok := b.required(root, m, top, "version"); ok {
		if s, ok := b.str(v, top.key("version")); ok && s != "1" {
			b.errorf(v.off, "version", "unsupported version %q (want \"1\")", s)
		}
	}
	if v, ok := b.required(root, m, top, "default"); ok {
		if s, ok := b.str(v, top.key("default")); ok {
			switch s {
			case "allow":
				e.def = Allow
			case "deny":
				e.def = Deny
			default:
				b.errorf(v.off, "default", "unknown default %q (want allow or deny)", s)
			}
		}
	}
	if v, ok := m["mode"]; ok {
		e.shadow = b.mode(v, top.key("mode"))
	}
	if v, ok := m["hide"]; ok {
		b.hide(e, v, top.key("hide"))
	}
	if v, ok := m["all_tools"]; ok {
		l := top.key("all_tools")
		if am, ok := b.object(v, l, "limits"); ok {
			if lv, ok := am["limits"]; ok {
				e.allLimits = b.limits(lv, l.key("limits"), false)
			}
		}
	}
	if v, ok := m["sandbox"]; ok {
		e.sandbox = b.sandbox(v, top.key("sandbox"))
	}
	if v, ok := m["snapshots"]; ok {
		e.snapshots = b.snapshotLimits(v, top.key("snapshots"))
	}
	if v, ok := m["tools"]; ok {
		b.tools(e, v, top.key("tools"))
	}
	for n := range e.tools {
		e.names = append(e.names, n)
	}
	for n := range e.hidden {
		e.names = append(e.names, n)
	}
	slices.Sort(e.names)
	e.names = slices.Compact(e.names)
	return e
}

// hide reads the hide list v (at l) into e.
func (b *builder) hide(e *Engine, v *node, l loc) {
	if v.kind != kindArray {
		b.errorf(v.off, l.path, "want an array of tool names, got %s", v.kind)
	}
	for i, el := range v.elems {
		li := l.index(i)
		if s, ok := b.str(el, li); ok && b.name(s, el.off, li, "tool", "") {
			e.mentions = append(e.mentions, b.mention(s, el.off, li))
			if _, dup := e.hidden[s]; dup {
				b.errorf(el.off, li.path, "tool %q is hidden twice", s)
			}
			e.hidden[s] = li.ptr
		}
	}
}

// tools reads the tools object v (at l) into e; hide is read first.
func (b *builder) tools(e *Engine, v *node, l loc) {
	if v.kind != kindObject {
		b.errorf(v.off, l.path, "want an object of tools, got %s", v.kind)
	}
	for i, k := range v.keys {
		lt := l.key(k)
		if !b.name(k, v.keyOffs[i], lt, "tool", "") {
			continue
		}
		e.mentions = append(e.mentions, b.mention(k, v.keyOffs[i], lt))
		if _, hidden := e.hidden[k]; hidden {
			b.errorf(v.keyOffs[i], lt.path, "tool %q is both hidden and configured; hidden tools are always denied", k)
		}
		e.tools[k] = b.tool(k, v.vals[i], lt, e.shadow)
	}
}

func (b *builder) mode(v *node, l loc) (shadow bool) {
	s, ok := b.str(v, l)
	if !ok {
		return false
	}
	switch s {
	case "enforce":
		return false
	case "shadow":
		return true
	}
	b.errorf(v.off, l.path, "unknown mode %q (want enforce or shadow)", s)
	return false
}

func (b *builder) tool(name string, n *node, l loc, shadow bool) *toolRule {
	t := &toolRule{name: name, ptr: l.ptr, action: Allow, actionPtr: l.ptr, shadow: shadow}
	m, ok := b.object(n, l, "action", "reason", "mode", "require", "deny_if", "approval", "limits", "sandbox", "files", "snapshot_before", "keep_files", "lease", "snapshots", "max_timeout_s")
	if !ok {
		return t
	}
	b.toolAction(t, m, l)
	if v, ok := m["mode"]; ok {
		t.shadow = b.mode(v, l.key("mode"))
	}
	if v, ok := m["require"]; ok {
		t.require = b.conditions(v, l.key("require"))
	}
	if v, ok := m["deny_if"]; ok {
		t.denyIf = b.conditions(v, l.key("deny_if"))
	}
	if v, ok := m["approval"]; ok {
		la := l.key("approval")
		if t.action != Approve {
			b.errorf(v.off, la.path, "approval is set but the action is not \"approve\"")
		}
		t.approval = b.approval(v, la)
	} else if t.action == Approve {
		t.approval = &ApprovalSpec{Channel: "operator", TTL: defaultTTL}
	}
	if v, ok := m["limits"]; ok {
		t.limits = b.limits(v, l.key("limits"), name == QuotaTool)
	}
	b.toolBlocks(t, m, l)
	t.denyReason = t.reason
	if t.denyReason == "" {
		t.denyReason = "tool " + name + " is denied by the policy"
	}
	return t
}

// toolAction reads t's action and reason from m (t's object, at l).
func (b *builder) toolAction(t *toolRule, m map[string]*node, l loc) {
	if v, ok := m["action"]; ok {
		la := l.key("action")
		t.actionPtr = la.ptr
		if s, ok := b.str(v, la); ok {
			switch s {
			case "allow":
				t.action = Allow
			case "deny":
				t.action = Deny
			case "approve":
				t.action = Approve
			default:
				b.errorf(v.off, la.path, "unknown action %q (want allow, deny or approve)", s)
			}
		}
	}
	if v, ok := m["reason"]; ok {
		lr := l.key("reason")
		if s, ok := b.str(v, lr); ok {
			if len(s) > maxReasonLen {
				b.errorf(v.off, lr.path, "reason is %d bytes; the limit is %d", len(s), maxReasonLen)
			}
			t.reason = s
		}
	}
}

// toolBlocks reads the blocks that belong on some tools only (lease,
// sandbox, files, keep_files, snapshot_before, snapshots, max_timeout_s)
// from m (t's object, at l).
func (b *builder) toolBlocks(t *toolRule, m map[string]*node, l loc) {
	name := t.name
	if v, ok := m["lease"]; ok {
		ll := l.key("lease")
		if name != QuotaTool {
			b.errorf(v.off, ll.path, "a lease block belongs on %s, not on %s", QuotaTool, name)
		} else {
			t.lease = b.lease(v, ll)
		}
	}
	if v, ok := m["sandbox"]; ok {
		ls := l.key("sandbox")
		switch name {
		case SandboxTool:
			t.sandbox = b.sandbox(v, ls)
		case ExecTool:
			t.sandbox = b.execSandbox(v, ls)
		default:
			b.errorf(v.off, ls.path, "a sandbox block belongs on %s or %s (or the top level), not on %s", SandboxTool, ExecTool, name)
		}
	}
	if v, ok := m["max_timeout_s"]; ok {
		t.maxTimeoutS = b.maxTimeout(name, v, l.key("max_timeout_s"))
	}
	if v, ok := m["files"]; ok {
		lf := l.key("files")
		if !isFileTool(name) {
			b.errorf(v.off, lf.path, "a files block belongs on %v, not on %s", FileTools(), name)
		} else {
			t.files = b.files(v, lf, name)
		}
	}
	if v, ok := m["keep_files"]; ok {
		t.keepFiles = b.keepFiles(name, v, l.key("keep_files"))
	}
	if v, ok := m["snapshot_before"]; ok {
		t.snapshot = b.snapshotBefore(name, v, l.key("snapshot_before"))
	}
	if v, ok := m["snapshots"]; ok {
		ls := l.key("snapshots")
		t.snapOthers, t.snapOthersPtr = b.snapshotOthers(name, v, ls), ls.ptr+"/others"
	}
}

func (b *builder) approval(n *node, l loc) *ApprovalSpec {
	a := &ApprovalSpec{Channel: "operator", TTL: defaultTTL}
	m, ok := b.object(n, l, "channel", "ttl")
	if !ok {
		return a
	}
	if v, ok := m["channel"]; ok {
		lc := l.key("channel")
		if s, ok := b.str(v, lc); ok {
			if s != "operator" && s != "client" {
				b.errorf(v.off, lc.path, "unknown channel %q (want operator or client)", s)
			}
			a.Channel = s
		}
	}
	if v, ok := m["ttl"]; ok {
		lt := l.key("ttl")
		if s, ok := b.str(v, lt); ok {
			d, err := time.ParseDuration(s)
			switch {
			case err != nil:
				b.errorf(v.off, lt.path, "bad duration %q (want a Go duration like \"15m\")", s)
			case d <= 0 || d > maxTTL:
				b.errorf(v.off, lt.path, "ttl %s is out of range (want more than 0 and at most %s)", d, maxTTL)
			default:
				a.TTL = d
			}
		}
	}
	return a
}

// Scope bits, in the fixed order they appear in counter keys.
const (
	scopeGrant uint8 = 1 << iota
	scopeSession
	scopeVM
)

// limits reads a list of limits; quotas says whether quota limits may be
// among them (only on QuotaTool).
func (b *builder) limits(n *node, l loc, quotas bool) []limit {
	if n.kind != kindArray {
		b.errorf(n.off, l.path, "want an array of limits, got %s", n.kind)
		return nil
	}
	var out []limit
	for i, el := range n.elems {
		if lim, ok := b.limit(el, l.index(i), quotas); ok {
			out = append(out, lim)
		}
	}
	return out
}

func (b *builder) limit(n *node, l loc, quotas bool) (limit, bool) {
	lim := limit{ptr: l.ptr}
	m, ok := b.object(n, l, "counter", "kind", "window", "max", "scope", "weight")
	if !ok {
		return lim, false
	}
	if !b.limitKind(m, l, quotas, &lim) {
		return lim, false
	}
	good := true
	if lim.quota {
		good = b.quotaLimit(n, m, l, &lim)
	} else if v, ok := m["weight"]; ok {
		b.errorf(v.off, l.key("weight").path, "weight is for quota limits (\"kind\": \"quota\")")
		good = false
	}
	if v, ok := b.required(n, m, l, "counter"); ok {
		lc := l.key("counter")
		if s, ok := b.str(v, lc); ok && b.name(s, v.off, lc, "counter", ":") {
			lim.name = s
		} else {
			good = false
		}
	} else {
		good = false
	}
	if !lim.quota { // a quota has no window: checked by quotaLimit
		good = b.limitWindow(n, m, l, &lim) && good
	}
	good = b.limitMax(n, m, l, &lim) && good
	if v, ok := b.required(n, m, l, "scope"); ok {
		if s, ok := b.scope(v, l.key("scope"), lim.quota); ok && (!lim.quota || b.quotaScope(v, l.key("scope"), s)) {
			lim.scope = s
		} else {
			good = false
		}
	} else {
		good = false
	}
	if !good {
		return lim, false
	}
	return lim, b.sameCounter(n, l, &lim)
}

// limitKind reads a limit's kind (rate, the default, or quota where
// quotas may be) into lim; false when it is not one.
func (b *builder) limitKind(m map[string]*node, l loc, quotas bool, lim *limit) bool {
	v, ok := m["kind"]
	if !ok {
		return true
	}
	lk := l.key("kind")
	s, ok := b.str(v, lk)
	switch {
	case !ok:
		return false
	case s == kindQuota && !quotas:
		b.errorf(v.off, lk.path, "a quota holds a unit while the VM a call created lives; only %s creates VMs, so quotas belong in tools.%s.limits", QuotaTool, QuotaTool)
		return false
	case s == kindQuota:
		lim.quota = true
	case s != kindRate:
		b.errorf(v.off, lk.path, "unknown kind %q (want rate or quota)", s)
		return false
	}
	return true
}

// limitWindow reads a rate limit's window into lim.
func (b *builder) limitWindow(n *node, m map[string]*node, l loc, lim *limit) bool {
	v, ok := b.required(n, m, l, "window")
	if !ok {
		return false
	}
	lw := l.key("window")
	s, ok := b.str(v, lw)
	if !ok {
		return false
	}
	d, ok := parseWindow(s)
	if !ok {
		b.errorf(v.off, lw.path, "unknown window %q (want second, minute, hour, day or a duration like \"90s\")", s)
		return false
	}
	lim.window = d
	if d <= 0 || d > maxWindow {
		b.errorf(v.off, lw.path, "window %q is out of range (want more than 0s and at most %s)", s, maxWindow)
		return false
	}
	return true
}

// limitMax reads a limit's max into lim.
func (b *builder) limitMax(n *node, m map[string]*node, l loc, lim *limit) bool {
	v, ok := b.required(n, m, l, "max")
	if !ok {
		return false
	}
	lm := l.key("max")
	x, ok := b.integer(v, lm)
	if !ok {
		return false
	}
	lim.max = x
	if x < 1 || x > maxMax {
		b.errorf(v.off, lm.path, "max %s is out of range (want 1 to %d; use \"action\": \"deny\" to forbid a tool)", v.str, maxMax)
		return false
	}
	return true
}

// sameCounter checks lim against the first limit of its counter (every
// limit with one counter shares one budget) or records it as the first.
func (b *builder) sameCounter(n *node, l loc, lim *limit) bool {
	first, ok := b.counters[lim.name]
	if !ok {
		b.counters[lim.name] = lim
		return true
	}
	if first.quota != lim.quota {
		b.errorf(n.off, l.path, "counter %q is defined at %s as a %s; a counter is either a rate limit or a quota", lim.name, first.ptr, first.kind())
		return false
	}
	if lim.quota && (first.max != lim.max || !slices.Equal(first.weight, lim.weight)) {
		b.errorf(n.off, l.path, "quota %q is defined at %s with max %d and weight %q; every limit with the same counter shares one quota, so max and weight must match",
			lim.name, first.ptr, first.max, first.weightPath())
		return false
	}
	if first.window != lim.window || first.max != lim.max {
		b.errorf(n.off, l.path, "counter %q is defined at %s with window %s and max %d; every limit with the same counter shares one budget, so window and max must match",
			lim.name, first.ptr, first.window, first.max)
		return false
	}
	return true
}

func parseWindow(s string) (time.Duration, bool) {
	switch s {
	case "second":
		return time.Second, true
	case "minute":
		return time.Minute, true
	case "hour":
		return time.Hour, true
	case "day":
		return 24 * time.Hour, true
	}
	d, err := time.ParseDuration(s)
	return d, err == nil
}

// integer reads a number that must be a whole number in int64 range.
func (b *builder) integer(n *node, l loc) (int64, bool) {
	if n.kind != kindNumber {
		b.errorf(n.off, l.path, "want an integer, got %s", n.kind)
		return 0, false
	}
	if x, err := strconv.ParseInt(n.str, 10, 64); err == nil {
		return x, true
	}
	f, err := strconv.ParseFloat(n.str, 64)
	switch {
	case err != nil || math.IsInf(f, 0) || math.Abs(f) > 1<<53:
		b.errorf(n.off, l.path, "number %s is out of range", n.str)
	case f != math.Trunc(f):
		b.errorf(n.off, l.path, "want an integer, got %s", n.str)
	default:
		return int64(f), true
	}
	return 0, false
}

// scope reads a limit's scope; template is a scope of quotas only.
func (b *builder) scope(n *node, l loc, quota bool) (uint8, bool) {
	var elems []*node
	var locs []loc
	switch n.kind {
	case kindString:
		elems, locs = []*node{n}, []loc{l}
	case kindArray:
		if len(n.elems) == 0 {
			b.errorf(n.off, l.path, "empty scope list (want grant, session, vm or global)")
			return 0, false
		}
		elems = n.elems
		for i := range elems {
			locs = append(locs, l.index(i))
		}
	default:
		b.errorf(n.off, l.path, "want a scope string or a list of them, got %s", n.kind)
		return 0, false
	}
	var bits uint8
	global := false
	for i, el := range elems {
		s, ok := b.str(el, locs[i])
		if !ok {
			return 0, false
		}
		var bit uint8
		switch s {
		case "grant":
			bit = scopeGrant
		case "session":
			bit = scopeSession
		case "vm":
			bit = scopeVM
		case "template":
			if !quota {
				b.errorf(el.off, locs[i].path, "scope \"template\" is for quota limits (\"kind\": \"quota\")")
				return 0, false
			}
			bit = scopeTemplate
		case "global":
			if global {
				b.errorf(el.off, locs[i].path, "scope %q is listed twice", s)
				return 0, false
			}
			global = true
			continue
		default:
			b.errorf(el.off, locs[i].path, "unknown scope %q (want grant, session, vm, template or global)", s)
			return 0, false
		}
		if bits&bit != 0 {
			b.errorf(el.off, locs[i].path, "scope %q is listed twice", s)
			return 0, false
		}
		bits |= bit
	}
	if global && bits != 0 {
		b.errorf(n.off, l.path, "scope \"global\" cannot be combined with other scopes")
		return 0, false
	}
	return bits, true
}

func (b *builder) conditions(n *node, l loc) []condition {
	if n.kind != kindArray {
		b.errorf(n.off, l.path, "want an array of conditions, got %s", n.kind)
		return nil
	}
	var out []condition
	for i, el := range n.elems {
		if c, ok := b.condition(el, l.index(i)); ok {
			out = append(out, c)
		}
	}
	return out
}

func (b *builder) condition(n *node, l loc) (condition, bool) {
	c := condition{ptr: l.ptr}
	m, ok := b.object(n, l, "path", "op", "value")
	if !ok {
		return c, false
	}
	good := true
	pv, okp := b.required(n, m, l, "path")
	ov, oko := b.required(n, m, l, "op")
	if okp {
		lp := l.key("path")
		if s, ok := b.str(pv, lp); ok {
			if err := c.setPath(s); err != nil {
				b.errorf(pv.off, lp.path, "%v", err)
				good = false
			}
		} else {
			good = false
		}
	}
	if !oko {
		return c, false
	}
	lo := l.key("op")
	s, ok := b.str(ov, lo)
	if !ok {
		return c, false
	}
	op, known := opNames[s]
	if !known {
		b.errorf(ov.off, lo.path, "unknown op %q (want eq, neq, in, not_in, lt, lte, gt, gte, regex, not_regex, glob, not_glob, contains or exists)", s)
		return c, false
	}
	c.op = op
	vv, hasValue := m["value"]
	lv := l.key("value")
	if op == opExists {
		if hasValue {
			b.errorf(vv.off, lv.path, "op exists takes no value")
			return c, false
		}
		c.src = c.path + " exists"
		return c, good && okp
	}
	if !hasValue {
		b.errorf(n.off, lv.path, "required field is missing (op %s needs a value)", s)
		return c, false
	}
	if err := c.setValue(vv); err != nil {
		off := vv.off
		if ve, ok := err.(*valueError); ok {
			off = ve.n.off
		}
		b.errorf(off, lv.path, "%v", err)
		return c, false
	}
	c.src = fmt.Sprintf("%s %s %s", c.path, s, string(b.data[vv.off:valueEnd(b.data, vv)]))
	return c, good && okp
}

// valueEnd finds where the JSON value n ends in data, for quoting it in
// messages (values are short: patterns and lists are capped).
func valueEnd(data []byte, n *node) int {
	end := n.end
	if end-n.off > 200 {
		end = n.off + 200
		for end > n.off && !utf8.RuneStart(data[end]) {
			end--
		}
	}
	return end
}
