package server

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/vmgate/vmgate/internal/guestctl"
)

// The tool catalogue. Each tool is described once, as a list of fields; the
// JSON Schema that tools/list publishes and the strict validator the gate
// runs are both generated from that description, so they cannot disagree.

type fieldKind uint8

const (
	kindString fieldKind = iota
	kindInteger
	kindBoolean
	kindStringArray
	kindStringMap
	kindObject
)

// field is one argument of a tool.
type field struct {
	name     string
	kind     fieldKind
	desc     string
	required bool
	enum     []string
	min, max int64 // integers: inclusive range
	maxLen   int   // strings: bytes; arrays: items; maps: entries (0: the server's argument cap only)
	allowNUL bool  // strings that may carry NUL (stdin, file content)
	// guestPath: a string that must be an absolute, clean path, so the
	// policy's path rules see the path the guest opens (tool_files.go).
	guestPath bool
	// allowEmpty: a string array may be empty (a list of extra paths).
	allowEmpty bool
	// valid, when set, checks each string (of a string or an array of
	// them) beyond maxLen and enum: a sandbox path must be absolute and clean.
	valid  func(s string) error
	fields []field
	// def is the value the handler uses when the field is left out
	// (published as the schema's default; policy conditions see it).
	def any
}

// toolSpec is one tool of the catalogue.
type toolSpec struct {
	name        string
	title       string
	desc        string
	fields      []field
	exactlyOne  [][]string // groups of fields of which exactly one must be present
	readOnly    bool
	destructive bool // can change a guest (its files, processes or power)
	idempotent  bool
	openWorld   bool // reaches outside the VM and vmgate's own state
	// output are the shapes of the tool's structuredContent on success
	// (JSON Schemas, output.go); the published outputSchema is one of them
	// or the error shape.
	output []map[string]any
	// plan and run are set by newTool from the tool's argument struct and
	// handler (see args.go).
	plan *argPlan
	run  func(s *Server, c *call) result
}

// withDefaults is args with every left-out field that has a default set to
// it: the arguments as the handler runs them, which policy conditions see
// (require args.signal in [TERM, KILL] allows a kill that leaves signal
// out). args is not changed.
func (t *toolSpec) withDefaults(args map[string]any) map[string]any {
	var out map[string]any
	for _, f := range t.fields {
		if _, ok := args[f.name]; ok || f.def == nil {
			continue
		}
		if out == nil {
			out = make(map[string]any, len(args)+1)
			maps.Copy(out, args)
		}
		out[f.name] = f.def
	}
	if out == nil {
		return args
	}
	return out
}

func (t *toolSpec) field(name string) *field {
	for i := range t.fields {
		if t.fields[i].name == name {
			return &t.fields[i]
		}
	}
	return nil
}

// Limits are the server-side caps on what a client may ask for.
type Limits struct {
	// MaxOutputBytes caps stdout and stderr of a command (each) and a file
	// read; a client's max_output_bytes or max_bytes is clamped to it.
	MaxOutputBytes int64
	// MaxTimeoutS is the largest timeout_s a command may ask for.
	MaxTimeoutS int64
	// DefaultTimeoutS is the timeout of a command that names none.
	DefaultTimeoutS int64
	// MaxMessageBytes bounds one tools/call message (the arguments with
	// their envelope); larger calls are rejected as invalid arguments.
	MaxMessageBytes int
}

// DefaultLimits are the limits of a config that sets none.
var DefaultLimits = Limits{
	MaxOutputBytes:  1 << 20,
	MaxTimeoutS:     600,
	DefaultTimeoutS: 30,
	MaxMessageBytes: 8 << 20,
}

func (l Limits) withDefaults() Limits {
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = DefaultLimits.MaxOutputBytes
	}
	if l.MaxTimeoutS <= 0 {
		l.MaxTimeoutS = DefaultLimits.MaxTimeoutS
	}
	if l.DefaultTimeoutS <= 0 {
		l.DefaultTimeoutS = min(DefaultLimits.DefaultTimeoutS, l.MaxTimeoutS)
	}
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = DefaultLimits.MaxMessageBytes
	}
	return l
}

const vmDesc = `VM id "<backend>/<name>" as list_vms returns it, e.g. "lab/vm1".`

func vmField(required bool) field {
	return field{name: "vm", kind: kindString, desc: vmDesc, required: required, maxLen: 512}
}

func sessionField() field {
	return field{name: "session", kind: kindString, desc: "Session id from create_session.", maxLen: 128}
}

