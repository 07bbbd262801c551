package readmetest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/vmgate/vmgate/config"
	_ "github.com/vmgate/vmgate/plugins/libvirt" // the drivers README's backends name
	_ "github.com/vmgate/vmgate/plugins/proxmox"
	_ "github.com/vmgate/vmgate/plugins/qemu"
	_ "github.com/vmgate/vmgate/plugins/virtualbox"
)

// checkMakeTargets: each make target the block names exists (make -n).
func checkMakeTargets(t *testing.T, e *env, b block) []result {
	var rs []result
	for _, l := range b.lines() {
		f := strings.Fields(l)
		what := strings.Join(f[:2], " ") + " (dry run)"
		if r := e.sh(e.root, nil, "make -n "+f[1]); r.code != 0 {
			rs = append(rs, fail(what, "make -n %s: %v", f[1], r))
		} else {
			rs = append(rs, ok(what))
		}
	}
	return rs
}

// installTable is README's table of where each install method puts vmgate
// and its config.
type installRow struct{ vmgate, config string }

var installRowRE = regexp.MustCompile("(?m)^\\| (`make install`|the package) \\| `([^`]+)` \\| `([^`]+)` \\|$")

func installTable(t *testing.T) map[string]installRow {
	raw, err := os.ReadFile(readmePath(t))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]installRow{}
	for _, m := range installRowRE.FindAllStringSubmatch(string(raw), -1) {
		rows[strings.Trim(m[1], "`")] = installRow{m[2], m[3]}
	}
	return rows
}

// checkInstall: make install (into a DESTDIR and with a BIN of the
// test's: as written it would write this machine's /usr/local) lays out
// the paths README's table gives it, and the package (make deb needs nfpm
// from the module proxy; scripts/install-test.sh --deb builds, installs and
// removes it in CI) lists the paths the table gives it.
func checkInstall(t *testing.T, e *env, b block) []result {
	lines := b.lines()
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "make install") || !strings.HasPrefix(lines[1], "make deb") {
		return []result{fail("lines", "want make install, then make deb; got %q", lines)}
	}
	rows := installTable(t)
	var rs []result
	dest, r := e.install(t)
	if r.code != 0 {
		return []result{fail("line 1 (make install into a DESTDIR)", "%v", r)}
	}
	rs = append(rs, ok("line 1 (make install into a DESTDIR)"))
	mi, okRow := rows["make install"]
	switch {
	case !okRow:
		rs = append(rs, fail("make install's paths in README", "README's install table has no make install row"))
	default:
		what := "make install's paths in README"
		if _, err := os.Stat(filepath.Join(dest, mi.config)); err != nil {
			rs = append(rs, fail(what, "README says %s; make install made no such file: %v", mi.config, err))
		} else if r := e.sh("", nil, filepath.Join(dest, mi.vmgate)+" version"); r.code != 0 || !strings.HasPrefix(r.stdout, "vmgate ") {
			rs = append(rs, fail(what, "README says %s; that file in the DESTDIR: %v", mi.vmgate, r))
		} else {
			rs = append(rs, ok(what))
		}
	}
	pkg, okRow := rows["the package"]
	raw, err := os.ReadFile(filepath.Join(e.root, "packaging", "nfpm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var nfpm struct {
		Contents []struct{ Dst string } `yaml:"contents"`
	}
	if err := yaml.Unmarshal(raw, &nfpm); err != nil {
		t.Fatal(err)
	}
	dsts := map[string]bool{}
	for _, c := range nfpm.Contents {
		dsts[c.Dst] = true
	}
	if what := "line 2 (the package's paths in README; make deb needs nfpm from the module proxy)"; !okRow || !dsts[pkg.vmgate] || !dsts[pkg.config] {
		rs = append(rs, fail(what, "README's package row %+v (found %v); the package holds %v", pkg, okRow, dsts))
	} else {
		rs = append(rs, ok(what))
	}
	return rs
}

// checkToken: the lines make a token and print its SHA-256 as sha256sum
// does, the hex a grant's token_sha256 takes.
func checkToken(t *testing.T, e *env, b block) []result {
	token, hash := e.newToken(t)
	sum := sha256.Sum256([]byte(token))
	if hex.EncodeToString(sum[:]) != hash {
		return []result{fail("token and hash", "sha256sum printed %s for a token whose SHA-256 is %x", hash, sum)}
	}
	return []result{ok("token and hash")}
}

