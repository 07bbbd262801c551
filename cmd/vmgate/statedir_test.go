package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeRefusesAnOpenStateDir: vmgate serve does not start on a state
// directory other users can read or write (as an older vmgate lab up left
// it): it names the directory, its mode and the command that fixes it, and
// changes and creates nothing there. A private one passes (the run then
// stops at the unknown grant, before serving).
func TestServeRefusesAnOpenStateDir(t *testing.T) {
	for _, tt := range []struct {
		mode os.FileMode
		says string
	}{
		{0o755, "has mode 0755: other users can read it"},
		{0o750, "has mode 0750: other users can read it"},
		{0o777, "has mode 0777: other users can write it"},
		{0o700, ""},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			base := t.TempDir()
			state := filepath.Join(base, "state")
			if err := os.Mkdir(state, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(state, tt.mode); err != nil {
				t.Fatal(err)
			}
			cfg := writeFile(t, base, "vmgate.yaml", "state_dir: "+state+"\ngrants:\n  - {name: alice, policy: builtin:default}\n")
			_, errOut, code := runVmgate(t, "serve", "--config", cfg, "--grant", "carol")
			if tt.says == "" {
				if want := `--grant "carol" is not a grant`; code != 1 || !strings.Contains(errOut, want) {
					t.Fatalf("serve on a 0700 state directory: code %d, %q; want 1 and %q (past the check)", code, errOut, want)
				}
				return
			}
			for _, want := range []string{"serve: ", "state directory " + state + " " + tt.says, `run "chmod 0700 ` + state + `"`} {
				if code != 1 || !strings.Contains(errOut, want) {
					t.Errorf("serve on a %04o state directory: code %d, stderr %q; want 1 and %q", tt.mode, code, errOut, want)
				}
			}
			fi, err := os.Stat(state)
			if err != nil || fi.Mode().Perm() != tt.mode {
				t.Errorf("state directory after the refusal: %v, %v; want mode %04o, untouched", fi.Mode(), err, tt.mode)
			}
			if ents, err := os.ReadDir(state); err != nil || len(ents) != 0 {
				t.Errorf("state directory after the refusal holds %v (%v); want nothing created", ents, err)
			}
		})
	}
}
