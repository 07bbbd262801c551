package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestServeUnknownGrant: --grant naming no grant is refused with the
// grants there are, before anything is opened or started.
func TestServeUnknownGrant(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state") // serve makes it 0700 (t.TempDir is 0755: refused)
	t.Setenv("VMGATE_STATE_DIR", state)
	cfg := writeFile(t, dir, "vmgate.yaml", "state_dir: "+state+"\ngrants:\n  - {name: alice, policy: builtin:default}\n  - {name: bob, policy: builtin:default}\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--config", cfg, "--grant", "carol"}, `serve: --grant "carol" is not a grant of the config ` + cfg + `; its grants: "alice", "bob"`},
		{[]string{"serve", "--grant", "carol"}, `serve: --grant "carol" is not a grant of the embedded defaults (no --config); its grants: "local"`},
		{[]string{"clients", "--config", cfg, "--grant", "carol"}, `clients: --grant "carol" is not a grant of the config ` + cfg + `; its grants: "alice", "bob"`},
	} {
		_, errOut, code := runVmgate(t, tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("vmgate %s: code %d, stderr %q; want 1 and %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
}
