// Package redistest starts real Redis processes for tests: a redis-server
// (Start), or a primary, its replica and three Sentinels (StartSentinel,
// sentinel.go). Each listens on a free loopback port, without persistence,
// in the test's temporary directory, owned (waited for) by the test and
// killed by pid when it ends.
//
// A test skips when redis-server is not on PATH, unless VMGATE_REQUIRE_VM is
// set (CI sets it): then it fails.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one redis-server (or redis-sentinel) process the test owns.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	// args are the command's arguments for the port it starts on;
	// password is what ping authenticates with ("": none).
	args     func(port int, dir string) ([]string, error)
	password string

	mu   sync.Mutex // mu guards cmd and done.
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Start starts redis-server and returns its address, a stop function (kill
// it and wait) and a restart function (start it again on the same port,
// empty). Both are safe to call in any order and more than once; t.Cleanup
// stops the server.
func Start(t testing.TB) (addr string, stop func(), restart func()) {
	t.Helper()
	s := newServer(t, serverBin(t), serverArgs(""), "")
	return s.Addr(), s.Stop, func() {
		t.Helper()
		s.Stop()
		if err := s.start(); err != nil {
			t.Fatalf("redistest: restart: %v", err)
		}
	}
}

// serverBin is the path of redis-server; a test without it skips (fails
// when VMGATE_REQUIRE_VM is set).
func serverBin(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("VMGATE_REQUIRE_VM") != "" {
			t.Fatalf("redistest: redis-server not on PATH and VMGATE_REQUIRE_VM is set: %v", err)
		}
		t.Skipf("redistest: redis-server not on PATH: %v", err)
	}
	return bin
}

// serverArgs are a redis-server's arguments: loopback only, no
// persistence, a full sync at once (no diskless-sync delay), the password
// when there is one, then extra.
func serverArgs(password string, extra ...string) func(port int, dir string) ([]string, error) {
	return func(port int, dir string) ([]string, error) {
		args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no",
			"--protected-mode", "yes", "--loglevel", "warning", "--logfile", "",
			"--repl-diskless-sync-delay", "0"}
		if password != "" {
			args = append(args, "--requirepass", password, "--masterauth", password)
		}
		return append(args, extra...), nil
	}
}

// newServer starts bin with args on a free port in a directory of its own
// (password: what it requires); t.Cleanup stops it.
func newServer(t testing.TB, bin string, args func(port int, dir string) ([]string, error), password string) *Server {
	t.Helper()
	s := &Server{t: t, bin: bin, dir: t.TempDir(), args: args, password: password}
	var startErr error
	for range 5 { // a free port can be taken between probing and binding
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s.port = port
		if startErr = s.start(); startErr == nil {
			break
		}
	}
	if startErr != nil {
		t.Fatalf("redistest: %v", startErr)
	}
	t.Cleanup(s.Stop)
	return s
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs the server and waits until it answers PING.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args, err := s.args(s.port, s.dir)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := &lockedWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	// Generous: the machine may be busy. The port was free when probed, but
	// another test run's server may have taken it since: only an answer
	// from our own process counts (ours then exits, "address in use").
	deadline := time.Now().Add(time.Minute)
	for {
		if err := ping(s.Addr(), s.password); err == nil {
			if err := servedBy(s.Addr(), s.password, cmd.Process.Pid); err == nil {
				return nil
			}
		}
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("%s on port %d exited: %s", s.bin, s.port, strings.TrimSpace(out.String()))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stopLocked()
			return fmt.Errorf("%s on port %d did not answer PING within a minute", s.bin, s.port)
		}
	}
}

// dial connects to addr and authenticates with password when there is one.
func dial(addr, password string) (net.Conn, *bufio.Reader, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, nil, err
	}
	c.SetDeadline(time.Now().Add(time.Second))
	r := bufio.NewReader(c)
	if password != "" {
		if _, err := fmt.Fprintf(c, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(password), password); err != nil {
			c.Close()
			return nil, nil, err
		}
		if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
			c.Close()
			return nil, nil, fmt.Errorf("AUTH answered %q (%v)", line, err)
		}
	}
	return c, r, nil
}

// ping sends PING (after AUTH password, when there is one) and wants PONG.
func ping(addr, password string) error {
	c, r, err := dial(addr, password)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// servedBy asks the server at addr for INFO server and checks that its
// process_id is pid.
func servedBy(addr, password string, pid int) error {
	c, r, err := dial(addr, password)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return err
	}
	head, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil || n < 0 || n > 1<<16 {
		return fmt.Errorf("INFO server answered %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	for _, line := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			if v != strconv.Itoa(pid) {
				return fmt.Errorf("%s is another process's server (pid %s, not %d)", addr, v, pid)
			}
			return nil
		}
	}
	return fmt.Errorf("INFO server from %s has no process_id", addr)
}

// Stop kills the server by pid and waits for it. Stopping a stopped server
// does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) // a paused server dies as well
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Pause stops the server with SIGSTOP: it keeps its port and connections
// but answers nothing (a replica that does not acknowledge) until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		syscall.Kill(s.cmd.Process.Pid, sig)
	}
}

// lockedWriter collects the server's output for error messages.
type lockedWriter struct {
	mu sync.Mutex // mu guards b.
	b  strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
