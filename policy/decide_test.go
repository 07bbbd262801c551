package policy

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestConditionOps(t *testing.T) {
	args := map[string]any{
		"s":      "hello world",
		"path":   "lab/vm1",
		"n":      float64(5),
		"num":    json.Number("7"),
		"i":      int(3),
		"b":      true,
		"null":   nil,
		"list":   []any{"a", float64(2)},
		"nested": map[string]any{"k": "v", "deep": map[string]any{"x": float64(1)}},
	}
	cases := []struct {
		path, op, value string // value is JSON, "" for none
		want            bool
	}{
		{"args.s", "eq", `"hello world"`, true},
		{"args.s", "eq", `"hello"`, false},
		{"args.n", "eq", `5`, true},
		{"args.num", "eq", `7`, true},
		{"args.i", "eq", `3`, true},
		{"args.b", "eq", `true`, true},
		{"args.s", "eq", `5`, false}, // type mismatch
		{"args.n", "eq", `"5"`, false},
		{"args.s", "neq", `"x"`, true},
		{"args.s", "neq", `"hello world"`, false},
		{"args.n", "neq", `"5"`, true}, // a number is never equal to a string
		{"args.missing", "neq", `"x"`, false},
		{"args.null", "neq", `"x"`, false}, // null is missing
		{"args.s", "in", `["a","hello world"]`, true},
		{"args.n", "in", `[1,5]`, true},
		{"args.n", "in", `["5"]`, false},
		{"args.s", "not_in", `["a","b"]`, true},
		{"args.s", "not_in", `["hello world"]`, false},
		{"args.missing", "not_in", `["a"]`, false},
		{"args.n", "lt", `6`, true},
		{"args.n", "lt", `5`, false},
		{"args.n", "lte", `5`, true},
		{"args.n", "gt", `4.5`, true},
		{"args.n", "gt", `5`, false},
		{"args.n", "gte", `5`, true},
		{"args.num", "gt", `6`, true},
		{"args.s", "lt", `100`, false}, // lt on a string is false
		{"args.b", "gte", `0`, false},
		{"args.list", "lt", `9`, false},
		{"args.s", "regex", `"^hello"`, true},
		{"args.s", "regex", `"^world"`, false},
		{"args.n", "regex", `"5"`, false},
		{"args.path", "glob", `"lab/*"`, true},
		{"args.path", "glob", `"lab/vm?"`, true},
		{"args.path", "glob", `"pve/*"`, false},
		{"args.path", "glob", `"*"`, false}, // * does not cross /
		{"args.n", "glob", `"*"`, false},
		{"args.s", "contains", `"lo wo"`, true},
		{"args.s", "contains", `"xyz"`, false},
		{"args.list", "contains", `"a"`, true},
		{"args.list", "contains", `2`, true},
		{"args.list", "contains", `"2"`, false},
		{"args.n", "contains", `"5"`, false},
		{"args.s", "exists", ``, true},
		{"args.missing", "exists", ``, false},
		{"args.null", "exists", ``, false},
		{"args.nested.k", "eq", `"v"`, true},
		{"args.nested.deep.x", "gte", `1`, true},
		{"args.nested.k.x", "exists", ``, false}, // through a string
		{"args.list.a", "exists", ``, false},     // a list is addressed by index only
		{"args.list.0", "eq", `"a"`, true},
		{"args.list.1", "eq", `2`, true},
		{"args.list.2", "exists", ``, false},  // past the end
		{"args.list.01", "exists", ``, false}, // no leading zero
		{"args.list.-1", "exists", ``, false},
		{"args.s.0", "exists", ``, false}, // a string is no list
		{"args.s", "not_regex", `"^world"`, true},
		{"args.s", "not_regex", `"^hello"`, false},
		{"args.n", "not_regex", `"5"`, true}, // present, and no string the pattern matches
		{"args.missing", "not_regex", `"x"`, false},
		{"args.null", "not_regex", `"x"`, false},
		{"args.path", "not_glob", `"pve/*"`, true},
		{"args.path", "not_glob", `"lab/*"`, false},
		{"args.list", "not_glob", `"*"`, true},
		{"args.missing", "not_glob", `"*"`, false},
		{"vm", "glob", `"lab/*"`, true},
		{"vm", "eq", `"pve/101"`, false},
		{"grant", "in", `["alice","bob"]`, true},
	}
	call := Call{Grant: "alice", Tool: "t", VM: "lab/vm1", Args: args}
	for _, tc := range cases {
		c := `{"path":"` + tc.path + `","op":"` + tc.op + `"`
		if tc.value != "" {
			c += `,"value":` + tc.value
		}
		c += "}"
		e := mustParse(t, wrap(`{"require":[`+c+`]}`))
		got := e.Decide(call).Verdict == Allow
		if got != tc.want {
			t.Errorf("condition %s on %v = %v; want %v", c, args, got, tc.want)
		}
		// deny_if with the same condition fires exactly when require passes.
		e = mustParse(t, wrap(`{"deny_if":[`+c+`]}`))
		if fired := e.Decide(call).Verdict == Deny; fired != tc.want {
			t.Errorf("deny_if %s fired = %v; want %v", c, fired, tc.want)
		}
	}
}

