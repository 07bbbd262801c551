package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// Conditions (`require`, `deny_if`) test one value of a call.
//
// Paths: "vm", "grant", or "args.<name>[.<name>…]" descending through JSON
// objects, where a name that is a number ("0", "12": no sign, no leading
// zero) also addresses that element of a list (args.command.0 is a
// command's program). A path that is absent, whose value is JSON null, or
// that descends through anything else is missing, and a missing path makes
// every condition false (so `require` denies and `deny_if` does not fire).
// An empty vm or grant is missing too.
//
// Ops: eq and neq compare a string, number or boolean (numbers as float64,
// so integers beyond 2^53 compare approximately); in and not_in test
// membership in a list of those; lt lte gt gte compare numbers; regex is an
// RE2 pattern (unanchored: use ^…$), glob is path.Match syntax where `*`
// and `?` do not cross `/` (so "lab/*" matches "lab/vm1" but not
// "lab/a/b"; "**" is rejected rather than given a meaning); not_regex and
// not_glob hold for a present value that is not a string they match (as
// neq and not_in do, so that deny_if not_glob says "when sent, it must
// match"); contains is a substring of a string or an element of an array;
// exists takes no value. A value of the wrong type (lt on a string, regex
// on a number) makes the condition false, never an error at call time.

type op uint8

const (
	opEq op = iota + 1
	opNeq
	opIn
	opNotIn
	opLt
	opLte
	opGt
	opGte
	opRegex
	opGlob
	opContains
	opExists
	opNotRegex
	opNotGlob
)

var opNames = map[string]op{
	"eq": opEq, "neq": opNeq, "in": opIn, "not_in": opNotIn,
	"lt": opLt, "lte": opLte, "gt": opGt, "gte": opGte,
	"regex": opRegex, "glob": opGlob, "contains": opContains, "exists": opExists,
	"not_regex": opNotRegex, "not_glob": opNotGlob,
}

const (
	targetArgs uint8 = iota
	targetVM
	targetGrant
)

const (
	maxPathLen  = 256
	maxPathSegs = 16
)

// condition is a compiled {path, op, value}.
type condition struct {
	ptr    string // JSON pointer of the condition in the document
	path   string // as written
	src    string // "args.x op value", for reasons and traces
	target uint8
	segs   []string // for targetArgs: the names after "args."
	op     op
	val    any     // eq, neq, contains: string, float64 or bool
	num    float64 // lt, lte, gt, gte
	set    []any   // in, not_in
	glob   string
	re     *regexp.Regexp
}

func (c *condition) setPath(p string) error {
	c.path = p
	switch {
	case len(p) > maxPathLen:
		return fmt.Errorf("path is %d bytes; the limit is %d", len(p), maxPathLen)
	case p == "vm":
		c.target = targetVM
	case p == "grant":
		c.target = targetGrant
	case strings.HasPrefix(p, "args."):
		c.target = targetArgs
		c.segs = strings.Split(p[len("args."):], ".")
		if len(c.segs) > maxPathSegs {
			return fmt.Errorf("path %q has more than %d names", p, maxPathSegs)
		}
		for _, s := range c.segs {
			if s == "" {
				return fmt.Errorf("path %q has an empty name", p)
			}
		}
	default:
		return fmt.Errorf("unknown path %q (want vm, grant or args.<name>[.<name>…])", p)
	}
	return nil
}

// valueError is a bad condition value, at the node n (a list element, say).
type valueError struct {
	n   *node
	msg string
}

func (e *valueError) Error() string { return e.msg }

func scalar(n *node) (any, error) {
	switch n.kind {
	case kindString:
		return n.str, nil
	case kindBool:
		return n.b, nil
	case kindNumber:
		f, err := strconv.ParseFloat(n.str, 64)
		if err != nil || math.IsInf(f, 0) {
			return nil, &valueError{n, "number " + n.str + " is out of range"}
		}
		return f, nil
	}
	return nil, &valueError{n, "want a string, number or boolean, got " + n.kind.String()}
}

