package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

const vmName = "e2e"

func TestMain(m *testing.M) {
	if os.Getenv(ocrHelperEnv) != "" {
		os.Exit(ocrMain()) // the test binary as screen.test.mjs's OCR
	}
	os.Exit(labtest.Main(m, lab.Spec{Name: vmName}))
}

// e2ePolicy is the policy of every grant of the run: kill_process is
// limited in the PolicyLayer form, vm_file_read needs an operator's
// approval, vm_power is hidden, tools the policy does not name are not
// listed.
const e2ePolicy = `{
  "version": "1",
  "default": "deny",
  "hide": ["vm_power"],
  "tools": {
    "list_vms": {},
    "vm_status": {},
    "list_processes": {},
    "list_sessions": {},
    "create_session": {},
    "vm_agent_exec_status": {},
    "vm_agent_exec": {
      "limits": [ { "counter": "exec_per_vm", "window": "minute", "max": 200, "scope": ["grant", "vm"] } ]
    },
    "kill_process": {
      "limits": [ { "counter": "kill_process_rate", "window": "minute", "max": 10, "scope": "grant" } ]
    },
    "vm_file_read": { "action": "approve", "approval": { "channel": "operator", "ttl": "10m" } },
    "destroy_session": { "action": "approve" },
    "vm_file_write": { "action": "deny", "reason": "file writes are disabled in the e2e policy" }
  }
}
`

// gatedPolicy is the policy of the grant "gated" (approval.test.mjs):
// every command needs an operator's approval.
const gatedPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "vm_agent_exec": { "action": "approve", "approval": { "channel": "operator", "ttl": "10m" } }
  }
}
`

// elicitPolicy is the policy of the grant "elicit" (elicit.test.mjs):
// vm_status and commands need the approval of the client's user.
const elicitPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "vm_status": { "action": "approve", "approval": { "channel": "client", "ttl": "30s" } },
    "vm_agent_exec": { "action": "approve", "approval": { "channel": "client", "ttl": "30s" } }
  }
}
`

// agentPolicy is the policy of the grant "agentside" (agent.test.mjs):
// everything is allowed, and a kill must be a TERM or a KILL (which a kill
// that leaves signal out is: its default is TERM).
const agentPolicy = `{
  "version": "1",
  "default": "allow",
  "tools": {
    "kill_process": { "require": [ { "path": "args.signal", "op": "in", "value": ["TERM", "KILL"] } ] }
  }
}
`

// requireNode finds node and the installed SDK. Missing either skips the
// test, unless VMGATE_REQUIRE_VM is set (CI runs npm ci first): then it fails.
func requireNode(t *testing.T) string {
	t.Helper()
	miss := func(why string) {
		if v := os.Getenv(labtest.RequireEnv); v != "" {
			t.Fatalf("%s=%s but %s", labtest.RequireEnv, v, why)
		}
		t.Skipf("%s (set %s=1 to make this a failure)", why, labtest.RequireEnv)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		miss("node is not on PATH")
	}
	if _, err := os.Stat(filepath.Join("node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		miss("e2e/node_modules has no @modelcontextprotocol/sdk: run `npm ci --prefix e2e`")
	}
	return node
}

// TestNodeSDKEndToEnd runs the Node end-to-end tests (stdio.test.mjs,
// elicit.test.mjs, http.test.mjs, sandbox.test.mjs, approval.test.mjs)
// against a real lab VM.
func TestNodeSDKEndToEnd(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	dir := t.TempDir()
	bin := buildVMGate(t, dir)
	state := filepath.Join(dir, "state")
	token := rand.Text() + rand.Text()
	gatedToken, operatorToken := rand.Text()+rand.Text(), rand.Text()+rand.Text()
	cfgPath := writeConfig(t, dir, state, vm, token, gatedToken, operatorToken)

	// Sentinels: nothing the tests send may change them.
	sentinelFile := "/tmp/vmgate-e2e-sentinel"
	sentinelText := "sentinel " + rand.Text()
	out := guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("printf '%%s\\n' '%s' > %s && (sleep 3600 </dev/null >/dev/null 2>&1 & echo $!)", sentinelText, sentinelFile))
	sentinelPID, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || sentinelPID < 2 {
		t.Fatalf("sentinel process: guest printed %q", out)
	}

	env := append(os.Environ(),
		"VMGATE_BIN="+bin,
		"VMGATE_E2E_CONFIG="+cfgPath,
		"VMGATE_E2E_STATE="+state,
		"VMGATE_E2E_VM=lab/"+vmName,
		"VMGATE_E2E_OTHER_VM=other/vm9",
		"VMGATE_E2E_SENTINEL_FILE="+sentinelFile,
		"VMGATE_E2E_SENTINEL_TEXT="+sentinelText,
		"VMGATE_E2E_SENTINEL_PID="+strconv.Itoa(sentinelPID),
	)
	t.Run("stdio", func(t *testing.T) {
		runNode(t, node, env, "stdio.test.mjs")
	})
	t.Run("elicit", func(t *testing.T) {
		runNode(t, node, env, "elicit.test.mjs")
	})
	t.Run("agent", func(t *testing.T) {
		runNode(t, node, env, "agent.test.mjs")
	})
	t.Run("http", func(t *testing.T) {
		url, stop := startHTTPServer(t, bin, cfgPath)
		runNode(t, node, append(env, "VMGATE_E2E_URL="+url, "VMGATE_E2E_TOKEN="+token), "http.test.mjs")
		stop()
	})
	t.Run("sandbox", func(t *testing.T) {
		runNode(t, node, env, "sandbox.test.mjs")
	})
	t.Run("approval", func(t *testing.T) {
		testOperatorSeesStdin(t, vm, node, bin, cfgPath, env, gatedToken, operatorToken)
	})

	// The whole run's audit log verifies.
	verify := exec.Command(bin, "audit", "verify", filepath.Join(state, "audit.log"))
	if b, err := verify.CombinedOutput(); err != nil || !strings.HasPrefix(string(b), "ok") {
		t.Errorf("vmgate audit verify = %v, %q; want ok", err, b)
	}

	// The sentinels are unchanged.
	got := guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("cat %s; tr '\\0' ' ' < /proc/%d/cmdline", sentinelFile, sentinelPID))
	if want := sentinelText + "\nsleep 3600 "; got != want {
		t.Errorf("sentinels after the run = %q; want %q (file and sleeping process unchanged)", got, want)
	}
	guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("kill %d; rm -f %s", sentinelPID, sentinelFile))
}

