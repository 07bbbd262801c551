package policy

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The strict JSON reader. encoding/json silently accepts duplicate keys and
// matches field names case-insensitively, and it does not say where a value
// was; a policy error must name its line and column. So the document is read
// by this small recursive-descent parser into a tree of nodes that remember
// their byte offsets, and the policy is then built from the tree.

// Limits of the reader.
const (
	// MaxDocumentSize is the largest policy document Parse accepts.
	MaxDocumentSize = 1 << 20
	// MaxDepth is the deepest nesting of objects and arrays Parse accepts.
	MaxDepth = 32
)

type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

func (k kind) String() string {
	return [...]string{"null", "boolean", "number", "string", "array", "object"}[k]
}

// node is one JSON value with the byte offset where it starts.
type node struct {
	kind kind
	off  int
	str  string // a string's value, or a number's literal text
	b    bool
	// members of an object, in document order
	keys    []string
	keyOffs []int
	vals    []*node
	elems   []*node // elements of an array
}

// syntaxError is a JSON syntax error at a byte offset.
type syntaxError struct {
	off int
	msg string
}

func (e *syntaxError) Error() string { return e.msg }

type reader struct {
	data []byte
	pos  int
}

// parseJSON reads one JSON value that fills data (whitespace aside).
func parseJSON(data []byte) (*node, error) {
	r := &reader{data: data}
	r.skipSpace()
	n, err := r.value(0)
	if err != nil {
		return nil, err
	}
	r.skipSpace()
	if r.pos < len(r.data) {
		return nil, r.errorf("unexpected %s after the document", r.describe())
	}
	return n, nil
}

func (r *reader) errorf(format string, args ...any) error {
	return &syntaxError{off: r.pos, msg: fmt.Sprintf(format, args...)}
}

// describe names the byte at pos for an error message.
func (r *reader) describe() string {
	if r.pos >= len(r.data) {
		return "end of document"
	}
	c, _ := utf8.DecodeRune(r.data[r.pos:])
	return strconv.QuoteRune(c)
}