func (c *condition) setValue(n *node) error {
	switch c.op {
	case opEq, opNeq, opContains:
		v, err := scalar(n)
		c.val = v
		return err
	case opIn, opNotIn:
		if n.kind != kindArray {
			return &valueError{n, "want a list, got " + n.kind.String()}
		}
		if len(n.elems) > maxSetLen {
			return &valueError{n, fmt.Sprintf("list has %d elements; the limit is %d", len(n.elems), maxSetLen)}
		}
		for _, el := range n.elems {
			v, err := scalar(el)
			if err != nil {
				return err
			}
			c.set = append(c.set, v)
		}
	case opLt, opLte, opGt, opGte:
		if n.kind != kindNumber {
			return &valueError{n, "want a number, got " + n.kind.String()}
		}
		v, err := scalar(n)
		if err != nil {
			return err
		}
		c.num = v.(float64)
	case opRegex, opGlob, opNotRegex, opNotGlob:
		if n.kind != kindString {
			return &valueError{n, "want a pattern string, got " + n.kind.String()}
		}
		if len(n.str) > maxPatternLen {
			return &valueError{n, fmt.Sprintf("pattern is %d bytes; the limit is %d", len(n.str), maxPatternLen)}
		}
		if c.op == opRegex || c.op == opNotRegex {
			re, err := regexp.Compile(n.str)
			if err != nil {
				return &valueError{n, "bad regex: " + strings.TrimPrefix(err.Error(), "error parsing regexp: ")}
			}
			c.re = re
			return nil
		}
		if err := checkGlob(n.str); err != nil {
			return &valueError{n, err.Error()}
		}
		c.glob = n.str
	}
	return nil
}

// checkGlob rejects a malformed path.Match pattern and "**".
func checkGlob(p string) error {
	if strings.Contains(p, "**") {
		return fmt.Errorf("bad glob %q: \"**\" is not supported (\"*\" matches within one /-separated name)", p)
	}
	// path.Match checks the whole pattern, even the parts a given name
	// does not reach.
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("bad glob %q: %w", p, err)
	}
	return nil
}

// eval reports whether the condition holds for call.
func (c *condition) eval(call *Call) bool {
	switch c.target {
	case targetVM:
		return call.VM != "" && c.evalString(call.VM)
	case targetGrant:
		return call.Grant != "" && c.evalString(call.Grant)
	}
	v, ok := lookup(call.Args, c.segs)
	if !ok {
		return false
	}
	switch x := v.(type) {
	case nil:
		return false // null is missing
	case string:
		return c.evalString(x)
	}
	switch c.op {
	case opExists, opNotRegex, opNotGlob:
		return true
	case opEq:
		return equal(v, c.val)
	case opNeq:
		return !equal(v, c.val)
	case opIn, opNotIn:
		in := false
		for _, w := range c.set {
			if equal(v, w) {
				in = true
				break
			}
		}
		return in == (c.op == opIn)
	case opLt, opLte, opGt, opGte:
		f, ok := number(v)
		if !ok {
			return false
		}
		switch c.op {
		case opLt:
			return f < c.num
		case opLte:
			return f <= c.num
		case opGt:
			return f > c.num
		}
		return f >= c.num
	case opContains:
		if x, ok := v.([]any); ok {
			for _, e := range x {
				if equal(e, c.val) {
					return true
				}
			}
		}
	}
	return false // regex and glob on a non-string; an unknown op (Parse rejects them)
}

// evalString is eval for a present string value; it does not box s.
func (c *condition) evalString(s string) bool {
	switch c.op {
	case opExists:
		return true
	case opEq, opNeq:
		w, ok := c.val.(string)
		return (ok && w == s) == (c.op == opEq)
	case opIn, opNotIn:
		in := false
		for _, w := range c.set {
			if w, ok := w.(string); ok && w == s {
				in = true
				break
			}
		}
		return in == (c.op == opIn)
	case opRegex:
		return c.re.MatchString(s)
	case opGlob, opNotGlob:
		m, err := path.Match(c.glob, s)
		return (err == nil && m) == (c.op == opGlob)
	case opNotRegex:
		return !c.re.MatchString(s)
	case opContains:
		w, ok := c.val.(string)
		return ok && strings.Contains(s, w)
	}
	return false // lt, lte, gt, gte on a string
}

// equal compares a call value with a document scalar (string, float64, bool).
func equal(v, w any) bool {
	switch w := w.(type) {
	case string:
		s, ok := v.(string)
		return ok && s == w
	case bool:
		b, ok := v.(bool)
		return ok && b == w
	case float64:
		f, ok := number(v)
		return ok && f == w
	}
	return false
}

// number converts the numeric types a decoder produces to float64.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case float32:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

// lookup descends args by segs: a name into an object, a number into a
// list (see the notes on paths above).
func lookup(args map[string]any, segs []string) (any, bool) {
	var v any = args
	for _, s := range segs {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[s]; !ok {
				return nil, false
			}
		case []any:
			i, ok := listIndex(s)
			if !ok || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// listIndex reads a path name as a list index: digits, no leading zero.
func listIndex(s string) (int, bool) {
	if s == "" || len(s) > 9 || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}
