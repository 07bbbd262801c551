package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
)

// approvedCallLog writes the records of one call an approval let through,
// as the server writes them: the first try parked (approve, its own call
// id), the operator's grant, the retry that consumed the approval, its
// outcome with the undo snapshot, the operator's undo of it, and an
// unrelated call of another grant two days earlier.
func approvedCallLog(t *testing.T, now time.Time) string {
	t.Helper()
	args := map[string]any{"vm": "lab/vm1", "command": []any{"rm", "-rf", "/srv/cache"}, "stdin": "password123"}
	recs := []audit.Record{
		{Time: now.Add(-48 * time.Hour), Kind: audit.KindDecision, CallID: "OLD1", Grant: "bob", Transport: "http", Tool: "list_vms", Decision: "allow"},
		{Time: now.Add(-10 * time.Minute), Kind: audit.KindDecision, CallID: "PARK1", Grant: "alice", Transport: "stdio", Tool: "vm_agent_exec", VM: "lab/vm1",
			Decision: "approve", Rule: "/tools/vm_agent_exec/action", Reason: "tool vm_agent_exec needs approval (operator)", ApprovalID: "APPR1", Args: args},
		{Time: now.Add(-9 * time.Minute), Kind: audit.KindDecision, CallID: "approval-APPR1", Grant: "alice", Transport: "operator", Tool: "vm_agent_exec",
			VM: "lab/vm1", Decision: "approval_granted", ApprovalID: "APPR1", Reason: "carol: cache cleanup is fine"},
		{Time: now.Add(-8 * time.Minute), Kind: audit.KindDecision, CallID: "CALL1", Grant: "alice", Transport: "stdio", Tool: "vm_agent_exec", VM: "lab/vm1",
			Decision: "approve", Rule: "/tools/vm_agent_exec/action", ApprovalID: "APPR1", Args: args},
		{Time: now.Add(-8 * time.Minute), Kind: audit.KindOutcome, CallID: "CALL1", Grant: "alice", Transport: "stdio", Tool: "vm_agent_exec", VM: "lab/vm1",
			Outcome: "ok", DurationMS: 812.5, Snapshot: "vmgate-undo-20260702T120000Z-CALL1"},
		{Time: now.Add(-time.Minute), Kind: audit.KindDecision, CallID: "undo-CALL1", Grant: "operator", Transport: "operator", Tool: "undo", VM: "lab/vm1", Decision: "allow"},
	}
	return writeAuditLog(t, recs)
}

// writeAuditLog writes recs to a new audit log, as the server would, and
// returns its path.
func writeAuditLog(t *testing.T, recs []audit.Record) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(path, audit.Options{Fsync: audit.FsyncInterval})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if _, err := l.Append(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestAuditSearchCommand(t *testing.T) {
	path := approvedCallLog(t, time.Now())
	tests := []struct {
		args []string
		want []string // call ids of the JSON lines, in order
	}{
		{[]string{"--grant", "alice"}, []string{"PARK1", "approval-APPR1", "CALL1", "CALL1"}},
		{[]string{"--grant", "alice", "--kind", "outcome"}, []string{"CALL1"}},
		{[]string{"--decision", "approval_granted"}, []string{"approval-APPR1"}},
		{[]string{"--approval", "APPR1", "--transport-is-not-a-flag"}, nil},
		{[]string{"--since", "1d"}, []string{"PARK1", "approval-APPR1", "CALL1", "CALL1", "undo-CALL1"}},
		{[]string{"--until", "1d"}, []string{"OLD1"}},
		{[]string{"--text", "/srv/cache", "--vm", "lab/vm1"}, []string{"PARK1", "CALL1"}},
		{[]string{"--text", "password123"}, nil},
	}
	for _, tt := range tests {
		out, errOut, code := runVmgate(t, append([]string{"audit", "search", path, "-o", "json"}, tt.args...)...)
		if strings.Contains(strings.Join(tt.args, " "), "not-a-flag") {
			if code == 0 || !strings.Contains(errOut, "unknown flag") {
				t.Errorf("search %v: code %d, stderr %q; want an unknown flag error", tt.args, code, errOut)
			}
			continue
		}
		if code != 0 {
			t.Fatalf("search %v: code %d, stderr %q", tt.args, code, errOut)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if line == "" {
				continue
			}
			var r audit.Record
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("search %v: line %q is not a record: %v", tt.args, line, err)
			}
			got = append(got, r.CallID)
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("search %v = %v; want %v", tt.args, got, tt.want)
		}
	}
	out, _, code := runVmgate(t, "audit", "search", path, "--count", "--tool", "vm_agent_exec")
	if code != 0 || out != "4\n" {
		t.Errorf("search --count --tool vm_agent_exec = %q (code %d); want 4 (the park, the operator's grant, the call's two)", out, code)
	}
	out, _, _ = runVmgate(t, "audit", "search", path, "--call", "CALL1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "TIME") || !strings.Contains(lines[2], "ok 812ms") || !strings.Contains(lines[2], "snapshot vmgate-undo-") {
		t.Errorf("search --call CALL1 (table) =\n%s\nwant a header and two rows, the outcome with its time and snapshot", out)
	}
	for _, bad := range [][]string{{"--since", "yesterday"}, {"--kind", "verdict"}, {"-o", "yaml"}, {"--since", "1h", "--until", "2h"}} {
		if _, errOut, code := runVmgate(t, append([]string{"audit", "search", path}, bad...)...); code == 0 || !strings.Contains(errOut, "audit search: ") {
			t.Errorf("search %v: code %d, stderr %q; want an error that says why", bad, code, errOut)
		}
	}
}