// argv is line's words as the shell splits them (a line is a command).
func (e *env) argv(t *testing.T, line string) []string {
	t.Helper()
	r := e.sh("", nil, `printf '%s\0' `+line)
	if r.code != 0 {
		t.Fatalf("splitting %q: %v", line, r)
	}
	return strings.Split(strings.TrimSuffix(r.stdout, "\x00"), "\x00")
}

// installedPath is the DESTDIR path of an installed file, and whether
// README's make install row names it (the client examples use those).
func (e *env) installedPath(t *testing.T, p string) (string, error) {
	dest, r := e.install(t)
	if r.code != 0 {
		return "", fmt.Errorf("make install: %v", r)
	}
	mi := installTable(t)["make install"]
	if p != mi.vmgate && p != mi.config {
		return "", fmt.Errorf("%s is not what README's install table says make install installs (%s, %s)", p, mi.vmgate, mi.config)
	}
	return filepath.Join(dest, p), nil
}

// checkStdio runs a client's stdio command (argv: vmgate serve …) as
// make install installs it: the installed vmgate, with the installed
// config (its state_dir moved into the test's directory), and lists the
// tools over MCP.
func (e *env) checkStdio(t *testing.T, what string, argv []string) result {
	bin, err := e.installedPath(t, argv[0])
	if err != nil {
		return fail(what, "%v", err)
	}
	args := slices.Clone(argv[1:])
	i := slices.Index(args, "--config")
	if i < 0 || i+1 >= len(args) {
		return fail(what, "%q has no --config", argv)
	}
	if _, err := e.installedPath(t, args[i+1]); err != nil {
		return fail(what, "%v", err)
	}
	args[i+1] = e.installedConfig(t, filepath.Join(e.dir, "stdio-state"), "")
	res, err := mcpStdio(e.command(e.dir, nil, bin, args...), map[string]any{"method": "tools/list"})
	if err != nil {
		return fail(what, "%s %q: %v", bin, args, err)
	}
	var list struct{ Tools []struct{ Name string } }
	if err := json.Unmarshal(res[0], &list); err != nil || len(list.Tools) == 0 {
		return fail(what, "tools/list = %s, %v; want the tools", res[0], err)
	}
	return ok(what)
}

// installedAddr is http.addr of the installed config: the unit serves
// there.
func (e *env) installedAddr(t *testing.T) string {
	raw, err := os.ReadFile(filepath.Join(e.root, "packaging", "vmgate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		HTTP struct{ Addr string } `yaml:"http"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil || c.HTTP.Addr == "" {
		t.Fatalf("packaging/vmgate.yaml http.addr: %v", err)
	}
	return c.HTTP.Addr
}

// checkEndpoint checks a client's HTTP URL and header: the URL is the
// installed unit's address, and the test's server at that path, sent the
// header with the token in place of the variable, initializes.
func (e *env) checkEndpoint(t *testing.T, what, rawURL, header string) result {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host != e.installedAddr(t) || u.Path != "/mcp" {
		return fail(what, "URL %q (%v); want http://%s/mcp, where the installed unit serves", rawURL, err, e.installedAddr(t))
	}
	srv := e.httpServer(t)
	name, value, found := strings.Cut(header, ":")
	if !found || name != "Authorization" {
		return fail(what, "header %q; want Authorization: Bearer …", header)
	}
	value = strings.TrimSpace(value)
	for _, v := range []string{"$VMGATE_TOKEN", "${VMGATE_TOKEN}", "${env:VMGATE_TOKEN}"} {
		value = strings.ReplaceAll(value, v, srv.token)
	}
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"readmetest","version":"1"}}}`
	req, _ := http.NewRequest("POST", srv.url, strings.NewReader(body))
	req.Header.Set("Authorization", value)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail(what, "POST %s: %v", srv.url, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fail(what, "initialize with header %q: HTTP %d; want 200", header, resp.StatusCode)
	}
	return ok(what)
}

// inspectorPin is the Inspector version README's text pins.
var inspectorPinRE = regexp.MustCompile(`@modelcontextprotocol/inspector@([0-9.]+)`)

// checkClientCommands: Claude Code's and the Inspector's command lines.
func checkClientCommands(t *testing.T, e *env, b block) []result {
	var rs []result
	for i, l := range b.lines() {
		what := fmt.Sprintf("line %d", i+1)
		argv := e.argv(t, l)
		if strings.Contains(l, "@modelcontextprotocol/inspector") {
			if m := inspectorPinRE.FindStringSubmatch(l); m == nil {
				rs = append(rs, fail(what+": Inspector pinned", "%q runs an unpinned Inspector", l))
				continue
			}
		}
		if j := slices.Index(argv, "--"); j >= 0 {
			rs = append(rs, e.checkStdio(t, what, argv[j+1:]))
			continue
		}
		rawURL, header := "", ""
		for k, a := range argv {
			if strings.HasPrefix(a, "http://") {
				rawURL = a
			}
			if a == "--header" && k+1 < len(argv) {
				header = argv[k+1]
			}
		}
		// The shell expanded $VMGATE_TOKEN to nothing: take the header as written.
		if m := regexp.MustCompile(`--header "([^"]*)"`).FindStringSubmatch(l); m != nil {
			header = m[1]
		}
		rs = append(rs, e.checkEndpoint(t, what, rawURL, header))
	}
	return rs
}