// catalogue returns the tool specs for limits, in tools/list order. Each
// tool is defined in the file of its family, with its argument struct and
// handler:
//
//	tool_vms.go        list_vms, vm_status
//	tool_exec.go       vm_agent_exec, vm_agent_exec_status
//	tool_processes.go  list_processes, kill_process
//	tool_sessions.go   create_session, list_sessions, destroy_session
//	tool_files.go      vm_file_read, vm_file_write
//	tool_power.go      vm_power
//	tool_snapshots.go  snapshot_create, snapshot_list, snapshot_revert, snapshot_delete
//	tool_observe.go    vm_network, vm_metrics
//	tool_trash.go      restore_session_files
//	tool_lifecycle.go  vm_create, vm_delete
//
// A new family (snapshots, VM lifecycle) gets its own tool_<family>.go and
// its entries here.
func catalogue(l Limits) []*toolSpec {
	return []*toolSpec{
		listVMsTool(),
		vmStatusTool(),
		listProcessesTool(),
		listSessionsTool(),
		execTool(l),
		execStatusTool(),
		createSessionTool(),
		killProcessTool(),
		destroySessionTool(),
		fileReadTool(l),
		fileWriteTool(),
		powerTool(),
		snapshotListTool(),
		snapshotCreateTool(),
		snapshotRevertTool(),
		snapshotDeleteTool(),
		vmNetworkTool(),
		vmMetricsTool(),
		restoreSessionFilesTool(),
		createTool(),
		deleteTool(),
	}
}

// schema returns the JSON Schema of fields as an object.
func schemaOf(fields []field) map[string]any {
	props := make(map[string]any, len(fields))
	var required []string
	for _, f := range fields {
		props[f.name] = f.schema()
		if f.required {
			required = append(required, f.name)
		}
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

func (f field) schema() map[string]any {
	var s map[string]any
	switch f.kind {
	case kindString:
		s = map[string]any{"type": "string"}
		if f.enum != nil {
			s["enum"] = f.enum
		}
		if f.maxLen > 0 {
			s["maxLength"] = f.maxLen
		}
	case kindInteger:
		s = map[string]any{"type": "integer", "minimum": f.min}
		if f.max != math.MaxInt64 {
			s["maximum"] = f.max
		}
	case kindBoolean:
		s = map[string]any{"type": "boolean"}
	case kindStringArray:
		s = map[string]any{"type": "array", "items": map[string]any{"type": "string"}}
		if !f.allowEmpty {
			s["minItems"] = 1
		}
		if f.maxLen > 0 {
			s["maxItems"] = f.maxLen
		}
	case kindStringMap:
		s = map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
		if f.maxLen > 0 {
			s["maxProperties"] = f.maxLen
		}
	case kindObject:
		s = schemaOf(f.fields)
	}
	if f.def != nil {
		s["default"] = f.def
	}
	s["description"] = f.desc
	return s
}

// mcpTool builds the mcp.Tool tools/list publishes.
func (t *toolSpec) mcpTool() mcp.Tool {
	raw, err := json.Marshal(schemaOf(t.fields))
	if err != nil {
		panic(fmt.Sprintf("server: schema of %s: %v", t.name, err)) // a programming error in the catalogue
	}
	tool := mcp.NewToolWithRawSchema(t.name, t.desc, raw)
	tool.Title = t.title
	tool.Annotations = mcp.ToolAnnotation{
		Title:           t.title,
		ReadOnlyHint:    mcp.ToBoolPtr(t.readOnly),
		DestructiveHint: mcp.ToBoolPtr(t.destructive),
		IdempotentHint:  mcp.ToBoolPtr(t.idempotent),
		OpenWorldHint:   mcp.ToBoolPtr(t.openWorld),
	}
	tool.RawOutputSchema = t.rawOutputSchema()
	return tool
}

// argError is an argument that failed validation.
type argError struct {
	path string
	msg  string
}

func (e *argError) Error() string {
	if e.path == "" {
		return e.msg
	}
	return e.path + ": " + e.msg
}

// validate checks args (from decodeStrict) against t and returns them
// normalised: integers become int64, everything else is kept.
func (t *toolSpec) validate(args map[string]any) (map[string]any, error) {
	out, err := validateObject(t.fields, args, "")
	if err != nil {
		return nil, err
	}
	for _, group := range t.exactlyOne {
		n := 0
		for _, name := range group {
			if _, ok := out[name]; ok {
				n++
			}
		}
		if n != 1 {
			return nil, &argError{msg: "give exactly one of " + strings.Join(group, ", ")}
		}
	}
	return out, nil
}

func validateObject(fields []field, obj map[string]any, prefix string) (map[string]any, error) {
	out := make(map[string]any, len(obj))
	for k := range obj {
		if !slices.ContainsFunc(fields, func(f field) bool { return f.name == k }) {
			return nil, &argError{path: prefix + k, msg: "unknown argument"}
		}
	}
	for i := range fields {
		f := &fields[i]
		v, ok := obj[f.name]
		if !ok {
			if f.required {
				return nil, &argError{path: prefix + f.name, msg: "required"}
			}
			continue
		}
		nv, err := f.check(v, prefix+f.name)
		if err != nil {
			return nil, err
		}
		out[f.name] = nv
	}
	return out, nil
}

func (f *field) check(v any, path string) (any, error) {
	switch f.kind {
	case kindString:
		s, ok := v.(string)
		if !ok {
			return nil, &argError{path, "want a string, got " + jsonType(v)}
		}
		if err := f.checkString(s, path); err != nil {
			return nil, err
		}
		return s, nil
	case kindInteger:
		n, ok := v.(json.Number)
		if !ok {
			return nil, &argError{path, "want an integer, got " + jsonType(v)}
		}
		i, err := integer(n)
		if err != nil {
			return nil, &argError{path, err.Error()}
		}
		if i < f.min || i > f.max {
			if f.max == math.MaxInt64 {
				return nil, &argError{path, fmt.Sprintf("%d is below the minimum %d", i, f.min)}
			}
			return nil, &argError{path, fmt.Sprintf("%d is out of range [%d, %d]", i, f.min, f.max)}
		}
		return i, nil
	case kindBoolean:
		b, ok := v.(bool)
		if !ok {
			return nil, &argError{path, "want a boolean, got " + jsonType(v)}
		}
		return b, nil
	case kindStringArray:
		a, ok := v.([]any)
		if !ok {
			return nil, &argError{path, "want an array of strings, got " + jsonType(v)}
		}
		if len(a) == 0 && !f.allowEmpty {
			return nil, &argError{path, "must not be empty"}
		}
		if f.maxLen > 0 && len(a) > f.maxLen {
			return nil, &argError{path, fmt.Sprintf("more than %d items", f.maxLen)}
		}
		out := make([]any, len(a))
		for i, e := range a {
			s, ok := e.(string)
			if !ok {
				return nil, &argError{fmt.Sprintf("%s[%d]", path, i), "want a string, got " + jsonType(e)}
			}
			if err := f.checkString(s, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return nil, err
			}
			out[i] = s
		}
		return out, nil
	case kindStringMap:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, &argError{path, "want an object of strings, got " + jsonType(v)}
		}
		if f.maxLen > 0 && len(m) > f.maxLen {
			return nil, &argError{path, fmt.Sprintf("more than %d entries", f.maxLen)}
		}
		for k, e := range m {
			if !envName(k) {
				return nil, &argError{path + "." + k, "not a valid environment variable name"}
			}
			if reservedEnv(k) {
				return nil, &argError{path + "." + k, "VMGATE_* variables are reserved: vmgate sets them itself (a session's membership), so a call may not name one; leave it out"}
			}
			s, ok := e.(string)
			if !ok {
				return nil, &argError{path + "." + k, "want a string, got " + jsonType(e)}
			}
			if strings.IndexByte(s, 0) >= 0 {
				return nil, &argError{path + "." + k, "contains a NUL byte"}
			}
		}
		return m, nil
	case kindObject:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, &argError{path, "want an object, got " + jsonType(v)}
		}
		return validateObject(f.fields, m, path+".")
	}
	return nil, &argError{path, "unsupported field kind"}
}

