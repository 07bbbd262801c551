// Package strictjson is vmgate's one strict JSON lexer, shared by the
// server (every MCP message) and the policy parser (policy documents).
//
// encoding/json silently keeps the last of two duplicate keys, matches
// field names case-insensitively and replaces invalid UTF-8; a policy that
// looked at one "vm" while the driver got another would be bypassed. The
// Lexer refuses all of that: it turns a document into a stream of tokens
// (Next) that follow the JSON grammar, and stops at the first of these:
// duplicate keys in an object, keys that differ only in case (by Unicode
// simple folding, as encoding/json compares them), invalid UTF-8 or lone
// surrogates in a string, control characters, nesting deeper than
// MaxDepth, a malformed number, or anything after the one top-level value.
// Numbers are kept as their literal text, so a huge pid is not rounded into
// a valid one. Every token and every error carries its byte offset, so the
// policy parser can name the line and column of a mistake.
//
// It imports the standard library only: docs/design.md (Layout) lets the policy package
// import exactly this leaf, and the dependency test keeps it a leaf.
package strictjson

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Kind is the kind of a token.
type Kind uint8

// The token kinds.
const (
	// End follows the one top-level value: the input is used up.
	End Kind = iota
	BeginObject
	EndObject
	BeginArray
	EndArray
	// Key is an object member's name (Text), which its value follows.
	Key
	String
	Number // Text is the literal as written
	True
	False
	Null
)