// clientJSON is a client configuration's one server.
func clientJSON(b block) (command string, args []string, err error) {
	var c struct {
		MCPServers map[string]struct {
			Command string   `json:"command"`
			Args    []string `json:"args"`
		} `json:"mcpServers"`
	}
	dec := json.NewDecoder(strings.NewReader(b.text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return "", nil, err
	}
	s, found := c.MCPServers["vmgate"]
	if !found || len(c.MCPServers) != 1 {
		return "", nil, fmt.Errorf("want one server, vmgate; got %v", c.MCPServers)
	}
	return s.Command, s.Args, nil
}

// checkDesktopStdio: the JSON parses, names the vmgate make install
// installs, and its args run it as a stdio server.
func checkDesktopStdio(t *testing.T, e *env, b block) []result {
	cmd, args, err := clientJSON(b)
	if err != nil {
		return []result{fail("parses", "%v", err)}
	}
	return []result{ok("parses"), e.checkStdio(t, "the command runs as installed", append([]string{cmd}, args...))}
}

// checkDesktopRemote: the JSON parses and mcp-remote's URL and header
// reach the installed unit's address with the token.
func checkDesktopRemote(t *testing.T, e *env, b block) []result {
	cmd, args, err := clientJSON(b)
	if err != nil {
		return []result{fail("parses", "%v", err)}
	}
	rs := []result{ok("parses")}
	i := slices.Index(args, "--header")
	if cmd != "npx" || !slices.Contains(args, "mcp-remote") || i < 0 || i+1 >= len(args) || len(args) < 3 {
		return append(rs, fail("mcp-remote's URL and header", "npx %q; want mcp-remote URL --header H", args))
	}
	return append(rs, e.checkEndpoint(t, "mcp-remote's URL and header", args[slices.Index(args, "mcp-remote")+1], args[i+1]))
}

// callResult is what vmgate call prints.
type callResult struct {
	StructuredContent map[string]any `json:"structuredContent"`
	IsError           bool           `json:"isError"`
	Text              string         `json:"text"`
}

// checkCallLines: the HTTP call (the token for "…", the test server's
// address for README's) runs uname in lab/vm1; the stdio line lists the
// lab's VMs.
func checkCallLines(t *testing.T, e *env, b block) []result {
	lines := b.lines()
	if len(lines) != 2 {
		return []result{fail("lines", "want 2 lines; got %q", lines)}
	}
	e.lab(t)
	srv := e.httpServer(t)
	u, _ := url.Parse(srv.url)
	line := strings.ReplaceAll(lines[0], "VMGATE_TOKEN=…", "VMGATE_TOKEN="+srv.token)
	line = strings.ReplaceAll(line, "127.0.0.1:8707", u.Host)
	var rs []result
	r := e.sh("", nil, line)
	var res callResult
	if err := json.Unmarshal([]byte(r.stdout), &res); r.code != 0 || err != nil || res.IsError || !strings.Contains(fmt.Sprint(res.StructuredContent["stdout"]), "Linux") {
		rs = append(rs, fail("line 1", "%v; want uname's Linux line", r))
	} else {
		rs = append(rs, ok("line 1"))
	}
	r = e.sh("", nil, lines[1])
	if err := json.Unmarshal([]byte(r.stdout), &res); r.code != 0 || err != nil || !strings.Contains(res.Text, "lab/vm1") {
		rs = append(rs, fail("line 2", "%v; want the lab VMs", r))
	} else {
		rs = append(rs, ok("line 2"))
	}
	return rs
}

// writeFile writes data to dir/name.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkPolicyDoc: the policy passes vmgate policy check --strict.
func checkPolicyDoc(t *testing.T, e *env, b block) []result {
	p := writeFile(t, t.TempDir(), "policy.json", b.text)
	if r := e.sh("", nil, "vmgate policy check --strict "+p); r.code != 0 {
		return []result{fail("policy check --strict", "%v", r)}
	}
	return []result{ok("policy check --strict")}
}

// policyCases is the cases file the block's policy test line names (README
// shows no cases file; these exercise README's first policy).
const policyCases = `[
 {"name": "read-only", "grant": "local", "tool": "list_vms", "expect": "allow"},
 {"name": "no shell", "grant": "local", "tool": "vm_agent_exec", "vm": "lab/vm1", "args": {"vm": "lab/vm1", "shell": "id"}, "expect": "deny"},
 {"name": "argv", "grant": "local", "tool": "vm_agent_exec", "vm": "lab/vm1", "args": {"vm": "lab/vm1", "command": ["id"]}, "expect": "allow"},
 {"name": "approval", "grant": "local", "tool": "destroy_session", "vm": "lab/vm1", "args": {"vm": "lab/vm1", "session": "s"}, "expect": "approve"},
 {"name": "no writes", "grant": "local", "tool": "vm_file_write", "vm": "lab/vm1", "args": {"vm": "lab/vm1", "path": "/tmp/x", "content": "x"}, "expect": "deny"}
]`

// checkPolicyCommands: each line runs on README's first policy as
// policy.json (and the cases above as cases.json) and exits 0.
func checkPolicyCommands(t *testing.T, e *env, b block) []result {
	dir := t.TempDir()
	writeFile(t, dir, "policy.json", e.block(t, "Policy #1").text)
	writeFile(t, dir, "cases.json", policyCases)
	var rs []result
	for i, l := range b.lines() {
		what := fmt.Sprintf("line %d", i+1)
		if r := e.sh(dir, nil, l); r.code != 0 || strings.TrimSpace(r.stdout+r.stderr) == "" && strings.Contains(l, "explain") {
			rs = append(rs, fail(what, "%s: %v", l, r))
		} else {
			rs = append(rs, ok(what))
		}
	}
	return rs
}

// loadStrict writes a config and loads it with config.Load.
func loadStrict(t *testing.T, dir, text string) error {
	p := writeFile(t, dir, "vmgate.yaml", text)
	_, err := config.Load(p, dir)
	return err
}

// checkFullConfig: the block loads as a whole config (state_dir moved into
// the test's directory, the policy file it names made from README's first
// policy); and vmgate serve --config serves HTTP on its http.addr.
func checkFullConfig(t *testing.T, e *env, b block) []result {
	dir := t.TempDir()
	writeFile(t, dir, "policies/ci.json", e.block(t, "Policy #1").text)
	text := mustReplace(t, b.text, "state_dir: /var/lib/vmgate", "state_dir: "+filepath.Join(dir, "state"))
	var rs []result
	if err := loadStrict(t, dir, text); err != nil {
		return append(rs, fail("config.Load", "%v", err))
	}
	rs = append(rs, ok("config.Load"))
	text = mustReplace(t, text, "addr: 127.0.0.1:8707", "addr: 127.0.0.1:0")
	p := writeFile(t, dir, "vmgate.yaml", text)
	if _, err := e.serve(t, nil, "--config", p); err != nil {
		rs = append(rs, fail("vmgate serve --config serves HTTP on http.addr", "%v", err))
	} else {
		rs = append(rs, ok("vmgate serve --config serves HTTP on http.addr"))
	}
	return rs
}

// checkConfigFragment: a fragment loads over a minimal config (grant
// local, and the lab backend for a templates fragment); the files it
// names relative to vmgate.yaml are made (empty secrets).
func checkConfigFragment(t *testing.T, e *env, b block) []result {
	dir := t.TempDir()
	var frag map[string]any
	if err := yaml.Unmarshal([]byte(b.text), &frag); err != nil {
		return []result{fail("config.Load", "YAML: %v", err)}
	}
	doc := map[string]any{"state_dir": filepath.Join(dir, "state"),
		"grants": []any{map[string]any{"name": "local", "policy": config.BuiltinPolicy}}}
	if _, has := frag["templates"]; has {
		doc["backends"] = []any{map[string]any{"name": "lab", "driver": "qemu", "settings": map[string]any{"lab": true}}}
	}
	for k, v := range frag {
		doc[k] = v
	}
	for _, f := range []string{"pve-token.secret", "pve-ca.pem", "vbox-guest.pw", "redis.password"} {
		if strings.Contains(b.text, f) {
			writeFile(t, dir, f, "secret\n")
		}
	}
	raw, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	// The merge keeps every key of the block: Load still refuses an
	// unknown or mistyped one.
	if err := loadStrict(t, dir, string(raw)); err != nil {
		return []result{fail("config.Load", "%v\n%s", err, raw)}
	}
	return []result{ok("config.Load")}
}

// checkLab: up, status, down as written (bin/vmgate is make build's);
// status lists both VMs running, and down leaves no QEMU of theirs.
func checkLab(t *testing.T, e *env, b block) []result {
	lines := b.lines()
	if len(lines) != 3 {
		return []result{fail("lines", "want up, status, down; got %q", lines)}
	}
	e.lab(t) // the QEMU rule; up is idempotent
	var rs []result
	if r := e.sh("", nil, lines[0]); r.code != 0 {
		return append(rs, fail("line 1", "%v", r))
	}
	rs = append(rs, ok("line 1"))
	r := e.sh("", nil, lines[1])
	pids := regexp.MustCompile(`(?m)^vm[12]\s+running\s+(\d+)\s`).FindAllStringSubmatch(r.stdout, -1)
	if r.code != 0 || len(pids) != 2 {
		return append(rs, fail("line 2", "%v; want vm1 and vm2 running", r))
	}
	rs = append(rs, ok("line 2"))
	if r := e.sh("", nil, lines[2]); r.code != 0 {
		return append(rs, fail("line 3", "%v", r))
	}
	e.mu.Lock()
	e.labUp = false
	e.mu.Unlock()
	for _, m := range pids {
		var pid int
		fmt.Sscan(m[1], &pid)
		if err := syscall.Kill(pid, 0); err == nil {
			if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); bytes.Contains(cmdline, []byte(e.state)) {
				return append(rs, fail("line 3", "QEMU pid %d still runs after lab down", pid))
			}
		}
	}
	return append(rs, ok("line 3"))
}

