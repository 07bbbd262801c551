package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
)

// The sandbox block says how loose a sandbox create_session may ask for.
//
//	"sandbox": {
//	  "net": "none",                                  // none < loopback < host
//	  "user": "session",                              // session < root
//	  "fs": {"read": ["/srv/data"], "write": ["/srv/out"]},
//	  "tcp": {"bind": [8080], "connect": [443]},      // absent: ports not limited
//	  "best_effort": ["cgroup"]                       // features the guest may lack
//	}
//
// It sits on the create_session tool entry or at the top level of the
// document (the grant's); the tool's wins. A policy with neither has the
// default: net none, user session, no extra paths, every feature required
// but cgroup (see defaultSandbox). A field a block leaves out has the
// default's value.
//
// A call's sandbox argument has the same shape. A field it leaves out takes
// the policy's value (so a call that asks for nothing gets the loosest the
// policy allows, never more); an object it gives is taken as it is (a
// missing list in it is empty). Each field must be as tight or tighter than
// the policy's: a lower net or user; read paths each inside a policy read or
// write path, write paths each inside a policy write path; with a policy tcp
// block, a tcp block whose ports are among the policy's; best_effort
// features among the policy's. A looser call is denied with the field that was too loose.

// SandboxTool is the tool whose calls the sandbox block constrains; ExecTool's
// one-shot sandboxes too (execsandbox.go).
const SandboxTool = "create_session"

// Sandbox is the sandbox a create_session call gets (Decision.Sandbox).
type Sandbox struct {
	Net  string // none, loopback or host
	User string // session or root
	// Read and Write are extra paths (absolute, clean), sorted.
	Read, Write []string
	// TCP limits TCP bind and connect to its ports; nil leaves them unlimited.
	TCP        *TCPPorts
	BestEffort []string // sorted
}

// TCPPorts are ports, sorted.
type TCPPorts struct {
	Bind, Connect []uint16
}

var (
	netRank  = map[string]int{"none": 0, "loopback": 1, "host": 2}
	userRank = map[string]int{"session": 0, "root": 1}
	// sandboxFeatures are the features best_effort may name (the guest's wire.Features).
	sandboxFeatures = []string{"landlock", "landlock_tcp", "netns", "mountns", "cgroup"}
)

// Limits of a sandbox block or argument.
const (
	maxSandboxPaths = 64
	maxSandboxPath  = 4096
	maxSandboxPorts = 64
)

// defaultSandbox is the ceiling of a policy without a sandbox block, and
// what a block starts from: the built-in policy's (net none, user session,
// no extra paths, only cgroup v2 may be missing: without it a session's
// processes are still found by their uid, which they cannot change).
var defaultSandbox = sandboxRule{sb: Sandbox{Net: "none", User: "session", BestEffort: []string{"cgroup"}}}

// sandboxRule is a compiled sandbox block.
type sandboxRule struct {
	sb  Sandbox
	ptr string // its JSON pointer; "" for the default
	// require (ExecTool's block only): every command of the tool runs
	// sandboxed, in a session or a sandbox of its own (execsandbox.go).
	require bool
}

// sandboxValue is what parses a sandbox, from a document (node tree) or
// from a call's arguments (decoded JSON): the two differ only in how a
// field is read and how a problem is reported.
type sandboxValue interface {
	fields(known ...string) (map[string]sandboxValue, bool)
	str() (string, bool)
	list() ([]sandboxValue, bool)
	port() (uint16, bool)
	fail(format string, args ...any)
}

// parseSandbox reads a sandbox into out; problems go to v.fail. Fields
// absent are left as they are in out, so a call's parse starts from the
// policy's sandbox. extra are fields the caller reads itself (the exec
// block's require), returned with the others.
func parseSandbox(v sandboxValue, out *Sandbox, extra ...string) map[string]sandboxValue {
	m, ok := v.fields(append([]string{"net", "user", "fs", "tcp", "best_effort"}, extra...)...)
	if !ok {
		return nil
	}
	if f, ok := m["net"]; ok {
		out.Net = rankedString(f, netRank, "net", "none, loopback or host", out.Net)
	}
	if f, ok := m["user"]; ok {
		out.User = rankedString(f, userRank, "user", "session or root", out.User)
	}
	if f, ok := m["fs"]; ok {
		fm, ok := f.fields("read", "write")
		if ok {
			out.Read, out.Write = sandboxPaths(fm["read"]), sandboxPaths(fm["write"])
		}
	}
	if f, ok := m["tcp"]; ok {
		tm, ok := f.fields("bind", "connect")
		if ok {
			out.TCP = &TCPPorts{Bind: sandboxPorts(tm["bind"], true), Connect: sandboxPorts(tm["connect"], false)}
		}
	}
	if f, ok := m["best_effort"]; ok {
		out.BestEffort = nil
		if elems, ok := f.list(); ok {
			for _, el := range elems {
				s, ok := el.str()
				if ok && !slices.Contains(sandboxFeatures, s) {
					el.fail("unknown feature %q (want %s)", s, strings.Join(sandboxFeatures, ", "))
				} else if ok {
					out.BestEffort = append(out.BestEffort, s)
				}
			}
		}
		out.BestEffort = sortedSet(out.BestEffort)
	}
	return m
}

