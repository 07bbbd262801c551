package readmetest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// env is what the checks share: the vmgate the test built (make build into
// a directory of the test's), a state directory for the lab VMs, and, made
// on first use, the lab VMs, make install's tree and an HTTP server.
type env struct {
	t     *testing.T
	root  string // the repository
	dir   string // the test's own directory
	bin   string // <dir>/bin: make build's output, first on PATH
	state string // VMGATE_STATE_DIR of the commands

	blocks map[string]block // README's blocks by id

	mu      sync.Mutex // guards the lazily made parts below
	labUp   bool
	destdir string  // make install's DESTDIR, once run
	srv     *server // the HTTP server on the installed config
}

// cmdTimeout bounds one command of a block: a bound against hangs (a lab
// VM's first boot builds the image), not a speed requirement.
const cmdTimeout = 15 * time.Minute

func newEnv(t *testing.T, blocks []block) *env {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e := &env{t: t, root: root, dir: dir, bin: filepath.Join(dir, "bin"), state: filepath.Join(dir, "state"), blocks: map[string]block{}}
	for _, b := range blocks {
		e.blocks[b.id] = b
	}
	if err := os.Mkdir(e.state, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := e.command(root, nil, "make", "-s", "build", "BIN="+e.bin).CombinedOutput(); err != nil {
		t.Fatalf("make build BIN=%s: %v\n%s", e.bin, err, out)
	}
	t.Cleanup(e.labDown)
	return e
}

// block is README's block id, which another block's check uses.
func (e *env) block(t *testing.T, id string) block {
	t.Helper()
	b, found := e.blocks[id]
	if !found {
		t.Fatalf("README has no block %q, which this check uses", id)
	}
	return b
}

// command is name with args in dir, with the test's PATH and state
// directory and extra in its environment, ended with the test (Pdeathsig).
func (e *env) command(dir string, extra []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+e.bin+":"+os.Getenv("PATH"), "VMGATE_STATE_DIR="+e.state)
	cmd.Env = append(cmd.Env, extra...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	return cmd
}

// ran is what a command did.
type ran struct {
	stdout, stderr string
	code           int // -1: killed, or did not start
}

func (r ran) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.code, clip(r.stdout), clip(r.stderr))
}

func clip(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "…"
	}
	return s
}

// sh runs line with sh -c in dir (the test's directory when empty), bounded
// by cmdTimeout; its process group is killed when it ends or times out.
func (e *env) sh(dir string, extra []string, line string) ran {
	if dir == "" {
		dir = e.dir
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := e.command(dir, extra, "sh", "-c", line)
	var o, er bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &er
	if err := cmd.Start(); err != nil {
		return ran{code: -1, stderr: err.Error()}
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	err := cmd.Wait()
	close(done)
	r := ran{stdout: o.String(), stderr: er.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		r.code = -1
	}
	if ctx.Err() != nil {
		r.stderr += fmt.Sprintf("\n(killed after %v)", cmdTimeout)
	}
	return r
}

// lab makes sure the lab VMs README's lab section boots run in the test's
// state directory; it skips (or, with VMGATE_REQUIRE_VM, fails) without
// QEMU.
func (e *env) lab(t *testing.T) {
	t.Helper()
	labtest.RequireQEMU(t)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.labUp {
		return
	}
	if r := e.sh(e.dir, nil, "vmgate lab up --vms 2"); r.code != 0 {
		t.Fatalf("vmgate lab up --vms 2: %v", r)
	}
	e.labUp = true
}

// labDown stops the lab VMs (a backstop: the lab block stops them too).
func (e *env) labDown() {
	if r := e.sh(e.dir, nil, "vmgate lab down"); r.code != 0 {
		e.t.Logf("vmgate lab down: %v", r)
	}
}

// install runs make install into a DESTDIR of the test's (with make
// build's output in a BIN of its own), once, and returns the DESTDIR.
func (e *env) install(t *testing.T) (string, ran) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	dest := filepath.Join(e.dir, "destdir")
	if e.destdir != "" {
		return e.destdir, ran{}
	}
	r := e.sh(e.root, nil, fmt.Sprintf("make -s install DESTDIR=%s BIN=%s", dest, filepath.Join(e.dir, "install-bin")))
	if r.code == 0 {
		e.destdir = dest
	}
	return dest, r
}

// installedConfig is the config make install lays down, made usable
// here: state_dir in the test's directory (dir, made 0700) and, when
// tokenHash is not empty, grant local's token, as README's Install section
// says to give it. The lab backend is the test's lab (lab_dir).
func (e *env) installedConfig(t *testing.T, dir, tokenHash string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.root, "packaging", "vmgate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s := mustReplace(t, string(raw), "state_dir: /var/lib/vmgate", "state_dir: "+dir)
	s = mustReplace(t, s, "settings: {lab: true}", "settings: {lab_dir: "+filepath.Join(e.state, "lab")+"}")
	if tokenHash != "" {
		s = mustReplace(t, s, "# token_sha256: <the 64 hex digits sha256sum printed>", "token_sha256: "+tokenHash)
	}
	p := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustReplace(t testing.TB, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("%q not found in:\n%s", old, s)
	}
	return strings.Replace(s, old, new, 1)
}

// server is a vmgate serve --http the test started.
type server struct {
	url, token, state string
	cmd               *exec.Cmd
	stderr            *lockedBuffer
}

// lockedBuffer is a buffer written by one goroutine and read by others.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var servingRE = regexp.MustCompile(`serving MCP over streamable HTTP" url=(\S+)`)

// serve starts vmgate serve with args and waits until it serves HTTP
// (its log names the URL) or exits; it is stopped when owner ends.
func (e *env) serve(owner testing.TB, extra []string, args ...string) (*server, error) {
	owner.Helper()
	cmd := e.command(e.dir, extra, filepath.Join(e.bin, "vmgate"), append([]string{"serve"}, args...)...)
	s := &server{cmd: cmd, stderr: &lockedBuffer{}}
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(s.stderr, pw)
	cmd.Stdin = nil // stdio would end at once: serve must not fall back to it
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var waitErr error
	exited := make(chan struct{}) // closed once Wait returned (waitErr set)
	go func() { waitErr = cmd.Wait(); pw.Close(); close(exited) }()
	owner.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(testload.Scale(30 * time.Second)):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case s.url = <-found:
		return s, nil
	case <-exited:
		return nil, fmt.Errorf("vmgate serve %q exited before serving HTTP (%v): %s", args, waitErr, clip(s.stderr.String()))
	case <-time.After(testload.Scale(2 * time.Minute)):
		return nil, fmt.Errorf("vmgate serve %q did not serve HTTP within 2 minutes: %s", args, clip(s.stderr.String()))
	}
}

