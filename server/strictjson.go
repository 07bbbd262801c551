package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The strict JSON reader of tool calls. encoding/json (and so mcp-go)
// silently keeps the last of two duplicate keys and matches field names
// case-insensitively; a policy that looked at one "vm" while the driver got
// another would be bypassed. So every tools/call message is read here first:
// duplicate keys and keys that differ only in case are errors, strings must
// be valid UTF-8, nesting is bounded, and numbers stay json.Number so that
// a huge pid is not rounded into a valid one.

// maxJSONDepth bounds the nesting of a message.
const maxJSONDepth = 64

// errJSON wraps every strict-decoding failure.
var errJSON = errors.New("malformed JSON")

type jsonReader struct {
	data []byte
	pos  int
}

// decodeStrict decodes one JSON value filling data (whitespace aside) into
// map[string]any, []any, string, json.Number, bool or nil.
func decodeStrict(data []byte) (any, error) {
	r := jsonReader{data: data}
	r.skipSpace()
	v, err := r.value(0)
	if err != nil {
		return nil, err
	}
	r.skipSpace()
	if r.pos < len(r.data) {
		return nil, r.errorf("unexpected data after the value")
	}
	return v, nil
}

func (r *jsonReader) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", errJSON, r.pos, fmt.Sprintf(format, args...))
}