func rankedString(v sandboxValue, ranks map[string]int, what, want, old string) string {
	s, ok := v.str()
	if !ok {
		return old
	}
	if _, known := ranks[s]; !known {
		v.fail("unknown %s %q (want %s)", what, s, want)
		return old
	}
	return s
}

// boundedList reads a list of at most max elements (what names them in
// the message); nil v is the empty list.
func boundedList(v sandboxValue, max int, what string) []sandboxValue {
	if v == nil {
		return nil
	}
	elems, ok := v.list()
	if ok && len(elems) > max {
		v.fail("%d %s; the limit is %d", len(elems), what, max)
		return nil
	}
	return elems
}

// sandboxPaths reads a list of absolute, clean paths; nil v is the empty list.
func sandboxPaths(v sandboxValue) []string {
	var out []string
	for _, el := range boundedList(v, maxSandboxPaths, "paths") {
		p, ok := el.str()
		if !ok {
			continue
		}
		switch {
		case len(p) > maxSandboxPath:
			el.fail("path is %d bytes; the limit is %d", len(p), maxSandboxPath)
		case strings.IndexByte(p, 0) >= 0:
			el.fail("path contains NUL")
		case !strings.HasPrefix(p, "/"):
			el.fail("path %q is not absolute", p)
		case path.Clean(p) != p:
			el.fail("path %q is not clean (want %q)", p, path.Clean(p))
		default:
			out = append(out, p)
		}
	}
	return sortedSet(out)
}

// sandboxPorts reads a list of TCP ports (0 only where zeroOK: binding port 0
// picks an ephemeral one); nil v is the empty list.
func sandboxPorts(v sandboxValue, zeroOK bool) []uint16 {
	var out []uint16
	for _, el := range boundedList(v, maxSandboxPorts, "ports") {
		p, ok := el.port()
		if ok && p == 0 && !zeroOK {
			el.fail("port 0 cannot be connected to")
			ok = false
		}
		if ok {
			out = append(out, p)
		}
	}
	return sortedSet(out)
}

func sortedSet[T string | uint16](in []T) []T {
	if len(in) == 0 {
		return nil
	}
	slices.Sort(in)
	return slices.Compact(in)
}

// looser names the first field of call that is looser than the ceiling c,
// "" when call is within it.
func (c Sandbox) looser(call Sandbox) string {
	if netRank[call.Net] > netRank[c.Net] {
		return fmt.Sprintf("net %q is looser than the policy's %q", call.Net, c.Net)
	}
	if userRank[call.User] > userRank[c.User] {
		return fmt.Sprintf("user %q is looser than the policy's %q", call.User, c.User)
	}
	for _, p := range call.Write {
		if !under(p, c.Write) {
			return fmt.Sprintf("fs.write %q is outside the policy's write paths %q", p, c.Write)
		}
	}
	for _, p := range call.Read {
		if !under(p, c.Read) && !under(p, c.Write) {
			return fmt.Sprintf("fs.read %q is outside the policy's read and write paths %q", p, append(slices.Clone(c.Read), c.Write...))
		}
	}
	if c.TCP != nil {
		if call.TCP == nil {
			return fmt.Sprintf("tcp is unlimited; the policy allows bind %v and connect %v only", c.TCP.Bind, c.TCP.Connect)
		}
		for _, l := range []struct {
			what       string
			call, ceil []uint16
		}{{"bind", call.TCP.Bind, c.TCP.Bind}, {"connect", call.TCP.Connect, c.TCP.Connect}} {
			for _, p := range l.call {
				if !slices.Contains(l.ceil, p) {
					return fmt.Sprintf("tcp.%s port %d is not among the policy's %v", l.what, p, l.ceil)
				}
			}
		}
	}
	for _, f := range call.BestEffort {
		if !slices.Contains(c.BestEffort, f) {
			return fmt.Sprintf("best_effort %q is not allowed by the policy (allowed: %q)", f, c.BestEffort)
		}
	}
	return ""
}

// under reports whether p is one of dirs or inside one.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || d == "/" || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// clone copies s deeply (Decision.Sandbox must not alias the Engine's).
func (s Sandbox) clone() Sandbox {
	s.Read, s.Write, s.BestEffort = slices.Clone(s.Read), slices.Clone(s.Write), slices.Clone(s.BestEffort)
	if s.TCP != nil {
		s.TCP = &TCPPorts{Bind: slices.Clone(s.TCP.Bind), Connect: slices.Clone(s.TCP.Connect)}
	}
	return s
}