// checkVagrant: the packages line installed what it names (scripts/deps.sh
// does), vagrant validate runs on a copy of the Vagrantfile, and the
// Vagrantfile has the providers README names.
func checkVagrant(t *testing.T, e *env, b block) []result {
	lines := b.lines()
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "apt-get install") || lines[1] != "vagrant validate"+strings.TrimPrefix(lines[1], "vagrant validate") {
		return []result{fail("lines", "want apt-get install, vagrant validate, vagrant up; got %q", lines)}
	}
	var rs []result
	pkgs := strings.Fields(strings.SplitN(strings.TrimPrefix(lines[0], "apt-get install"), "#", 2)[0])
	if r := e.sh("", nil, "dpkg-query -W "+strings.Join(pkgs, " ")); r.code != 0 {
		rs = append(rs, fail("line 1 (the packages are installed)", "%v (scripts/deps.sh installs them)", r))
	} else {
		rs = append(rs, ok("line 1 (the packages are installed)"))
	}
	dir := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(e.root, "Vagrantfile"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "Vagrantfile", string(raw))
	cmd := strings.TrimSpace(strings.SplitN(lines[1], "#", 2)[0])
	if r := e.sh(dir, []string{"VAGRANT_HOME=" + filepath.Join(dir, ".vagrant.d")}, cmd); r.code != 0 || !strings.Contains(r.stdout, "validated successfully") {
		rs = append(rs, fail("line 2", "%v", r))
	} else {
		rs = append(rs, ok("line 2"))
	}
	what := "line 3 (the Vagrantfile has the providers README names)"
	for _, p := range []string{"libvirt", "virtualbox"} {
		if !bytes.Contains(raw, []byte("config.vm.provider :"+p)) {
			return append(rs, fail(what, "the Vagrantfile has no %s provider", p))
		}
	}
	if r := e.sh(e.root, nil, "make -n build"); r.code != 0 {
		return append(rs, fail(what, "make -n build: %v", r))
	}
	return append(rs, ok(what))
}

