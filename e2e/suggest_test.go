package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/config"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/replay"
	"github.com/vmgate/vmgate/server/tools"
)

// trialPolicy is a policy on trial in shadow mode (it decides and
// records, and lets every call through), with the built-in policy's
// rules; kill_process alone is enforced, since agent.test.mjs expects a
// HUP to be refused.
const trialPolicy = `{
  "version": "1",
  "default": "deny",
  "mode": "shadow",
  "tools": {
    "list_vms": {}, "vm_status": {}, "list_processes": {}, "list_sessions": {}, "vm_agent_exec_status": {}, "vm_file_read": {},
    "vm_agent_exec": { "limits": [ { "counter": "exec_per_vm", "window": "minute", "max": 60, "scope": ["grant", "vm"] } ] },
    "create_session": { "limits": [ { "counter": "sessions_per_vm", "window": "hour", "max": 30, "scope": ["grant", "vm"] } ] },
    "kill_process": {
      "mode": "enforce",
      "require": [ { "path": "args.signal", "op": "in", "value": ["TERM", "KILL"] } ],
      "limits": [ { "counter": "kill_process_rate", "window": "minute", "max": 10, "scope": "grant" } ]
    },
    "destroy_session": { "action": "approve" },
    "vm_power": { "action": "approve" },
    "vm_file_write": { "action": "deny", "reason": "file writes are disabled by the policy on trial" }
  }
}
`