// buildVMGate builds the vmgate binary into dir, with the amd64 build of
// vmgate-guest beside it (where the server finds it and pushes it into the
// lab guest: the process and session tools, kill_process included, run
// through it).
func buildVMGate(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "vmgate")
	for _, b := range []struct {
		args []string
		env  []string
	}{
		{[]string{"-o", bin, "github.com/vmgate/vmgate/cmd/vmgate"}, nil},
		{[]string{"-trimpath", "-ldflags=-s -w", "-o", filepath.Join(dir, "vmgate-guest-linux-amd64"), "github.com/vmgate/vmgate/cmd/vmgate-guest"},
			[]string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}},
	} {
		cmd := exec.Command("go", append([]string{"build"}, b.args...)...)
		cmd.Env = append(os.Environ(), b.env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", strings.Join(b.args, " "), err, out)
		}
	}
	return bin
}

func writeConfig(t *testing.T, dir, state string, vm *lab.VM, token, gatedToken, operatorToken string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "policy.json"), []byte(e2ePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gated.json"), []byte(gatedPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	hash := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	if err := os.WriteFile(filepath.Join(dir, "elicit.json"), []byte(elicitPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agentside.json"), []byte(agentPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(token))
	cfg := fmt.Sprintf(`state_dir: %q
audit:
  fsync: always
limits:
  max_timeout_s: 600
grants:
  - name: local
    policy: policy.json
    vms: ["lab/*"]
  - name: agent
    token_sha256: %s
    policy: policy.json
    vms: ["lab/*"]
  - name: elicit
    policy: elicit.json
    vms: ["lab/*"]
  - name: gated
    token_sha256: %s
    policy: gated.json
    vms: ["lab/*"]
  - name: other
    policy: policy.json
    vms: ["other/*"]
  - name: agentside
    policy: agentside.json
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
operator:
  token_sha256: %s
`, state, hex.EncodeToString(sum[:]), hash(gatedToken), vmName, vm.QMPSocket, vm.QGASocket,
		filepath.Join(dir, "nowhere", "qmp.sock"), filepath.Join(dir, "nowhere", "qga.sock"), hash(operatorToken))
	p := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// bearerConfig writes a config of one grant on the lab VM, reached over
// HTTP with a bearer token, under policy (written as GRANT.json), with its
// state in dir/state; it returns the config's path and the token.
func bearerConfig(t *testing.T, dir, grant, policy string, vm *lab.VM) (string, string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, grant+".json"), []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	token := rand.Text() + rand.Text()
	sum := sha256.Sum256([]byte(token))
	cfg := fmt.Sprintf(`state_dir: %q
audit:
  fsync: always
grants:
  - name: %s
    token_sha256: %s
    policy: %s.json
    vms: ["lab/*"]
backends:
  - name: lab
    driver: qemu
    settings:
      vms:
        - {name: %s, qmp: %q, qga: %q}
`, filepath.Join(dir, "state"), grant, hex.EncodeToString(sum[:]), grant, vmName, vm.QMPSocket, vm.QGASocket)
	p := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, token
}

