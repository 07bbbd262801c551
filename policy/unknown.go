package policy

import (
	"fmt"
	"slices"
	"strings"
)

// A document may name tools the server does not have: a typo
// ("vm_agent_exce"), a tool of a newer or older vmgate, a tool of another
// PolicyLayer server. Parse cannot tell them apart, because the policy
// package knows no tool catalogue (it is pure: the server owns the
// catalogue). So Parse accepts any well-formed name, records where the
// document names it, and UnknownTools checks the names against the
// catalogue the caller passes in: `vmgate policy check` prints the result
// as warnings (errors with --strict), and serve logs it at start-up and on
// every reload.

// mention is one place the document names a tool.
type mention struct {
	name      string
	line, col int
	path      string // "tools.vm_agent_exce" or "hide[0]"
	hide      bool
}

func (b *builder) mention(name string, off int, l loc) mention {
	line, col := lineCol(b.data, off)
	return mention{name: name, line: line, col: col, path: l.path, hide: strings.HasPrefix(l.path, "hide")}
}

// UnknownTools returns one problem for each place the document names a tool
// that is not in known (the server's tool catalogue), in document order,
// with the closest known name when one is near. The problems are warnings
// for the caller to report: the document is valid and the Engine works
// (an unknown tool's rule never applies; hiding an unknown tool hides
// nothing).
func (e *Engine) UnknownTools(known []string) Errors {
	var out Errors
	for _, m := range e.mentions {
		if slices.Contains(known, m.name) {
			continue
		}
		effect := "its rule never applies"
		if m.hide {
			effect = "hiding it hides nothing"
		}
		msg := fmt.Sprintf("unknown tool %q: %s", m.name, effect)
		if near := closest(m.name, known); near != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", near)
		} else if len(known) > 0 {
			msg += " (the tools are " + strings.Join(known, ", ") + ")"
		}
		out = append(out, &Error{File: e.name, Line: m.line, Col: m.col, Path: m.path, Msg: msg})
	}
	return out
}

// closest returns the known name nearest to name: one that differs only in
// case, else one within a small edit distance (two edits, or a quarter of
// the name's length for long names), or "" when none is that near. Ties go
// to the earlier name of known.
func closest(name string, known []string) string {
	for _, k := range known {
		if strings.EqualFold(k, name) {
			return k
		}
	}
	limit := max(2, len(name)/4)
	best, bestD := "", limit+1
	for _, k := range known {
		if d := editDistance(name, k, bestD); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b
// (insertions, deletions, substitutions and transpositions of adjacent
// bytes, each costing one). Once the distance is known to be at least
// stop it returns stop, so comparing a long name costs little.
func editDistance(a, b string, stop int) int {
	if d := len(a) - len(b); d >= stop || -d >= stop {
		return stop
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= stop {
			return stop
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return min(prev[len(b)], stop)
}
