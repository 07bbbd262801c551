package policy

import (
	"strings"
	"testing"
)

var catalogueForTest = []string{"list_vms", "vm_status", "vm_agent_exec", "vm_agent_exec_status", "kill_process", "vm_file_read", "vm_file_write", "vm_power"}

func TestUnknownTools(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want []string // each warning as Error() renders it
	}{
		{"all known", `{"version":"1","default":"deny","hide":["vm_power"],"tools":{"list_vms":{},"vm_agent_exec":{}}}`, nil},
		{"transposed letters", "{\"version\":\"1\",\"default\":\"deny\",\n  \"tools\":{\"vm_agent_exce\":{}}}",
			[]string{`policy.json:2:12: tools.vm_agent_exce: unknown tool "vm_agent_exce": its rule never applies (did you mean "vm_agent_exec"?)`}},
		{"case", `{"version":"1","default":"deny","tools":{"List_VMs":{}}}`,
			[]string{`policy.json:1:42: tools.List_VMs: unknown tool "List_VMs": its rule never applies (did you mean "list_vms"?)`}},
		{"hidden typo", `{"version":"1","default":"allow","hide":["vm_powr"]}`,
			[]string{`policy.json:1:42: hide[0]: unknown tool "vm_powr": hiding it hides nothing (did you mean "vm_power"?)`}},
		{"nothing near", `{"version":"1","default":"deny","tools":{"rm_rf":{}}}`,
			[]string{`policy.json:1:42: tools.rm_rf: unknown tool "rm_rf": its rule never applies (the tools are ` + strings.Join(catalogueForTest, ", ") + `)`}},
		{"several in document order", `{"version":"1","default":"deny","hide":["a_tool"],"tools":{"list_vm":{},"kill_proces":{},"vm_status":{}}}`,
			[]string{
				`policy.json:1:41: hide[0]: unknown tool "a_tool": hiding it hides nothing (the tools are ` + strings.Join(catalogueForTest, ", ") + `)`,
				`policy.json:1:60: tools.list_vm: unknown tool "list_vm": its rule never applies (did you mean "list_vms"?)`,
				`policy.json:1:73: tools.kill_proces: unknown tool "kill_proces": its rule never applies (did you mean "kill_process"?)`,
			}},
	} {
		e := mustParse(t, tc.doc)
		got := e.UnknownTools(catalogueForTest)
		if len(got) != len(tc.want) {
			t.Errorf("%s: UnknownTools() = %v; want %d warnings %q", tc.name, got, len(tc.want), tc.want)
			continue
		}
		for i, w := range got {
			if w.Error() != tc.want[i] {
				t.Errorf("%s: UnknownTools()[%d] = %s; want %s", tc.name, i, w, tc.want[i])
			}
		}
	}
}

// TestUnknownToolsEngineStillWorks: an unknown name is a warning, not an
// error: the document parses and its other rules apply.
func TestUnknownToolsEngineStillWorks(t *testing.T) {
	e := mustParse(t, `{"version":"1","default":"deny","tools":{"vm_agent_exce":{},"list_vms":{}}}`)
	if d := e.Decide(Call{Grant: "g", Tool: "list_vms"}); d.Verdict != Allow {
		t.Errorf("Decide(list_vms) = %v; want allow", d.Verdict)
	}
	if d := e.Decide(Call{Grant: "g", Tool: "vm_agent_exec"}); d.Verdict != Deny || d.Rule != "/default" {
		t.Errorf("Decide(vm_agent_exec) = %v %s; want deny /default (the typo's rule does not apply)", d.Verdict, d.Rule)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		stop int
		want int
	}{
		{"vm_agent_exce", "vm_agent_exec", 9, 1},
		{"kill_proces", "kill_process", 9, 1},
		{"abc", "abc", 9, 0},
		{"", "abc", 9, 3},
		{"abc", "xyz", 9, 3},
		{"list_vms", "vm_file_write", 3, 3},
		{"a", "abcdefgh", 3, 3},
	} {
		if got := editDistance(tc.a, tc.b, tc.stop); got != tc.want {
			t.Errorf("editDistance(%q, %q, %d) = %d; want %d", tc.a, tc.b, tc.stop, got, tc.want)
		}
	}
}