func TestConditionsWithoutVMOrGrantAreMissing(t *testing.T) {
	e := mustParse(t, wrap(`{"require":[{"path":"vm","op":"neq","value":"x"}]}`))
	if d := e.Decide(Call{Grant: "g", Tool: "t"}); d.Verdict != Deny || d.Rule != "/tools/t/require/0" {
		t.Errorf("Decide(no vm) = %v %s; want deny /tools/t/require/0", d.Verdict, d.Rule)
	}
}

func TestEvaluationOrder(t *testing.T) {
	doc := `{"version":"1","default":"deny","hide":["vm_power"],
	"all_tools":{"limits":[{"counter":"all","window":"minute","max":100,"scope":"grant"}]},
	"tools":{
	  "off":{"action":"deny","require":[{"path":"args.never","op":"exists"}]},
	  "exec":{"require":[{"path":"args.session","op":"exists"},{"path":"vm","op":"glob","value":"lab/*"}],
	          "deny_if":[{"path":"args.shell","op":"exists"}],
	          "limits":[{"counter":"exec","window":"minute","max":10,"scope":["grant","vm"]}]},
	  "gated":{"action":"approve","reason":"ask first","deny_if":[{"path":"args.force","op":"eq","value":true}],
	          "approval":{"channel":"client","ttl":"2m"},
	          "limits":[{"counter":"gated","window":"hour","max":1,"scope":"global"}]}}}`
	e := mustParse(t, doc)
	all := Counter{Key: "all|grant=1:g", Name: "all", Window: time.Minute, Max: 100, Rule: "/all_tools/limits/0"}
	cases := []struct {
		name string
		call Call
		want Decision
	}{
		{"hidden", Call{Grant: "g", Tool: "vm_power"},
			Decision{Verdict: Deny, Rule: "/hide/0", Reason: "tool vm_power is hidden by the policy"}},
		{"unlisted", Call{Grant: "g", Tool: "other"},
			Decision{Verdict: Deny, Rule: "/default", Reason: "tool other is not allowed by the policy (not listed; the default is deny)"}},
		{"action before require", Call{Grant: "g", Tool: "off"},
			Decision{Verdict: Deny, Rule: "/tools/off/action", Reason: "tool off is denied by the policy"}},
		{"require", Call{Grant: "g", Tool: "exec", VM: "lab/vm1", Args: map[string]any{"shell": "x"}},
			Decision{Verdict: Deny, Rule: "/tools/exec/require/0", Reason: "requirement not met: args.session exists"}},
		{"second require", Call{Grant: "g", Tool: "exec", VM: "pve/1", Args: map[string]any{"session": "s"}},
			Decision{Verdict: Deny, Rule: "/tools/exec/require/1", Reason: `requirement not met: vm glob "lab/*"`}},
		{"deny_if after require", Call{Grant: "g", Tool: "exec", VM: "lab/vm1", Args: map[string]any{"session": "s", "shell": "x"}},
			Decision{Verdict: Deny, Rule: "/tools/exec/deny_if/0", Reason: "denied because args.shell exists"}},
		{"limits", Call{Grant: "g", Tool: "exec", VM: "lab/vm1", Args: map[string]any{"session": "s"}},
			Decision{Verdict: Allow, Rule: "/tools/exec", Counters: []Counter{
				{Key: "exec|grant=1:g|vm=7:lab/vm1", Name: "exec", Window: time.Minute, Max: 10, Rule: "/tools/exec/limits/0"}, all}}},
		{"deny_if before approval", Call{Grant: "g", Tool: "gated", Args: map[string]any{"force": true}},
			Decision{Verdict: Deny, Rule: "/tools/gated/deny_if/0", Reason: "ask first"}},
		{"approval with counters", Call{Grant: "g", Tool: "gated"},
			Decision{Verdict: Approve, Rule: "/tools/gated/action", Reason: "ask first", Approval: &ApprovalSpec{Channel: "client", TTL: 2 * time.Minute},
				Counters: []Counter{{Key: "gated", Name: "gated", Window: time.Hour, Max: 1, Rule: "/tools/gated/limits/0"}, all}}},
		{"no grant", Call{Tool: "exec"}, Decision{Verdict: Deny, Reason: "the call names no tool or no grant"}},
	}
	for _, tc := range cases {
		d := e.Decide(tc.call)
		if !reflect.DeepEqual(d, tc.want) {
			t.Errorf("%s: Decide(%+v) = %+v; want %+v", tc.name, tc.call, d, tc.want)
		}
		ed, steps := e.Explain(tc.call)
		if !reflect.DeepEqual(ed, d) || len(steps) == 0 {
			t.Errorf("%s: Explain = %+v with %d steps; want the Decide result and steps", tc.name, ed, len(steps))
		} else if last := steps[len(steps)-1]; d.Verdict == Deny && last.Result != "deny" {
			t.Errorf("%s: last step %+v; want a deny step", tc.name, last)
		}
	}
}

