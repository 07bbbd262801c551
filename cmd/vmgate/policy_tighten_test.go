package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
)

// agentLog writes a few minutes of one grant's calls as the server logs
// them (arguments as sent: kill_process leaves signal out) under a shadow
// policy, and one call of another grant.
func agentLog(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(path, audit.Options{Fsync: audit.FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 7, 1, 9, 0, 0, 0, time.UTC)
	n := 0
	add := func(grant, tool, decision string, shadow bool, args map[string]any) {
		n++
		at = at.Add(5 * time.Second)
		id := fmt.Sprintf("CALL%02d", n)
		vm, _ := args["vm"].(string)
		for _, r := range []audit.Record{
			{Time: at, Kind: audit.KindDecision, CallID: id, Grant: grant, Transport: "stdio", Tool: tool, VM: vm, Decision: decision, Shadow: shadow, Args: args},
			{Time: at, Kind: audit.KindOutcome, CallID: id, Grant: grant, Transport: "stdio", Tool: tool, VM: vm, Outcome: "ok"},
		} {
			if _, err := l.Append(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
	}
	vm := "lab/vm1"
	add("agent", "list_vms", "allow", true, nil)
	for i := range 4 {
		add("agent", "vm_agent_exec", "allow", true, map[string]any{"vm": vm, "command": []any{"make", "-j2"}, "timeout_s": 120})
		add("agent", "vm_file_read", "allow", true, map[string]any{"vm": vm, "path": fmt.Sprintf("/srv/build/out-%d.log", 700+i)})
	}
	add("agent", "kill_process", "allow", true, map[string]any{"vm": vm, "pid": 4242})
	add("agent", "vm_file_write", "deny", true, map[string]any{"vm": vm, "path": "/srv/build/notes.txt", "content": "hello"})
	add("other", "vm_power", "allow", false, map[string]any{"vm": vm, "action": "stop"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

const shadowDoc = `{"version":"1","default":"deny","mode":"shadow","tools":{
  "list_vms":{},"vm_agent_exec":{"limits":[{"counter":"exec","window":"minute","max":60,"scope":["grant","vm"]}]},
  "vm_file_read":{},"kill_process":{},"vm_file_write":{"action":"deny","reason":"no writes"}}}`

func TestPolicySuggestDiffReplay(t *testing.T) {
	dir := t.TempDir()
	logPath := agentLog(t)
	suggested := filepath.Join(dir, "suggested.json")
	shadow := writeFile(t, dir, "shadow.json", shadowDoc)

	_, errOut, code := runVmgate(t, "policy", "suggest", "--from", logPath)
	if code != 1 || !strings.Contains(errOut, "the log holds the calls of several grants ([agent other])") {
		t.Errorf("suggest without --grant: code %d, stderr %q; want the grants to choose from", code, errOut)
	}
	_, errOut, code = runVmgate(t, "policy", "suggest", "--from", logPath, "--grant", "agent", "-o", suggested)
	if code != 0 || !strings.Contains(errOut, "wrote "+suggested+": 11 calls of grant agent") {
		t.Fatalf("suggest: code %d, stderr %q", code, errOut)
	}
	if !strings.Contains(errOut, "note: vm_file_write: args.content: only its digest is logged") {
		t.Errorf("suggest stderr = %q; want a note on the file content", errOut)
	}
	if out, errOut, code := runVmgate(t, "policy", "check", "--strict", suggested); code != 0 || !strings.Contains(out, "ok (5 tools") {
		t.Errorf("check --strict of the suggestion: code %d, %q %q; want ok with 5 tools", code, out, errOut)
	}

	out, errOut, code := runVmgate(t, "policy", "test", "--replay", logPath, "--grant", "agent", suggested)
	if code != 0 || !strings.Contains(out, "replayed 11 calls of "+logPath+" with "+suggested+": 1 decision(s) change; 0 calls that went through would be refused or parked, 0 refused calls would go through") {
		t.Errorf("replay of the suggestion: code %d, stdout %q, stderr %q; want 11 replayed, 1 change (the shadow denial now allowed), none refused", code, out, errOut)
	}
	if !strings.Contains(out, "deny (shadow), ran") || !strings.Contains(out, "allow, runs") {
		t.Errorf("replay table = %q; want the shadow denial of vm_file_write now allowed", out)
	}

	tight := writeFile(t, dir, "tight.json", `{"version":"1","default":"deny","tools":{"list_vms":{},"vm_agent_exec":{"require":[{"path":"args.timeout_s","op":"lte","value":60}]}}}`)
	out, errOut, code = runVmgate(t, "policy", "test", "--replay", logPath, "--grant", "agent", tight)
	if code != 1 || !strings.Contains(errOut, "would refuse 10 call(s) that went through") || !strings.Contains(out, "requirement not met: args.timeout_s lte 60") {
		t.Errorf("replay of a tighter policy: code %d, stdout %q, stderr %q; want exit 1 and the refused calls with why", code, out, errOut)
	}

	out, _, code = runVmgate(t, "policy", "diff", shadow, suggested)
	for _, want := range []string{
		"every tool\n  - mode: OLD is in shadow mode",
		"vm_file_write\n  ~ OLD runs it in shadow mode", // or "-": checked below
		"  + OLD denies every call (action deny: no writes); NEW allows it (under",
		"kill_process\n  - OLD runs it in shadow mode: every call goes through",
		"  - NEW requires args.pid gte 2121, OLD does not",
		"vm_agent_exec\n  - OLD runs it in shadow mode",
		"  - its calls: limit tightened from 60 a minute per grant and vm (counter exec) (OLD) to 8 a minute per grant (counter vm_agent_exec_rate) (NEW)",
		`  - NEW requires args.path glob "/srv/build/out-*.log", OLD does not`,
	} {
		if strings.HasPrefix(want, "vm_file_write\n  ~") {
			want = "vm_file_write\n  - OLD runs it in shadow mode"
		}
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("policy diff shadow suggested (code %d) =\n%s\nwant it to contain %q", code, out, want)
		}
	}
	if _, _, code := runVmgate(t, "policy", "diff", "--exit-code", suggested, suggested); code != 0 {
		t.Errorf("diff --exit-code of a policy with itself: code %d; want 0", code)
	}
	if out, _, code := runVmgate(t, "policy", "diff", "--exit-code", shadow, suggested); code != 1 || !strings.HasPrefix(out, "OLD "+shadow+"\nNEW "+suggested+"\n") {
		t.Errorf("diff --exit-code of different policies: code %d, %q; want 1", code, out)
	}
}
