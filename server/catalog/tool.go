package catalog

import (
	"maps"
)

// The tool catalogue. Each tool is described once, as a list of fields; the
// JSON Schema that tools/list publishes and the strict validator the gate
// runs are both generated from that description, so they cannot disagree.

// Kind is the JSON type of an argument.
type Kind uint8

// The argument kinds.
const (
	KindString Kind = iota
	KindInteger
	KindBoolean
	KindStringArray // an array of strings
	KindStringMap   // an object of strings (an environment: names checked, VMGATE_* refused)
	KindObject      // an object of Fields
)

// Field is one argument of a tool.
type Field struct {
	Name     string
	Kind     Kind
	Desc     string
	Required bool
	Enum     []string
	Min, Max int64 // integers: inclusive range
	MaxLen   int   // strings: bytes; arrays: items; maps: entries (0: the server's argument cap only)
	AllowNUL bool  // strings that may carry NUL (stdin, file content)
	// GuestPath: a string that must be an absolute, clean path, so the
	// policy's path rules see the path the guest opens (tools/files.go).
	GuestPath bool
	// AllowEmpty: a string array may be empty (a list of extra paths).
	AllowEmpty bool
	// Valid, when set, checks each string (of a string or an array of
	// them) beyond MaxLen and Enum: a sandbox path must be absolute and clean.
	Valid  func(s string) error
	Fields []Field // KindObject's fields
	// Default is the value the handler uses when the field is left out
	// (published as the schema's default; policy conditions see it).
	Default any
}

// Tool is one tool of the catalogue: its name, annotations and
// arguments, the shapes of its results, and (set by NewTool) its typed
// arguments and handler.
type Tool struct {
	Name        string
	Title       string
	Desc        string
	Fields      []Field
	ExactlyOne  [][]string // groups of fields of which exactly one must be present
	ReadOnly    bool
	Destructive bool // can change a guest (its files, processes or power)
	Idempotent  bool
	OpenWorld   bool // reaches outside the VM and vmgate's own state
	// Output are the shapes of the tool's structuredContent on success
	// (JSON Schemas, output.go); the published outputSchema is one of them
	// or the error shape.
	Output []map[string]any
	// plan and run are set by NewTool from the tool's argument struct and
	// handler (see args.go).
	plan *argPlan
	run  func(e *Env, c *Call) Result
}

// WithDefaults is args with every left-out field that has a default set to
// it: the arguments as the handler runs them, which policy conditions see
// (require args.signal in [TERM, KILL] allows a kill that leaves signal
// out). args is not changed.
func (t *Tool) WithDefaults(args map[string]any) map[string]any {
	var out map[string]any
	for _, f := range t.Fields {
		if _, ok := args[f.Name]; ok || f.Default == nil {
			continue
		}
		if out == nil {
			out = make(map[string]any, len(args)+1)
			maps.Copy(out, args)
		}
		out[f.Name] = f.Default
	}
	if out == nil {
		return args
	}
	return out
}

// Field returns the argument name, or nil.
func (t *Tool) Field(name string) *Field {
	for i := range t.Fields {
		if t.Fields[i].Name == name {
			return &t.Fields[i]
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
func DefaultLimits() Limits {
	return Limits{
		MaxOutputBytes:  1 << 20,
		MaxTimeoutS:     600,
		DefaultTimeoutS: 30,
		MaxMessageBytes: 8 << 20,
	}
}

// WithDefaults is l with DefaultLimits in place of every value not set.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	if l.MaxTimeoutS <= 0 {
		l.MaxTimeoutS = d.MaxTimeoutS
	}
	if l.DefaultTimeoutS <= 0 {
		l.DefaultTimeoutS = min(d.DefaultTimeoutS, l.MaxTimeoutS)
	}
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = d.MaxMessageBytes
	}
	return l
}

const vmDesc = `VM id "<backend>/<name>" as list_vms returns it, e.g. "lab/vm1".`

// VMField is the vm argument every tool on one VM has; the gate resolves
// it (Call.VM, Call.Driver), so argument structs do not repeat it.
func VMField(required bool) Field {
	return Field{Name: "vm", Kind: KindString, Desc: vmDesc, Required: required, MaxLen: 512}
}

// SessionField is the session argument of the tools that run in one.
func SessionField() Field {
	return Field{Name: "session", Kind: KindString, Desc: "Session id from create_session.", MaxLen: 128}
}
