package main

import (
	"context"
	"testing"

	"github.com/vmgate/vmgate/policy"
)

// TestDecidersAgree checks that the two engines of row 3 implement the
// same rule, on the benchmark's call and on hostile ones.
func TestDecidersAgree(t *testing.T) {
	ctx := context.Background()
	d, err := newDeciders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	call := func(tool, vm string, args map[string]any) policy.Call {
		return policy.Call{Grant: "local", Transport: "stdio", Tool: tool, VM: vm, Args: args}
	}
	tests := []struct {
		name string
		c    policy.Call
		want bool
	}{
		{"benchmark call", benchKill(), true},
		{"KILL", call("kill_process", "lab/vm9", map[string]any{"pid": float64(2), "signal": "KILL"}), true},
		{"pid 1", call("kill_process", "lab/vm1", map[string]any{"pid": float64(1), "signal": "TERM"}), false},
		{"pid 0", call("kill_process", "lab/vm1", map[string]any{"pid": float64(0), "signal": "TERM"}), false},
		{"negative pid", call("kill_process", "lab/vm1", map[string]any{"pid": float64(-7), "signal": "TERM"}), false},
		{"pid 1.5", call("kill_process", "lab/vm1", map[string]any{"pid": 1.5, "signal": "TERM"}), false},
		{"pid as string", call("kill_process", "lab/vm1", map[string]any{"pid": "5", "signal": "TERM"}), false},
		{"pid missing", call("kill_process", "lab/vm1", map[string]any{"signal": "TERM"}), false},
		{"signal HUP", call("kill_process", "lab/vm1", map[string]any{"pid": float64(5), "signal": "HUP"}), false},
		{"signal lower case", call("kill_process", "lab/vm1", map[string]any{"pid": float64(5), "signal": "term"}), false},
		{"signal missing", call("kill_process", "lab/vm1", map[string]any{"pid": float64(5)}), false},
		{"signal as list", call("kill_process", "lab/vm1", map[string]any{"pid": float64(5), "signal": []any{"TERM"}}), false},
		{"other backend", call("kill_process", "pve/101", map[string]any{"pid": float64(5), "signal": "TERM"}), false},
		{"nested name", call("kill_process", "lab/a/b", map[string]any{"pid": float64(5), "signal": "TERM"}), false},
		{"prefix only", call("kill_process", "lab2/vm1", map[string]any{"pid": float64(5), "signal": "TERM"}), false},
		{"other tool", call("vm_agent_exec", "lab/vm1", map[string]any{"pid": float64(5), "signal": "TERM"}), false},
	}
	for _, tt := range tests {
		gotPolicy := d.vmgate(tt.c)
		gotOPA, err := d.rego(ctx, tt.c)
		if err != nil {
			t.Errorf("%s: opa(%+v) = %v", tt.name, tt.c, err)
			continue
		}
		if gotPolicy != tt.want || gotOPA != tt.want {
			t.Errorf("%s: Decide(%+v) allows %v, OPA allows %v; want %v", tt.name, tt.c, gotPolicy, gotOPA, tt.want)
		}
	}
}

func TestDecideRow(t *testing.T) {
	r := decideRow(context.Background(), 1, 5)
	if r.Err != nil {
		t.Fatalf("decideRow: %v", r.Err)
	}
	if _, err := r.Stats(); err != nil || len(r.A) != 5 {
		t.Errorf("decideRow has %d pairs, Stats() = %v; want 5 and nil", len(r.A), err)
	}
}
