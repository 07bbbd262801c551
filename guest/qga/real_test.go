package qga

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dangerousRPCs are blocked in every qemu-ga a test starts on the host.
var dangerousRPCs = []string{
	"guest-shutdown", "guest-suspend-disk", "guest-suspend-ram", "guest-suspend-hybrid",
	"guest-fsfreeze-freeze", "guest-fsfreeze-freeze-list", "guest-fsfreeze-thaw", "guest-fstrim",
	"guest-set-time", "guest-set-user-password", "guest-set-vcpus", "guest-set-memory-blocks",
	"guest-ssh-add-authorized-keys", "guest-ssh-remove-authorized-keys", "guest-network-get-route",
}

// qemuGA finds qemu-ga, skipping unless VMGATE_REQUIRE_VM is set.
func qemuGA(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("qemu-ga")
	if err != nil {
		if os.Getenv("VMGATE_REQUIRE_VM") != "" {
			t.Fatalf("qemu-ga not found and VMGATE_REQUIRE_VM is set: %v", err)
		}
		t.Skip("qemu-ga not on PATH")
	}
	return p
}

// realAgent is a qemu-ga running on the host in unix-listen mode.
type realAgent struct {
	sock string
	cmd  *exec.Cmd
	done chan struct{}
}

// startAgent starts qemu-ga on sock with the dangerous RPCs and extra
// blocked, and returns once it accepts connections. The test's cleanup
// kills it by pid and waits for it.
func startAgent(t testing.TB, dir, sock string, extraBlocked ...string) *realAgent {
	t.Helper()
	bin := qemuGA(t)
	os.Remove(sock) // a killed agent leaves its socket file behind
	blocked := append(append([]string{}, dangerousRPCs...), extraBlocked...)
	cmd := exec.Command(bin, "-m", "unix-listen", "-p", sock, "-t", dir,
		"-f", filepath.Join(dir, "qga.pid"), "-b", strings.Join(blocked, ","))
	cmd.Stderr = &bytes.Buffer{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu-ga: %v", err)
	}
	a := &realAgent{sock: sock, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(a.done) }()
	t.Cleanup(a.stop)
	a.waitListening(t)
	return a
}

// agentStartTimeout bounds qemu-ga's start: a limit on a condition, not a
// pause (the wait ends as soon as the agent accepts).
const agentStartTimeout = time.Minute

