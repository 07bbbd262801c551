package catalog

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/internal/guestctl"
)

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

// Validate checks args (from jsonrpc.Decode) against t and returns them
// normalised: integers become int64, everything else is kept.
func (t *Tool) Validate(args map[string]any) (map[string]any, error) {
	out, err := validateObject(t.Fields, args, "")
	if err != nil {
		return nil, err
	}
	for _, group := range t.ExactlyOne {
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

func validateObject(fields []Field, obj map[string]any, prefix string) (map[string]any, error) {
	out := make(map[string]any, len(obj))
	for k := range obj {
		if !slices.ContainsFunc(fields, func(f Field) bool { return f.Name == k }) {
			return nil, &argError{path: prefix + k, msg: "unknown argument"}
		}
	}
	for i := range fields {
		f := &fields[i]
		v, ok := obj[f.Name]
		if !ok {
			if f.Required {
				return nil, &argError{path: prefix + f.Name, msg: "required"}
			}
			continue
		}
		nv, err := f.check(v, prefix+f.Name)
		if err != nil {
			return nil, err
		}
		out[f.Name] = nv
	}
	return out, nil
}

// check validates v (as jsonrpc.Decode gives it) as f's value at path and
// returns it normalised.
func (f *Field) check(v any, path string) (any, error) {
	switch f.Kind {
	case KindString:
		s, ok := v.(string)
		if !ok {
			return nil, &argError{path, "want a string, got " + jsonType(v)}
		}
		if err := f.checkString(s, path); err != nil {
			return nil, err
		}
		return s, nil
	case KindInteger:
		return f.checkInteger(v, path)
	case KindBoolean:
		b, ok := v.(bool)
		if !ok {
			return nil, &argError{path, "want a boolean, got " + jsonType(v)}
		}
		return b, nil
	case KindStringArray:
		return f.checkStringArray(v, path)
	case KindStringMap:
		return f.checkStringMap(v, path)
	case KindObject:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, &argError{path, "want an object, got " + jsonType(v)}
		}
		return validateObject(f.Fields, m, path+".")
	}
	return nil, &argError{path, "unsupported field kind"}
}

// checkInteger validates an integer within [Min, Max] as an int64.
func (f *Field) checkInteger(v any, path string) (any, error) {
	n, ok := v.(json.Number)
	if !ok {
		return nil, &argError{path, "want an integer, got " + jsonType(v)}
	}
	i, err := integer(n)
	if err != nil {
		return nil, &argError{path, err.Error()}
	}
	if i < f.Min || i > f.Max {
		if f.Max == math.MaxInt64 {
			return nil, &argError{path, fmt.Sprintf("%d is below the minimum %d", i, f.Min)}
		}
		return nil, &argError{path, fmt.Sprintf("%d is out of range [%d, %d]", i, f.Min, f.Max)}
	}
	return i, nil
}

// checkStringArray validates an array of at most MaxLen strings, each
// as checkString does.
func (f *Field) checkStringArray(v any, path string) (any, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, &argError{path, "want an array of strings, got " + jsonType(v)}
	}
	if len(a) == 0 && !f.AllowEmpty {
		return nil, &argError{path, "must not be empty"}
	}
	if f.MaxLen > 0 && len(a) > f.MaxLen {
		return nil, &argError{path, fmt.Sprintf("more than %d items", f.MaxLen)}
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
}

// checkStringMap validates an environment: at most MaxLen variables with
// valid names, none of them VMGATE_*, values without NUL.
func (f *Field) checkStringMap(v any, path string) (any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, &argError{path, "want an object of strings, got " + jsonType(v)}
	}
	if f.MaxLen > 0 && len(m) > f.MaxLen {
		return nil, &argError{path, fmt.Sprintf("more than %d entries", f.MaxLen)}
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
}

func (f *Field) checkString(s, path string) error {
	if !f.AllowNUL && strings.IndexByte(s, 0) >= 0 {
		return &argError{path, "contains a NUL byte"}
	}
	if f.MaxLen > 0 && f.Kind == KindString && len(s) > f.MaxLen {
		return &argError{path, fmt.Sprintf("longer than %d bytes", f.MaxLen)}
	}
	if f.GuestPath {
		if err := guestctl.CheckPath("", s); err != nil {
			return &argError{path, PathProblem(err)}
		}
	}
	if f.Enum != nil && !slices.Contains(f.Enum, s) {
		return &argError{path, fmt.Sprintf("%q is not one of %s", Truncate(s, 40), strings.Join(f.Enum, ", "))}
	}
	if f.Valid != nil {
		if err := f.Valid(s); err != nil {
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
		return 0, fmt.Errorf("%s is out of range", Truncate(string(n), 40))
	}
	if f != math.Trunc(f) {
		return 0, fmt.Errorf("%s is not an integer", Truncate(string(n), 40))
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

// Truncate cuts s to n bytes and marks the cut, for messages.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// PathProblem is guestctl's complaint about a path, without its prefix.
func PathProblem(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, "invalid argument: "); i >= 0 {
		msg = msg[i+len("invalid argument: "):]
	}
	return msg
}
