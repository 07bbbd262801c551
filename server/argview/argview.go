// Package argview renders the arguments of a parked call for the operator
// who decides it: every argument, with stdin, file content and env values
// in full (up to a size, with their total length), so that an operator
// never approves what they cannot see.
//
// What is shown cannot hide anything: text is shown as text, except that
// every character that a terminal or a browser would not print as itself
// (control characters such as ESC or a carriage return, Unicode format
// characters such as bidirectional overrides and zero-width joiners,
// invalid UTF-8) is shown as a visible escape (\x1b, \u{202e}), and
// counted; content that is not mostly text (binary, or more than a tenth
// escapes) is shown as a hex dump. Newlines and tabs stay as they are: a
// caller that prints text line by line must mark each line as part of the
// value (cmd/vmgate prefixes them with "|"), so that a value cannot forge
// lines of its own.
//
// The package is a leaf: standard library only.
package argview

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The kinds of a Field.
const (
	KindText = "text" // Value is the text, with escapes
	KindHex  = "hex"  // Value is a hex dump of the bytes
	KindJSON = "json" // Value is the JSON of a value that is not a string
)

// Field is one argument (or one env variable) as the operator sees it.
type Field struct {
	// Name is the argument's name; env variables are "env.NAME", and
	// content_base64 is shown decoded.
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Value is what to show: at most Shown bytes of the value, rendered.
	Value string `json:"value"`
	// Bytes is the value's whole length in bytes (decoded, for
	// content_base64; the JSON's length for KindJSON).
	Bytes int `json:"bytes"`
	// Shown is how many of those bytes Value shows.
	Shown int `json:"shown"`
	// Escaped counts the characters Value shows as escapes.
	Escaped int `json:"escaped,omitempty"`
}

// Truncated reports whether Value shows less than the whole value.
func (f Field) Truncated() bool { return f.Shown < f.Bytes }

// ErrNotObject: the arguments are not a JSON object.
var ErrNotObject = errors.New("argview: the arguments are not a JSON object")

// Fields renders args, the JSON object of a call's arguments; each value
// shows at most limit bytes (limit <= 0: all of it). Fields are in the
// order of their names, env variables after the other arguments.
func Fields(args string, limit int) ([]Field, error) {
	return fields(args, limit, block)
}

// InlineFields renders args, every value in full, for a view that shows
// each value on one line of plain text (Inline).
func InlineFields(args string) ([]Field, error) {
	return fields(args, 0, inline)
}

// A style renders the bytes shown of a value: text (with escapes) or, for
// content that is not mostly text, hex.
type style struct {
	text func(s string) (string, int)
	hex  func(b []byte) string
}

var (
	block  = style{text: Escape, hex: func(b []byte) string { return strings.TrimSuffix(hex.Dump(b), "\n") }}
	inline = style{text: Inline, hex: hexLine}
)

func fields(args string, limit int, st style) ([]Field, error) {
	dec := json.NewDecoder(strings.NewReader(args))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, ErrNotObject
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	var out, env []Field
	for _, k := range names {
		v := m[k]
		switch {
		case k == "env":
			vars, ok := v.(map[string]any)
			if !ok {
				out = append(out, value(k, v, limit, st))
				continue
			}
			keys := make([]string, 0, len(vars))
			for name := range vars {
				keys = append(keys, name)
			}
			slices.Sort(keys)
			for _, name := range keys {
				env = append(env, value("env."+escapeName(name), vars[name], limit, st))
			}
		case k == "content_base64":
			s, ok := v.(string)
			b, err := base64.StdEncoding.DecodeString(s)
			if !ok || err != nil {
				out = append(out, value(k, v, limit, st))
				continue
			}
			f := render(b, limit, st)
			f.Name = k + " (decoded)"
			out = append(out, f)
		default:
			out = append(out, value(escapeName(k), v, limit, st))
		}
	}
	return append(out, env...), nil
}

// Of renders the arguments of a parked call: full (the call's arguments
// in full) when they are kept, else redacted (what the audit log records),
// with usedRedacted set. Arguments that do not decode give no fields.
func Of(full, redacted string, limit int) (fields []Field, usedRedacted bool) {
	src := full
	if src == "" {
		src, usedRedacted = redacted, true
	}
	fields, _ = Fields(src, limit)
	return fields, usedRedacted
}

// value renders one JSON value: a string as text (or hex), anything else
// as its JSON.
func value(name string, v any, limit int, st style) Field {
	if s, ok := v.(string); ok {
		f := render([]byte(s), limit, st)
		f.Name = name
		return f
	}
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(fmt.Sprintf("%v", v))
	}
	f := Field{Name: name, Kind: KindJSON, Bytes: len(b)}
	shown := cut(b, limit)
	f.Value, f.Escaped = st.text(string(shown))
	f.Shown = len(shown)
	return f
}

// Bytes renders b as text with escapes when it is mostly text, else as a
// hex dump; at most limit bytes (limit <= 0: all).
func Bytes(b []byte, limit int) Field { return render(b, limit, block) }

func render(b []byte, limit int, st style) Field {
	f := Field{Bytes: len(b)}
	shown := cut(b, limit)
	f.Shown = len(shown)
	if isText(b) {
		f.Kind = KindText
		f.Value, f.Escaped = st.text(string(shown))
		return f
	}
	f.Kind = KindHex
	f.Value = st.hex(shown)
	return f
}

// cut returns at most limit bytes of b, ending on a rune boundary of text.
func cut(b []byte, limit int) []byte {
	if limit <= 0 || len(b) <= limit {
		return b
	}
	for n := limit; n > 0 && n > limit-utf8.UTFMax; n-- {
		if utf8.RuneStart(b[n]) {
			return b[:n]
		}
	}
	return b[:limit]
}

// isText: valid UTF-8 without NUL whose escapes are at most a tenth of its
// characters.
func isText(b []byte) bool {
	if !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 {
		return false
	}
	runes, hidden := 0, 0
	for _, r := range string(b) {
		runes++
		if needsEscape(r) {
			hidden++
		}
	}
	return hidden*10 <= runes
}

// needsEscape reports whether r is not shown as itself.
func needsEscape(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0:
		return true
	case r == utf8.RuneError:
		return true
	}
	return !unicode.IsGraphic(r) || unicode.In(r, unicode.Cf, unicode.Co, unicode.Cs)
}

// Escape returns s with every character that would not print as itself
// replaced by a visible escape (\xNN for control characters and invalid
// bytes, \u{XXXX} for the rest), and how many it replaced.
func Escape(s string) (string, int) {
	var b strings.Builder
	n := 0
	for i := 0; i < len(s); {
		size, escaped := escapeRune(&b, s[i:])
		if escaped {
			n++
		}
		i += size
	}
	return b.String(), n
}

// escapeRune writes the first character of s to b, escaped if it would not
// print as itself, and returns its size in bytes.
func escapeRune(b *strings.Builder, s string) (size int, escaped bool) {
	r, size := utf8.DecodeRuneInString(s)
	switch {
	case r == utf8.RuneError && size <= 1:
		fmt.Fprintf(b, `\x%02x`, s[0])
	case r < 0x80 && needsEscape(r):
		fmt.Fprintf(b, `\x%02x`, r)
	case needsEscape(r):
		fmt.Fprintf(b, `\u{%04x}`, r)
	default:
		b.WriteString(s[:size])
		return size, false
	}
	return size, true
}

// escapeName makes an argument or variable name safe to show on one line.
func escapeName(s string) string {
	e, _ := Escape(s)
	return strings.NewReplacer("\n", `\n`, "\t", `\t`).Replace(e)
}
