package policy

import (
	"strconv"
	"strings"
	"testing"
)

// twentyTools is a 20-tool policy; "exec" has conditions and, with
// all_tools, two limits.
func twentyTools() string {
	var b strings.Builder
	b.WriteString(`{"version":"1","default":"deny","hide":["vm_power"],
	"all_tools":{"limits":[{"counter":"all_calls","window":"minute","max":600,"scope":"grant"}]},
	"tools":{
	"exec":{"require":[{"path":"args.session","op":"exists"},{"path":"vm","op":"glob","value":"lab/*"},
	                   {"path":"args.timeout_s","op":"lte","value":600}],
	        "deny_if":[{"path":"args.shell","op":"exists"},{"path":"args.command.0","op":"regex","value":"^(rm|dd)$"},
	                   {"path":"args.cwd","op":"in","value":["/","/etc","/boot"]}],
	        "limits":[{"counter":"exec_per_vm","window":"minute","max":30,"scope":["grant","vm"]}]}`)
	for i := range 19 {
		b.WriteString(`,"tool_` + strconv.Itoa(i) + `":{"limits":[{"counter":"c` + strconv.Itoa(i) + `","window":"hour","max":100,"scope":"grant"}]}`)
	}
	b.WriteString(`}}`)
	return b.String()
}

func BenchmarkDecide(b *testing.B) {
	e := mustParse(b, twentyTools())
	call := Call{Grant: "local", Tool: "exec", VM: "lab/vm1", Session: "s-1234",
		Args: map[string]any{"vm": "lab/vm1", "session": "s-1234", "command": []any{"ls", "-l"}, "timeout_s": float64(30), "cwd": "/tmp"}}
	if d := e.Decide(call); d.Verdict != Allow || len(d.Counters) != 2 {
		b.Fatalf("Decide = %+v; want allow with 2 counters", d)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = e.Decide(call)
	}
}

// BenchmarkDecideBaseline is the floor to read BenchmarkDecide against: a
// map lookup and building the same two counter keys by concatenation.
func BenchmarkDecideBaseline(b *testing.B) {
	m := map[string]int{"exec": 1}
	call := Call{Grant: "local", Tool: "exec", VM: "lab/vm1"}
	b.ReportAllocs()
	var sink []Counter
	for b.Loop() {
		_ = m[call.Tool]
		sink = []Counter{
			{Key: "exec_per_vm|grant=" + strconv.Itoa(len(call.Grant)) + ":" + call.Grant + "|vm=" + strconv.Itoa(len(call.VM)) + ":" + call.VM},
			{Key: "all_calls|grant=" + strconv.Itoa(len(call.Grant)) + ":" + call.Grant},
		}
	}
	_ = sink
}
