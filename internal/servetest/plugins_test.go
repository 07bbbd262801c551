package servetest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

const execPolicy = `{"version": "1", "default": "deny", "tools": {"list_vms": {}, "vm_agent_exec": {}}}`

// execStdout is the stdout of a vm_agent_exec result.
func execStdout(t *testing.T, r toolResult) string {
	t.Helper()
	var sc struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal(r.StructuredContent, &sc); err != nil {
		t.Fatalf("vm_agent_exec structuredContent %s: %v", r.StructuredContent, err)
	}
	return sc.Stdout
}

// auditRecord is the part of an audit record the tests read.
type auditRecord struct {
	Kind     string `json:"kind"`
	CallID   string `json:"call_id"`
	Tool     string `json:"tool"`
	VM       string `json:"vm"`
	Decision string `json:"decision"`
	Outcome  string `json:"outcome"`
	Reason   string `json:"reason"`
}

func readAudit(t *testing.T, path string) []auditRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []auditRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r auditRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return recs
}

// waitConsole waits until the guest's console log at path holds mark.
func waitConsole(t *testing.T, path, mark string, within time.Duration) {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		if data, err := os.ReadFile(path); err == nil && bytes.Contains(data, []byte(mark)) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the guest's console (%s) did not show %q within %v: the command did not start", path, mark, within)
		case <-time.After(20 * time.Millisecond): // poll interval
		}
	}
}

