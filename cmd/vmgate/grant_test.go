package main

import (
	"path/filepath"
	"slices"
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

// TestClientsFromConfig: without --grant, vmgate clients takes "local",
// else the config's first grant (rather than refusing a config without
// "local"); it says to export a grant's token only when a grant has one.
func TestClientsFromConfig(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("VMGATE_STATE_DIR", filepath.Join(dir, "state"))
	const hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	noTokens := writeFile(t, dir, "a.yaml", "grants:\n  - {name: alice, policy: builtin:default}\n  - {name: bob, policy: builtin:default}\nhttp: {addr: 127.0.0.1:9123}\n")
	withToken := writeFile(t, dir, "b.yaml", "grants:\n  - {name: alice, policy: builtin:default}\n  - {name: bob, policy: builtin:default, token_sha256: "+hash+"}\n")
	for _, tc := range []struct {
		args         []string
		want, refuse string
	}{
		{[]string{"clients", "--config", noTokens}, `--grant alice`, "<the grant's token>"},
		{[]string{"clients", "--config", noTokens}, `vmgate serve --http 127.0.0.1:9123` + "`" + "\n# refuses every request (401)", "--grant local"},
		{[]string{"clients", "--config", withToken, "--grant", "bob"}, `--grant bob`, "refuses every request"},
		{[]string{"clients", "--config", withToken}, `export VMGATE_TOKEN=<the grant's token>`, "refuses every request"},
		{[]string{"clients"}, `no grant has a token_sha256`, "<the grant's token>"},
	} {
		out, errOut, code := runVmgate(t, tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) || strings.Contains(out, tc.refuse) {
			t.Errorf("vmgate %s: code %d, stderr %q, stdout %q; want 0, %q and not %q", strings.Join(tc.args, " "), code, errOut, out, tc.want, tc.refuse)
		}
	}
}

// TestChildArgs: the stdio child of vmgate call is serve with the
// arguments after "--", with or without a leading "serve".
func TestChildArgs(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{nil, []string{"serve"}},
		{[]string{"--grant", "local"}, []string{"serve", "--grant", "local"}},
		{[]string{"serve", "--grant", "local"}, []string{"serve", "--grant", "local"}},
		{[]string{"--config", "serve"}, []string{"serve", "--config", "serve"}},
	} {
		if got := childArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("childArgs(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}
