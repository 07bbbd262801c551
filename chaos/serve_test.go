package chaos

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/plugins/qemu"
)

// grantSpec is one grant of a generated config.
type grantSpec struct {
	name   string
	token  string // "" for a stdio-only grant
	policy string // the policy document
	vms    []string
	// requestsPerMinute overrides the HTTP request budget for this grant.
	requestsPerMinute int
}

// setup is a generated vmgate.yaml and where it keeps its state.
type setup struct {
	dir      string // holds vmgate.yaml and the policy files
	state    string // state_dir
	auditLog string // the audit log (default <state>/audit.log)
	cfg      string // the config file
}

// configOpts are the knobs of writeConfig.
type configOpts struct {
	store    string // "" (bolt), "memory" or "redis"
	redisURL string
	prefix   string
	// sentinel, with store "redis" and no redisURL, is the store's
	// sentinel section (YAML flow mapping).
	sentinel string
	auditDir string // "" : the state directory
	grants   []grantSpec
	vms      []*lab.VM
	metrics  bool   // serve /metrics on a loopback port of its own (metrics.addr)
	replica  string // metrics.replica, with metrics
	// operatorToken, when set, opens /ui to the operator.
	operatorToken string
	// http is the config's http section (YAML flow mapping); empty: a
	// request budget far above the default, since the campaign's load is
	// far above an agent's (the budget and the session caps have their
	// own test, TestInitializeFlood).
	http string
	// labDir, when set, lets backend "lab" make VMs there (lab_dir);
	// templates is the config's templates section (YAML), if any.
	labDir, templates string
}

// writeConfig writes a config for the lab VMs in o.vms (as backend "lab")
// and the grants in o.grants.
func writeConfig(t *testing.T, o configOpts) setup {
	t.Helper()
	dir := t.TempDir()
	s := setup{dir: dir, state: filepath.Join(dir, "state"), cfg: filepath.Join(dir, "vmgate.yaml")}
	var b strings.Builder
	fmt.Fprintf(&b, "state_dir: %q\n", s.state)
	switch o.store {
	case "redis":
		where := fmt.Sprintf("url: %q", o.redisURL)
		if o.sentinel != "" {
			where = "sentinel: " + o.sentinel
		}
		fmt.Fprintf(&b, "store:\n  type: redis\n  %s\n  prefix: %q\n", where, o.prefix)
	case "memory":
		b.WriteString("store:\n  type: memory\n")
	}
	s.auditLog = filepath.Join(s.state, "audit.log")
	b.WriteString("audit:\n  fsync: always\n")
	if o.auditDir != "" {
		s.auditLog = filepath.Join(o.auditDir, "audit.log")
		fmt.Fprintf(&b, "  path: %q\n  key_file: %q\n", s.auditLog, filepath.Join(dir, "audit.key"))
	}
	if o.metrics {
		fmt.Fprintf(&b, "metrics: {addr: \"127.0.0.1:0\", replica: %q}\n", o.replica)
	}
	if o.operatorToken != "" {
		sum := sha256.Sum256([]byte(o.operatorToken))
		fmt.Fprintf(&b, "operator: {token_sha256: %s}\n", hex.EncodeToString(sum[:]))
	}
	if o.http == "" {
		o.http = "{requests_per_minute: 1000000}"
	}
	fmt.Fprintf(&b, "http: %s\n", o.http)
	b.WriteString("limits:\n  max_timeout_s: 120\ngrants:\n")
	for _, g := range o.grants {
		pf := filepath.Join(dir, "policy-"+g.name+".json")
		if err := os.WriteFile(pf, []byte(g.policy), 0o600); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "  - name: %s\n    policy: %q\n", g.name, pf)
		if g.token != "" {
			sum := sha256.Sum256([]byte(g.token))
			fmt.Fprintf(&b, "    token_sha256: %s\n", hex.EncodeToString(sum[:]))
		}
		if len(g.vms) > 0 {
			vms, _ := json.Marshal(g.vms)
			fmt.Fprintf(&b, "    vms: %s\n", vms)
		}
		if g.requestsPerMinute > 0 {
			fmt.Fprintf(&b, "    requests_per_minute: %d\n", g.requestsPerMinute)
		}
	}
	b.WriteString("backends:\n  - name: lab\n    driver: qemu\n    settings:\n")
	if o.labDir != "" {
		fmt.Fprintf(&b, "      lab_dir: %q\n", o.labDir)
	}
	if len(o.vms) > 0 {
		b.WriteString("      vms:\n")
	}
	for _, vm := range o.vms {
		fmt.Fprintf(&b, "        - {name: %s, qmp: %q, qga: %q}\n", vm.Name, vm.QMPSocket, vm.QGASocket)
	}
	b.WriteString(o.templates)
	if err := os.WriteFile(s.cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

func newToken() string { return rand.Text() + rand.Text() }

// serveProc is one `vmgate serve --http` process; the test owns it.
type serveProc struct {
	cmd    *exec.Cmd
	url    string
	stderr *syncBuffer
	done   chan struct{} // closed once Wait returned
	err    error         // Wait's result
}

var urlLine = regexp.MustCompile(`url=(http://127\.0\.0\.1:[0-9]+/mcp)`)

// startServe starts `vmgate serve --config cfg --http 127.0.0.1:0` and waits
// for its URL. t.Cleanup kills it if the test has not stopped it.
func startServe(t *testing.T, cfg string) *serveProc {
	t.Helper()
	p, err := launchServe(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.kill() })
	return p
}