// waitListening waits until the agent accepts a connection: its socket file
// exists, then a connect succeeds (qemu-ga creates the file when it binds,
// before it listens, so a connect in between is refused). It fails the test
// when qemu-ga exits first or does not listen within agentStartTimeout.
func (a *realAgent) waitListening(t testing.TB) {
	t.Helper()
	deadline := time.NewTimer(agentStartTimeout)
	defer deadline.Stop()
	wait := time.Millisecond
	var last error
	for {
		if fi, err := os.Stat(a.sock); err != nil {
			last = err
		} else if fi.Mode()&os.ModeSocket == 0 {
			last = fmt.Errorf("%s is not a socket", a.sock)
		} else if conn, err := net.Dial("unix", a.sock); err != nil {
			last = err
		} else {
			conn.Close()
			return
		}
		retry := time.NewTimer(wait)
		select {
		case <-a.done:
			retry.Stop()
			t.Fatalf("qemu-ga exited at start: %s", a.cmd.Stderr)
		case <-deadline.C:
			retry.Stop()
			t.Fatalf("qemu-ga does not accept connections on %s after %v: %v", a.sock, agentStartTimeout, last)
		case <-retry.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// stop kills the agent by pid and waits for it. Idempotent.
func (a *realAgent) stop() {
	a.cmd.Process.Kill()
	<-a.done
}

func newRealClient(t testing.TB, extraBlocked ...string) (*Client, *realAgent) {
	t.Helper()
	dir := t.TempDir()
	a := startAgent(t, dir, filepath.Join(dir, "qga.sock"), extraBlocked...)
	c := New(a.sock)
	t.Cleanup(func() { c.Close() })
	return c, a
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestRealExec(t *testing.T) {
	c, _ := newRealClient(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name             string
		req              ExecRequest
		stdout, stderr   string
		code, signal     int
		outTrunc, errTrc bool
	}{
		{name: "argv not shell", req: ExecRequest{Path: "printf", Args: []string{"%s|", "a b", "$HOME", "*"}}, stdout: "a b|$HOME|*|"},
		{name: "stdin", req: ExecRequest{Path: "cat", Stdin: []byte("hello\x00\xffworld")}, stdout: "hello\x00\xffworld"},
		{name: "env added", req: ExecRequest{Path: "sh", Args: []string{"-c", `echo "$FOO|$BAR"; command -v cat >/dev/null && echo path-kept`}, Env: []string{"FOO=x y", "BAR="}}, stdout: "x y|\npath-kept\n"},
		{name: "exit code", req: ExecRequest{Path: "sh", Args: []string{"-c", "echo oops >&2; exit 3"}}, stderr: "oops\n", code: 3},
		{name: "signal", req: ExecRequest{Path: "sh", Args: []string{"-c", "kill -TERM $$"}}, code: -1, signal: int(syscall.SIGTERM)},
		{name: "cwd", req: ExecRequest{Path: "pwd", Cwd: dir}, stdout: dir + "\n"},
		{name: "cwd with hostile name", req: ExecRequest{Path: "pwd", Cwd: dir + "/no such $(dir)"}, code: 2},
		{name: "cwd through a symlink", req: ExecRequest{Path: "pwd", Cwd: dir + "/link"}, code: 126,
			stderr: "vmgate: cwd " + dir + "/link leads through a symlink (to " + dir + "/real); the command did not run\n"},
		{name: "cwd through a magic link", req: ExecRequest{Path: "pwd", Cwd: "/proc/self/root" + dir}, code: 126,
			stderr: "vmgate: cwd /proc/self/root" + dir + " leads through a symlink (to " + dir + "); the command did not run\n"},
		{name: "cwd with dot-dot", req: ExecRequest{Path: "pwd", Cwd: dir + "/real/.."}, code: 126,
			stderr: "vmgate: cwd " + dir + "/real/.. leads through a symlink (to " + dir + "); the command did not run\n"},
		{name: "output cap", req: ExecRequest{Path: "sh", Args: []string{"-c", "printf 0123456789; printf abcdefghij >&2"}, MaxOutputBytes: 4}, stdout: "0123", stderr: "abcd", outTrunc: true, errTrc: true},
		{name: "output at cap", req: ExecRequest{Path: "printf", Args: []string{"0123"}, MaxOutputBytes: 4}, stdout: "0123"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := c.Exec(testCtx(t, 20*time.Second), tt.req)
			if err != nil {
				t.Fatalf("Exec(%+v) error %v", tt.req, err)
			}
			if !st.Exited || st.ExitCode != tt.code || st.Signal != tt.signal || st.TimedOut {
				t.Errorf("Exec(%+v) = exited %v code %d signal %d timedout %v; want exited, code %d signal %d",
					tt.req, st.Exited, st.ExitCode, st.Signal, st.TimedOut, tt.code, tt.signal)
			}
			if string(st.Stdout) != tt.stdout || (tt.code != 2 && string(st.Stderr) != tt.stderr) {
				t.Errorf("Exec(%+v) output = %q, %q; want %q, %q", tt.req, st.Stdout, st.Stderr, tt.stdout, tt.stderr)
			}
			if st.StdoutTruncated != tt.outTrunc || st.StderrTruncated != tt.errTrc {
				t.Errorf("Exec(%+v) truncated = %v, %v; want %v, %v", tt.req, st.StdoutTruncated, st.StderrTruncated, tt.outTrunc, tt.errTrc)
			}
		})
	}
}

func TestRealExecTimeoutKills(t *testing.T) {
	c, _ := newRealClient(t)
	start := time.Now()
	st, err := c.Exec(testCtx(t, 20*time.Second), ExecRequest{
		Path: "sh", Args: []string{"-c", "echo started; exec sleep 30"}, Timeout: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("Exec(sleep 30, timeout 500ms) error %v", err)
	}
	if !st.TimedOut || !st.Exited || st.Signal != int(syscall.SIGKILL) {
		t.Errorf("Exec(sleep 30, timeout 500ms) = timedout %v exited %v signal %d; want true true %d", st.TimedOut, st.Exited, st.Signal, syscall.SIGKILL)
	}
	if string(st.Stdout) != "started\n" {
		t.Errorf("Exec(sleep 30, timeout 500ms) partial stdout = %q; want %q", st.Stdout, "started\n")
	}
	if el := time.Since(start); el >= 30*time.Second {
		t.Errorf("Exec(sleep 30, timeout 500ms) took %v; the kill did not work", el)
	}
	// The agent runs on this host, so its pids are ours: the process must be gone.
	if err := syscall.Kill(int(st.PID), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill(%d, 0) = %v; want ESRCH (process gone)", st.PID, err)
	}
}

// TestRealExecTimeoutKillsTree: children that ignore SIGTERM, one holding the
// output pipe in the background and one that left the tree with setsid, are
// all gone after the timeout, and the call returns promptly.
func TestRealExecTimeoutKillsTree(t *testing.T) {
	c, _ := newRealClient(t)
	dir := t.TempDir()
	script := `trap "" TERM
sleep 300 & echo $! > "$1/child"
setsid sh -c 'trap "" TERM; echo $$ > "$1/escaped"; exec sleep 300' sh "$1" &
echo started
wait`
	start := time.Now()
	st, err := c.Exec(testCtx(t, 60*time.Second), ExecRequest{
		Path: "sh", Args: []string{"-c", script, "sh", dir}, Timeout: time.Second,
	})
	if err != nil {
		t.Fatalf("Exec(tree, timeout 1s) error %v", err)
	}
	if !st.TimedOut || string(st.Stdout) != "started\n" {
		t.Errorf("Exec(tree, timeout 1s) = timedout %v stdout %q; want true %q", st.TimedOut, st.Stdout, "started\n")
	}
	if el := time.Since(start); el >= 30*time.Second {
		t.Errorf("Exec(tree, timeout 1s) took %v; the tree was not killed", el)
	}
	for _, name := range []string{"child", "escaped"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("read %s pid: %v", name, err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s pid %q: %v", name, b, err)
		}
		gone := false
		for range 100 {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				gone = true
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !gone {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("%s process %d still alive after the timeout kill", name, pid)
		}
	}
}

func TestRealExecStatusUnknownPID(t *testing.T) {
	c, _ := newRealClient(t)
	ctx := testCtx(t, 10*time.Second)
	st, err := c.Exec(ctx, ExecRequest{Path: "true"})
	if err != nil {
		t.Fatalf("Exec(true) error %v", err)
	}
	if _, err := c.ExecStatus(ctx, st.PID, 0); !errors.Is(err, ErrUnknownExec) {
		t.Errorf("ExecStatus(collected pid %d) error %v; want ErrUnknownExec", st.PID, err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Errorf("Ping after an error reply: %v", err)
	}
}

func TestRealFileRoundTrip(t *testing.T) {
	c, _ := newRealClient(t)
	ctx := testCtx(t, 30*time.Second)
	data := make([]byte, 3*FileChunkBytes+17)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "blob")
	if err := c.FileWrite(ctx, path, data, 0o640); err != nil {
		t.Fatalf("FileWrite(%s, %d bytes) error %v", path, len(data), err)
	}
	onDisk, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(onDisk, data) {
		t.Fatalf("file on disk: %d bytes, equal %v, err %v; want %d bytes equal", len(onDisk), bytes.Equal(onDisk, data), err, len(data))
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode of written file = %v (%v); want 0640", fi.Mode().Perm(), err)
	}
	tests := []struct {
		max       int64
		want      []byte
		truncated bool
	}{
		{0, data, false},
		{int64(len(data)), data, false},
		{int64(len(data)) - 1, data[:len(data)-1], true},
		{FileChunkBytes, data[:FileChunkBytes], true},
		{1, data[:1], true},
	}
	for _, tt := range tests {
		got, trunc, err := c.FileRead(ctx, path, tt.max)
		if err != nil || !bytes.Equal(got, tt.want) || trunc != tt.truncated {
			t.Errorf("FileRead(%d) = %d bytes (equal %v), %v, %v; want %d bytes, %v", tt.max, len(got), bytes.Equal(got, tt.want), trunc, err, len(tt.want), tt.truncated)
		}
	}
	// Error paths: a missing file is an agent error and the connection stays usable.
	_, _, err = c.FileRead(ctx, filepath.Join(t.TempDir(), "missing"), 0)
	var e *Error
	if !errors.As(err, &e) || e.Class != "GenericError" {
		t.Errorf("FileRead(missing) error %v; want a *Error of class GenericError", err)
	}
	if err := c.FileWrite(ctx, filepath.Join(t.TempDir(), "no", "dir"), []byte("x"), 0); err == nil {
		t.Errorf("FileWrite(missing dir) = nil; want an error")
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := c.FileWrite(ctx, empty, nil, 0); err != nil {
		t.Fatalf("FileWrite(empty) error %v", err)
	}
	if got, trunc, err := c.FileRead(ctx, empty, 0); err != nil || len(got) != 0 || trunc {
		t.Errorf("FileRead(empty) = %q, %v, %v; want empty", got, trunc, err)
	}
}

func TestRealInfo(t *testing.T) {
	c, _ := newRealClient(t)
	ctx := testCtx(t, 10*time.Second)
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("Info() error %v", err)
	}
	out, err := exec.Command(qemuGA(t), "-V").Output()
	if err != nil {
		t.Fatalf("qemu-ga -V: %v", err)
	}
	if info.Version == "" || !strings.Contains(string(out), info.Version) {
		t.Errorf("Info().Version = %q; want the version in %q", info.Version, out)
	}
	for name, want := range map[string]bool{"guest-exec": true, "guest-ping": true, "guest-shutdown": false, "guest-set-time": false, "no-such-command": false} {
		if got := info.Enabled(name); got != want {
			t.Errorf("Info().Enabled(%q) = %v; want %v", name, got, want)
		}
	}
	if _, err := c.OSInfo(ctx); err != nil {
		t.Errorf("OSInfo() error %v", err)
	}
	ifs, err := c.NetworkInterfaces(ctx)
	if err != nil {
		t.Fatalf("NetworkInterfaces() error %v", err)
	}
	var lo *NetworkInterface
	for i := range ifs {
		if ifs[i].Name == "lo" {
			lo = &ifs[i]
		}
	}
	if lo == nil || lo.Statistics == nil || !slices.ContainsFunc(lo.IPAddresses, func(a IPAddress) bool {
		return a.Type == "ipv4" && a.Address == "127.0.0.1" && a.Prefix == 8
	}) {
		t.Errorf("NetworkInterfaces() = %+v; want lo with 127.0.0.1/8 and statistics", ifs)
	}
}

func TestRealDisabledExec(t *testing.T) {
	c, _ := newRealClient(t, "guest-exec")
	ctx := testCtx(t, 10*time.Second)
	_, err := c.Exec(ctx, ExecRequest{Path: "true"})
	var de *DisabledError
	if !errors.As(err, &de) || de.Command != "guest-exec" {
		t.Fatalf("Exec with guest-exec blocked: error %v; want *DisabledError{guest-exec}", err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.Enabled("guest-exec") {
		t.Errorf("Info().Enabled(guest-exec) = %v, %v; want false", info.Enabled("guest-exec"), err)
	}
	// A command the agent does not know is reported the same way.
	err = c.Call(ctx, "guest-no-such-command", nil, nil)
	if !errors.As(err, &de) || de.Command != "guest-no-such-command" {
		t.Errorf("Call(guest-no-such-command) error %v; want *DisabledError", err)
	}
}

func TestRealAgentRestart(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "qga.sock")
	a := startAgent(t, dir, sock)
	c := New(sock)
	defer c.Close()
	ctx := testCtx(t, 30*time.Second)
	pid, err := c.ExecStart(ctx, ExecRequest{Path: "sleep", Args: []string{"10"}})
	if err != nil {
		t.Fatalf("ExecStart(sleep) error %v", err)
	}
	// The agent's child outlives the agent: kill it by its pid.
	t.Cleanup(func() { syscall.Kill(int(pid), syscall.SIGKILL) })
	a.stop()
	_, err = c.ExecStatus(ctx, pid, 0)
	if !errors.Is(err, ErrConnLost) && !errors.Is(err, ErrNoAgent) {
		t.Fatalf("ExecStatus with the agent killed: error %v; want ErrConnLost or ErrNoAgent", err)
	}
	if err := c.Ping(ctx); !errors.Is(err, ErrNoAgent) {
		t.Errorf("Ping with no agent: error %v; want ErrNoAgent", err)
	}
	startAgent(t, dir, sock)
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping after the agent restarted: %v", err)
	}
	if st, err := c.Exec(ctx, ExecRequest{Path: "echo", Args: []string{"back"}}); err != nil || string(st.Stdout) != "back\n" {
		t.Errorf("Exec(echo back) after restart = %q, %v; want %q", st.Stdout, err, "back\n")
	}
}

// BenchmarkExecTrue runs /bin/true through the real agent with adaptive polling.
func BenchmarkExecTrue(b *testing.B) {
	c, _ := newRealClient(b)
	ctx := context.Background()
	for b.Loop() {
		st, err := c.Exec(ctx, ExecRequest{Path: "/bin/true"})
		if err != nil || st.ExitCode != 0 {
			b.Fatalf("Exec(/bin/true) = %d, %v", st.ExitCode, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
}

// BenchmarkExecTrueFixedPoll1s is the baseline: the same command polled
// every second, as the Proxmox MCP servers do. Run it with -benchtime=3x.
func BenchmarkExecTrueFixedPoll1s(b *testing.B) {
	c, _ := newRealClient(b)
	ctx := context.Background()
	for b.Loop() {
		pid, err := c.ExecStart(ctx, ExecRequest{Path: "/bin/true"})
		if err != nil {
			b.Fatalf("ExecStart(/bin/true) error %v", err)
		}
		for {
			time.Sleep(time.Second)
			st, err := c.ExecStatus(ctx, pid, 0)
			if err != nil {
				b.Fatalf("ExecStatus(%d) error %v", pid, err)
			}
			if st.Exited {
				break
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
}
