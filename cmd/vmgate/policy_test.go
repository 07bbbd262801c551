package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/config"
)

const killPolicy = `{"version":"1","default":"deny","tools":{"kill_process":{"limits":[{"counter":"kill_process_rate","window":"minute","max":10,"scope":"grant"}]}}}`

// runVmgate runs the root command with args and returns stdout, stderr and the exit code.
func runVmgate(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err := root.Execute()
	var ec exitCoder
	switch {
	case err == nil:
	case errors.As(err, &ec):
		code = ec.ExitCode()
		errb.WriteString(err.Error())
	default:
		code = 1
		errb.WriteString(err.Error())
	}
	return out.String(), errb.String(), code
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyCheck(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.json", killPolicy)
	bad := writeFile(t, dir, "bad.json", "{\n  \"version\": \"1\",\n  \"default\": \"deny\",\n  \"tools\": {\"kill_process\": {\"limits\": [{\"counter\": \"k\", \"window\": \"minit\", \"max\": 1, \"scope\": \"grant\"}]}}\n}\n")
	huge := writeFile(t, dir, "huge.json", strings.Repeat(" ", 10<<20))

	out, errOut, code := runVmgate(t, "policy", "check", good)
	if code != 0 || !strings.HasPrefix(out, good+": ok") {
		t.Errorf("check good: code %d, stdout %q, stderr %q; want 0 and ok", code, out, errOut)
	}
	_, errOut, code = runVmgate(t, "policy", "check", good, bad, huge)
	for _, want := range []string{
		bad + `:4:68: tools.kill_process.limits[0].window: unknown window "minit"`,
		huge + ":1:1: document is 10485760 bytes; the limit is 1048576",
		"2 of 3 files have errors",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("check bad: stderr %q; want it to contain %q", errOut, want)
		}
	}
	if code != 1 {
		t.Errorf("check bad: exit code %d; want 1", code)
	}
}

func TestPolicyTestSlidingWindow(t *testing.T) {
	dir := t.TempDir()
	pol := writeFile(t, dir, "policy.json", killPolicy)
	cases := writeFile(t, dir, "cases.json", `[
	  {"name": "burst", "tool": "kill_process", "args": {"vm": "lab/vm1", "pid": 100}, "at": "0s", "repeat": 10, "every": "1s", "expect": "allow"},
	  {"name": "full at 59s", "tool": "kill_process", "at": "59s", "expect": "rate_limited", "expect_rule": "/tools/kill_process/limits/0"},
	  {"name": "another grant", "grant": "bob", "tool": "kill_process", "at": "59s", "expect": "allow"},
	  {"name": "first slot frees at 60s", "tool": "kill_process", "at": "60s", "expect": "allow", "expect_rule": "/tools/kill_process"},
	  {"name": "only one slot", "tool": "kill_process", "at": "60s", "expect": "rate_limited"},
	  {"name": "unlisted", "tool": "vm_power", "at": "60s", "expect": "deny", "expect_rule": "/default"}
	]`)
	out, errOut, code := runVmgate(t, "policy", "test", pol, cases)
	if code != 0 || !strings.Contains(out, "PASS: 15 calls") {
		t.Fatalf("policy test: code %d\nstdout:\n%s\nstderr:\n%s\nwant PASS: 15 calls", code, out, errOut)
	}

	// A wrong expectation stops the run with a diff.
	wrong := writeFile(t, dir, "wrong.json", `[
	  {"tool": "kill_process", "repeat": 10, "every": "1s", "expect": "allow"},
	  {"name": "too early", "tool": "kill_process", "at": "59s", "expect": "allow"},
	  {"tool": "kill_process", "at": "60s", "expect": "allow"}
	]`)
	out, errOut, code = runVmgate(t, "policy", "test", pol, wrong)
	for _, want := range []string{
		"FAIL case 2 (too early) at t=59s",
		"verdict: want allow",
		"got rate_limited",
		"/tools/kill_process/limits/0",
		"retry in 1s",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("policy test wrong: stderr %q; want it to contain %q", errOut, want)
		}
	}
	if code != 1 || strings.Contains(out, "t=1m0s") {
		t.Errorf("policy test wrong: code %d, stdout %q; want 1 and a stop at the first mismatch", code, out)
	}
}

func TestPolicyTestBadCases(t *testing.T) {
	dir := t.TempDir()
	pol := writeFile(t, dir, "policy.json", killPolicy)
	for _, tc := range []struct{ name, cases, want string }{
		{"unknown field", `[{"tool":"kill_process","expect":"allow","expected":"x"}]`, `unknown field "expected"`},
		{"bad expect", `[{"tool":"kill_process","expect":"ok"}]`, `expect is "ok"`},
		{"clock backwards", `[{"tool":"kill_process","at":"5s","expect":"allow"},{"tool":"kill_process","at":"1s","expect":"allow"}]`, "the clock only moves forward"},
		{"bad at", `[{"tool":"kill_process","at":"soon","expect":"allow"}]`, `at "soon" is not a duration`},
		{"no tool", `[{"expect":"allow"}]`, "tool is missing"},
		{"empty", `[]`, "no cases"},
		{"trailing", `[{"tool":"kill_process","expect":"allow"}] []`, "data after the list"},
	} {
		p := writeFile(t, dir, "cases.json", tc.cases)
		_, errOut, code := runVmgate(t, "policy", "test", pol, p)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: code %d, stderr %q; want 1 and %q", tc.name, code, errOut, tc.want)
		}
	}
}