// httpServer is vmgate serve --http on the installed config with grant
// local's token made as README's Install section says, on the test's lab.
func (e *env) httpServer(t *testing.T) *server {
	t.Helper()
	e.mu.Lock()
	srv := e.srv
	e.mu.Unlock()
	if srv != nil {
		return srv
	}
	token, hash := e.newToken(t)
	state := filepath.Join(e.dir, "http-state")
	cfg := e.installedConfig(t, state, hash)
	s, err := e.serve(e.t, nil, "--config", cfg, "--http", "127.0.0.1:0") // shared: lives as long as the whole test
	if err != nil {
		t.Fatal(err)
	}
	s.token, s.state = token, state
	e.mu.Lock()
	e.srv = s
	e.mu.Unlock()
	return s
}

// tokenBlock is the id of README's block that makes a grant's token.
const tokenBlock = "Install #2"

var (
	sha256sumRE = regexp.MustCompile(`^([0-9a-f]{64})  -\n$`)
	tokenRE     = regexp.MustCompile(`^[A-Za-z0-9]{21,43}$`)
)

// newToken runs README's token lines (and prints the token, which README
// leaves in $token) and returns the token and its hex SHA-256.
func (e *env) newToken(t *testing.T) (string, string) {
	t.Helper()
	r := e.sh("", nil, e.block(t, tokenBlock).text+"\nprintf '%s' \"$token\" >&2")
	m := sha256sumRE.FindStringSubmatch(r.stdout)
	// 32 random bytes are 43 base64 characters, less each '/' and '+' the
	// lines drop (about 1.3 on average; 20 or fewer left: below 1e-12).
	sum := sha256.Sum256([]byte(r.stderr))
	if r.code != 0 || m == nil || !tokenRE.MatchString(r.stderr) || m[1] != hex.EncodeToString(sum[:]) {
		t.Fatalf("README's token lines: %v; want a token of 21 to 43 letters and digits and its sha256sum", r)
	}
	return r.stderr, m[1]
}

// mcpStdio speaks MCP over the stdio of cmd (not started): initialize,
// then each request in turn; it returns each reply's result.
func mcpStdio(cmd *exec.Cmd, requests ...map[string]any) ([]json.RawMessage, error) {
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(testload.Scale(30 * time.Second)):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}()
	dec := json.NewDecoder(out)
	send := func(m map[string]any) error { return json.NewEncoder(in).Encode(m) }
	reply := func(id int) (json.RawMessage, error) {
		for {
			var msg struct {
				ID     *int            `json:"id"`
				Result json.RawMessage `json:"result"`
				Error  json.RawMessage `json:"error"`
			}
			if err := dec.Decode(&msg); err != nil {
				return nil, fmt.Errorf("reading reply %d: %w (stderr: %s)", id, err, clip(stderr.String()))
			}
			if msg.ID == nil || *msg.ID != id {
				continue // a notification
			}
			if msg.Error != nil {
				return nil, fmt.Errorf("reply %d: error %s", id, msg.Error)
			}
			return msg.Result, nil
		}
	}
	if err := send(map[string]any{"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": map[string]any{
		"protocolVersion": "2025-06-18", "capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "readmetest", "version": "1"}}}); err != nil {
		return nil, err
	}
	if _, err := reply(0); err != nil {
		return nil, err
	}
	if err := send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"}); err != nil {
		return nil, err
	}
	var results []json.RawMessage
	for i, r := range requests {
		req := map[string]any{"jsonrpc": "2.0", "id": i + 1}
		for k, v := range r {
			req[k] = v
		}
		if err := send(req); err != nil {
			return nil, err
		}
		res, err := reply(i + 1)
		if err != nil {
			return nil, err
		}
		results = append(results, res)
	}
	return results, nil
}