func TestAuditShowCommand(t *testing.T) {
	path := approvedCallLog(t, time.Now())
	out, errOut, code := runVmgate(t, "audit", "show", "CALL1", path)
	if code != 0 {
		t.Fatalf("show CALL1: code %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"call CALL1: grant alice, tool vm_agent_exec, vm lab/vm1, over stdio",
		"decision  ", "approve  /tools/vm_agent_exec/action", "approval APPR1",
		`"stdin":"sha256:`,
		"APPR1  approve: parked by call PARK1",
		"APPR1  approval_granted: decided by the operator", "reason   carol: cache cleanup is fine",
		"outcome   ", "ok  812.5 ms", "snapshot vmgate-undo-20260702T120000Z-CALL1 (undo: vmgate undo CALL1)",
		"undo decision", "allow",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show CALL1 =\n%s\nwant it to contain %q", out, want)
		}
	}
	if strings.Contains(out, "password123") {
		t.Errorf("show CALL1 printed the secret stdin:\n%s", out)
	}
	out, _, code = runVmgate(t, "audit", "show", "CALL1", path, "--json")
	var cr struct {
		CallID                  string `json:"call_id"`
		Records, Approval, Undo []audit.Record
	}
	if err := json.Unmarshal([]byte(out), &cr); code != 0 || err != nil || cr.CallID != "CALL1" || len(cr.Records) != 2 || len(cr.Approval) != 2 || len(cr.Undo) != 1 {
		t.Errorf("show --json = %s (code %d, %v); want 2 records, 2 of the approval, 1 undo", out, code, err)
	}
	_, errOut, code = runVmgate(t, "audit", "show", "NOPE", path)
	if code != 1 || !strings.Contains(errOut, "has no record of call NOPE") {
		t.Errorf("show NOPE: code %d, stderr %q; want 1 and no record", code, errOut)
	}
}

func TestAuditTailCommand(t *testing.T) {
	path := approvedCallLog(t, time.Now())
	out, errOut, code := runVmgate(t, "audit", "tail", path, "-n", "2", "-o", "json")
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r audit.Record
		if err := json.Unmarshal([]byte(line), &r); err == nil {
			ids = append(ids, r.CallID)
		}
	}
	if code != 0 || strings.Join(ids, ",") != "CALL1,undo-CALL1" {
		t.Errorf("tail -n 2 = %v (code %d, stderr %q); want CALL1's outcome and the undo", ids, code, errOut)
	}
	out, _, _ = runVmgate(t, "audit", "tail", path, "-n", "1", "--grant", "bob")
	if !strings.Contains(out, "OLD1") || strings.Count(out, "\n") != 2 {
		t.Errorf("tail -n 1 --grant bob =\n%s\nwant the header and OLD1", out)
	}
}

func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Time
		bad  bool
	}{
		{"", time.Time{}, false},
		{"7d", now.Add(-7 * 24 * time.Hour), false},
		{"1d12h", now.Add(-36 * time.Hour), false},
		{"90m", now.Add(-90 * time.Minute), false},
		{"2026-07-01T08:30:00Z", time.Date(2026, 7, 1, 8, 30, 0, 0, time.UTC), false},
		{"2026-07-01T10:30:00+02:00", time.Date(2026, 7, 1, 8, 30, 0, 0, time.UTC), false},
		{"2026-07-01", time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC), false},
		{"-5m", time.Time{}, true},
		{"7days", time.Time{}, true},
		{"xd", time.Time{}, true},
		{"yesterday", time.Time{}, true},
	}
	for _, tt := range tests {
		got, err := parseWhen("--since", tt.in, now)
		if (err != nil) != tt.bad || !got.Equal(tt.want) {
			t.Errorf("parseWhen(%q) = %v, %v; want %v (error: %v)", tt.in, got, err, tt.want, tt.bad)
		}
	}
}