func launchServe(cfg string) (*serveProc, error) {
	cmd := exec.Command(vmgateBin, "serve", "--config", cfg, "--http", "127.0.0.1:0", "--grace", "20s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p := &serveProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start vmgate serve: %w", err)
	}
	found := make(chan string, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for sc.Scan() {
			p.stderr.Write([]byte(sc.Text() + "\n"))
			if m := urlLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	go func() {
		<-drained
		p.err = cmd.Wait()
		close(p.done)
	}()
	wait := testload.Scale(60 * time.Second)
	select {
	case p.url = <-found:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("chaos: vmgate serve exited (%v) before serving:\n%s", p.err, p.stderr.String())
	case <-time.After(wait):
		p.kill()
		return nil, fmt.Errorf("chaos: vmgate serve printed no URL within %v (60 s scaled by the machine's load):\n%s", wait, p.stderr.String())
	}
}

func (p *serveProc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM and waits; an unclean exit is an error.
func (p *serveProc) stop() error {
	select {
	case <-p.done:
		return fmt.Errorf("chaos: vmgate serve had already exited: %v", p.err)
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	wait := testload.Scale(45 * time.Second)
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("chaos: vmgate serve exited with %v:\n%s", p.err, tail(p.stderr.String(), 40))
		}
		return nil
	case <-time.After(wait):
		p.kill()
		return fmt.Errorf("chaos: vmgate serve did not stop within %v of SIGTERM (45 s scaled by the machine's load)", wait)
	}
}

// kill sends SIGKILL (by pid) and waits.
func (p *serveProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

var metricsLine = regexp.MustCompile(`serving metrics" url=(http://127\.0\.0\.1:[0-9]+/metrics)`)

// metricsURL waits up to 30 s (scaled by the machine's load) for the
// metrics URL a server started with configOpts.metrics logs.
func (p *serveProc) metricsURL() (string, error) {
	wait := testload.Scale(30 * time.Second)
	deadline := time.Now().Add(wait)
	for {
		if m := metricsLine.FindStringSubmatch(p.stderr.String()); m != nil {
			return m[1], nil
		}
		select {
		case <-p.done:
			return "", fmt.Errorf("chaos: vmgate serve exited (%v) without a metrics URL:\n%s", p.err, tail(p.stderr.String(), 30))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("chaos: vmgate serve logged no metrics URL within %v:\n%s", wait, tail(p.stderr.String(), 30))
		}
	}
}

// scrapeClient scrapes without keep-alive: a scrape leaves no connection
// (and no server goroutine) behind to skew the next one.
var scrapeClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// sample scrapes url and returns the value of the unlabelled series name.
func sample(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("chaos: scrape: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("chaos: scrape: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("chaos: scrape: GET %s = %s", url, resp.Status)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("chaos: scrape: %s = %q: %w", name, v, err)
			}
			return f, nil
		}
	}
	return 0, fmt.Errorf("chaos: scrape: no %s on %s", name, url)
}

// fds counts the open file descriptors of pid.
func fds(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}

// threads reads the thread count of pid.
func threads(pid int) (int, error) {
	v, err := procStatus(pid, "Threads")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// procStatus reads the field key of /proc/pid/status.
func procStatus(pid int, key string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no %s line for pid %d", key, pid)
}

// procInfo is one process of /proc.
type procInfo struct {
	pid, ppid int
	cmdline   string
}

// descendants lists every process below pid, with their command lines.
func descendants(pid int) []procInfo {
	ents, _ := os.ReadDir("/proc")
	children := map[int][]procInfo{}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(st), ')')
		f := strings.Fields(string(st[i+1:]))
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n))
		children[ppid] = append(children[ppid], procInfo{pid: n, ppid: ppid, cmdline: strings.TrimSpace(strings.ReplaceAll(string(cl), "\x00", " "))})
	}
	var out []procInfo
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			out = append(out, c)
			walk(c.pid)
		}
	}
	walk(pid)
	return out
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(st), ')')
	f := strings.Fields(string(st[i+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// qmp runs one QMP command on the socket through the QEMU plugin's monitor,
// within 10 s.
func qmp(ctx context.Context, sock, command string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m := qemu.NewMonitor("unix", sock, qemu.MonitorOptions{})
	if err := m.ConnectContext(ctx); err != nil {
		return err
	}
	defer m.Disconnect()
	if _, err := m.RunContext(ctx, fmt.Appendf(nil, `{"execute":%q}`, command)); err != nil {
		return fmt.Errorf("qmp: %s: %w", command, err)
	}
	return nil
}

// runVMGate runs a vmgate subcommand and returns its combined output.
func runVMGate(args ...string) (string, error) {
	ctx, cancel := testload.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, vmgateBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
