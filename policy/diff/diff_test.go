package diff

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/policy"
)

func summary(t *testing.T, doc string) policy.Summary {
	t.Helper()
	e, err := policy.Parse("p.json", []byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s) = %v", doc, err)
	}
	return e.Describe()
}

// doc is a document with default deny and the given tools.
func doc(tools string) string {
	return `{"version":"1","default":"deny","tools":{` + tools + `}}`
}

// TestCompareWording: each kind of difference, in words and with the
// right sign, for one tool.
func TestCompareWording(t *testing.T) {
	const kill = `"kill_process":`
	tests := []struct {
		name     string
		old, new string
		want     []string // "tool mark text"
	}{
		{"same, written differently", doc(kill + `{"_why":"x","limits":[{"counter":"k","window":"minute","max":5,"scope":"grant"}]},"list_vms":{}`),
			doc(`"list_vms":{"_c":1},` + kill + `{"limits":[{"scope":"grant","max":5,"window":"60s","counter":"k"}]}`), nil},
		{"not listed any more", doc(kill + `{}`), doc(``),
			[]string{"kill_process - OLD allows it; NEW denies every call (not listed; the default is deny)"}},
		{"denied, then allowed under conditions", doc(kill + `{"action":"deny","reason":"no kills"}`),
			doc(kill + `{"require":[{"path":"args.signal","op":"in","value":["TERM"]}]}`),
			[]string{
				"kill_process + OLD denies every call (action deny: no kills); NEW allows it (under 1 condition)",
				`kill_process ~ NEW lets it through only when args.signal in ["TERM"]`,
			}},
		{"approval added", doc(kill + `{}`), doc(kill + `{"action":"approve"}`),
			[]string{"kill_process - OLD allows calls without an approval; NEW needs an operator's approval for each"}},
		{"approval changed", doc(kill + `{"action":"approve"}`), doc(kill + `{"action":"approve","approval":{"channel":"client","ttl":"1m"}}`),
			[]string{"kill_process ~ approval: OLD through the operator, valid 15m0s, NEW through the client's user, valid 1m0s"}},
		{"hidden", doc(kill + `{"action":"deny"}`), `{"version":"1","default":"deny","hide":["kill_process"]}`,
			[]string{"kill_process ~ OLD denies every call (action deny), NEW denies every call (hidden: not in tools/list): both deny every call, and only OLD shows it in tools/list"}},
		{"require added, deny_if removed", doc(kill + `{"deny_if":[{"path":"args.pid","op":"lt","value":100}]}`),
			doc(kill + `{"require":[{"path":"vm","op":"glob","value":"lab/*"}]}`),
			[]string{
				`kill_process - NEW requires vm glob "lab/*", OLD does not: NEW denies the calls where it does not hold`,
				"kill_process + OLD denies calls where args.pid lt 100, NEW does not",
			}},
		{"set narrowed", doc(kill + `{"require":[{"path":"args.signal","op":"in","value":["TERM","KILL"]}]}`),
			doc(kill + `{"require":[{"path":"args.signal","op":"in","value":["TERM"]}]}`),
			[]string{`kill_process - require args.signal: OLD args.signal in ["TERM","KILL"], NEW args.signal in ["TERM"] (NEW drops "KILL", adds nothing)`}},
		{"deny_if not_in widened", doc(kill + `{"deny_if":[{"path":"args.signal","op":"not_in","value":["TERM"]}]}`),
			doc(kill + `{"deny_if":[{"path":"args.signal","op":"not_in","value":["TERM","INT"]}]}`),
			[]string{`kill_process + deny_if args.signal: OLD args.signal not_in ["TERM"], NEW args.signal not_in ["TERM","INT"] (NEW drops nothing, adds "INT")`}},
		{"bound lowered in require", doc(kill + `{"require":[{"path":"args.pid","op":"lte","value":5000}]}`),
			doc(kill + `{"require":[{"path":"args.pid","op":"lte","value":900}]}`),
			[]string{"kill_process - require args.pid: OLD args.pid lte 5000, NEW args.pid lte 900"}},
		{"bound lowered in deny_if", doc(kill + `{"deny_if":[{"path":"args.pid","op":"gt","value":5000}]}`),
			doc(kill + `{"deny_if":[{"path":"args.pid","op":"gt","value":900}]}`),
			[]string{"kill_process - deny_if args.pid: OLD args.pid gt 5000, NEW args.pid gt 900"}},
		{"lower bound raised", doc(kill + `{"require":[{"path":"args.pid","op":"gte","value":2}]}`),
			doc(kill + `{"require":[{"path":"args.pid","op":"gte","value":300}]}`),
			[]string{"kill_process - require args.pid: OLD args.pid gte 2, NEW args.pid gte 300"}},
		{"limits", doc(kill + `{"limits":[{"counter":"k","window":"minute","max":10,"scope":"grant"},{"counter":"h","window":"hour","max":100,"scope":["grant","vm"]}]}`),
			doc(kill + `{"limits":[{"counter":"kills","window":"minute","max":4,"scope":"grant"},{"counter":"d","window":"day","max":50,"scope":"global"}]}`),
			[]string{
				"kill_process - its calls: limit tightened from 10 a minute per grant (counter k) (OLD) to 4 a minute per grant (counter kills) (NEW)",
				"kill_process - NEW limits its calls to 50 a day in all (counter d); OLD has no such limit",
				"kill_process + OLD limits its calls to 100 an hour per grant and vm (counter h); NEW has no such limit",
			}},
		{"limit on a coarser scope", doc(kill + `{"limits":[{"counter":"k","window":"minute","max":60,"scope":["grant","vm"]}]}`),
			doc(kill + `{"limits":[{"counter":"j","window":"minute","max":8,"scope":"grant"}]}`),
			[]string{"kill_process - its calls: limit tightened from 60 a minute per grant and vm (counter k) (OLD) to 8 a minute per grant (counter j) (NEW)"}},
		{"limit on a finer scope, lower", doc(kill + `{"limits":[{"counter":"k","window":"minute","max":60,"scope":"global"}]}`),
			doc(kill + `{"limits":[{"counter":"k","window":"minute","max":8,"scope":"vm"}]}`),
			[]string{"kill_process ~ its calls: limit changed from 60 a minute in all (counter k) (OLD) to 8 a minute per vm (counter k) (NEW)"}},
		{"limit loosened", doc(kill + `{"limits":[{"counter":"k","window":"minute","max":10,"scope":"grant"}]}`),
			doc(kill + `{"limits":[{"counter":"k","window":"minute","max":30,"scope":"grant"}]}`),
			[]string{"kill_process + its calls: limit loosened from 10 a minute per grant (counter k) (OLD) to 30 a minute per grant (counter k) (NEW)"}},
		{"shadow to enforce", `{"version":"1","default":"allow","mode":"shadow","tools":{"kill_process":{"action":"deny"}}}`,
			`{"version":"1","default":"allow","tools":{"kill_process":{"action":"deny"}}}`,
			[]string{
				"every tool - mode: OLD is in shadow mode (it decides and records, and lets every call through), NEW enforces its decisions",
				"kill_process - OLD runs it in shadow mode: every call goes through (OLD would say: it denies every call (action deny)); NEW enforces: it denies every call (action deny)",
			}},
		{"shadow document, tools neither lists", `{"version":"1","default":"deny","mode":"shadow"}`, `{"version":"1","default":"deny"}`,
			[]string{
				"every tool - mode: OLD is in shadow mode (it decides and records, and lets every call through), NEW enforces its decisions",
				"every tool - the 2 tools neither lists (kill_process, list_vms): OLD runs them in shadow mode, so every call goes through (it would say: it denies every call (not listed; the default is deny)); NEW denies every call (not listed; the default is deny)",
			}},
		{"shadow tool, limits enforced", doc(`"list_vms":{"mode":"shadow","limits":[{"counter":"l","window":"minute","max":5,"scope":"grant"}]}`),
			doc(`"list_vms":{"limits":[{"counter":"l","window":"minute","max":5,"scope":"grant"}]}`),
			[]string{"list_vms - OLD runs it in shadow mode: every call goes through (OLD would say: it allows it); NEW enforces: it allows it, within 1 limit(s)"}},
		{"enforced to shadow", doc(kill + `{"require":[{"path":"args.pid","op":"gt","value":1}]}`),
			doc(kill + `{"mode":"shadow","require":[{"path":"args.pid","op":"gt","value":1}]}`),
			[]string{"kill_process + NEW runs it in shadow mode: every call goes through (NEW would say: it allows it); OLD enforces: it allows it (under 1 condition)"}},
		{"default and all_tools", `{"version":"1","default":"allow","all_tools":{"limits":[{"counter":"a","window":"minute","max":600,"scope":"grant"}]}}`,
			`{"version":"1","default":"deny","tools":{"kill_process":{}}}`,
			[]string{
				"every tool - default: OLD allows the tools it does not list, NEW denies them",
				"every tool + OLD limits every call to 600 a minute per grant (counter a); NEW has no such limit",
				"list_vms - OLD allows it (not listed; the default is allow); NEW denies every call (not listed; the default is deny)",
			}},
		{"blocks", doc(`"destroy_session":{"keep_files":"1h","snapshot_before":true}`), doc(`"destroy_session":{}`),
			[]string{
				"destroy_session ~ OLD has snapshot_before (an undo snapshot before each call), NEW does not (without it: no undo snapshot)",
				"destroy_session ~ keep_files: OLD keeps a destroyed session's files 1h0m0s, NEW removes a destroyed session's files",
			}},
		{"exec blocks", doc(`"vm_agent_exec":{}`), doc(`"vm_agent_exec":{"sandbox":{"require":true},"max_timeout_s":3600}`),
			[]string{
				"vm_agent_exec ~ NEW has a sandbox block, OLD does not (without it: the top-level or default sandbox applies)",
				"vm_agent_exec ~ max_timeout_s: OLD none (the server's cap), NEW 3600 s",
			}},
		{"a higher timeout cap", doc(`"vm_agent_exec":{"max_timeout_s":600}`), doc(`"vm_agent_exec":{"max_timeout_s":3600}`),
			[]string{"vm_agent_exec + max_timeout_s: OLD 600 s, NEW 3600 s"}},
		{"a lower timeout cap", doc(`"vm_agent_exec":{"max_timeout_s":3600}`), doc(`"vm_agent_exec":{"max_timeout_s":600}`),
			[]string{"vm_agent_exec - max_timeout_s: OLD 3600 s, NEW 600 s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changes := Compare(summary(t, tt.old), summary(t, tt.new), []string{"kill_process", "list_vms"})
			var got []string
			for _, c := range changes {
				tool := c.Tool
				if tool == "" {
					tool = "every tool"
				}
				got = append(got, fmt.Sprintf("%s %s %s", tool, c.Effect.Mark(), c.Text))
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("Compare =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestWrite(t *testing.T) {
	var b bytes.Buffer
	err := Write(&b, []Change{
		{Effect: Tighter, Text: "default: x"},
		{Tool: "a", Effect: Looser, Text: "one"},
		{Tool: "a", Effect: Other, Text: "two"},
		{Tool: "b", Effect: Tighter, Text: "three"},
	})
	want := "every tool\n  - default: x\na\n  + one\n  ~ two\nb\n  - three\n"
	if err != nil || b.String() != want {
		t.Errorf("Write = %q, %v; want %q", b.String(), err, want)
	}
}
