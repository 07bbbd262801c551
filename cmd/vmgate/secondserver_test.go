package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/policy/audit"
)

// TestServeSecondServerOnStateDir: a second server on a state directory
// whose audit log another process holds is refused with what to do: talk
// to the running one with `vmgate call --url`, or use another state
// directory.
func TestServeSecondServerOnStateDir(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	t.Setenv("VMGATE_STATE_DIR", state)
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	held, err := audit.Open(config.Default(state).Audit.Path, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, args := range [][]string{{"serve"}, {"serve", "--http", "127.0.0.1:0"}} {
		_, errOut, code := runVmgate(t, args...)
		for _, want := range []string{"in use by another process", "another vmgate serve", "vmgate call --url", "another state directory", state} {
			if code != 1 || !strings.Contains(errOut, want) {
				t.Errorf("vmgate %s with the audit log held: code %d, stderr %q; want 1 and %q", strings.Join(args, " "), code, errOut, want)
			}
		}
	}
}