// runNode runs one Node test file and fails t if it fails.
func runNode(t *testing.T, node string, env []string, file string) {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", file)
	// lib.mjs scales the scenario's deadlines by the same load factor.
	cmd.Env = append(env[:len(env):len(env)], fmt.Sprintf("VMGATE_TEST_LOAD_FACTOR=%.2f", testload.Factor()))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("node --test %s:\n%s", file, out.String())
	if err != nil {
		t.Fatalf("node --test %s: %v", file, err)
	}
	if !regexp.MustCompile(`(?m)^ℹ pass [1-9]`).Match(out.Bytes()) {
		t.Fatalf("node --test %s passed no test", file)
	}
	if regexp.MustCompile(`(?m)^ℹ skipped [1-9]`).Match(out.Bytes()) {
		t.Fatalf("node --test %s skipped tests", file)
	}
}

var urlLine = regexp.MustCompile(`url=(http://127\.0\.0\.1:[0-9]+/mcp)`)

// startHTTPServer runs `vmgate serve --http 127.0.0.1:0` and returns its
// URL and a stop function (SIGTERM, then wait); the test owns the process.
func startHTTPServer(t *testing.T, bin, cfgPath string) (string, func()) {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--config", cfgPath, "--http", "127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("vmgate serve --http: %v", err)
	}
	var (
		mu  sync.Mutex
		log strings.Builder
	)
	found := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			log.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := urlLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan error, 1)
			go func() { <-drained; done <- cmd.Wait() }()
			wait := testload.Scale(30 * time.Second)
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("vmgate serve --http exited with %v", err)
				}
			case <-time.After(wait):
				_ = cmd.Process.Kill()
				<-done
				t.Errorf("vmgate serve --http did not stop within %v of SIGTERM (30 s scaled by the machine's load)", wait)
			}
			mu.Lock()
			t.Logf("vmgate serve --http stderr:\n%s", log.String())
			mu.Unlock()
		})
	}
	t.Cleanup(stop)
	wait := testload.Scale(60 * time.Second)
	select {
	case u := <-found:
		return u, stop
	case <-time.After(wait):
		stop()
		t.Fatalf("vmgate serve --http printed no URL within %v (60 s scaled by the machine's load)", wait)
	}
	return "", stop
}

// guestRun runs argv in the guest through the agent directly (not through
// vmgate) and returns its stdout; a non-zero exit fails t.
func guestRun(t *testing.T, vm *lab.VM, argv ...string) string {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := qga.New(vm.QGASocket)
	defer c.Close()
	st, err := qga.Agent{Caller: c}.Exec(ctx, qga.ExecRequest{Path: argv[0], Args: argv[1:]})
	if err != nil {
		t.Fatalf("guest-exec %q: %v", argv, err)
	}
	if st.ExitCode != 0 || st.Signal != 0 || st.StdoutTruncated {
		t.Fatalf("guest-exec %q: exit %d (signal %d), output %q (truncated: %v)", argv, st.ExitCode, st.Signal, st.Stdout, st.StdoutTruncated)
	}
	return string(st.Stdout)
}

// testOperatorSeesStdin runs approval.test.mjs against `vmgate serve
// --http` and checks the guest afterwards: the script the operator
// approved (and saw) ran once, the one the agent swapped in never ran.
func testOperatorSeesStdin(t *testing.T, vm *lab.VM, node, bin, cfgPath string, env []string, gatedToken, operatorToken string) {
	approved, victim := "/tmp/vmgate-e2e-approved", "/tmp/vmgate-e2e-victim"
	mark := "approved-" + rand.Text()
	guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("rm -f %s; echo victim > %s", approved, victim))
	url, stop := startHTTPServer(t, bin, cfgPath)
	runNode(t, node, append(env, "VMGATE_E2E_URL="+url, "VMGATE_E2E_GATED_TOKEN="+gatedToken, "VMGATE_E2E_OPERATOR_TOKEN="+operatorToken,
		"VMGATE_E2E_APPROVED_FILE="+approved, "VMGATE_E2E_VICTIM_FILE="+victim, "VMGATE_E2E_MARK="+mark), "approval.test.mjs")
	stop()
	got := guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("cat %s; cat %s", approved, victim))
	if want := mark + "\nvictim\n"; got != want {
		t.Errorf("guest after the approval = %q; want %q (the approved script ran, the swapped one did not)", got, want)
	}
	guestRun(t, vm, "/bin/sh", "-c", fmt.Sprintf("rm -f %s %s", approved, victim))
}