// checkSentinelConf: every line is a sentinel directive on the master the
// store block names.
func checkSentinelConf(t *testing.T, e *env, b block) []result {
	store := e.block(t, "Running several replicas #1")
	var c struct {
		Store struct {
			Sentinel struct{ Master string } `yaml:"sentinel"`
		} `yaml:"store"`
	}
	if err := yaml.Unmarshal([]byte(store.text), &c); err != nil || c.Store.Sentinel.Master == "" {
		return []result{fail("directives", "the store block has no sentinel.master: %v", err)}
	}
	known := []string{"monitor", "down-after-milliseconds", "failover-timeout", "auth-pass", "parallel-syncs"}
	for _, l := range b.lines() {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "sentinel" || !slices.Contains(known, f[1]) || f[2] != c.Store.Sentinel.Master {
			return []result{fail("directives", "%q: want sentinel <directive> %s …", l, c.Store.Sentinel.Master)}
		}
	}
	return []result{ok("directives")}
}

// toolsTableRE is README's tools table, and toolsRowRE one of its rows.
var (
	toolsTableRE = regexp.MustCompile("(?m)^\\| tool \\| arguments \\|\n\\|---\\|---\\|\n((?:\\|.*\\|\n)+)")
	toolsRowRE   = regexp.MustCompile("(?m)^\\| (`[a-z_]+`(?:, `[a-z_]+`)*) \\| (.+) \\|$")
)

