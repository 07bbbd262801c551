package suggest

import (
	"path"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// Shapes of strings. A path or an id seen once says little about the next
// one: /tmp/job-4711.log will be /tmp/job-4712.log, a session id is new
// every time. So a value without spaces is cut into tokens (runs of
// letters and digits between other characters), and the tokens that look
// like what changes from call to call (volatile: numbers, long tokens
// with digits, long runs of capitals) keep only their kind: the characters
// they are made of and their length. What is left is the value's shape,
// written as a glob ("/tmp/job-*.log", for paths and VM ids) or as a
// regex with the kinds spelt out ("^[0-9a-f]{32}$", for ids). Shapes that
// differ only in their tokens' lengths or kinds are one shape. Text with
// spaces (a shell command) is free text: its shape is itself.

// Token kinds, as bits: what a volatile token is made of.
const (
	kindDigit   = 1 << iota // 0-9
	kindHex                 // a-f
	kindLower               // g-z
	kindUpper               // A-Z
	kindAnyName             // anything but "/" (a path's last name, coarsened)
)

// part is one piece of a shape: a literal, or a volatile token's kind
// with the range of lengths seen.
type part struct {
	lit      string
	kinds    int // 0 for a literal
	min, max int
}

// shape is a value's shape.
type shape []part

// volatile reports whether tok, a run of letters and digits, looks like a
// value that changes between calls: a number, a token of 8 or more with a
// digit (a hex id), or one of 16 or more without small letters (the
// capitals and digits of rand.Text).
func volatile(tok string) bool {
	digits, lower := 0, 0
	for _, r := range tok {
		switch {
		case r >= '0' && r <= '9':
			digits++
		case r >= 'a' && r <= 'z':
			lower++
		}
	}
	n := len(tok)
	return digits == n || (n >= 8 && digits > 0) || (n >= 16 && lower == 0)
}

func isTokenByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// hasSpace reports whether s is free text (holds white space).
func hasSpace(s string) bool { return strings.IndexFunc(s, unicode.IsSpace) >= 0 }

// shapeOf is s's shape.
func shapeOf(s string) shape {
	if hasSpace(s) {
		return shape{{lit: s}}
	}
	var sh shape
	lit := func(x string) {
		if n := len(sh); n > 0 && sh[n-1].kinds == 0 {
			sh[n-1].lit += x
			return
		}
		sh = append(sh, part{lit: x})
	}
	for i := 0; i < len(s); {
		if !isTokenByte(s[i]) {
			lit(s[i : i+1])
			i++
			continue
		}
		j := i
		for j < len(s) && isTokenByte(s[j]) {
			j++
		}
		if tok := s[i:j]; volatile(tok) {
			sh = append(sh, part{kinds: kindsOf(tok), min: len(tok), max: len(tok)})
		} else {
			lit(tok)
		}
		i = j
	}
	return sh
}

func kindsOf(tok string) int {
	k := 0
	for i := 0; i < len(tok); i++ {
		switch c := tok[i]; {
		case c >= '0' && c <= '9':
			k |= kindDigit
		case c >= 'a' && c <= 'f':
			k |= kindHex
		case c >= 'a' && c <= 'z':
			k |= kindLower
		default:
			k |= kindUpper
		}
	}
	return k
}

// stable reports whether s is a value a set of literals can hold: free
// text, or a value with no volatile token.
func stable(s string) bool {
	for _, p := range shapeOf(s) {
		if p.kinds != 0 {
			return false
		}
	}
	return true
}

// key is what two shapes that are one share: their literals, and where
// their tokens are.
func (sh shape) key() string {
	var b strings.Builder
	for _, p := range sh {
		if p.kinds != 0 {
			b.WriteString("\x00")
			continue
		}
		b.WriteString(strconv.Quote(p.lit))
	}
	return b.String()
}

// widen is sh grown to hold o too (o has sh's key).
func (sh shape) widen(o shape) shape {
	out := append(shape(nil), sh...)
	for i := range out {
		if out[i].kinds != 0 {
			out[i].kinds |= o[i].kinds
			out[i].min, out[i].max = min(out[i].min, o[i].min), max(out[i].max, o[i].max)
		}
	}
	return out
}

// glob is sh as a glob: tokens as "*", what a glob gives a meaning to
// escaped.
func (sh shape) glob() string {
	var b strings.Builder
	for _, p := range sh {
		if p.kinds != 0 {
			b.WriteByte('*')
			continue
		}
		for i := 0; i < len(p.lit); i++ {
			if strings.IndexByte(`*?[\`, p.lit[i]) >= 0 {
				b.WriteByte('\\')
			}
			b.WriteByte(p.lit[i])
		}
	}
	return b.String()
}

// trivial reports whether sh says nothing but how many names a path has
// ("*", "*/*"): every value of that depth fits it.
func (sh shape) trivial() bool {
	g := sh.glob()
	return strings.Trim(g, "*/") == "" && !strings.HasPrefix(g, "/")
}

// regex is sh as an RE2 fragment: a token as its kinds and lengths (a
// number as any number of digits: its length says nothing).
func (sh shape) regex() string {
	var b strings.Builder
	for _, p := range sh {
		if p.kinds == 0 {
			b.WriteString(regexp.QuoteMeta(p.lit))
			continue
		}
		b.WriteString(kindClass(p.kinds))
		switch {
		case p.kinds&kindAnyName != 0:
			b.WriteByte('*')
		case p.kinds == kindDigit:
			b.WriteByte('+')
		case p.min == p.max:
			b.WriteString("{" + strconv.Itoa(p.min) + "}")
		default:
			b.WriteString("{" + strconv.Itoa(p.min) + "," + strconv.Itoa(p.max) + "}")
		}
	}
	return b.String()
}

// kindClass is the narrowest of a few familiar classes that holds kinds.
func kindClass(kinds int) string {
	switch {
	case kinds&kindAnyName != 0:
		return "[^/]"
	case kinds == kindDigit:
		return "[0-9]"
	case kinds&^(kindDigit|kindHex) == 0:
		return "[0-9a-f]"
	case kinds&^(kindDigit|kindUpper) == 0:
		return "[0-9A-Z]"
	}
	return "[0-9A-Za-z]"
}

// dirShape is a coarser shape of a path: its last name as any name
// ("/var/log/a.log" → "/var/log/*"); nil for a value that is no path.
func dirShape(s string) shape {
	if hasSpace(s) || !strings.HasPrefix(s, "/") {
		return nil
	}
	dir := path.Dir(s)
	if dir == "/" {
		dir = ""
	}
	return append(shapeOf(dir+"/"), part{kinds: kindAnyName})
}