// waitAllowed waits until the audit log at path holds n allowed decisions
// for tool. Lines are read as they are in the file: a record being written
// (no newline yet) is not counted.
func waitAllowed(t *testing.T, path, tool string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for line := range bytes.Lines(data) {
			var r auditRecord
			if bytes.HasSuffix(line, []byte("\n")) && json.Unmarshal(line, &r) == nil && r.Tool == tool && r.Decision == "allow" {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("allowed %s decisions in the audit log = %d after %v; want %d", tool, got, within, n)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

var metricsLine = regexp.MustCompile(`serving metrics" url=(http://127\.0\.0\.1:[0-9]+/metrics)`)

// metricsURLOf finds the metrics URL serve logged.
func metricsURLOf(t *testing.T, p *serveProc) string {
	t.Helper()
	m := metricsLine.FindStringSubmatch(p.stderr.String())
	if m == nil {
		t.Fatalf("vmgate serve logged no metrics URL:\n%s", p.stderr.String())
	}
	return m[1]
}

const restartsSeries = `vmgate_plugin_restarts_total{backend="lab"}`

// restartsMetric scrapes the lab backend's plugin restart count.
func restartsMetric(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d, %v", url, resp.StatusCode, err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), restartsSeries+" "); ok {
			return v
		}
	}
	t.Fatalf("GET %s: no %s in:\n%s", url, restartsSeries, body)
	return ""
}

// TestPluginKilledMidExec: `vmgate serve` over stdio with the lab backend
// as a qemu plugin. The plugin is SIGKILLed while `sleep 5` runs through
// it: that call fails as a backend error naming the exited driver, the next
// call works through a restarted plugin, the audit log holds both calls'
// decision and outcome records, and its chain verifies.
func TestPluginKilledMidExec(t *testing.T) {
	vm := labtest.VM(t, labVM)
	dir := t.TempDir()
	auditLog := filepath.Join(dir, "audit.log")
	policy := writeFile(t, dir, "policy.json", execPolicy)
	// The lab backend reads <state_dir>/lab/*/vm.json: state_dir is the lab's.
	labState := filepath.Dir(filepath.Dir(vm.Dir))
	cfg := writeFile(t, dir, "vmgate.yaml", fmt.Sprintf(`state_dir: %q
store: {type: bolt, path: %q}
audit: {path: %q}
metrics: {addr: "127.0.0.1:0"}
grants: [{name: local, policy: %q}]
backends: [{name: lab, driver: qemu, settings: {lab: true}}]
`, labState, filepath.Join(dir, "store.db"), auditLog, policy))

	p := startServe(t, cfg)
	p.initialize(t)
	id := "lab/" + labVM

	first := p.call(t, "vm_agent_exec", map[string]any{"vm": id, "command": []string{"echo", "before"}})
	if first.IsError || execStdout(t, first) != "before\n" {
		t.Fatalf("vm_agent_exec(echo before) = %+v; want stdout \"before\\n\"", first)
	}
	plugins := pluginChildren(t, p, 1)
	if argv := cmdline(plugins[0].pid); !slices.Equal(argv[len(argv)-2:], []string{"plugin", "qemu"}) {
		t.Fatalf("serve's child %d runs %q; want the qemu plugin (vmgate plugin qemu)", plugins[0].pid, argv)
	}
	metricsURL := metricsURLOf(t, p)
	if got := restartsMetric(t, metricsURL); got != "0" {
		t.Errorf("%s before the kill = %q; want 0", restartsSeries, got)
	}

	// The command says on the guest's console that it runs, then sleeps
	// 5 s: once the console shows its mark the call is in the plugin (the
	// decision record alone is written before dispatch, and a kill then,
	// on a loaded machine, came before the plugin had the call, which the
	// restarted plugin then ran).
	mark := "vmgate-midexec-" + rand.Text()
	inFlight := p.callAsync(t, "vm_agent_exec", map[string]any{"vm": id, "command": []string{"/bin/sh", "-c", "echo " + mark + " > /dev/console; exec sleep 5"}})
	waitAllowed(t, auditLog, "vm_agent_exec", 2, 30*time.Second)
	waitConsole(t, vm.SerialLog, mark, 30*time.Second)
	if err := syscall.Kill(plugins[0].pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", plugins[0].pid, err)
	}
	killed := p.result(t, inFlight, "vm_agent_exec(sleep 5) whose plugin was killed")
	if !killed.IsError || !strings.HasPrefix(killed.text(), "[BACKEND ERROR] driver qemu exited") {
		t.Errorf("vm_agent_exec(sleep 5) with its plugin killed = %+v; want [BACKEND ERROR] driver qemu exited", killed)
	}

	after := p.call(t, "vm_agent_exec", map[string]any{"vm": id, "command": []string{"echo", "after"}})
	if after.IsError || execStdout(t, after) != "after\n" {
		t.Fatalf("vm_agent_exec(echo after) after the plugin died = %+v; want stdout \"after\\n\" from a restarted plugin", after)
	}
	restarted := pluginChildren(t, p, 1)
	if restarted[0] == plugins[0] {
		t.Errorf("plugin after the kill = %v; want a new process", restarted[0])
	}
	if got := restartsMetric(t, metricsURL); got != "1" {
		t.Errorf("%s after the kill = %q; want 1", restartsSeries, got)
	}

	p.stop(t)
	waitGone(t, restarted, 5*time.Second)

	// Three exec calls: each a decision (allow) and an outcome; the killed
	// one's outcome is an error naming the driver that exited.
	recs := readAudit(t, auditLog)
	var decisions, outcomes []auditRecord
	for _, r := range recs {
		if r.Tool != "vm_agent_exec" {
			continue
		}
		switch r.Kind {
		case "decision":
			decisions = append(decisions, r)
		case "outcome":
			outcomes = append(outcomes, r)
		}
	}
	if len(decisions) != 3 || len(outcomes) != 3 {
		t.Fatalf("audit: %d decision and %d outcome records for vm_agent_exec; want 3 and 3: %+v", len(decisions), len(outcomes), recs)
	}
	for i, d := range decisions {
		if d.Decision != "allow" || d.VM != id || outcomes[i].CallID != d.CallID {
			t.Errorf("audit: decision %+v / outcome %+v; want allow on %s, linked by call id", d, outcomes[i], id)
		}
	}
	if o := outcomes[1]; o.Outcome != "error" || !strings.Contains(o.Reason, "driver qemu exited") {
		t.Errorf("audit: outcome of the killed call = %+v; want outcome error with reason containing \"driver qemu exited\"", o)
	}
	if outcomes[0].Outcome != "ok" || outcomes[2].Outcome != "ok" {
		t.Errorf("audit: outcomes = %q, %q around the kill; want ok, ok", outcomes[0].Outcome, outcomes[2].Outcome)
	}
	out, err := exec.Command(vmgateBinary(t), "audit", "verify", auditLog).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ok") {
		t.Errorf("vmgate audit verify = %v, %q; want ok", err, out)
	}
}

