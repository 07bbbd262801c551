package suggest

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/policy/audit"
)

// Conditions from values. For every path a tool's calls had a value at
// (the VM, and args.<name>[.<name>…] into objects), the narrowest
// condition that holds for every value seen:
//
//   - strings: "in" the set seen, when it is small and stable (no value
//     with a volatile token: see shape.go); else a "glob" of their one
//     shape (paths, VM ids), or a "regex" of their few shapes; paths too
//     varied for that by their directories; none when even those are many;
//   - numbers: "gte" the smallest and "lte" the largest, with headroom;
//   - booleans: "in" the values seen (which also refuses another type);
//   - lists: their first element as a value of its own (args.command.0,
//     an argv's program), the list itself none; objects: their members;
//   - stdin, env and file content: none (the log has their digests).
//
// A path every call had goes into require. One some calls left out goes
// into deny_if, negated (not_in, lt, gt, not_glob, not_regex), so that
// leaving it out is still allowed and sending it takes what require would
// have. An argument of the tool no call sent at all gets deny_if exists.

// condition is one suggested condition, as the document holds it.
type condition struct {
	Path  string `json:"path"`
	Op    string `json:"op"`
	Value any    `json:"value,omitempty"`
	Why   string `json:"_why,omitempty"`
}

// facts are the values one path took in a tool's calls.
type facts struct {
	path    string
	present int // calls that had a value there
	strs    []string
	nums    []float64
	bools   []bool
	other   int  // lists, objects held whole, null
	secret  bool // stdin, env, content: only its presence is known
}

// gather collects the facts of every path of calls, sorted by path.
func gather(calls []*Call) []*facts {
	byPath := map[string]*facts{}
	get := func(p string) *facts {
		f := byPath[p]
		if f == nil {
			f = &facts{path: p}
			byPath[p] = f
		}
		return f
	}
	for _, c := range calls {
		if c.VM != "" {
			f := get("vm")
			f.present++
			f.strs = append(f.strs, c.VM)
		}
		for k, v := range c.Args {
			if k == "vm" {
				continue // the same as the call's VM
			}
			walk(get, "args."+k, k, v)
		}
	}
	out := make([]*facts, 0, len(byPath))
	for _, f := range byPath {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b *facts) int {
		if (a.path == "vm") != (b.path == "vm") {
			if a.path == "vm" {
				return -1
			}
			return 1
		}
		return strings.Compare(a.path, b.path)
	})
	return out
}

// walk records value v of path p, whose last name is name.
func walk(get func(string) *facts, p, name string, v any) {
	f := get(p)
	f.present++
	if audit.IsSecretArg(name) {
		f.secret = true
		return
	}
	switch v := v.(type) {
	case string:
		f.strs = append(f.strs, v)
	case bool:
		f.bools = append(f.bools, v)
	case map[string]any:
		f.other++
		for k, e := range v {
			walk(get, p+"."+k, k, e)
		}
	case []any:
		// A list's first element (an argv's program) gets a condition of
		// its own; the list as a whole none.
		f.other++
		if len(v) > 0 {
			walk(get, p+".0", "0", v[0])
		}
	default:
		if x, ok := number(v); ok {
			f.nums = append(f.nums, x)
		} else {
			f.other++
		}
	}
}

// number reads the numbers evidence holds: float64 from the log, the
// int64 of a default (tools.ArgsWithDefaults).
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case int:
		return float64(x), true
	}
	return 0, false
}

// conditions are the conditions of f for a tool called total times: the
// require ones, the deny_if ones, and a note when there is none and why.
func (f *facts) conditions(total int, o *Options) (require, denyIf []condition, note string) {
	optional := f.present < total
	var cs []condition
	switch n := f.present; {
	case f.secret:
		return nil, nil, f.path + ": only its digest is logged: no condition on its value"
	case f.other > 0 || len(f.strs) != n && len(f.nums) != n && len(f.bools) != n:
		return nil, nil, ""
	case len(f.strs) == n:
		cs, note = f.stringConditions(o)
	case len(f.nums) == n:
		cs = f.numberConditions(o)
	default:
		cs = []condition{{Path: f.path, Op: "in", Value: boolSet(f.bools), Why: seenWhy(f.bools)}}
	}
	if !optional {
		return cs, nil, note
	}
	for _, c := range cs {
		c.Op = negated[c.Op]
		c.Why = fmt.Sprintf("sent in %d of %s; %s", f.present, callsWord(total), c.Why)
		denyIf = append(denyIf, c)
	}
	return nil, denyIf, note
}

// negated is the op that holds for a present value (of the kind op
// compares) where op does not: deny_if with it refuses what require with
// op would have, and still lets a call leave the value out.
var negated = map[string]string{"in": "not_in", "gte": "lt", "lte": "gt", "glob": "not_glob", "regex": "not_regex"}

func boolSet(bs []bool) []any {
	var out []any
	for _, v := range []bool{false, true} {
		if slices.Contains(bs, v) {
			out = append(out, v)
		}
	}
	return out
}