// suggestConfig is a config with the one grant agent.test.mjs uses.
func suggestConfig(t *testing.T, dir, name, state, policyFile string, vm *lab.VM) string {
	t.Helper()
	cfg := fmt.Sprintf(`state_dir: %q
audit:
  fsync: always
limits:
  max_timeout_s: 600
grants:
  - name: agentside
    policy: %s
    vms: ["lab/*", "other/vm9"]
backends:
  - name: lab
    driver: qemu
    settings:
      vms:
        - {name: %s, qmp: %q, qga: %q}
  - name: other
    driver: qemu
    settings:
      vms:
        - {name: vm9, qmp: %q, qga: %q}
`, state, policyFile, vmName, vm.QMPSocket, vm.QGASocket, filepath.Join(dir, "nowhere", "qmp.sock"), filepath.Join(dir, "nowhere", "qga.sock"))
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func vmgateOut(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	t.Logf("$ vmgate %s\n%s%s", strings.Join(args, " "), out.String(), errOut.String())
	return out.String(), err
}

// TestNodeSDKSuggest is issue 35's done-when test: the official SDK's
// scenario (agent.test.mjs) runs under a policy on trial in shadow mode;
// `vmgate policy suggest` writes a policy from its audit log; that policy
// allows the same scenario when its calls are replayed and when it runs
// again for real in enforce mode (with `vmgate audit tail -f` following
// the log, every record once), denies at least 90% of the hostile
// corpus's tool calls that the built-in policy allows, and `vmgate policy
// diff` lists each difference from the policy on trial.
func TestNodeSDKSuggest(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	dir := t.TempDir()
	bin := buildVMGate(t, dir)
	trial := filepath.Join(dir, "trial.json")
	if err := os.WriteFile(trial, []byte(trialPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(cfg, state string) []string {
		// Both policies deny the tools they do not list, which are then
		// not in tools/list: agent.test.mjs checks the ones listed.
		return append(os.Environ(), "VMGATE_BIN="+bin, "VMGATE_E2E_CONFIG="+cfg, "VMGATE_E2E_STATE="+state,
			"VMGATE_E2E_VM=lab/"+vmName, "VMGATE_E2E_OTHER_VM=other/vm9", "VMGATE_E2E_TOOLS=subset")
	}

	// The scenario under the policy on trial.
	trialState := filepath.Join(dir, "trial-state")
	runNode(t, node, env(suggestConfig(t, dir, "trial.yaml", trialState, trial, vm), trialState), "agent.test.mjs")
	trialLog := filepath.Join(trialState, "audit.log")

	// One run of the scenario is all the evidence there is, and on a busy
	// machine it takes from ten seconds to minutes: limits per ten minutes
	// hold its calls however the second run's speed differs.
	suggested := filepath.Join(dir, "suggested.json")
	if _, err := vmgateOut(t, bin, "policy", "suggest", "--from", trialLog, "--grant", "agentside", "--window", "10m", "-o", suggested); err != nil {
		t.Fatalf("policy suggest: %v", err)
	}
	if out, err := vmgateOut(t, bin, "policy", "check", "--strict", suggested); err != nil || !strings.Contains(out, ": ok (") {
		t.Fatalf("policy check --strict of the suggestion = %v, %q; want ok", err, out)
	}
	doc, err := os.ReadFile(suggested)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("suggested policy:\n%s", doc)

	// Replayed: no call that went through is refused.
	out, err := vmgateOut(t, bin, "policy", "test", "--replay", trialLog, "--grant", "agentside", "--json", suggested)
	var res replay.Result
	if jerr := json.Unmarshal([]byte(out), &res); err != nil || jerr != nil || res.Replayed < 20 || res.Stopped != 0 {
		t.Fatalf("policy test --replay = %v (%v): %d replayed, %d that went through refused; want 20 or more, none refused", err, jerr, res.Replayed, res.Stopped)
	}
	if _, err := vmgateOut(t, bin, "policy", "test", "--replay", trialLog, "--grant", "agentside", suggested); err != nil {
		t.Errorf("policy test --replay (table): %v", err)
	}

	// Run for real under the suggested policy, tail -f following the log.
	realState := filepath.Join(dir, "real-state")
	realLog := filepath.Join(realState, "audit.log")
	if err := os.MkdirAll(realState, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(realLog, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tail := startAuditTail(t, bin, realLog)
	runNode(t, node, env(suggestConfig(t, dir, "real.yaml", realState, suggested, vm), realState), "agent.test.mjs")
	checkTailSawAll(t, tail, realLog)
	checkEnforced(t, realLog)

	checkHostile(t, doc)
	checkDiff(t, bin, trial, suggested)
}

// auditTail is `vmgate audit tail -f` running as a child, its lines kept.
type auditTail struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func startAuditTail(t *testing.T, bin, log string) *auditTail {
	t.Helper()
	a := &auditTail{done: make(chan struct{})}
	a.cmd = exec.Command(bin, "audit", "tail", "-f", "-n", "0", "--grant", "agentside", "-o", "json", log)
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	a.cmd.Stderr = os.Stderr
	stdout, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 2<<20)
		for sc.Scan() {
			a.mu.Lock()
			a.lines = append(a.lines, sc.Text())
			a.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		<-a.done
		_ = a.cmd.Wait()
	})
	return a
}

// checkTailSawAll waits until tail -f has printed as many records as the
// log holds of the grant, then checks they are the log's, once each, in
// order.
func checkTailSawAll(t *testing.T, a *auditTail, log string) {
	t.Helper()
	var want []string
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	_, err = audit.Search(f, audit.Filter{Grant: "agentside"}, func(m *audit.Match) error {
		want = append(want, string(m.Line))
		return nil
	})
	f.Close()
	if err != nil || len(want) < 40 {
		t.Fatalf("the log of the real run: %d records of agentside, %v; want 40 or more", len(want), err)
	}
	deadline := time.Now().Add(testload.Scale(time.Minute))
	for {
		a.mu.Lock()
		got := slices.Clone(a.lines)
		a.mu.Unlock()
		if len(got) >= len(want) || time.Now().After(deadline) {
			if !slices.Equal(got, want) {
				t.Errorf("vmgate audit tail -f printed %d lines; the log holds %d records of agentside: not the same, once each, in order", len(got), len(want))
			}
			return
		}
		select {
		case <-a.done:
			t.Fatalf("vmgate audit tail -f exited after %d of %d records", len(got), len(want))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// checkEnforced: the real run ran under the suggested policy in enforce
// mode: the kill with HUP was refused by its require, no decision was
// recorded in shadow mode, and nothing else was refused by it.
func checkEnforced(t *testing.T, log string) {
	t.Helper()
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var denied []string
	_, err = audit.Search(f, audit.Filter{Grant: "agentside", Kind: audit.KindDecision}, func(m *audit.Match) error {
		r := m.Record
		if r.Shadow {
			t.Errorf("decision %s in the real run was in shadow mode", r.CallID)
		}
		if r.Decision == "deny" || r.Decision == "rate_limited" || r.Decision == "approve" {
			denied = append(denied, fmt.Sprintf("%s %s %v by %s", r.Tool, r.Decision, r.Args, r.Rule))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(denied) != 1 || !strings.HasPrefix(denied[0], "kill_process deny") || !strings.Contains(denied[0], "signal:HUP") || !strings.Contains(denied[0], "by /tools/kill_process/require/") {
		t.Errorf("refused in the real run: %q; want only the kill with HUP, by the suggested require", denied)
	}
}

// hostileCall is a tools/call of the hostile corpus.
type hostileCall struct {
	name string
	call policy.Call
}

// hostileCalls reads the corpus's tool calls (testdata/hostile), each
// distinct call once (many cases are about the envelope or the transport
// and carry the same list_vms call), the lab VM the chaos tests use
// (lab/chaos1) replaced by this run's, so that a call is not refused
// merely for naming another VM.
func hostileCalls(t *testing.T) []hostileCall {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "testdata", "hostile", "*.json"))
	if err != nil || len(files) < 100 {
		t.Fatalf("hostile corpus: %d files, %v", len(files), err)
	}
	var out []hostileCall
	seen := map[string]bool{}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var c struct{ Name, Body string }
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		dec := json.NewDecoder(strings.NewReader(c.Body))
		dec.UseNumber()
		var msg struct {
			Method string
			Params struct {
				Name      string
				Arguments map[string]any
			}
		}
		if dec.Decode(&msg) != nil || msg.Method != "tools/call" || msg.Params.Name == "" {
			continue
		}
		args := msg.Params.Arguments
		if args == nil {
			args = map[string]any{}
		}
		if args["vm"] == "lab/chaos1" {
			args["vm"] = "lab/" + vmName
		}
		key, _ := json.Marshal([]any{msg.Params.Name, args})
		if seen[string(key)] {
			continue
		}
		seen[string(key)] = true
		vm, _ := args["vm"].(string)
		session, _ := args["session"].(string)
		out = append(out, hostileCall{name: c.Name, call: policy.Call{Grant: "agentside", Transport: "stdio", Tool: msg.Params.Name, VM: vm, Session: session,
			Args: tools.ArgsWithDefaults(msg.Params.Name, args)}})
	}
	return out
}

// checkHostile decides the corpus's tool calls offline: of those the
// built-in policy allows, the suggested one must deny 90% or more.
func checkHostile(t *testing.T, suggested []byte) {
	t.Helper()
	builtin, err := policy.Parse("default_policy.json", config.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	sug, err := policy.Parse("suggested.json", suggested)
	if err != nil {
		t.Fatal(err)
	}
	calls := hostileCalls(t)
	var allowed, denied, approve int
	var through []string
	for _, h := range calls {
		if builtin.Decide(h.call).Verdict != policy.Allow {
			continue
		}
		allowed++
		switch d := sug.Decide(h.call); d.Verdict {
		case policy.Deny:
			denied++
		case policy.Approve:
			approve++
			through = append(through, h.name+" (approve)")
		default:
			through = append(through, h.name)
		}
	}
	share := float64(denied) / float64(max(allowed, 1))
	t.Logf("hostile corpus: %d tool calls, %d allowed by the built-in policy; the suggested policy denies %d of them (%.1f%%), asks approval for %d; allowed: %s",
		len(calls), allowed, denied, 100*share, approve, strings.Join(through, ", "))
	if allowed < 50 || share < 0.9 {
		t.Errorf("the suggested policy denies %d of the %d hostile calls the built-in policy allows (%.1f%%); want 90%% or more", denied, allowed, 100*share)
	}
}

// checkDiff: `vmgate policy diff` lists every tool whose calls the two
// policies let through differently, and every condition and limit the
// suggestion adds.
func checkDiff(t *testing.T, bin, trial, suggested string) {
	t.Helper()
	out, err := vmgateOut(t, bin, "policy", "diff", trial, suggested)
	if err != nil {
		t.Fatalf("policy diff: %v", err)
	}
	oldE, err := policy.Parse("trial.json", []byte(trialPolicy))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(suggested)
	if err != nil {
		t.Fatal(err)
	}
	newE, err := policy.Parse("suggested.json", data)
	if err != nil {
		t.Fatal(err)
	}
	// A tool whose probe calls the two let through differently has a
	// section of its own, or is in the line of the tools neither lists.
	through := func(e *policy.Engine, c policy.Call) bool {
		d := e.Decide(c)
		return d.Shadow || d.Verdict == policy.Allow
	}
	differs := map[string]bool{}
	for _, h := range hostileCalls(t) {
		// A name that is no tool is refused before any policy decides.
		if !slices.Contains(tools.Names(), h.call.Tool) {
			continue
		}
		if through(oldE, h.call) != through(newE, h.call) {
			differs[h.call.Tool] = true
		}
	}
	for tool := range differs {
		if !strings.Contains(out, "\n"+tool+"\n") && !inUnlistedLine(out, tool) {
			t.Errorf("policy diff does not list %s, whose calls the two let through differently:\n%s", tool, out)
		}
	}
	condText := func(c policy.ConditionSummary) string {
		if c.Op == "exists" {
			return c.Path + " exists"
		}
		var v bytes.Buffer
		enc := json.NewEncoder(&v)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(c.Value)
		return c.Path + " " + c.Op + " " + strings.TrimSpace(v.String())
	}
	old := oldE.Describe()
	for name, rule := range newE.Describe().Tools {
		for _, c := range append(slices.Clone(rule.Require), rule.DenyIf...) {
			text := condText(c)
			oldRule, listed := old.Tools[name]
			if listed && slices.ContainsFunc(append(slices.Clone(oldRule.Require), oldRule.DenyIf...), func(o policy.ConditionSummary) bool { return condText(o) == text }) {
				continue
			}
			if !strings.Contains(out, text) {
				t.Errorf("policy diff does not mention %s's new condition %s", name, text)
			}
		}
		for _, l := range rule.Limits {
			if !strings.Contains(out, "(counter "+l.Counter+")") {
				t.Errorf("policy diff does not mention %s's new limit %s", name, l.Counter)
			}
		}
	}
}

// inUnlistedLine reports whether tool is in diff's line of the tools
// neither policy lists.
func inUnlistedLine(out, tool string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "tools neither lists (") && strings.Contains(line, tool) {
			return true
		}
	}
	return false
}
