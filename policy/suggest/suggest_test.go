package suggest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
)

// testTools is a small catalogue.
var testTools = []Tool{
	{Name: "list_vms"},
	{Name: "vm_agent_exec", Args: []string{"vm", "command", "shell", "stdin", "env", "cwd", "session", "timeout_s", "wait"}, Destructive: true},
	{Name: "kill_process", Args: []string{"vm", "pid", "signal", "started_at"}, Destructive: true},
	{Name: "destroy_session", Args: []string{"vm", "session"}, Destructive: true},
	{Name: "vm_file_read", Args: []string{"vm", "path", "max_bytes"}},
	{Name: "vm_file_write", Args: []string{"vm", "path", "content", "mode"}, Destructive: true},
}

func testDefaults(tool string, args map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range args {
		out[k] = v
	}
	switch tool {
	case "kill_process":
		if _, ok := out["signal"]; !ok {
			out["signal"] = "TERM"
		}
	case "vm_agent_exec":
		if _, ok := out["timeout_s"]; !ok {
			out["timeout_s"] = 30.0
		}
	}
	return out
}

// logWriter appends a grant's calls as the server records them.
type logWriter struct {
	t   *testing.T
	l   *audit.Log
	now time.Time
	n   int
}

func (w *logWriter) call(grant, tool, decision string, shadow, ran bool, args map[string]any) {
	w.t.Helper()
	w.n++
	w.now = w.now.Add(7 * time.Second)
	id := fmt.Sprintf("C%03d", w.n)
	vm, _ := args["vm"].(string)
	rec := audit.Record{Time: w.now, Kind: audit.KindDecision, CallID: id, Grant: grant, Transport: "stdio", Tool: tool, VM: vm, Decision: decision, Shadow: shadow, Args: args}
	if decision == "approve" {
		rec.ApprovalID = "AP" + id
	}
	if _, err := w.l.Append(context.Background(), rec); err != nil {
		w.t.Fatal(err)
	}
	if ran {
		out := audit.Record{Time: w.now.Add(time.Second), Kind: audit.KindOutcome, CallID: id, Grant: grant, Transport: "stdio", Tool: tool, VM: vm, Outcome: "ok"}
		if _, err := w.l.Append(context.Background(), out); err != nil {
			w.t.Fatal(err)
		}
	}
}