// sandboxFor is the sandbox of a create_session call under ceiling r: the
// call's args.sandbox over r's values; reason is why it was denied ("" when
// it was not).
func (r *sandboxRule) sandboxFor(args map[string]any) (sb Sandbox, reason string) {
	sb = r.sb.clone()
	raw, ok := args["sandbox"]
	if !ok || raw == nil {
		return sb, ""
	}
	var problem string
	parseSandbox(&argValue{v: raw, path: "sandbox", err: &problem}, &sb)
	if problem != "" {
		return sb, problem
	}
	if why := r.sb.looser(sb); why != "" {
		return sb, "sandbox " + why
	}
	return sb, ""
}

// argValue is a sandboxValue over a call's decoded JSON arguments. The
// first problem is kept in *err (shared by every value of one parse).
type argValue struct {
	v    any
	path string
	err  *string
}

func (a *argValue) fail(format string, args ...any) {
	if *a.err == "" {
		*a.err = a.path + ": " + fmt.Sprintf(format, args...)
	}
}

func (a *argValue) fields(known ...string) (map[string]sandboxValue, bool) {
	obj, ok := a.v.(map[string]any)
	if !ok {
		a.fail("want an object, got %s", jsonKind(a.v))
		return nil, false
	}
	out := make(map[string]sandboxValue, len(obj))
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !slices.Contains(known, k) {
			a.fail("unknown field %q (known: %s)", k, strings.Join(known, ", "))
			return nil, false
		}
		if v := obj[k]; v != nil {
			out[k] = &argValue{v: v, path: a.path + "." + k, err: a.err}
		}
	}
	return out, true
}

func (a *argValue) str() (string, bool) {
	s, ok := a.v.(string)
	if !ok {
		a.fail("want a string, got %s", jsonKind(a.v))
	}
	return s, ok
}

func (a *argValue) list() ([]sandboxValue, bool) {
	l, ok := a.v.([]any)
	if !ok {
		a.fail("want a list, got %s", jsonKind(a.v))
		return nil, false
	}
	out := make([]sandboxValue, len(l))
	for i, v := range l {
		out[i] = &argValue{v: v, path: a.path + "[" + strconv.Itoa(i) + "]", err: a.err}
	}
	return out, true
}

func (a *argValue) port() (uint16, bool) {
	var f float64
	switch n := a.v.(type) {
	case float64:
		f = n
	case json.Number:
		x, err := n.Float64()
		if err != nil {
			a.fail("port %s is not a number", n)
			return 0, false
		}
		f = x
	default:
		a.fail("want a port number, got %s", jsonKind(a.v))
		return 0, false
	}
	if f < 0 || f > 65535 || f != float64(int(f)) {
		a.fail("port %v is not 0 to 65535", f)
		return 0, false
	}
	return uint16(f), true
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64, json.Number:
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// nodeValue is a sandboxValue over the document's node tree; problems
// become parse errors with the JSON path and line.
type nodeValue struct {
	b *builder
	n *node
	l loc
}

func (v *nodeValue) fail(format string, args ...any) { v.b.errorf(v.n.off, v.l.path, format, args...) }

func (v *nodeValue) fields(known ...string) (map[string]sandboxValue, bool) {
	m, ok := v.b.object(v.n, v.l, known...)
	if !ok {
		return nil, false
	}
	out := make(map[string]sandboxValue, len(m))
	for k, n := range m {
		out[k] = &nodeValue{b: v.b, n: n, l: v.l.key(k)}
	}
	return out, true
}

func (v *nodeValue) str() (string, bool) { return v.b.str(v.n, v.l) }

func (v *nodeValue) list() ([]sandboxValue, bool) {
	if v.n.kind != kindArray {
		v.fail("want a list, got %s", v.n.kind)
		return nil, false
	}
	out := make([]sandboxValue, len(v.n.elems))
	for i, el := range v.n.elems {
		out[i] = &nodeValue{b: v.b, n: el, l: v.l.index(i)}
	}
	return out, true
}

func (v *nodeValue) port() (uint16, bool) {
	x, ok := v.b.integer(v.n, v.l)
	if ok && (x < 0 || x > 65535) {
		v.fail("port %d is not 0 to 65535", x)
		return 0, false
	}
	return uint16(x), ok
}

// sandbox compiles a sandbox block at l. It starts from the default, so a
// block that leaves a field out has the default's value.
func (b *builder) sandbox(n *node, l loc) *sandboxRule {
	r := &sandboxRule{sb: defaultSandbox.sb.clone(), ptr: l.ptr}
	parseSandbox(&nodeValue{b: b, n: n, l: l}, &r.sb)
	return r
}