func TestPolicyExplain(t *testing.T) {
	dir := t.TempDir()
	pol := writeFile(t, dir, "policy.json", `{"version":"1","default":"deny",
	  "all_tools":{"limits":[{"counter":"all","window":"minute","max":600,"scope":"grant"}]},
	  "tools":{"vm_agent_exec":{"require":[{"path":"args.session","op":"exists"}],"deny_if":[{"path":"args.shell","op":"exists"}],
	    "limits":[{"counter":"exec_per_vm","window":"minute","max":30,"scope":["grant","vm"]}]}}}`)
	out, errOut, code := runVmgate(t, "policy", "explain", "--policy", pol, "--tool", "vm_agent_exec", "--grant", "alice",
		"--args", `{"vm":"lab/vm1","session":"s1","command":["ls"]}`)
	if code != 0 {
		t.Fatalf("explain: code %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"decision: allow", "rule:     /tools/vm_agent_exec",
		"key exec_per_vm|grant=5:alice|vm=7:lab/vm1", "key all|grant=5:alice",
		"require[0]", "deny_if[0]", "args.shell exists: not fired",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain: stdout\n%s\nwant it to contain %q", out, want)
		}
	}
	out, _, _ = runVmgate(t, "policy", "explain", "--policy", pol, "--tool", "vm_agent_exec", "--args", `{"vm":"lab/vm1","session":"s1","shell":"rm -rf /"}`)
	if !strings.Contains(out, "decision: deny") || !strings.Contains(out, "rule:     /tools/vm_agent_exec/deny_if/0") {
		t.Errorf("explain shell: stdout\n%s\nwant deny at /tools/vm_agent_exec/deny_if/0", out)
	}
	for _, bad := range []string{`[1]`, `{"a":1} x`, `{`} {
		if _, errOut, code := runVmgate(t, "policy", "explain", "--policy", pol, "--tool", "t", "--args", bad); code != 1 || !strings.Contains(errOut, "--args") {
			t.Errorf("explain --args %s: code %d, stderr %q; want 1 and an --args error", bad, code, errOut)
		}
	}
	if _, _, code := runVmgate(t, "policy", "explain", "--tool", "t"); code != 1 {
		t.Errorf("explain without --policy: code %d; want 1", code)
	}
}

// TestPolicyCheckUnknownTool: a tool name that is no tool of the server is
// a warning naming the place and the likely tool; --strict makes it an
// error. The built-in policy names only real tools.
func TestPolicyCheckUnknownTool(t *testing.T) {
	dir := t.TempDir()
	typo := writeFile(t, dir, "typo.json", "{\"version\": \"1\", \"default\": \"deny\",\n \"tools\": {\"vm_agent_exce\": {}, \"list_vms\": {}}}\n")
	want := typo + `:2:12: tools.vm_agent_exce: warning: unknown tool "vm_agent_exce": its rule never applies (did you mean "vm_agent_exec"?)`

	out, errOut, code := runVmgate(t, "policy", "check", typo)
	if code != 0 || !strings.Contains(errOut, want) || !strings.HasPrefix(out, typo+": ok (2 tools, 1 warning,") {
		t.Errorf("check typo: code %d, stdout %q, stderr %q; want 0, ok with 1 warning, stderr with %q", code, out, errOut, want)
	}
	out, errOut, code = runVmgate(t, "policy", "check", "--strict", typo)
	wantStrict := strings.Replace(want, "warning:", "error:", 1)
	if code != 1 || !strings.Contains(errOut, wantStrict) || strings.Contains(out, "ok") {
		t.Errorf("check --strict typo: code %d, stdout %q, stderr %q; want 1 and %q", code, out, errOut, wantStrict)
	}
	builtin := writeFile(t, dir, "builtin.json", string(config.DefaultPolicy()))
	if out, errOut, code := runVmgate(t, "policy", "check", "--strict", builtin); code != 0 || errOut != "" {
		t.Errorf("check --strict (built-in policy): code %d, stdout %q, stderr %q; want 0 and no warning", code, out, errOut)
	}
}

// TestPolicyExplainSeesDefaults: explain decides as the server does, with
// the arguments' defaults filled in: a kill without signal is a TERM.
func TestPolicyExplainSeesDefaults(t *testing.T) {
	dir := t.TempDir()
	pol := writeFile(t, dir, "policy.json", `{"version":"1","default":"deny",
	  "tools":{"kill_process":{"require":[{"path":"args.signal","op":"in","value":["TERM","KILL"]}]}}}`)
	for _, c := range []struct{ args, want string }{
		{`{"vm":"lab/vm1","pid":42}`, "decision: allow"},
		{`{"vm":"lab/vm1","pid":42,"signal":"HUP"}`, "decision: deny"},
	} {
		out, errOut, code := runVmgate(t, "policy", "explain", "--policy", pol, "--tool", "kill_process", "--args", c.args)
		if code != 0 || !strings.Contains(out, c.want) {
			t.Errorf("explain kill_process %s: code %d, stdout\n%s\nstderr %q; want %q", c.args, code, out, errOut, c.want)
		}
	}
}
