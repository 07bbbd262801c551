package readmetest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// block is one fenced code block of README.md.
type block struct {
	id   string // "<section> #<n>": the n-th block under the heading
	lang string // sh, json, yaml, or "" for a plain block
	line int    // README's line of the opening fence
	text string
}

// lines are the block's commands: its lines without comments and blank
// ones, a line ending in '\' joined with the next.
func (b block) lines() []string {
	var out []string
	cur := ""
	for _, l := range strings.Split(b.text, "\n") {
		if strings.HasSuffix(l, `\`) {
			cur += strings.TrimSuffix(l, `\`)
			continue
		}
		l = cur + l
		cur = ""
		if s := strings.TrimSpace(l); s != "" && !strings.HasPrefix(s, "#") {
			out = append(out, s)
		}
	}
	return out
}

// class says how the README test treats a block.
type class string

const (
	// run: runs here as written, in a temporary state directory, against
	// the vmgate the test built.
	run class = "runs"
	// parsed: a client configuration or a config snippet, parsed and
	// checked (JSON names a command make install installs; YAML loads
	// with config.Load; a policy passes vmgate policy check).
	parsed class = "parsed"
	// absent: needs what this machine lacks (a reason says what); the
	// test checks the parts it can.
	absent class = "needs what is absent"
)

// entry is a block's class and its check.
type entry struct {
	class class
	// has is text the block must contain: it keeps an entry from judging
	// another block that moved under its id.
	has string
	// why is, for absent, what the block needs that is not here.
	why string
	// check runs or checks the block and reports each part of it.
	check func(t *testing.T, e *env, b block) []result
}

// result is one part of a check: what was checked and, when it did not
// hold, why.
type result struct {
	what string
	err  error
}

func ok(what string) result { return result{what: what} }

func fail(what, format string, args ...any) result {
	return result{what: what, err: fmt.Errorf(format, args...)}
}

// headingRE and fenceRE find README's headings and fences.
var (
	headingRE = regexp.MustCompile(`^#{1,6} +(.+?)\s*$`)
	fenceRE   = regexp.MustCompile("^```([A-Za-z]*)\\s*$")
)

// readmePath is README.md at the repository's root.
func readmePath(t testing.TB) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readmeBlocks parses README's fenced blocks.
func readmeBlocks(t testing.TB) []block {
	t.Helper()
	raw, err := os.ReadFile(readmePath(t))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var blocks []block
	section, n := "", 0
	for i := 0; i < len(lines); i++ {
		if m := headingRE.FindStringSubmatch(lines[i]); m != nil {
			section, n = m[1], 0
			continue
		}
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		j := i + 1
		for j < len(lines) && !strings.HasPrefix(lines[j], "```") {
			j++
		}
		if j == len(lines) {
			t.Fatalf("README.md:%d: a block that never ends", i+1)
		}
		n++
		blocks = append(blocks, block{id: fmt.Sprintf("%s #%d", section, n), lang: m[1], line: i + 1,
			text: strings.Join(lines[i+1:j], "\n")})
		i = j
	}
	return blocks
}

// TestREADME: every fenced block of README.md has a class in classes and
// passes its check; the parts knownBroken lists still fail (when one
// starts to pass, its entry must go); and the README statements checked
// beside the blocks (prose) hold.
func TestREADME(t *testing.T) {
	blocks := readmeBlocks(t)
	e := newEnv(t, blocks)
	judged := map[string]bool{}
	judge := func(t *testing.T, id string, rs []result) {
		t.Helper()
		for _, r := range rs {
			key := id + " / " + r.what
			if judged[key] {
				t.Errorf("%s is reported twice: give its parts distinct names", key)
			}
			judged[key] = true
			finding, broken := knownBroken[key]
			switch {
			case broken && r.err == nil:
				t.Errorf("%s now works as README says: remove it from knownBroken (%s)", key, finding)
			case broken:
				t.Logf("%s: still broken (%s): %v", key, finding, r.err)
			case r.err != nil:
				t.Errorf("%s: %v", key, r.err)
			}
		}
	}
	for _, p := range prose {
		t.Run(p.id, func(t *testing.T) { judge(t, p.id, p.check(t, e)) })
	}
	seen := map[string]bool{}
	for _, b := range blocks {
		seen[b.id] = true
		ent, ok := classes[b.id]
		if !ok {
			t.Errorf("README.md:%d: block %q (%s) has no class: add it to classes (runs, parsed, or needs what is absent, with the reason)\n%s",
				b.line, b.id, b.lang, b.text)
			continue
		}
		if !strings.Contains(b.text, ent.has) {
			t.Errorf("README.md:%d: block %q does not contain %q: the blocks moved; classify them again", b.line, b.id, ent.has)
			continue
		}
		if ent.class == absent && ent.why == "" {
			t.Errorf("classes[%q]: a block that needs what is absent says what", b.id)
		}
		t.Run(b.id, func(t *testing.T) { judge(t, b.id, ent.check(t, e, b)) })
	}
	for id := range classes {
		if !seen[id] {
			t.Errorf("classes lists %q, which README.md does not have", id)
		}
	}
	for key, finding := range knownBroken {
		if !judged[key] && !t.Failed() {
			t.Errorf("knownBroken lists %q (%s), which no check reports", key, finding)
		}
	}
}

// TestBlockLines: how a block is cut into commands.
func TestBlockLines(t *testing.T) {
	b := block{text: "# comment\na --x \\\n  --y\n\n  b   # trailing\n"}
	if got, want := b.lines(), []string{"a --x   --y", "b   # trailing"}; !slices.Equal(got, want) {
		t.Errorf("lines() = %q; want %q", got, want)
	}
}

// TestClassesComplete: every README block has a class (without running
// anything, so that this holds even where the checks cannot run).
func TestClassesComplete(t *testing.T) {
	for _, b := range readmeBlocks(t) {
		if _, ok := classes[b.id]; !ok {
			t.Errorf("README.md:%d: block %q has no class", b.line, b.id)
		}
	}
}