func (f *field) checkString(s, path string) error {
	if !f.allowNUL && strings.IndexByte(s, 0) >= 0 {
		return &argError{path, "contains a NUL byte"}
	}
	if f.maxLen > 0 && f.kind == kindString && len(s) > f.maxLen {
		return &argError{path, fmt.Sprintf("longer than %d bytes", f.maxLen)}
	}
	if f.guestPath {
		if err := guestctl.CheckPath("", s); err != nil {
			return &argError{path, pathProblem(err)}
		}
	}
	if f.enum != nil && !slices.Contains(f.enum, s) {
		return &argError{path, fmt.Sprintf("%q is not one of %s", truncate(s, 40), strings.Join(f.enum, ", "))}
	}
	if f.valid != nil {
		if err := f.valid(s); err != nil {
			return &argError{path, err.Error()}
		}
	}
	return nil
}

// integer parses a JSON number that must be an integer within int64.
func integer(n json.Number) (int64, error) {
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return i, nil
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsInf(f, 0) || f >= math.MaxInt64 || f <= math.MinInt64 {
		return 0, fmt.Errorf("%s is out of range", truncate(string(n), 40))
	}
	if f != math.Trunc(f) {
		return 0, fmt.Errorf("%s is not an integer", truncate(string(n), 40))
	}
	return int64(f), nil
}

func envName(k string) bool {
	if k == "" || len(k) > 256 {
		return false
	}
	for i, c := range k {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// reservedEnv reports whether k is a VMGATE_* name, in any case: vmgate
// sets these itself (VMGATE_SESSION proves a session's membership where
// there is no cgroup), so no call may set one, on any exec road. The case
// is ignored so that no spelling of the prefix reaches a guest.
func reservedEnv(k string) bool {
	return len(k) >= len(reservedEnvPrefix) && strings.EqualFold(k[:len(reservedEnvPrefix)], reservedEnvPrefix)
}

const reservedEnvPrefix = "VMGATE_"

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