func TestDefaultAllowAndVisibility(t *testing.T) {
	e := mustParse(t, `{"version":"1","default":"allow","hide":["h"],"tools":{"off":{"action":"deny"}},
		"all_tools":{"limits":[{"counter":"all","window":"second","max":5,"scope":"global"}]}}`)
	d := e.Decide(Call{Grant: "g", Tool: "anything"})
	want := Decision{Verdict: Allow, Rule: "/default", Counters: []Counter{{Key: "all", Name: "all", Window: time.Second, Max: 5, Rule: "/all_tools/limits/0"}}}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("Decide(unlisted) = %+v; want %+v", d, want)
	}
	deny := mustParse(t, `{"version":"1","default":"deny","hide":["h"],"tools":{"off":{"action":"deny"},"on":{}}}`)
	for _, tc := range []struct {
		e    *Engine
		tool string
		want bool
	}{
		{e, "anything", true}, {e, "h", false}, {e, "off", true},
		{deny, "anything", false}, {deny, "h", false}, {deny, "off", true}, {deny, "on", true},
	} {
		if got := tc.e.Visible(tc.tool); got != tc.want {
			t.Errorf("Visible(%q) under default %v = %v; want %v", tc.tool, tc.e.def, got, tc.want)
		}
	}
	if got, want := deny.Tools(), []string{"h", "off", "on"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Tools() = %v; want %v", got, want)
	}
}

func TestShadowMode(t *testing.T) {
	e := mustParse(t, `{"version":"1","default":"deny","tools":{
		"a":{"mode":"shadow","action":"deny","reason":"no"},
		"b":{"require":[{"path":"args.x","op":"exists"}]}}}`)
	if d := e.Decide(Call{Grant: "g", Tool: "a"}); d.Verdict != Deny || !d.Shadow || d.Reason != "no" {
		t.Errorf("Decide(shadowed deny) = %+v; want Deny, Shadow, reason no", d)
	}
	if d := e.Decide(Call{Grant: "g", Tool: "b"}); d.Verdict != Deny || d.Shadow {
		t.Errorf("Decide(enforced) = %+v; want Deny without Shadow", d)
	}
	top := mustParse(t, `{"version":"1","default":"deny","mode":"shadow","tools":{"b":{"mode":"enforce","action":"deny"}}}`)
	if d := top.Decide(Call{Grant: "g", Tool: "unlisted"}); d.Verdict != Deny || !d.Shadow {
		t.Errorf("Decide(unlisted, top shadow) = %+v; want Deny, Shadow", d)
	}
	if d := top.Decide(Call{Grant: "g", Tool: "b"}); d.Shadow {
		t.Errorf("Decide(tool enforce under top shadow) = %+v; want no Shadow", d)
	}
}

