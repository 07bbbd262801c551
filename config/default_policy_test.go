package config

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
)

// TestDefaultPolicySandbox: the built-in policy gives create_session the
// tightest useful sandbox and denies a call that asks for more.
func TestDefaultPolicySandbox(t *testing.T) {
	e, err := policy.Parse("default_policy.json", DefaultPolicy())
	if err != nil {
		t.Fatalf("Parse(DefaultPolicy) = %v", err)
	}
	d := e.Decide(policy.Call{Grant: "local", Tool: policy.SandboxTool, VM: "lab/vm1", Args: map[string]any{}})
	want := &policy.Sandbox{Net: "none", User: "session", BestEffort: []string{"cgroup"}}
	if d.Verdict != policy.Allow || !reflect.DeepEqual(d.Sandbox, want) {
		t.Errorf("Decide(create_session) = %v, sandbox %+v; want allow with %+v", d.Verdict, d.Sandbox, want)
	}
	for _, sb := range []map[string]any{
		{"net": "loopback"},
		{"user": "root"},
		{"fs": map[string]any{"write": []any{"/tmp"}}},
		{"fs": map[string]any{"read": []any{"/root"}}},
		{"best_effort": []any{"landlock"}},
	} {
		d := e.Decide(policy.Call{Grant: "local", Tool: policy.SandboxTool, VM: "lab/vm1", Args: map[string]any{"sandbox": sb}})
		if d.Verdict != policy.Deny || !strings.HasPrefix(d.Reason, "sandbox ") || d.Rule != "/tools/create_session/sandbox" {
			t.Errorf("Decide(create_session, sandbox %v) = %v %q %q; want a sandbox deny", sb, d.Verdict, d.Rule, d.Reason)
		}
	}
}

// TestDefaultPolicySnapshots: the built-in policy lets an agent read a VM's
// snapshots, network and metrics, take snapshots at a limited rate, and
// revert or delete one only with an operator's approval.
func TestDefaultPolicySnapshots(t *testing.T) {
	e, err := policy.Parse("default_policy.json", DefaultPolicy())
	if err != nil {
		t.Fatalf("Parse(DefaultPolicy) = %v", err)
	}
	tests := []struct {
		tool    string
		want    policy.Verdict
		counter string // a counter the decision reserves, "" for none beyond all_calls
	}{
		{"snapshot_list", policy.Allow, ""},
		{"vm_network", policy.Allow, ""},
		{"vm_metrics", policy.Allow, ""},
		{"snapshot_create", policy.Allow, "snapshots_per_vm"},
		{"snapshot_revert", policy.Approve, ""},
		{"snapshot_delete", policy.Approve, ""},
		{"restore_session_files", policy.Allow, ""},
	}
	for _, tt := range tests {
		d := e.Decide(policy.Call{Grant: "local", Tool: tt.tool, VM: "lab/vm1", Args: map[string]any{"name": "s1"}})
		if d.Verdict != tt.want {
			t.Errorf("Decide(%s) = %v; want %v", tt.tool, d.Verdict, tt.want)
		}
		if tt.counter == "" {
			continue
		}
		if !reserves(d, tt.counter) {
			t.Errorf("Decide(%s) counters = %+v; want %s", tt.tool, d.Counters, tt.counter)
		}
	}
}

// TestDefaultPolicyKeepsFiles: a destroyed session's files stay in the
// guest's trash for a day.
func TestDefaultPolicyKeepsFiles(t *testing.T) {
	e, err := policy.Parse("default_policy.json", DefaultPolicy())
	if err != nil {
		t.Fatalf("Parse(DefaultPolicy) = %v", err)
	}
	if d := e.Decide(policy.Call{Grant: "local", Tool: "destroy_session", VM: "lab/vm1"}); d.KeepFiles != 24*time.Hour {
		t.Errorf("Decide(destroy_session).KeepFiles = %v; want 24h", d.KeepFiles)
	}
}

