package readmetest

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// flagRE finds the flags a command line uses (--name, -o).
var flagRE = regexp.MustCompile(`^(--?[A-Za-z][-A-Za-z]*)(=.*)?$`)

// checkCommandFlags: each vmgate command of the block (a "$ " prompt
// dropped, lines of output skipped) names a subcommand whose --help
// exits 0 and lists every flag the line uses.
func checkCommandFlags(t *testing.T, e *env, b block) []result {
	var rs []result
	for i, l := range b.lines() {
		l = strings.TrimPrefix(l, "$ ")
		if !strings.HasPrefix(l, "vmgate ") {
			continue
		}
		what := "line " + strconv.Itoa(i+1) + " flags"
		argv := e.argv(t, l)
		var sub []string
		for _, a := range argv[1:] {
			if strings.HasPrefix(a, "-") || strings.ContainsAny(a, "./") {
				break
			}
			sub = append(sub, a)
		}
		r := e.sh("", nil, "vmgate "+strings.Join(sub, " ")+" --help")
		if r.code != 0 || !strings.Contains(r.stdout, "Flags:") {
			rs = append(rs, fail(what, "vmgate %s --help: %v", strings.Join(sub, " "), r))
			continue
		}
		res := ok(what)
		for _, a := range argv[1:] {
			m := flagRE.FindStringSubmatch(a)
			if m == nil {
				continue
			}
			f := m[1]
			if !strings.Contains(r.stdout, " "+f+" ") && !strings.Contains(r.stdout, " "+f+",") {
				res = fail(what, "vmgate %s has no flag %s (its --help: %s)", strings.Join(sub, " "), f, clip(r.stdout))
				break
			}
		}
		rs = append(rs, res)
	}
	if len(rs) == 0 {
		t.Fatalf("block %s has no vmgate command", b.id)
	}
	return rs
}

// suggestedToolRE and suggestedListRE find a tool's key and one of its
// rule lists in an excerpt of a suggested policy.
var (
	suggestedToolRE = regexp.MustCompile(`^"([a-z_]+)": \{$`)
	suggestedListRE = regexp.MustCompile(`^"(require|deny_if|limits)": \[$`)
)

// checkSuggestedExcerpt: the excerpt ("…" where lines were left out) is
// made whole again, each rule under its tool and list, and the policy it
// makes passes vmgate policy check --strict.
func checkSuggestedExcerpt(t *testing.T, e *env, b block) []result {
	const what = "its rules pass policy check --strict"
	tools := map[string]map[string][]json.RawMessage{}
	tool, list, n := "", "", 0
	for _, l := range b.lines() {
		l = strings.TrimSuffix(strings.TrimSpace(l), ",")
		switch m, ml := suggestedToolRE.FindStringSubmatch(l), suggestedListRE.FindStringSubmatch(l); {
		case m != nil:
			tool, list = m[1], ""
			tools[tool] = map[string][]json.RawMessage{}
		case ml != nil && tool != "":
			list = ml[1]
		case strings.HasPrefix(l, "{") && list != "":
			if !json.Valid([]byte(l)) {
				return []result{fail(what, "%s.%s: %s is not JSON", tool, list, l)}
			}
			tools[tool][list] = append(tools[tool][list], json.RawMessage(l))
			n++
		}
	}
	if n < 5 {
		t.Fatalf("block %s: %d rules found; the excerpt changed shape", b.id, n)
	}
	doc, err := json.Marshal(map[string]any{"version": "1", "default": "deny", "tools": tools})
	if err != nil {
		t.Fatal(err)
	}
	p := writeFile(t, t.TempDir(), "suggested.json", string(doc))
	if r := e.sh("", nil, "vmgate policy check --strict "+p); r.code != 0 {
		return []result{fail(what, "%v", r)}
	}
	return []result{ok(what)}
}

// checkDiffExcerpt: the tools the excerpt of policy diff names (its lines
// that are not indented) are in vmgate serve's tools/list.
func checkDiffExcerpt(t *testing.T, e *env, b block) []result {
	res, err := mcpStdio(e.command(e.dir, []string{"VMGATE_STATE_DIR=" + filepath.Join(e.dir, "diff-state")}, filepath.Join(e.bin, "vmgate"), "serve"),
		map[string]any{"method": "tools/list"})
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var list struct{ Tools []struct{ Name string } }
	if err := json.Unmarshal(res[0], &list); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tl := range list.Tools {
		names[tl.Name] = true
	}
	var rs []result
	for _, l := range strings.Split(b.text, "\n") {
		if l == "" || strings.HasPrefix(l, " ") {
			continue
		}
		if names[l] {
			rs = append(rs, ok(l+" is a tool"))
		} else {
			rs = append(rs, fail(l+" is a tool", "tools/list has no %q", l))
		}
	}
	if len(rs) == 0 {
		t.Fatalf("block %s names no tool", b.id)
	}
	return rs
}