// evidenceLog writes three days of calls of grant "ci" (and some of
// "other"), with every kind of record Collect must tell apart.
func evidenceLog(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(path, audit.Options{Fsync: audit.FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	w := &logWriter{t: t, l: l, now: time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC)}
	vm := "lab/vm1"
	for day := range 3 {
		w.now = time.Date(2026, 7, 1+day, 9, 0, 0, 0, time.UTC)
		w.call("ci", "list_vms", "allow", false, true, nil)
		for i := range 5 {
			w.call("ci", "vm_agent_exec", "allow", false, true, map[string]any{"vm": vm, "command": []any{"make", "test"}, "timeout_s": float64(60 * (i + 1))})
			w.call("ci", "vm_file_read", "allow", false, true, map[string]any{"vm": vm, "path": fmt.Sprintf("/srv/ci/build-%d.log", 4000+day*10+i)})
		}
		w.call("ci", "kill_process", "allow", false, true, map[string]any{"vm": vm, "pid": float64(900 + day)})
		w.call("ci", "kill_process", "deny", false, false, map[string]any{"vm": vm, "pid": 1.0, "signal": "KILL"}) // refused: no evidence
		w.call("ci", "vm_file_write", "deny", true, true, map[string]any{"vm": vm, "path": "/srv/ci/out.txt", "content": "secret"})
	}
	w.call("ci", "destroy_session", "approve", false, false, map[string]any{"vm": vm, "session": "s1"}) // parked
	w.call("ci", "destroy_session", "approve", false, true, map[string]any{"vm": vm, "session": "s1"})  // approved, ran
	w.call("ci", "vm_status", "unknown_vm", false, false, map[string]any{"vm": "lab/nope"})
	w.call("other", "vm_power", "allow", false, true, map[string]any{"vm": vm, "action": "reset"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func collect(t *testing.T, path string, o Options) (*Evidence, error) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return Collect(f, o)
}

func TestCollect(t *testing.T) {
	path := evidenceLog(t)
	if _, err := collect(t, path, Options{}); !errors.Is(err, ErrGrant) || !strings.Contains(err.Error(), "[ci other]") {
		t.Errorf("Collect(no grant) = %v; want ErrGrant naming ci and other", err)
	}
	ev, err := collect(t, path, Options{Grant: "ci", Defaults: testDefaults})
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]int{}
	for _, c := range ev.Calls {
		tools[c.Tool]++
	}
	want := map[string]int{"list_vms": 3, "vm_agent_exec": 15, "vm_file_read": 15, "kill_process": 3, "vm_file_write": 3, "destroy_session": 1}
	if fmt.Sprint(tools) != fmt.Sprint(want) {
		t.Errorf("Collect(ci) calls by tool = %v; want %v", tools, want)
	}
	wantSkipped := map[string]int{"refused by the policy (deny)": 3, "parked for an approval": 1, "refused before the policy decided (unknown_vm)": 1}
	if fmt.Sprint(ev.Skipped) != fmt.Sprint(wantSkipped) {
		t.Errorf("Collect(ci) skipped = %v; want %v", ev.Skipped, wantSkipped)
	}
	ev, err = collect(t, path, Options{Grant: "ci", OnlyAllowed: true, Since: time.Date(2026, 7, 2, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(ev.Calls, func(c Call) bool {
		return c.Tool == "vm_file_write" || c.Time.Before(time.Date(2026, 7, 2, 0, 0, 0, 0, time.UTC))
	}) {
		t.Errorf("Collect(only allowed, since day 2) kept a shadow denial or an older call")
	}
}

// TestSuggest: the suggested policy lists only the tools used, allows
// every call of the evidence and refuses what the grant never did; every
// rule says why.
func TestSuggest(t *testing.T) {
	path := evidenceLog(t)
	o := Options{Grant: "ci", Defaults: testDefaults, Tools: testTools, Source: "audit.log"}
	ev, err := collect(t, path, o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Suggest(ev, o)
	if err != nil {
		t.Fatal(err)
	}
	e, err := policy.Parse("suggested.json", res.Document)
	if err != nil {
		t.Fatalf("the suggestion does not parse: %v\n%s", err, res.Document)
	}
	var doc struct {
		Why   string `json:"_why"`
		Tools map[string]map[string]json.RawMessage
	}
	if err := json.Unmarshal(res.Document, &doc); err != nil {
		t.Fatal(err)
	}
	var names []string
	for name, rule := range doc.Tools {
		names = append(names, name)
		if _, ok := rule["_why"]; !ok {
			t.Errorf("tools.%s has no _why", name)
		}
	}
	slices.Sort(names)
	if want := "destroy_session,kill_process,list_vms,vm_agent_exec,vm_file_read,vm_file_write"; strings.Join(names, ",") != want {
		t.Errorf("tools = %v; want %s", names, want)
	}
	if !strings.Contains(doc.Why, "for grant ci: 40 calls from 2026-07-01T09:00:07Z") || !strings.Contains(doc.Why, "3 refused by the policy (deny)") {
		t.Errorf("_why = %q; want the grant, the count and what was left out", doc.Why)
	}
	decide := func(tool string, args map[string]any) policy.Verdict {
		vm, _ := args["vm"].(string)
		return e.Decide(policy.Call{Grant: "ci", Tool: tool, VM: vm, Args: testDefaults(tool, args)}).Verdict
	}
	tests := []struct {
		tool string
		args map[string]any
		want policy.Verdict
	}{
		{"vm_agent_exec", map[string]any{"vm": "lab/vm1", "command": []any{"make"}, "timeout_s": 120.0}, policy.Allow},
		{"vm_agent_exec", map[string]any{"vm": "lab/vm2", "command": []any{"make"}}, policy.Deny},                       // another VM
		{"vm_agent_exec", map[string]any{"vm": "lab/vm1", "shell": "make"}, policy.Deny},                                // shell never sent
		{"vm_agent_exec", map[string]any{"vm": "lab/vm1", "command": []any{"make"}, "stdin": "x"}, policy.Deny},         // nor stdin
		{"vm_agent_exec", map[string]any{"vm": "lab/vm1", "command": []any{"make"}, "timeout_s": 3600.0}, policy.Deny},  // past 300 × 2
		{"vm_file_read", map[string]any{"vm": "lab/vm1", "path": "/srv/ci/build-4711.log"}, policy.Allow},               // the shape
		{"vm_file_read", map[string]any{"vm": "lab/vm1", "path": "/etc/shadow"}, policy.Deny},                           // not the shape
		{"kill_process", map[string]any{"vm": "lab/vm1", "pid": 950.0}, policy.Allow},                                   // a TERM (default)
		{"kill_process", map[string]any{"vm": "lab/vm1", "pid": 950.0, "signal": "KILL"}, policy.Deny},                  // only TERM was used
		{"kill_process", map[string]any{"vm": "lab/vm1", "pid": 1.0}, policy.Deny},                                      // below 900 / 2
		{"destroy_session", map[string]any{"vm": "lab/vm1", "session": "s1"}, policy.Approve},                           // needed approval every time
		{"destroy_session", map[string]any{"vm": "lab/vm1", "session": "s2"}, policy.Deny},                              // another session
		{"vm_file_write", map[string]any{"vm": "lab/vm1", "path": "/srv/ci/out.txt", "content": "other"}, policy.Allow}, // ran under shadow
		{"vm_power", map[string]any{"vm": "lab/vm1", "action": "reset"}, policy.Deny},                                   // another grant's
		{"vm_status", map[string]any{"vm": "lab/vm1"}, policy.Deny},                                                     // never used
	}
	for _, tt := range tests {
		if got := decide(tt.tool, tt.args); got != tt.want {
			t.Errorf("suggested policy on %s %v = %v; want %v", tt.tool, tt.args, got, tt.want)
		}
	}
	sum := e.Describe()
	// Calls are 7 s apart, an exec every other one: 5 execs and 9 calls
	// that ran fit in a minute.
	if l := sum.Tools["vm_agent_exec"].Limits; len(l) != 1 || l[0].Max != 10 || l[0].Window != time.Minute {
		t.Errorf("vm_agent_exec limits = %+v; want 10 a minute (peak 5 per minute × 2)", l)
	}
	if sum.AllTools[0].Max != 18 {
		t.Errorf("all_tools limit = %+v; want 18 a minute (peak 9 per minute × 2)", sum.AllTools)
	}
	if sum.Tools["vm_file_write"].Action != policy.Allow {
		t.Errorf("vm_file_write action = %v; want allow (3 calls are not rare: at most 2 are)", sum.Tools["vm_file_write"].Action)
	}
	if !slices.Contains(res.Notes, "vm_file_write: args.content: only its digest is logged: no condition on its value") {
		t.Errorf("notes = %q; want the one on the file content", res.Notes)
	}

}

// TestSuggestOnlyAllowed: with only the calls the policy in force
// allowed, what the shadow policy would have refused stays refused; a
// destructive tool within ApproveRare calls over days needs approval.
func TestSuggestOnlyAllowed(t *testing.T) {
	path := evidenceLog(t)
	o := Options{Grant: "ci", Defaults: testDefaults, Tools: testTools, OnlyAllowed: true, ApproveRare: 3}
	ev, err := collect(t, path, o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Suggest(ev, o)
	if err != nil {
		t.Fatal(err)
	}
	e, err := policy.Parse("suggested.json", res.Document)
	if err != nil {
		t.Fatal(err)
	}
	decide := func(tool string, args map[string]any) policy.Verdict {
		return e.Decide(policy.Call{Grant: "ci", Tool: tool, VM: "lab/vm1", Args: testDefaults(tool, args)}).Verdict
	}
	if got := decide("vm_file_write", map[string]any{"vm": "lab/vm1", "path": "/srv/ci/out.txt", "content": "x"}); got != policy.Deny {
		t.Errorf("OnlyAllowed: vm_file_write = %v; want deny (the shadow policy would have refused it)", got)
	}
	if got := decide("kill_process", map[string]any{"vm": "lab/vm1", "pid": 950.0}); got != policy.Approve {
		t.Errorf("ApproveRare 3: kill_process (3 calls) = %v; want approve", got)
	}
}

// TestSuggestShortEvidence: evidence of less than a day calls no tool rare.
func TestSuggestShortEvidence(t *testing.T) {
	t0 := time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC)
	ev := &Evidence{Grant: "g", First: t0, Last: t0.Add(time.Hour), Calls: []Call{
		{ID: "a", Time: t0, Tool: "kill_process", VM: "lab/vm1", Args: map[string]any{"pid": 100.0, "signal": "TERM"}, Decision: "allow"},
		{ID: "b", Time: t0.Add(time.Hour), Tool: "list_vms", Args: map[string]any{}, Decision: "allow"},
	}}
	res, err := Suggest(ev, Options{Tools: testTools})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := policy.Parse("s.json", res.Document)
	if d := e.Describe(); d.Tools["kill_process"].Action != policy.Allow {
		t.Errorf("kill_process after one hour of evidence: action %v; want allow", d.Tools["kill_process"].Action)
	}
	if _, err := Suggest(&Evidence{Grant: "g", Skipped: map[string]int{"parked for an approval": 2}}, Options{}); !errors.Is(err, ErrNoCalls) || !strings.Contains(err.Error(), "2 parked") {
		t.Errorf("Suggest(no calls) = %v; want ErrNoCalls saying what was left out", err)
	}
}