func (r *reader) skipSpace() {
	for r.pos < len(r.data) {
		switch r.data[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

func (r *reader) value(depth int) (*node, error) {
	if r.pos >= len(r.data) {
		return nil, r.errorf("unexpected end of document")
	}
	switch c := r.data[r.pos]; {
	case c == '{':
		if depth >= MaxDepth {
			return nil, r.errorf("nesting deeper than %d levels", MaxDepth)
		}
		return r.object(depth + 1)
	case c == '[':
		if depth >= MaxDepth {
			return nil, r.errorf("nesting deeper than %d levels", MaxDepth)
		}
		return r.array(depth + 1)
	case c == '"':
		off := r.pos
		s, err := r.string()
		if err != nil {
			return nil, err
		}
		return &node{kind: kindString, off: off, str: s}, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return r.number()
	default:
		for _, lit := range [...]struct {
			text string
			n    node
		}{{"true", node{kind: kindBool, b: true}}, {"false", node{kind: kindBool}}, {"null", node{kind: kindNull}}} {
			if strings.HasPrefix(string(r.data[r.pos:min(len(r.data), r.pos+len(lit.text))]), lit.text) {
				n := lit.n
				n.off = r.pos
				r.pos += len(lit.text)
				return &n, nil
			}
		}
		return nil, r.errorf("unexpected %s, want a value", r.describe())
	}
}

func (r *reader) object(depth int) (*node, error) {
	n := &node{kind: kindObject, off: r.pos}
	var seen map[string]int // folded key → index, for large objects
	r.pos++                 // {
	r.skipSpace()
	if r.pos < len(r.data) && r.data[r.pos] == '}' {
		r.pos++
		return n, nil
	}
	for {
		r.skipSpace()
		if r.pos >= len(r.data) || r.data[r.pos] != '"' {
			return nil, r.errorf("unexpected %s, want a quoted key", r.describe())
		}
		keyOff := r.pos
		key, err := r.string()
		if err != nil {
			return nil, err
		}
		// Keys that differ only in case are duplicates too: a reader that
		// folds case (encoding/json does) would see one of them only. Small
		// objects are searched; large ones use a map so that a document
		// with many keys costs linear time.
		prev := -1
		if len(n.keys) < 16 {
			for i, k := range n.keys {
				if strings.EqualFold(k, key) {
					prev = i
					break
				}
			}
		} else {
			if seen == nil {
				seen = make(map[string]int, 2*len(n.keys))
				for i, k := range n.keys {
					seen[foldKey(k)] = i
				}
			}
			fk := foldKey(key)
			if i, ok := seen[fk]; ok {
				prev = i
			} else {
				seen[fk] = len(n.keys)
			}
		}
		if prev >= 0 {
			r.pos = keyOff
			if k := n.keys[prev]; k != key {
				return nil, r.errorf("key %q differs from key %q only in case", key, k)
			}
			return nil, r.errorf("duplicate key %q", key)
		}
		r.skipSpace()
		if r.pos >= len(r.data) || r.data[r.pos] != ':' {
			return nil, r.errorf("unexpected %s, want ':'", r.describe())
		}
		r.pos++
		r.skipSpace()
		v, err := r.value(depth)
		if err != nil {
			return nil, err
		}
		n.keys = append(n.keys, key)
		n.keyOffs = append(n.keyOffs, keyOff)
		n.vals = append(n.vals, v)
		r.skipSpace()
		if r.pos >= len(r.data) {
			return nil, r.errorf("unexpected end of document, want ',' or '}'")
		}
		switch r.data[r.pos] {
		case ',':
			r.pos++
		case '}':
			r.pos++
			return n, nil
		default:
			return nil, r.errorf("unexpected %s, want ',' or '}'", r.describe())
		}
	}
}

func (r *reader) array(depth int) (*node, error) {
	n := &node{kind: kindArray, off: r.pos}
	r.pos++ // [
	r.skipSpace()
	if r.pos < len(r.data) && r.data[r.pos] == ']' {
		r.pos++
		return n, nil
	}
	for {
		r.skipSpace()
		v, err := r.value(depth)
		if err != nil {
			return nil, err
		}
		n.elems = append(n.elems, v)
		r.skipSpace()
		if r.pos >= len(r.data) {
			return nil, r.errorf("unexpected end of document, want ',' or ']'")
		}
		switch r.data[r.pos] {
		case ',':
			r.pos++
		case ']':
			r.pos++
			return n, nil
		default:
			return nil, r.errorf("unexpected %s, want ',' or ']'", r.describe())
		}
	}
}

// number reads a number literal of the JSON grammar and keeps its text.
func (r *reader) number() (*node, error) {
	start := r.pos
	d := r.data
	p := r.pos
	if p < len(d) && d[p] == '-' {
		p++
	}
	digits := func() int {
		s := p
		for p < len(d) && d[p] >= '0' && d[p] <= '9' {
			p++
		}
		return p - s
	}
	switch {
	case p < len(d) && d[p] == '0':
		p++
	case digits() == 0:
		r.pos = p
		return nil, r.errorf("malformed number: want a digit, got %s", r.describe())
	}
	if p < len(d) && d[p] == '.' {
		p++
		if digits() == 0 {
			r.pos = p
			return nil, r.errorf("malformed number: want a digit after '.', got %s", r.describe())
		}
	}
	if p < len(d) && (d[p] == 'e' || d[p] == 'E') {
		p++
		if p < len(d) && (d[p] == '+' || d[p] == '-') {
			p++
		}
		if digits() == 0 {
			r.pos = p
			return nil, r.errorf("malformed number: want a digit in the exponent, got %s", r.describe())
		}
	}
	r.pos = p
	return &node{kind: kindNumber, off: start, str: string(d[start:p])}, nil
}

// string reads a quoted string at pos and returns its value.
func (r *reader) string() (string, error) {
	d := r.data
	r.pos++ // opening quote
	start := r.pos
	// Fast path: no escapes.
	for p := start; p < len(d); p++ {
		c := d[p]
		if c == '"' {
			r.pos = p + 1
			return string(d[start:p]), nil
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
			return b.String(), nil
		case c < 0x20:
			return "", r.errorf("control character %q in string", rune(c))
		case c != '\\':
			b.WriteByte(c)
			r.pos++
			continue
		}
		// An escape.
		if r.pos+1 >= len(d) {
			r.pos++
			return "", r.errorf("unterminated string")
		}
		r.pos++
		e := d[r.pos]
		r.pos++
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
				// A high surrogate must be followed by \u and a low one.
				if r.pos+1 < len(d) && d[r.pos] == '\\' && d[r.pos+1] == 'u' {
					save := r.pos
					r.pos += 2
					c2, err := r.hex4()
					if err != nil {
						return "", err
					}
					if dec := utf16.DecodeRune(c1, c2); dec != utf8.RuneError {
						b.WriteRune(dec)
						continue
					}
					r.pos = save
				}
				return "", r.errorf("invalid surrogate pair in string")
			}
			b.WriteRune(c1)
		default:
			r.pos -= 2
			return "", r.errorf("invalid escape %q in string", string(d[r.pos:r.pos+2]))
		}
	}
}

func (r *reader) hex4() (rune, error) {
	if r.pos+4 > len(r.data) {
		return 0, r.errorf("truncated \\u escape in string")
	}
	v, err := strconv.ParseUint(string(r.data[r.pos:r.pos+4]), 16, 32)
	if err != nil {
		return 0, r.errorf("invalid \\u escape %q in string", string(r.data[r.pos:r.pos+4]))
	}
	r.pos += 4
	return rune(v), nil
}

// lineCol turns a byte offset into a 1-based line and column (in runes).
func lineCol(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	line, col = 1, 1
	for _, c := range string(data[:off]) {
		if c == '\n' {
			line++
			col = 1
		} else {
			col++
		}
	}
	return line, col
}

// foldKey maps s to a string that is equal for two strings exactly when
// strings.EqualFold says they are: each rune becomes the smallest rune of
// its simple case-folding orbit.
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
