package policy

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func mustParseFile(t testing.TB, name string) *Engine {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	e, err := Parse(name, data)
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return e
}

func mustParse(t testing.TB, doc string) *Engine {
	t.Helper()
	e, err := Parse("policy.json", []byte(doc))
	if err != nil {
		t.Fatalf("Parse(%s): %v", doc, err)
	}
	return e
}

func TestPolicyLayerDocumentsLoadUnchanged(t *testing.T) {
	for _, tc := range []struct {
		file, tool, counter string
	}{
		{"policylayer_kill_process.json", "kill_process", "kill_process_rate"},
		{"policylayer_vm_agent_exec.json", "vm_agent_exec", "vm_agent_exec_rate"},
	} {
		e := mustParseFile(t, tc.file)
		d := e.Decide(Call{Grant: "alice", Tool: tc.tool, VM: "lab/vm1"})
		want := Decision{Verdict: Allow, Rule: "/tools/" + tc.tool, Counters: []Counter{{
			Key: tc.counter + "|grant=5:alice", Name: tc.counter, Window: time.Minute, Max: 10, Rule: "/tools/" + tc.tool + "/limits/0",
		}}}
		if !reflect.DeepEqual(d, want) {
			t.Errorf("%s: Decide = %+v; want %+v", tc.file, d, want)
		}
		if d := e.Decide(Call{Grant: "alice", Tool: "vm_power"}); d.Verdict != Deny || d.Rule != "/default" {
			t.Errorf("%s: Decide(vm_power) = %v %s; want deny /default", tc.file, d.Verdict, d.Rule)
		}
		if got := e.Tools(); !reflect.DeepEqual(got, []string{tc.tool}) {
			t.Errorf("%s: Tools() = %v; want [%s]", tc.file, got, tc.tool)
		}
	}
}

// TestCounterLabel: a counter's key in words, for people; a key that is
// not one of the engine's stays as it is.
func TestCounterLabel(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"all_calls", "all_calls"},
		{"all_calls|grant=5:agent", "all_calls (grant agent)"},
		{"exec_per_vm|grant=5:alice|vm=7:lab/vm1", "exec_per_vm (grant alice, vm lab/vm1)"},
		{"s|session=0:", `s (session "")`},
		{"odd|vm=3:a|b|grant=1:x", "odd (vm a|b, grant x)"},
		{"bad|grant=9:short", "bad|grant=9:short"},
		{"bad|grant=x:y", "bad|grant=x:y"},
		{"bad|color=1:x", "bad|color=1:x"},
	} {
		if got := CounterLabel(tc.key); got != tc.want {
			t.Errorf("CounterLabel(%q) = %q; want %q", tc.key, got, tc.want)
		}
	}
}
