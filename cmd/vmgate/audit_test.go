package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/policy/audit"
)

// TestAuditVerifyMissing: a log that is not there is named as missing (not
// blamed on its key), with the default log's path when there is one; a log
// without its key names the key; a good log verifies.
func TestAuditVerifyMissing(t *testing.T) {
	state := t.TempDir()
	t.Setenv("VMGATE_STATE_DIR", state)
	other := t.TempDir()

	_, errOut, code := runVmgate(t, "audit", "verify", filepath.Join(other, "missing.log"))
	want := "audit verify: there is no audit log at " + filepath.Join(other, "missing.log") + " (the log is audit.path in vmgate.yaml"
	if code != 1 || !strings.Contains(errOut, want) || strings.Contains(errOut, "key") {
		t.Errorf("verify missing.log: code %d, stderr %q; want 1 and %q, no word of a key", code, errOut, want)
	}

	logPath := filepath.Join(state, "audit.log")
	l, err := audit.Open(logPath, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(context.Background(), audit.Record{Kind: audit.KindDecision, CallID: "c1", Grant: "local", Tool: "list_vms", Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_, errOut, _ = runVmgate(t, "audit", "verify", filepath.Join(other, "missing.log"))
	if want := "(the default log is " + logPath + ")"; !strings.Contains(errOut, want) {
		t.Errorf("verify missing.log with a default log: stderr %q; want %q", errOut, want)
	}
	if out, errOut, code := runVmgate(t, "audit", "verify", logPath); code != 0 || !strings.HasPrefix(out, "ok: "+logPath+": 1 records") {
		t.Errorf("verify good log: code %d, stdout %q, stderr %q; want ok with 1 record", code, out, errOut)
	}
	_, errOut, code = runVmgate(t, "audit", "verify", state)
	if code != 1 || !strings.Contains(errOut, state+" is a directory") {
		t.Errorf("verify a directory: code %d, stderr %q; want 1 and 'is a directory'", code, errOut)
	}
	if err := os.Remove(filepath.Join(state, "audit.key")); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runVmgate(t, "audit", "verify", logPath)
	if want := "the log " + logPath + " is there but its key " + filepath.Join(state, "audit.key") + " is not"; code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("verify without key: code %d, stderr %q; want 1 and %q", code, errOut, want)
	}
}