// checkTools: every tool README's table names exists and takes the
// arguments the row names (in a row without ';' every tool takes every
// argument; with ';' each argument is some tool's); and the missing-file
// example is what vm_file_read answers.
func checkTools(t *testing.T, e *env) []result {
	raw, err := os.ReadFile(readmePath(t))
	if err != nil {
		t.Fatal(err)
	}
	res, err := mcpStdio(e.command(e.dir, []string{"VMGATE_STATE_DIR=" + filepath.Join(e.dir, "tools-state")}, filepath.Join(e.bin, "vmgate"), "serve"),
		map[string]any{"method": "tools/list"})
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var list struct {
		Tools []struct {
			Name        string
			InputSchema struct{ Properties map[string]any } `json:"inputSchema"`
		}
	}
	if err := json.Unmarshal(res[0], &list); err != nil {
		t.Fatal(err)
	}
	props := map[string]map[string]any{}
	for _, tl := range list.Tools {
		props[tl.Name] = tl.InputSchema.Properties
	}
	var rs []result
	table := toolsTableRE.FindStringSubmatch(string(raw))
	if table == nil {
		t.Fatal("README has no tools table (| tool | arguments |)")
	}
	rows := toolsRowRE.FindAllStringSubmatch(table[1], -1)
	if len(rows) < 10 {
		t.Fatalf("README's tools table: %d rows found", len(rows))
	}
	for _, row := range rows {
		tools := regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(row[1], -1)
		names := make([]string, len(tools))
		for i, m := range tools {
			names[i] = m[1]
		}
		what := strings.Join(names, ", ") + ": arguments"
		rs = append(rs, checkToolRow(what, names, row[2], props))
	}
	return append(rs, checkMissingFile(t, e, string(raw)))
}

// parenRE drops what parentheses hold (values, sub-fields, remarks).
var parenRE = regexp.MustCompile(`\([^()]*\)`)

