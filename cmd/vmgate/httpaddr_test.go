package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/config"
)

// httpConfig writes a config whose only grant, ci, has a token, with
// http.addr addr, and returns its path.
func httpConfig(t *testing.T, addr string) string {
	t.Helper()
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VMGATE_STATE_DIR", state)
	return writeFile(t, dir, "my.yaml", "state_dir: "+state+"\nhttp:\n  addr: "+addr+"\ngrants:\n"+
		"  - {name: ci, policy: builtin:default, token_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}\n")
}

// TestServeHonoursHTTPAddr: `serve --config my.yaml` serves HTTP on the
// config's http.addr (here a non-loopback address without TLS, which is
// refused before it is bound: the refusal names it), not stdio as grant
// "local", which the config does not have.
func TestServeHonoursHTTPAddr(t *testing.T) {
	cfg := httpConfig(t, "192.0.2.1:8707")
	_, errOut, code := runVmgate(t, "serve", "--config", cfg)
	want := `refusing to serve plain HTTP on non-loopback "192.0.2.1:8707"`
	if code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("vmgate serve --config %s: code %d, stderr %q; want 1 and %q", cfg, code, errOut, want)
	}
}

// TestWarnNoTokens: serve --http warns at start when no grant has a
// token, naming what to do; not when one has.
func TestWarnNoTokens(t *testing.T) {
	for _, tc := range []struct {
		grants []config.Grant
		warn   bool
	}{
		{[]config.Grant{{Name: "local"}}, true},
		{[]config.Grant{{Name: "local"}, {Name: "ci", TokenSHA256: strings.Repeat("a", 64)}}, false},
	} {
		var b bytes.Buffer
		warnNoTokens(slog.New(slog.NewTextHandler(&b, nil)), &config.Config{Grants: tc.grants})
		got := b.String()
		if warned := strings.Contains(got, "level=WARN") && strings.Contains(got, "401") && strings.Contains(got, "token_sha256"); warned != tc.warn {
			t.Errorf("warnNoTokens(%+v) logged %q; want a warning naming 401 and token_sha256: %v", tc.grants, got, tc.warn)
		}
	}
}
