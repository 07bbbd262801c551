package policy

import (
	"strings"
	"testing"
)

// TestCommentKeys: a key that starts with "_" is a comment in every object
// of fields (top level, tool, condition, limit, approval): any value, no
// effect on decisions. Other unknown keys stay errors, and a "_" name under
// tools is a tool name, not a comment.
func TestCommentKeys(t *testing.T) {
	doc := `{"version":"1","default":"deny","_why":{"from":"audit.log","calls":3},
  "all_tools":{"_why":"peak 4/min","limits":[{"counter":"all","window":"minute","max":8,"scope":"grant","_why":"peak 4"}]},
  "tools":{"kill_process":{"_why":"3 calls, first 2026-07-01","require":[{"path":"args.signal","op":"in","value":["TERM"],"_why":["TERM x3"]}],
    "limits":[{"counter":"kills","window":"minute","max":2,"scope":"grant","_note":null}]},
   "destroy_session":{"action":"approve","approval":{"channel":"operator","_why":"rare"}}}}`
	e, err := Parse("c.json", []byte(doc))
	if err != nil {
		t.Fatalf("Parse(with comment keys) = %v; want no error", err)
	}
	call := Call{Grant: "g", Tool: "kill_process", VM: "lab/vm1", Args: map[string]any{"signal": "TERM"}}
	if d := e.Decide(call); d.Verdict != Allow || len(d.Counters) != 2 {
		t.Errorf("Decide(TERM) = %v with %d counters; want allow with 2", d.Verdict, len(d.Counters))
	}
	call.Args["signal"] = "HUP"
	if d := e.Decide(call); d.Verdict != Deny {
		t.Errorf("Decide(HUP) = %v; want deny", d.Verdict)
	}
	if got := e.Tools(); strings.Join(got, ",") != "destroy_session,kill_process" {
		t.Errorf("Tools() = %v; want the two tools, no comment", got)
	}
	for _, bad := range []struct{ doc, want string }{
		{`{"version":"1","default":"deny","why":1}`, `why: unknown field "why"`},
		{`{"version":"1","default":"deny","tools":{"_why":{}}}`, ""},
	} {
		e, err := Parse("c.json", []byte(bad.doc))
		switch {
		case bad.want != "" && (err == nil || !strings.Contains(err.Error(), bad.want)):
			t.Errorf("Parse(%s) = %v; want %q", bad.doc, err, bad.want)
		case bad.want == "" && (err != nil || len(e.UnknownTools([]string{"kill_process"})) != 1):
			t.Errorf("Parse(%s) = %v; want a tool named _why (an unknown tool), not a comment", bad.doc, err)
		}
	}
}
