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