// TestServeKilledTakesItsPlugins: SIGKILL on `vmgate serve` leaves none of
// its plugin processes (a built-in one and an external one) running.
func TestServeKilledTakesItsPlugins(t *testing.T) {
	cfg := fakePluginConfig(t, `backends:
  - {name: lab, driver: qemu, settings: {lab: true}}
  - {name: ext, driver: fake, settings: {vms: [e1]}}
`)
	p := startServe(t, cfg)
	p.initialize(t)
	plugins := pluginChildren(t, p, 2)
	var names []string
	for _, c := range plugins {
		argv := cmdline(c.pid)
		names = append(names, filepath.Base(argv[0])+" "+strings.Join(argv[1:], " "))
	}
	slices.Sort(names)
	if want := []string{"vmgate plugin qemu", "vmgate-plugin-fake "}; !slices.Equal(names, want) {
		t.Fatalf("serve's children run %q; want %q", names, want)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	waitGone(t, plugins, 5*time.Second)
}

// TestExternalPluginServesListVMs: a driver from plugin_dir serves list_vms
// through serve, and a clean shutdown stops it.
func TestExternalPluginServesListVMs(t *testing.T) {
	cfg := fakePluginConfig(t, "backends: [{name: ext, driver: fake, settings: {vms: [e1, e2]}}]\n")
	p := startServe(t, cfg)
	p.initialize(t)
	r := p.call(t, "list_vms", map[string]any{})
	var sc struct {
		VMs []struct{ ID, State, Info string } `json:"vms"`
	}
	if err := json.Unmarshal(r.StructuredContent, &sc); err != nil || r.IsError {
		t.Fatalf("list_vms = %+v, %v", r, err)
	}
	var ids []string
	for _, v := range sc.VMs {
		ids = append(ids, v.ID+" "+v.State+" "+v.Info)
	}
	if want := []string{"ext/e1 running external fake", "ext/e2 running external fake"}; !slices.Equal(ids, want) {
		t.Errorf("list_vms = %q; want %q", ids, want)
	}
	plugins := pluginChildren(t, p, 1)
	p.stop(t)
	waitGone(t, plugins, 5*time.Second)
}

// TestServeRefusesBadBackends: bad settings stop serve at start with the
// setting's path; a plugin that cannot start (missing, wrong handshake,
// its driver refusing the settings) stops it with the backend's name.
func TestServeRefusesBadBackends(t *testing.T) {
	dir := t.TempDir()
	pluginDir := filepath.Join(dir, "plugins")
	if err := os.Mkdir(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	fakePlugin(t, pluginDir, "fake", "badcookie")
	// A plugin another user could change runs as the server: never.
	nobodys := filepath.Join(pluginDir, "vmgate-plugin-nobodys")
	b, err := os.ReadFile(fakeBuild.get(t, "fakeplugin", "../pluginhost/testdata/fakeplugin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nobodys, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(nobodys, 65534, 65534); err != nil {
		t.Fatalf("chown to nobody (the tests run as root): %v", err)
	}
	secret := writeFile(t, dir, "pve.secret", "s3cret\n")
	head := fmt.Sprintf("state_dir: %q\nplugin_dir: %q\ngrants: [{name: local, policy: builtin:default}]\n", filepath.Join(dir, "state"), pluginDir)
	// want is the message's start (after "vmgate: ") and what it says further on.
	tests := []struct{ name, backends, want, says string }{
		{"proxmox over http",
			"backends:\n  - {name: lab, driver: qemu, settings: {lab: true}}\n  - {name: pve, driver: proxmox, settings: {url: 'http://pve:8006', token_id: 'a@pve!tk', token_secret_file: s}}\n",
			"config: " + filepath.Join(dir, "vmgate-0.yaml") + ": ", `backends[1].settings.url: "http://pve:8006" must be https`},
		{"virtualbox unknown setting",
			"backends: [{name: vb, driver: virtualbox, settings: {username: u, password_file: p, password: hunter2}}]\n",
			"config: " + filepath.Join(dir, "vmgate-1.yaml") + ": ", "backends[0].settings.password: unknown setting"},
		{"qemu bad duration",
			"backends: [{name: lab, driver: qemu, settings: {lab: true, exec_timeout: forever}}]\n",
			"config: " + filepath.Join(dir, "vmgate-2.yaml") + ": ", `backends[0].settings.exec_timeout: time: invalid duration "forever"`},
		{"external settings not a mapping",
			"backends: [{name: ext, driver: fake, settings: [e1]}]\n",
			"config: " + filepath.Join(dir, "vmgate-3.yaml") + ": ", "backends[0].settings: want a mapping"},
		{"external plugin missing",
			"backends: [{name: ext, driver: nosuch}]\n",
			"serve: backend ext (driver nosuch): ", `unknown driver: "nosuch"`},
		{"external plugin with a wrong handshake",
			"backends: [{name: bad, driver: badcookie}]\n",
			"serve: backend bad (driver badcookie): ", "plugin handshake failed"},
		{"external plugin owned by nobody",
			"backends: [{name: ext, driver: nobodys}]\n",
			"serve: backend ext (driver nobodys): ", "untrusted plugin: plugin " + nobodys + " (owner uid 65534 (nobody), mode 0755) is owned by neither root nor vmgate's user"},
		{"external plugin refusing its settings",
			"backends: [{name: ext, driver: fake, settings: {vms: [a], surprise: 1}}]\n",
			"serve: backend ext (driver fake): ", `fakeplugin: config: invalid argument: json: unknown field "surprise"`},
		{"proxmox plugin refusing a missing secret file",
			fmt.Sprintf("backends: [{name: pve, driver: proxmox, settings: {url: 'https://pve:8006', token_id: 'a@pve!tk', token_secret_file: %q}}]\n", secret+".missing"),
			"serve: backend pve (driver proxmox): ", "proxmox: config: token secret file: open " + secret + ".missing"},
		{"virtualbox plugin without VBoxManage",
			fmt.Sprintf("backends: [{name: vb, driver: virtualbox, settings: {vboxmanage: no-such-vboxmanage, username: u, password_file: %q}}]\n", secret),
			"serve: backend vb (driver virtualbox): ", `virtualbox: config: vboxmanage: exec: "no-such-vboxmanage"`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := writeFile(t, dir, fmt.Sprintf("vmgate-%d.yaml", i), head+tt.backends)
			ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, vmgateBinary(t), "serve", "--config", cfg)
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			var stderr syncBuffer
			cmd.Stderr = &stderr
			// stdin is /dev/null: a serve that got as far as MCP would end at EOF with 0.
			err := cmd.Run()
			var ee *exec.ExitError
			msg := stderr.String()
			if i := strings.LastIndex(msg, "vmgate: "); i >= 0 {
				msg = msg[i+len("vmgate: "):] // the error main prints last
			}
			if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.HasPrefix(msg, tt.want) || !strings.Contains(msg, tt.says) {
				t.Errorf("vmgate serve with %s = %v, %q; want exit 1 and a message starting %q saying %q\nstderr:\n%s", tt.name, err, msg, tt.want, tt.says, stderr.String())
			}
		})
	}
}

// TestInProcess: with --in-process the built-in driver runs inside serve
// (no plugin process for it) while an external driver is still a plugin;
// both serve list_vms.
func TestInProcess(t *testing.T) {
	cfg := fakePluginConfig(t, `backends:
  - {name: lab, driver: qemu, settings: {lab: true}}
  - {name: ext, driver: fake, settings: {vms: [e1]}}
`)
	p := startServe(t, cfg, "--in-process")
	p.initialize(t)
	r := p.call(t, "list_vms", map[string]any{})
	if r.IsError || !strings.Contains(string(r.StructuredContent), `"ext/e1"`) {
		t.Errorf("list_vms with --in-process = %+v; want ext/e1", r)
	}
	plugins := pluginChildren(t, p, 1)
	if argv := cmdline(plugins[0].pid); filepath.Base(argv[0]) != "vmgate-plugin-fake" {
		t.Errorf("serve --in-process has child %q; want only the external plugin", argv)
	}
	p.stop(t)
	waitGone(t, plugins, 5*time.Second)
}

// fakePluginConfig writes a vmgate.yaml with a fresh state directory, a
// plugin directory holding the fake external driver "fake", grant local on
// the built-in policy, and backends (YAML, starting with "backends:").
func fakePluginConfig(t *testing.T, backends string) string {
	t.Helper()
	dir := t.TempDir()
	pluginDir := filepath.Join(dir, "plugins")
	if err := os.Mkdir(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	fakePlugin(t, pluginDir, "fake")
	return writeFile(t, dir, "vmgate.yaml", fmt.Sprintf(`state_dir: %q
plugin_dir: %q
grants: [{name: local, policy: builtin:default}]
`, filepath.Join(dir, "state"), pluginDir)+backends)
}