// seenWhy lists the values seen with their counts, the commonest first.
func seenWhy[T comparable](vs []T) string {
	counts := map[T]int{}
	var order []T
	for _, v := range vs {
		if counts[v] == 0 {
			order = append(order, v)
		}
		counts[v]++
	}
	slices.SortStableFunc(order, func(a, b T) int { return counts[b] - counts[a] })
	var parts []string
	for i, v := range order {
		if i == 6 {
			parts = append(parts, fmt.Sprintf("%d more", len(order)-i))
			break
		}
		word := fmt.Sprint(v)
		if s, ok := any(v).(string); ok {
			word = short(s)
		}
		parts = append(parts, fmt.Sprintf("%s ×%d", word, counts[v]))
	}
	return "seen: " + strings.Join(parts, ", ")
}

func short(s string) string {
	if len(s) <= 60 {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:57] + "…")
}

// stringConditions is the narrowest string condition of f (see the notes
// at the top of the file).
func (f *facts) stringConditions(o *Options) ([]condition, string) {
	distinct := slices.Compact(slices.Sorted(slices.Values(f.strs)))
	if len(distinct) <= o.MaxIn && !slices.ContainsFunc(distinct, func(s string) bool { return !stable(s) }) {
		set := make([]any, len(distinct))
		for i, s := range distinct {
			set[i] = s
		}
		return []condition{{Path: f.path, Op: "in", Value: set, Why: seenWhy(f.strs)}}, ""
	}
	shapes, how := shapesOf(distinct, o.MaxShapes)
	why := fmt.Sprintf("%s in %s, %s", valuesWord(len(distinct)), callsWord(f.present), how)
	paths := !slices.ContainsFunc(distinct, func(s string) bool { return !strings.Contains(s, "/") })
	var c condition
	switch {
	case shapes == nil:
		return nil, f.path + ": " + why + ": too varied for a condition"
	case len(shapes) == 1 && paths && shapes[0].trivial():
		return nil, f.path + ": " + why + ": every value is an id that changes"
	case len(shapes) == 1 && paths && !strings.Contains(shapes[0].glob(), "**"):
		c = condition{Path: f.path, Op: "glob", Value: shapes[0].glob(), Why: why}
	default:
		alts := make([]string, len(shapes))
		for i, s := range shapes {
			alts[i] = s.regex()
		}
		re := "^(?:" + strings.Join(alts, "|") + ")$"
		if len(re) > maxPattern {
			return nil, f.path + ": " + why + ": the pattern would be too long"
		}
		c = condition{Path: f.path, Op: "regex", Value: re, Why: why}
	}
	return []condition{c}, ""
}

// maxPattern is the policy parser's limit on a pattern.
const maxPattern = 1024

// shapesOf returns the few shapes of values (in key order), coarser ones
// (paths by their directories) when there are more than max; nil when
// there are still too many. how says which.
func shapesOf(values []string, max int) (shapes []shape, how string) {
	for _, level := range []struct {
		shape func(string) shape
		how   string
	}{
		{shapeOf, "shaped with their numbers and ids as patterns"},
		{func(s string) shape {
			if d := dirShape(s); d != nil {
				return d
			}
			return shapeOf(s)
		}, "shaped by their directories"},
	} {
		byKey := map[string]shape{}
		var keys []string
		for _, v := range values {
			sh := level.shape(v)
			k := sh.key()
			if old, ok := byKey[k]; ok {
				byKey[k] = old.widen(sh)
				continue
			}
			byKey[k] = sh
			keys = append(keys, k)
		}
		if len(keys) <= max {
			slices.Sort(keys)
			for _, k := range keys {
				shapes = append(shapes, byKey[k])
			}
			return shapes, level.how
		}
	}
	return nil, "with more shapes than " + strconv.Itoa(max)
}

// numberConditions bound f's numbers with headroom: gte the smallest
// divided by it, lte the largest times it (whole numbers when every value
// was one).
func (f *facts) numberConditions(o *Options) []condition {
	lo, hi := slices.Min(f.nums), slices.Max(f.nums)
	whole := !slices.ContainsFunc(f.nums, func(x float64) bool { return x != math.Trunc(x) })
	h := o.Headroom
	lower, upper := lo/h, hi*h
	if lo < 0 {
		lower = lo * h
	}
	if hi < 0 {
		upper = hi / h
	}
	if whole {
		lower, upper = math.Floor(lower), math.Ceil(upper)
	}
	if upper == 0 {
		upper = 0 // not -0
	}
	why := fmt.Sprintf("%d values from %s to %s, ×%s headroom", len(f.nums), fmtNum(lo), fmtNum(hi), fmtNum(h))
	if lo == hi {
		why = fmt.Sprintf("seen: %s ×%d, ×%s headroom", fmtNum(lo), len(f.nums), fmtNum(h))
	}
	return []condition{
		{Path: f.path, Op: "gte", Value: lower, Why: why},
		{Path: f.path, Op: "lte", Value: upper, Why: why},
	}
}

// valuesWord is "1 value", "4 different values".
func valuesWord(n int) string {
	if n == 1 {
		return "1 value"
	}
	return fmt.Sprintf("%d different values", n)
}

func fmtNum(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
