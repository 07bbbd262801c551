package servetest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testload"
)

// syncBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
type syncBuffer struct {
	mu sync.Mutex // mu guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// response is one JSON-RPC response.
type response struct {
	ID     int             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// toolResult is the part of a tools/call result the tests read.
type toolResult struct {
	IsError           bool                    `json:"isError"`
	Content           []struct{ Text string } `json:"content"`
	StructuredContent json.RawMessage         `json:"structuredContent"`
}

func (r toolResult) text() string {
	var parts []string
	for _, c := range r.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n")
}

// serveProc is one `vmgate serve` over stdio, owned by the test: a reader
// goroutine hands responses out by id and then waits for the process.
type serveProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncBuffer
	done   chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's result, set before done is closed

	mu      sync.Mutex // mu guards nextID and pending
	nextID  int
	pending map[int]chan response
}

// startServe starts `vmgate serve --config cfg args...`; t.Cleanup kills
// it by pid if it is still running, and waits for it.
func startServe(t *testing.T, cfg string, args ...string) *serveProc {
	t.Helper()
	cmd := exec.Command(vmgateBinary(t), append([]string{"serve", "--config", cfg}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &serveProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{}), pending: map[int]chan response{}}
	cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var r response
			if json.Unmarshal(sc.Bytes(), &r) != nil || r.ID == 0 {
				continue // a notification
			}
			p.mu.Lock()
			ch := p.pending[r.ID]
			delete(p.pending, r.ID)
			p.mu.Unlock()
			if ch != nil {
				ch <- r
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("vmgate serve stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// send writes a request and returns where its response will arrive.
func (p *serveProc) send(t *testing.T, method string, params any) <-chan response {
	t.Helper()
	ch := make(chan response, 1)
	p.mu.Lock()
	p.nextID++
	id := p.nextID
	p.pending[id] = ch
	p.mu.Unlock()
	line, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		t.Fatalf("writing %s to vmgate serve: %v", method, err)
	}
	return ch
}

func (p *serveProc) wait(t *testing.T, ch <-chan response, what string, timeout time.Duration) response {
	t.Helper()
	select {
	case r := <-ch:
		if r.Error != nil {
			t.Fatalf("%s: JSON-RPC error %d %s", what, r.Error.Code, r.Error.Message)
		}
		return r
	case <-p.done:
		t.Fatalf("%s: vmgate serve exited (%v) before answering", what, p.err)
	case <-time.After(timeout):
		t.Fatalf("%s: no answer within %v", what, timeout)
	}
	return response{}
}

// initialize does the MCP handshake.
func (p *serveProc) initialize(t *testing.T) {
	t.Helper()
	ch := p.send(t, "initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "servetest", "version": "1"}})
	p.wait(t, ch, "initialize", time.Minute)
	line := []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n")
	if _, err := p.stdin.Write(line); err != nil {
		t.Fatal(err)
	}
}

func (p *serveProc) callAsync(t *testing.T, tool string, args map[string]any) <-chan response {
	t.Helper()
	return p.send(t, "tools/call", map[string]any{"name": tool, "arguments": args})
}

func (p *serveProc) result(t *testing.T, ch <-chan response, what string) toolResult {
	t.Helper()
	r := p.wait(t, ch, what, 2*time.Minute)
	var tr toolResult
	if err := json.Unmarshal(r.Result, &tr); err != nil {
		t.Fatalf("%s: result %s: %v", what, r.Result, err)
	}
	return tr
}

func (p *serveProc) call(t *testing.T, tool string, args map[string]any) toolResult {
	t.Helper()
	return p.result(t, p.callAsync(t, tool, args), tool)
}

// stop closes stdin (the end of the MCP stream) and waits for serve to exit.
func (p *serveProc) stop(t *testing.T) {
	t.Helper()
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(testload.Scale(time.Minute)):
		t.Fatalf("vmgate serve did not exit within a minute of its stdin closing")
	}
	if p.err != nil {
		t.Errorf("vmgate serve exited with %v; want 0", p.err)
	}
}

// proc identifies a process by pid and start time (a reused pid is another process).
type proc struct {
	pid   int
	start string
}

// stat returns the state and start time fields of /proc/pid/stat.
func stat(pid int) (state, start string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", "", false
	}
	// The command name is in parentheses and may hold spaces: split after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", "", false
	}
	return f[0], f[19], true // field 3 (state) and field 22 (starttime)
}

// alive reports whether p still runs (a zombie has finished running).
func (p proc) alive() bool {
	state, start, ok := stat(p.pid)
	return ok && start == p.start && state != "Z"
}

// children lists pid's child processes from /proc/PID/task/*/children.
func children(t *testing.T, pid int) []proc {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no /proc/%d/task/*/children (%v): is the process gone?", pid, err)
	}
	var ps []proc
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that just exited
		}
		for _, field := range strings.Fields(string(b)) {
			c, err := strconv.Atoi(field)
			if err != nil {
				t.Fatalf("%s: %q is not a pid", f, field)
			}
			if _, start, ok := stat(c); ok && !slices.ContainsFunc(ps, func(p proc) bool { return p.pid == c }) {
				ps = append(ps, proc{pid: c, start: start})
			}
		}
	}
	return ps
}

// cmdline is pid's argv.
func cmdline(pid int) []string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// pluginChildren waits until serve has n children (its plugins) and returns them.
func pluginChildren(t *testing.T, p *serveProc, n int) []proc {
	t.Helper()
	deadline := time.Now().Add(testload.Scale(30 * time.Second))
	for {
		ps := children(t, p.cmd.Process.Pid)
		if len(ps) == n {
			return ps
		}
		if time.Now().After(deadline) {
			t.Fatalf("vmgate serve has children %v; want %d plugin processes", ps, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitGone waits until every process in ps has stopped running.
func waitGone(t *testing.T, ps []proc, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, p := range ps {
		for p.alive() {
			if time.Now().After(deadline) {
				t.Fatalf("process %d (%q) still runs %v after its server ended; want it gone", p.pid, cmdline(p.pid), within)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// writeFile writes content to dir/name and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
