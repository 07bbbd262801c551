package readmetest

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// demo is a running scripts/demo.sh and what it printed.
type demo struct {
	out     string // everything printed before the server started
	state   string
	bin     string // the vmgate it built
	url     string
	token   string
	opToken string
}

// startDemo runs scripts/demo.sh (make demo) on a state directory, an
// address and a build directory of the test's, until it serves; it is
// stopped (and its lab VM with it) when the test ends.
func startDemo(t *testing.T) *demo {
	t.Helper()
	labtest.RequireQEMU(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	d := &demo{state: filepath.Join(dir, "state")}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "demo.sh"))
	cmd.Env = append(os.Environ(), "VMGATE_STATE_DIR="+d.state, "VMGATE_DEMO_ADDR="+addr, "VMGATE_DEMO_BIN="+filepath.Join(dir, "bin"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	stdout := &lockedBuffer{}
	cmd.Stdout = stdout
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{}) // closed once Wait returned (waitErr set)
	go func() { waitErr = cmd.Wait(); pw.Close(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(testload.Scale(30 * time.Second)):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		down := exec.Command(filepath.Join(dir, "bin", "vmgate"), "lab", "down")
		down.Env = append(os.Environ(), "VMGATE_STATE_DIR="+d.state)
		if out, err := down.CombinedOutput(); err != nil {
			t.Errorf("vmgate lab down after the demo: %v\n%s", err, out)
		}
	})
	var errB lockedBuffer
	serving := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			errB.Write([]byte(sc.Text() + "\n"))
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
				serving <- m[1]
			}
		}
	}()
	select {
	case d.url = <-serving:
	case <-exited:
		t.Fatalf("make demo ended before serving (%v):\n%s\n%s", waitErr, stdout.String(), clip(errB.String()))
	case <-time.After(cmdTimeout):
		t.Fatalf("make demo did not serve within %v", cmdTimeout)
	}
	// The script printed everything before it started the server (exec):
	// its stdout is complete once the server logs that it serves.
	d.out = stdout.String()
	d.bin = filepath.Join(dir, "bin", "vmgate")
	d.token = demoField(t, d.out, `(?m)^Bearer token.*:\n\n  (\S+)$`)
	d.opToken = demoField(t, d.out, `(?m)^  operator token .*: (\S+)$`)
	return d
}

func demoField(t *testing.T, out, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("make demo printed no %s:\n%s", re, out)
	}
	return m[1]
}

// TestDemo: what make demo prints runs as written: the shell lines (an
// operator's ID is a placeholder: its command's help is checked), the
// Claude Code and mcp-remote header against its server, the Inspector
// pinned as README pins it, and its operator token opens the approvals
// page (issue 32, item 3).
func TestDemo(t *testing.T) {
	d := startDemo(t)
	if !strings.Contains(d.url, "/mcp") {
		t.Fatalf("demo serves %q", d.url)
	}
	shell := regexp.MustCompile(`(?s)From a shell:\n(.*?)\n\n`).FindStringSubmatch(d.out)
	if shell == nil {
		t.Fatalf("make demo printed no shell lines:\n%s", d.out)
	}
	for _, l := range strings.Split(shell[1], "\n") {
		l = strings.TrimSpace(regexp.MustCompile(`\s{2,}\(.*\)$`).ReplaceAllString(l, ""))
		if strings.HasSuffix(l, " ID --config "+filepath.Join(d.state, "demo", "vmgate.yaml")) {
			l = strings.Replace(l, " ID --config", " --help --config", 1) // ID is an approval's
		}
		out, err := exec.Command("bash", "-c", l).CombinedOutput()
		if err != nil {
			t.Errorf("make demo's %q: %v\n%s", l, err, out)
		}
	}
	readme, err := os.ReadFile(readmePath(t))
	if err != nil {
		t.Fatal(err)
	}
	pin := inspectorPinRE.FindSubmatch(readme)
	for _, m := range regexp.MustCompile(`npx[^\n]*@modelcontextprotocol/inspector(@[0-9.]+)?`).FindAllStringSubmatch(d.out, -1) {
		if pin == nil || m[1] != "@"+string(pin[1]) {
			t.Errorf("make demo prints %q; want the Inspector README pins (%s)", m[0], pin)
		}
	}
	for _, h := range regexp.MustCompile(`--header"?,? "(Authorization:[^"]*)"`).FindAllStringSubmatch(d.out, -1) {
		checkDemoHeader(t, d, h[1])
	}
	checkDemoOperator(t, d)
}

// checkDemoHeader sends initialize with a header the demo prints.
func checkDemoHeader(t *testing.T, d *demo, header string) {
	_, value, _ := strings.Cut(header, ":")
	req, _ := http.NewRequest("POST", d.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	req.Header.Set("Authorization", strings.TrimSpace(value))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("initialize with make demo's header %q: HTTP %d; want 200", header, resp.StatusCode)
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// checkDemoOperator logs in to the approvals page the demo names with the
// operator token it prints.
func checkDemoOperator(t *testing.T, d *demo) {
	page := demoField(t, d.out, `(?m)^Approvals page.*: (http://\S+/ui)$`)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(page + "/login")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := csrfRE.FindSubmatch(body)
	if m == nil {
		t.Fatalf("GET %s/login = %d, no login form (is the operator token in the demo's config?):\n%s", page, resp.StatusCode, clip(string(body)))
	}
	resp, err = c.PostForm(page+"/login", url.Values{"csrf": {string(m[1])}, "token": {d.opToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login with make demo's operator token = %d; want 303 to the page", resp.StatusCode)
	}
	resp, err = c.Get(page + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s/ after login = %d; want 200", page, resp.StatusCode)
	}
}

// TestDemoDesktopJSON: the Claude Desktop configuration make demo prints
// parses once its URL and token are in it (without running the demo).
func TestDemoDesktopJSON(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\n  (\{\n    "mcpServers".*?\n  \})\n`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("scripts/demo.sh prints no Claude Desktop JSON")
	}
	text := strings.NewReplacer("$URL", "http://127.0.0.1:8707/mcp", "$TOKEN", "t0ken").Replace(string(m[1]))
	var v struct {
		MCPServers map[string]struct {
			Command string
			Args    []string
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal([]byte(text), &v); err != nil || v.MCPServers["vmgate"].Command != "npx" {
		t.Errorf("the demo's Claude Desktop JSON = %+v, %v:\n%s", v, err, text)
	}
}