func checkToolRow(what string, tools []string, args string, props map[string]map[string]any) result {
	for _, tool := range tools {
		if _, found := props[tool]; !found {
			return fail(what, "tools/list has no %s", tool)
		}
	}
	args = parenRE.ReplaceAllString(args, "")
	every := !strings.Contains(args, ";")
	for _, m := range regexp.MustCompile("`([a-z_]+)\\??`").FindAllStringSubmatch(args, -1) {
		arg := m[1]
		if _, isTool := props[arg]; isTool {
			continue // a tool the text mentions ("snapshot_list shows …")
		}
		var takers []string
		for _, tool := range tools {
			if _, takes := props[tool][arg]; takes {
				takers = append(takers, tool)
			}
		}
		switch {
		case every && len(takers) != len(tools):
			return fail(what, "README gives %v argument %q; only %v take it", tools, arg, takers)
		case len(takers) == 0:
			return fail(what, "README gives %v argument %q; none takes it", tools, arg)
		}
	}
	return ok(what)
}

// checkMissingFile: README's example of a guest's refusal (a file that is
// not there) is vm_file_read's answer for /nope on lab/vm1.
func checkMissingFile(t *testing.T, e *env, readme string) result {
	const what = "the missing-file example"
	m := regexp.MustCompile("`(\\[INVALID ARGUMENT\\] not found:[^`…]*)`").FindStringSubmatch(readme)
	if m == nil {
		return fail(what, "README has no [INVALID ARGUMENT] not found: example")
	}
	e.lab(t)
	srv := e.httpServer(t)
	r := e.sh("", []string{"VMGATE_TOKEN=" + srv.token}, `vmgate call vm_file_read --url `+srv.url+` --args '{"vm":"lab/vm1","path":"/nope"}'`)
	var res callResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Text != m[1] {
		return fail(what, "vm_file_read of /nope: %v; README says %q", r, m[1])
	}
	return ok(what)
}

// checkClientProse: on the embedded defaults (no grant has a token) serve
// --http says so and vmgate clients does not send one to export a
// grant's token; vmgate call beside a running server on the same state
// directory says what to do.
func checkClientProse(t *testing.T, e *env) []result {
	var rs []result
	state := filepath.Join(e.dir, "defaults-state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	extra := []string{"VMGATE_STATE_DIR=" + state}
	const noToken = "serve --http on embedded defaults says no grant has a token"
	if s, err := e.serve(t, extra, "--http", "127.0.0.1:0", "--in-process"); err != nil {
		rs = append(rs, fail(noToken, "%v", err))
	} else if log := s.stderr.String(); !regexp.MustCompile(`level=WARN.*token`).MatchString(log) {
		rs = append(rs, fail(noToken, "its log says nothing of it: %s", clip(log)))
	} else {
		rs = append(rs, ok(noToken))
	}
	const clients = "vmgate clients on embedded defaults"
	if r := e.sh("", extra, "vmgate clients"); r.code != 0 || strings.Contains(r.stdout, "<the grant's token>") {
		rs = append(rs, fail(clients, "%v: tells to export a token no grant has", r))
	} else {
		rs = append(rs, ok(clients))
	}
	const beside = "vmgate call beside a running server says what to do"
	srv := e.httpServer(t)
	cfg := filepath.Join(srv.state, "vmgate.yaml")
	r := e.sh("", nil, "vmgate call list_vms -- --config "+cfg+" --grant local")
	if r.code == 0 || !(strings.Contains(r.stderr, "--url") || strings.Contains(r.stderr, "another state directory")) {
		rs = append(rs, fail(beside, "%v; want a refusal naming --url or another state directory", r))
	} else {
		rs = append(rs, ok(beside))
	}
	return rs
}

// checkAuditVerify: `vmgate audit verify <state>/audit.log` verifies the
// HTTP server's log after the calls above.
func checkAuditVerify(t *testing.T, e *env) []result {
	const what = "vmgate audit verify <state>/audit.log"
	srv := e.httpServer(t)
	if r := e.sh("", nil, "vmgate audit verify "+filepath.Join(srv.state, "audit.log")); r.code != 0 {
		return []result{fail(what, "%v", r)}
	}
	return []result{ok(what)}
}
