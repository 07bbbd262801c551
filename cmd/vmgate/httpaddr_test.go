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

// TestServeTransport: which transport serve uses: --http, else stdio when
// --grant is given, else the config's http.addr, else stdio.
func TestServeTransport(t *testing.T) {
	for _, tc := range []struct {
		o        serveOptions
		httpAddr string
		want     string
	}{
		{serveOptions{grant: "local"}, "", ""},
		{serveOptions{grant: "local"}, "127.0.0.1:8707", "127.0.0.1:8707"},
		{serveOptions{grant: "local", grantSet: true}, "127.0.0.1:8707", ""},
		{serveOptions{grant: "local", httpAddr: "127.0.0.1:9"}, "127.0.0.1:8707", "127.0.0.1:9"},
		{serveOptions{grant: "local", grantSet: true, httpAddr: "127.0.0.1:9"}, "", "127.0.0.1:9"},
	} {
		cfg := &config.Config{HTTP: config.HTTP{Addr: tc.httpAddr}}
		if got := httpAddrOf(tc.o, cfg); got != tc.want {
			t.Errorf("httpAddrOf(%+v, http.addr %q) = %q; want %q", tc.o, tc.httpAddr, got, tc.want)
		}
	}
}

// TestClientsHonoursHTTPAddr: `clients --config my.yaml` prints the HTTP
// forms at the config's http.addr, and, as the config has no grant
// "local", says how to get the stdio forms instead of failing.
func TestClientsHonoursHTTPAddr(t *testing.T) {
	cfg := httpConfig(t, "127.0.0.1:9717")
	out, errOut, code := runVmgate(t, "clients", "--config", cfg)
	if code != 0 {
		t.Fatalf("vmgate clients --config %s: code %d, stderr %q; want 0", cfg, code, errOut)
	}
	for _, want := range []string{"http://127.0.0.1:9717/mcp", `--grant NAME`, `"ci"`, "vmgate serve --config " + cfg} {
		if !strings.Contains(out, want) {
			t.Errorf("vmgate clients --config %s: stdout lacks %q:\n%s", cfg, want, out)
		}
	}
	if strings.Contains(out, "--grant local") {
		t.Errorf("vmgate clients --config %s: stdout has stdio forms as grant local, which the config lacks:\n%s", cfg, out)
	}
	out, errOut, code = runVmgate(t, "clients", "--config", cfg, "--grant", "ci")
	if code != 0 || !strings.Contains(out, "--grant ci") {
		t.Errorf("vmgate clients --config %s --grant ci: code %d, stderr %q; want 0 and the stdio forms as ci:\n%s", cfg, code, errOut, out)
	}
}

// TestClientsSayHowToGiveAToken: clients says how a grant gets a token,
// and, when no grant has one, that HTTP refuses every request until one
// does.
func TestClientsSayHowToGiveAToken(t *testing.T) {
	t.Setenv("VMGATE_STATE_DIR", filepath.Join(t.TempDir(), "state"))
	out, errOut, code := runVmgate(t, "clients")
	if code != 0 {
		t.Fatalf("vmgate clients: code %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"no grant has a token", "token_sha256", "sha256sum", "--config"} {
		if !strings.Contains(out, want) {
			t.Errorf("vmgate clients: stdout lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = runVmgate(t, "clients", "--config", httpConfig(t, "127.0.0.1:9717"), "--grant", "ci")
	if strings.Contains(out, "no grant has a token") || !strings.Contains(out, "sha256sum") {
		t.Errorf("vmgate clients with a grant that has a token: want the how-to and no warning:\n%s", out)
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
		warnNoTokens(slog.New(slog.NewTextHandler(&b, nil)), &config.Config{Grants: tc.grants}, "")
		got := b.String()
		if warned := strings.Contains(got, "level=WARN") && strings.Contains(got, "401") && strings.Contains(got, "token_sha256"); warned != tc.warn {
			t.Errorf("warnNoTokens(%+v) logged %q; want a warning naming 401 and token_sha256: %v", tc.grants, got, tc.warn)
		}
	}
}