var kindNames = [...]string{"end", "{", "}", "[", "]", "key", "string", "number", "true", "false", "null"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Token is one token of a document.
type Token struct {
	Kind Kind
	Off  int    // the byte offset where the token starts
	Text string // Key and String: the value, unescaped; Number: the literal
}

// SyntaxError is the first thing in a document the Lexer refuses.
type SyntaxError struct {
	Off int    // byte offset
	Msg string // what is wrong, e.g. `duplicate key "vm"`
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("byte %d: %s", e.Off, e.Msg) }

// DefaultMaxDepth is the nesting limit of a Lexer whose MaxDepth is 0.
const DefaultMaxDepth = 64

// state is what the grammar lets come next.
type state uint8

const (
	wantValue      state = iota // the top-level value, a member's value, an array element after ','
	wantValueOrEnd              // after '['
	wantKeyOrEnd                // after '{'
	wantCommaOrEnd              // after a value inside an object or array
	wantEOF                     // after the top-level value
)

// foldAbove is the number of keys past which an object's case-fold check
// uses a map instead of comparing with every earlier key.
const foldAbove = 16

// frame is one open object or array.
type frame struct {
	object   bool
	keyStart int               // objects: where this object's keys start in Lexer.keys
	folded   map[string]string // objects past foldAbove keys: folded key → key
}

// Lexer reads one JSON document as tokens. Set MaxDepth and Intern (both
// optional), then Reset it to a document and call Next until it returns
// End or an error. A Lexer is not safe for concurrent use.
type Lexer struct {
	// MaxDepth bounds the nesting of objects and arrays (0: DefaultMaxDepth).
	MaxDepth int
	// Intern, when set, may return a constant for the text of an escape-free
	// key or string (the keys and values every message carries), so reading
	// it allocates nothing; "" means no constant.
	Intern func(b []byte) string

	data  []byte
	pos   int
	state state
	stack []frame
	keys  []string // the keys of every open object, innermost last
	err   error    // sticky: Next returns it again once set
}

// Offset is the byte offset just past the last token Next returned (past
// the closing bracket of an object or array, the closing quote of a
// string, the last digit of a number).
func (l *Lexer) Offset() int { return l.pos }

// Reset starts reading data. A Lexer reset for each document keeps the
// room its stack and keys took (Reset(nil) keeps no reference to the last
// document), so a pooled Lexer reads without allocating beyond the tokens'
// text.
func (l *Lexer) Reset(data []byte) {
	l.data, l.pos, l.state, l.err = data, 0, wantValue, nil
	clear(l.keys[:cap(l.keys)])
	clear(l.stack[:cap(l.stack)])
	l.stack, l.keys = l.stack[:0], l.keys[:0]
}

// Next returns the next token: the document's tokens in order, then End.
// After an error it returns the same error again.
func (l *Lexer) Next() (Token, error) {
	if l.err != nil {
		return Token{}, l.err
	}
	t, err := l.next()
	if err != nil {
		l.err = err
	}
	return t, err
}

func (l *Lexer) next() (Token, error) {
	l.skipSpace()
	switch l.state {
	case wantEOF:
		if l.pos < len(l.data) {
			return Token{}, l.errorf("unexpected %s after the value", l.describe())
		}
		return Token{Kind: End, Off: l.pos}, nil
	case wantCommaOrEnd:
		return l.afterValue()
	case wantKeyOrEnd:
		if l.pos < len(l.data) && l.data[l.pos] == '}' {
			return l.close(EndObject), nil
		}
		return l.key()
	case wantValueOrEnd:
		if l.pos < len(l.data) && l.data[l.pos] == ']' {
			return l.close(EndArray), nil
		}
	}
	return l.value()
}

// afterValue reads what follows a value inside an object or array: a
// comma and the next key or element, or the closing bracket.
func (l *Lexer) afterValue() (Token, error) {
	top := &l.stack[len(l.stack)-1]
	closer, end := byte(']'), EndArray
	if top.object {
		closer, end = '}', EndObject
	}
	if l.pos >= len(l.data) {
		return Token{}, l.errorf("unexpected end of input, want ',' or '%c'", closer)
	}
	switch l.data[l.pos] {
	case ',':
		l.pos++
		l.skipSpace()
		if top.object {
			return l.key()
		}
		return l.value()
	case closer:
		return l.close(end), nil
	}
	return Token{}, l.errorf("unexpected %s, want ',' or '%c'", l.describe(), closer)
}

// close ends the innermost object or array at its closing bracket.
func (l *Lexer) close(k Kind) Token {
	t := Token{Kind: k, Off: l.pos}
	l.pos++
	top := l.stack[len(l.stack)-1]
	if top.object {
		l.keys = l.keys[:top.keyStart]
	}
	l.stack = l.stack[:len(l.stack)-1]
	l.valueDone()
	return t
}

// valueDone sets the state that follows a complete value.
func (l *Lexer) valueDone() {
	if len(l.stack) == 0 {
		l.state = wantEOF
	} else {
		l.state = wantCommaOrEnd
	}
}

// key reads a member's name and the colon after it.
func (l *Lexer) key() (Token, error) {
	if l.pos >= len(l.data) || l.data[l.pos] != '"' {
		return Token{}, l.errorf("unexpected %s, want a quoted key", l.describe())
	}
	off := l.pos
	k, err := l.string()
	if err != nil {
		return Token{}, err
	}
	if err := l.addKey(k, off); err != nil {
		return Token{}, err
	}
	l.skipSpace()
	if l.pos >= len(l.data) || l.data[l.pos] != ':' {
		return Token{}, l.errorf("unexpected %s, want ':'", l.describe())
	}
	l.pos++
	l.state = wantValue
	return Token{Kind: Key, Off: off, Text: k}, nil
}

// addKey records key (at off) in the innermost object, refusing a key
// equal to an earlier one or differing from it only in case: a reader that
// folds case (encoding/json does) would see one of them only. Small
// objects are searched; large ones use a map, so a document with many keys
// costs linear time.
func (l *Lexer) addKey(key string, off int) error {
	top := &l.stack[len(l.stack)-1]
	prev := ""
	found := false
	if keys := l.keys[top.keyStart:]; len(keys) < foldAbove {
		for _, k := range keys {
			if strings.EqualFold(k, key) {
				prev, found = k, true
				break
			}
		}
	} else {
		if top.folded == nil {
			top.folded = make(map[string]string, 2*len(keys))
			for _, k := range keys {
				top.folded[foldKey(k)] = k
			}
		}
		fk := foldKey(key)
		if prev, found = top.folded[fk]; !found {
			top.folded[fk] = key
		}
	}
	if found {
		if prev != key {
			return &SyntaxError{Off: off, Msg: fmt.Sprintf("key %q differs from key %q only in case", key, prev)}
		}
		return &SyntaxError{Off: off, Msg: fmt.Sprintf("duplicate key %q", key)}
	}
	l.keys = append(l.keys, key)
	return nil
}

// value reads a value at pos: a scalar, or the opening of an object or array.
func (l *Lexer) value() (Token, error) {
	if l.pos >= len(l.data) {
		return Token{}, l.errorf("unexpected end of input")
	}
	off := l.pos
	switch c := l.data[l.pos]; {
	case c == '{' || c == '[':
		if len(l.stack) >= l.maxDepth() {
			return Token{}, l.errorf("nesting deeper than %d levels", l.maxDepth())
		}
		l.pos++
		if c == '{' {
			l.stack = append(l.stack, frame{object: true, keyStart: len(l.keys)})
			l.state = wantKeyOrEnd
			return Token{Kind: BeginObject, Off: off}, nil
		}
		l.stack = append(l.stack, frame{})
		l.state = wantValueOrEnd
		return Token{Kind: BeginArray, Off: off}, nil
	case c == '"':
		s, err := l.string()
		if err != nil {
			return Token{}, err
		}
		l.valueDone()
		return Token{Kind: String, Off: off, Text: s}, nil
	case c == '-' || c >= '0' && c <= '9':
		n, err := l.number()
		if err != nil {
			return Token{}, err
		}
		l.valueDone()
		return Token{Kind: Number, Off: off, Text: n}, nil
	}
	for _, lit := range [...]struct {
		text string
		kind Kind
	}{{"true", True}, {"false", False}, {"null", Null}} {
		if strings.HasPrefix(string(l.data[l.pos:min(len(l.data), l.pos+len(lit.text))]), lit.text) {
			l.pos += len(lit.text)
			l.valueDone()
			return Token{Kind: lit.kind, Off: off}, nil
		}
	}
	return Token{}, l.errorf("unexpected %s, want a value", l.describe())
}

func (l *Lexer) maxDepth() int {
	if l.MaxDepth > 0 {
		return l.MaxDepth
	}
	return DefaultMaxDepth
}

func (l *Lexer) errorf(format string, args ...any) error {
	return &SyntaxError{Off: l.pos, Msg: fmt.Sprintf(format, args...)}
}

// describe names the byte at pos for an error message.
func (l *Lexer) describe() string {
	if l.pos >= len(l.data) {
		return "end of input"
	}
	c, _ := utf8.DecodeRune(l.data[l.pos:])
	return strconv.QuoteRune(c)
}

func (l *Lexer) skipSpace() {
	for l.pos < len(l.data) {
		switch l.data[l.pos] {
		case ' ', '\t', '\n', '\r':
			l.pos++
		default:
			return
		}
	}
}

// number reads a number literal of the JSON grammar and returns its text.
func (l *Lexer) number() (string, error) {
	d, start, p := l.data, l.pos, l.pos
	digits := func() int {
		s := p
		for p < len(d) && d[p] >= '0' && d[p] <= '9' {
			p++
		}
		return p - s
	}
	fail := func(what string) (string, error) {
		l.pos = p
		return "", l.errorf("malformed number: want a digit%s, got %s", what, l.describe())
	}
	if p < len(d) && d[p] == '-' {
		p++
	}
	if p < len(d) && d[p] == '0' {
		p++
	} else if digits() == 0 {
		return fail("")
	}
	if p < len(d) && d[p] == '.' {
		p++
		if digits() == 0 {
			return fail(" after '.'")
		}
	}
	if p < len(d) && (d[p] == 'e' || d[p] == 'E') {
		p++
		if p < len(d) && (d[p] == '+' || d[p] == '-') {
			p++
		}
		if digits() == 0 {
			return fail(" in the exponent")
		}
	}
	l.pos = p
	return string(d[start:p]), nil
}

// string reads a quoted string at pos and returns its value.
func (l *Lexer) string() (string, error) {
	d := l.data
	l.pos++ // the opening quote
	start := l.pos
	// Fast path: no escapes.
	for p := start; p < len(d); p++ {
		c := d[p]
		if c == '"' {
			s := d[start:p]
			if l.Intern != nil {
				if k := l.Intern(s); k != "" {
					l.pos = p + 1
					return k, nil
				}
			}
			if !utf8.Valid(s) {
				return "", l.errorf("invalid UTF-8 in string")
			}
			l.pos = p + 1
			return string(s), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
	}
	return l.escaped()
}

// escaped reads the rest of a string that has escapes or control
// characters, from pos (just after the opening quote).
func (l *Lexer) escaped() (string, error) {
	d := l.data
	var b strings.Builder
	for {
		if l.pos >= len(d) {
			return "", l.errorf("unterminated string")
		}
		c := d[l.pos]
		switch {
		case c == '"':
			l.pos++
			s := b.String()
			if !utf8.ValidString(s) {
				return "", l.errorf("invalid UTF-8 in string")
			}
			return s, nil
		case c < 0x20:
			return "", l.errorf("control character %q in string", rune(c))
		case c != '\\':
			b.WriteByte(c)
			l.pos++
			continue
		}
		if err := l.escape(&b); err != nil {
			return "", err
		}
	}
}

// escape reads one escape sequence at pos into b.
func (l *Lexer) escape(b *strings.Builder) error {
	d := l.data
	if l.pos+1 >= len(d) {
		l.pos++
		return l.errorf("unterminated string")
	}
	e := d[l.pos+1]
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
		l.pos += 2
		return l.unicodeEscape(b)
	default:
		return l.errorf("invalid escape %q in string", string(d[l.pos:l.pos+2]))
	}
	l.pos += 2
	return nil
}

// unicodeEscape reads the hex digits of a \u escape at pos (and the low
// half of a surrogate pair) into b.
func (l *Lexer) unicodeEscape(b *strings.Builder) error {
	d := l.data
	c1, err := l.hex4()
	if err != nil {
		return err
	}
	if !utf16.IsSurrogate(c1) {
		b.WriteRune(c1)
		return nil
	}
	// A high surrogate must be followed by \u and a low one.
	if l.pos+1 < len(d) && d[l.pos] == '\\' && d[l.pos+1] == 'u' {
		save := l.pos
		l.pos += 2
		c2, err := l.hex4()
		if err != nil {
			return err
		}
		if dec := utf16.DecodeRune(c1, c2); dec != utf8.RuneError {
			b.WriteRune(dec)
			return nil
		}
		l.pos = save
	}
	return l.errorf("invalid surrogate pair in string")
}

func (l *Lexer) hex4() (rune, error) {
	if l.pos+4 > len(l.data) {
		return 0, l.errorf("truncated \\u escape in string")
	}
	v, err := strconv.ParseUint(string(l.data[l.pos:l.pos+4]), 16, 32)
	if err != nil {
		return 0, l.errorf("invalid \\u escape %q in string", string(l.data[l.pos:l.pos+4]))
	}
	l.pos += 4
	return rune(v), nil
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