func (r *jsonReader) skipSpace() {
	for r.pos < len(r.data) {
		switch r.data[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

func (r *jsonReader) value(depth int) (any, error) {
	if r.pos >= len(r.data) {
		return nil, r.errorf("unexpected end of input")
	}
	switch c := r.data[r.pos]; {
	case c == '{':
		if depth >= maxJSONDepth {
			return nil, r.errorf("nesting deeper than %d", maxJSONDepth)
		}
		return r.object(depth + 1)
	case c == '[':
		if depth >= maxJSONDepth {
			return nil, r.errorf("nesting deeper than %d", maxJSONDepth)
		}
		return r.array(depth + 1)
	case c == '"':
		return r.string()
	case c == '-' || (c >= '0' && c <= '9'):
		return r.number()
	case c == 't':
		return true, r.literal("true")
	case c == 'f':
		return false, r.literal("false")
	case c == 'n':
		return nil, r.literal("null")
	}
	return nil, r.errorf("unexpected character %q", r.data[r.pos])
}

func (r *jsonReader) literal(lit string) error {
	if !strings.HasPrefix(string(r.data[r.pos:min(len(r.data), r.pos+len(lit))]), lit) {
		return r.errorf("invalid literal")
	}
	r.pos += len(lit)
	return nil
}

func (r *jsonReader) object(depth int) (map[string]any, error) {
	m := make(map[string]any, 8)
	var folded map[string]string // folded key → key, built lazily for large objects
	r.pos++
	r.skipSpace()
	if r.pos < len(r.data) && r.data[r.pos] == '}' {
		r.pos++
		return m, nil
	}
	for {
		r.skipSpace()
		if r.pos >= len(r.data) || r.data[r.pos] != '"' {
			return nil, r.errorf("want a quoted key")
		}
		key, err := r.string()
		if err != nil {
			return nil, err
		}
		if _, dup := m[key]; dup {
			return nil, fmt.Errorf("%w: duplicate key %q", errJSON, key)
		}
		// Keys differing only in case are duplicates for a case-folding reader.
		if len(m) < 16 {
			for k := range m {
				if strings.EqualFold(k, key) {
					return nil, fmt.Errorf("%w: key %q differs from key %q only in case", errJSON, key, k)
				}
			}
		} else {
			if folded == nil {
				folded = make(map[string]string, 2*len(m))
				for k := range m {
					folded[foldKey(k)] = k
				}
			}
			fk := foldKey(key)
			if k, ok := folded[fk]; ok {
				return nil, fmt.Errorf("%w: key %q differs from key %q only in case", errJSON, key, k)
			}
			folded[fk] = key
		}
		r.skipSpace()
		if r.pos >= len(r.data) || r.data[r.pos] != ':' {
			return nil, r.errorf("want ':'")
		}
		r.pos++
		r.skipSpace()
		v, err := r.value(depth)
		if err != nil {
			return nil, err
		}
		m[key] = v
		r.skipSpace()
		if r.pos >= len(r.data) {
			return nil, r.errorf("unexpected end of input in object")
		}
		switch r.data[r.pos] {
		case ',':
			r.pos++
		case '}':
			r.pos++
			return m, nil
		default:
			return nil, r.errorf("want ',' or '}'")
		}
	}
}

func (r *jsonReader) array(depth int) ([]any, error) {
	a := make([]any, 0, 4)
	r.pos++
	r.skipSpace()
	if r.pos < len(r.data) && r.data[r.pos] == ']' {
		r.pos++
		return a, nil
	}
	for {
		r.skipSpace()
		v, err := r.value(depth)
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		r.skipSpace()
		if r.pos >= len(r.data) {
			return nil, r.errorf("unexpected end of input in array")
		}
		switch r.data[r.pos] {
		case ',':
			r.pos++
		case ']':
			r.pos++
			return a, nil
		default:
			return nil, r.errorf("want ',' or ']'")
		}
	}
}

func (r *jsonReader) number() (json.Number, error) {
	d, start, p := r.data, r.pos, r.pos
	digits := func() int {
		s := p
		for p < len(d) && d[p] >= '0' && d[p] <= '9' {
			p++
		}
		return p - s
	}
	if p < len(d) && d[p] == '-' {
		p++
	}
	if p < len(d) && d[p] == '0' {
		p++
	} else if digits() == 0 {
		r.pos = p
		return "", r.errorf("malformed number")
	}
	if p < len(d) && d[p] == '.' {
		p++
		if digits() == 0 {
			r.pos = p
			return "", r.errorf("malformed number")
		}
	}
	if p < len(d) && (d[p] == 'e' || d[p] == 'E') {
		p++
		if p < len(d) && (d[p] == '+' || d[p] == '-') {
			p++
		}
		if digits() == 0 {
			r.pos = p
			return "", r.errorf("malformed number")
		}
	}
	r.pos = p
	return json.Number(d[start:p]), nil
}

func (r *jsonReader) string() (string, error) {
	d := r.data
	r.pos++
	start := r.pos
	for p := start; p < len(d); p++ {
		c := d[p]
		if c == '"' {
			s := d[start:p]
			r.pos = p + 1
			if k := intern(s); k != "" {
				return k, nil
			}
			if !utf8.Valid(s) {
				r.pos = start
				return "", r.errorf("invalid UTF-8 in string")
			}
			return string(s), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
	}
	var b strings.Builder
	for {
		if r.pos >= len(d) {
			return "", r.errorf("unterminated string")
		}
		c := d[r.pos]
		switch {
		case c == '"':
			r.pos++
			s := b.String()
			if !utf8.ValidString(s) {
				return "", r.errorf("invalid UTF-8 in string")
			}
			return s, nil
		case c < 0x20:
			return "", r.errorf("control character in string")
		case c != '\\':
			b.WriteByte(c)
			r.pos++
			continue
		}
		if r.pos+1 >= len(d) {
			return "", r.errorf("unterminated string")
		}
		e := d[r.pos+1]
		r.pos += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			c1, err := r.hex4()
			if err != nil {
				return "", err
			}
			if utf16.IsSurrogate(c1) {
				if r.pos+1 < len(d) && d[r.pos] == '\\' && d[r.pos+1] == 'u' {
					r.pos += 2
					c2, err := r.hex4()
					if err != nil {
						return "", err
					}
					if dec := utf16.DecodeRune(c1, c2); dec != utf8.RuneError {
						b.WriteRune(dec)
						continue
					}
				}
				return "", r.errorf("invalid surrogate pair in string")
			}
			b.WriteRune(c1)
		default:
			return "", r.errorf("invalid escape in string")
		}
	}
}

func (r *jsonReader) hex4() (rune, error) {
	if r.pos+4 > len(r.data) {
		return 0, r.errorf("truncated \\u escape")
	}
	v, err := strconv.ParseUint(string(r.data[r.pos:r.pos+4]), 16, 32)
	if err != nil {
		return 0, r.errorf("invalid \\u escape")
	}
	r.pos += 4
	return rune(v), nil
}

// intern returns the constant for the keys and values every tools/call
// carries, so decoding them allocates nothing; "" for anything else. The
// switch on string(b) does not allocate.
func intern(b []byte) string {
	switch string(b) {
	case "jsonrpc":
		return "jsonrpc"
	case "2.0":
		return "2.0"
	case "id":
		return "id"
	case "method":
		return "method"
	case "tools/call":
		return "tools/call"
	case "params":
		return "params"
	case "name":
		return "name"
	case "arguments":
		return "arguments"
	case "_meta":
		return "_meta"
	case "vm":
		return "vm"
	case "session":
		return "session"
	case "command":
		return "command"
	case "timeout_s":
		return "timeout_s"
	case "pid":
		return "pid"
	case "signal":
		return "signal"
	case "path":
		return "path"
	case "list_vms":
		return "list_vms"
	case "vm_status":
		return "vm_status"
	case "vm_agent_exec":
		return "vm_agent_exec"
	case "list_processes":
		return "list_processes"
	case "kill_process":
		return "kill_process"
	}
	return ""
}

// foldKey maps s to a string equal for two strings exactly when
// strings.EqualFold says they are.
func foldKey(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, c := range s {
		least := c
		for f := unicode.SimpleFold(c); f != c; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}