func TestApprovalDefaults(t *testing.T) {
	e := mustParse(t, wrap(`{"action":"approve"}`))
	d := e.Decide(Call{Grant: "g", Tool: "t"})
	if d.Verdict != Approve || d.Approval == nil || *d.Approval != (ApprovalSpec{Channel: "operator", TTL: 15 * time.Minute}) {
		t.Fatalf("Decide = %+v (approval %+v); want Approve with operator, 15m", d, d.Approval)
	}
	d.Approval.TTL = time.Hour // the caller's copy: must not change the engine
	if d2 := e.Decide(Call{Grant: "g", Tool: "t"}); d2.Approval.TTL != 15*time.Minute {
		t.Errorf("Decide after caller mutation: TTL = %v; want 15m", d2.Approval.TTL)
	}
}

func TestSessionScopeWithoutSessionDenies(t *testing.T) {
	e := mustParse(t, wrap(`{"limits":[{"counter":"c","window":"minute","max":1,"scope":["session"]}]}`))
	d := e.Decide(Call{Grant: "g", Tool: "t"})
	if d.Verdict != Deny || d.Rule != "/tools/t/limits/0" || !strings.Contains(d.Reason, "no session") {
		t.Errorf("Decide(no session) = %+v; want deny at /tools/t/limits/0", d)
	}
	if d := e.Decide(Call{Grant: "g", Tool: "t", Session: "s"}); d.Verdict != Allow || d.Counters[0].Key != "c|session=1:s" {
		t.Errorf("Decide(session s) = %+v; want allow with key c|session=1:s", d)
	}
}

func TestSharedCounterIsReservedOnce(t *testing.T) {
	e := mustParse(t, `{"version":"1","default":"deny",
		"all_tools":{"limits":[{"counter":"c","window":"minute","max":3,"scope":"grant"}]},
		"tools":{"t":{"limits":[{"counter":"c","window":"minute","max":3,"scope":"grant"}]}}}`)
	if d := e.Decide(Call{Grant: "g", Tool: "t"}); len(d.Counters) != 1 {
		t.Errorf("Decide = %+v; want one counter", d.Counters)
	}
}

func TestCounterKeysDoNotCollide(t *testing.T) {
	e := mustParse(t, wrap(`{"limits":[{"counter":"c","window":"minute","max":1,"scope":["grant","session","vm"]}]}`))
	calls := []Call{
		{Grant: "a|session=1:b", Session: "c", VM: "d"},
		{Grant: "a", Session: "b|vm=1:c", VM: "d"},
		{Grant: "a", Session: "b", VM: "c|vm=1:d"},
		{Grant: "a", Session: "b", VM: ""},
		{Grant: "a", Session: "b", VM: "0:"},
		{Grant: "ab", Session: "b", VM: ""},
		{Grant: "a", Session: "bb", VM: ""},
	}
	seen := map[string]Call{}
	for _, c := range calls {
		c.Tool = "t"
		d := e.Decide(c)
		if len(d.Counters) != 1 {
			t.Fatalf("Decide(%+v) = %+v; want one counter", c, d)
		}
		if prev, dup := seen[d.Counters[0].Key]; dup {
			t.Errorf("key %q shared by %+v and %+v", d.Counters[0].Key, prev, c)
		}
		seen[d.Counters[0].Key] = c
	}
}

func TestTenMegabyteDocumentFailsFast(t *testing.T) {
	doc := make([]byte, 10<<20)
	for i := range doc {
		doc[i] = ' '
	}
	_, err := Parse("big.json", doc)
	if err == nil || err.Error() != fmt.Sprintf("big.json:1:1: document is %d bytes; the limit is %d", 10<<20, MaxDocumentSize) {
		t.Errorf("Parse(10 MB) = %v; want the size error", err)
	}
}

func TestFingerprint(t *testing.T) {
	a := mustParse(t, wrap(`{}`))
	b := mustParse(t, wrap(`{ }`))
	if len(a.Fingerprint()) != 64 || a.Fingerprint() == b.Fingerprint() {
		t.Errorf("Fingerprint() = %q and %q; want distinct 64-hex digests", a.Fingerprint(), b.Fingerprint())
	}
	if a.Fingerprint() != mustParse(t, wrap(`{}`)).Fingerprint() {
		t.Errorf("Fingerprint() differs for the same document")
	}
}

func TestPointerEscaping(t *testing.T) {
	if got := escapePointer("a/b~c"); got != "a~1b~0c" {
		t.Errorf("escapePointer(a/b~c) = %q; want a~1b~0c", got)
	}
}