// TestDefaultPolicyScreen: the built-in policy lets an agent look at a
// VM's screen and console at a limited rate, and sends keys and console
// input (as strong as a command on a root console) to an operator.
func TestDefaultPolicyScreen(t *testing.T) {
	e, err := policy.Parse("default_policy.json", DefaultPolicy())
	if err != nil {
		t.Fatalf("Parse(DefaultPolicy) = %v", err)
	}
	tests := []struct {
		tool    string
		args    map[string]any
		want    policy.Verdict
		counter string
	}{
		{"vm_screenshot", map[string]any{}, policy.Allow, "screenshots_per_vm"},
		{"vm_console_read", map[string]any{"tail_bytes": 100.0}, policy.Allow, "console_reads_per_vm"},
		{"vm_send_keys", map[string]any{"keys": []any{"ctrl-alt-delete"}}, policy.Approve, ""},
		{"vm_send_keys", map[string]any{"text": "ls\n"}, policy.Approve, ""},
		{"vm_console_write", map[string]any{"text": "uname -a\n"}, policy.Approve, ""},
	}
	for _, tt := range tests {
		d := e.Decide(policy.Call{Grant: "local", Tool: tt.tool, VM: "lab/vm1", Args: tt.args})
		if d.Verdict != tt.want {
			t.Errorf("Decide(%s, %v) = %v; want %v", tt.tool, tt.args, d.Verdict, tt.want)
		}
		if d.Verdict == policy.Approve && (d.Approval == nil || d.Approval.Channel != "operator") {
			t.Errorf("Decide(%s) approval = %+v; want the operator's", tt.tool, d.Approval)
		}
		if tt.counter == "" {
			continue
		}
		if !reserves(d, tt.counter) {
			t.Errorf("Decide(%s) counters = %+v; want %s", tt.tool, d.Counters, tt.counter)
		}
	}
}

// reserves reports whether d reserves the counter name.
func reserves(d policy.Decision, name string) bool {
	for _, c := range d.Counters {
		if c.Name == name {
			return true
		}
	}
	return false
}

// TestSandboxedPolicy: builtin:sandboxed is the default policy but for
// vm_agent_exec, whose every command runs confined: in its session, or in
// the policy's sandbox (never as root) when it asks for none.
func TestSandboxedPolicy(t *testing.T) {
	file, doc, ok := Builtin(BuiltinSandboxed)
	if !ok || file != "sandboxed_policy.json" {
		t.Fatalf("Builtin(%q) = %q, ok %v; want sandboxed_policy.json", BuiltinSandboxed, file, ok)
	}
	e, err := policy.Parse(file, doc)
	if err != nil {
		t.Fatalf("Parse(%s) = %v", file, err)
	}
	def, err := policy.Parse("default_policy.json", DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(e.Tools(), def.Tools()) {
		t.Errorf("sandboxed policy's tools = %v; want the default's %v", e.Tools(), def.Tools())
	}
	// Every other rule is the default's: the two documents do not drift.
	var sandboxed, plain map[string]any
	if err := json.Unmarshal(doc, &sandboxed); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(DefaultPolicy(), &plain); err != nil {
		t.Fatal(err)
	}
	exec, _ := sandboxed["tools"].(map[string]any)[policy.ExecTool].(map[string]any)
	if _, ok := exec["sandbox"]; !ok {
		t.Errorf("sandboxed policy's %s has no sandbox block", policy.ExecTool)
	}
	delete(exec, "sandbox")
	if !reflect.DeepEqual(sandboxed, plain) {
		t.Errorf("sandboxed policy without %s's sandbox block differs from the default policy; want the same rules", policy.ExecTool)
	}
	want := &policy.Sandbox{Net: "none", User: "session", BestEffort: []string{"cgroup"}}
	d := e.Decide(policy.Call{Grant: "local", Tool: policy.ExecTool, VM: "lab/vm1", Args: map[string]any{"command": []any{"id"}}})
	if d.Verdict != policy.Allow || !reflect.DeepEqual(d.Sandbox, want) {
		t.Errorf("Decide(vm_agent_exec) = %v %q, sandbox %+v; want allow in %+v", d.Verdict, d.Reason, d.Sandbox, want)
	}
	d = e.Decide(policy.Call{Grant: "local", Tool: policy.ExecTool, VM: "lab/vm1", Args: map[string]any{"command": []any{"id"}, "sandbox": map[string]any{"user": "root"}}})
	if d.Verdict != policy.Deny || d.Rule != "/tools/vm_agent_exec/sandbox" {
		t.Errorf("Decide(vm_agent_exec as root) = %v %q %q; want a sandbox deny", d.Verdict, d.Rule, d.Reason)
	}
	d = def.Decide(policy.Call{Grant: "local", Tool: policy.ExecTool, VM: "lab/vm1", Args: map[string]any{"command": []any{"id"}}})
	if d.Verdict != policy.Allow || d.Sandbox != nil {
		t.Errorf("default policy: Decide(vm_agent_exec) = %v, sandbox %+v; want allow, unconfined", d.Verdict, d.Sandbox)
	}
	if _, _, ok := Builtin("builtin:other"); ok {
		t.Errorf("Builtin(builtin:other) ok; want only the two built-in policies")
	}
}
