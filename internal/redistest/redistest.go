// Package redistest starts a real redis-server for tests: on a free
// loopback port, without persistence, in the test's temporary directory,
// owned (waited for) by the test and killed by pid when it ends.
//
// A test skips when redis-server is not on PATH, unless VMGATE_REQUIRE_VM is
// set (CI sets it): then it fails.
package redistest

import (
	"bufio"
	"fmt"
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

// Server is one redis-server process the test owns.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int

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
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("VMGATE_REQUIRE_VM") != "" {
			t.Fatalf("redistest: redis-server not on PATH and VMGATE_REQUIRE_VM is set: %v", err)
		}
		t.Skipf("redistest: redis-server not on PATH: %v", err)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	var startErr error
	for range 5 { // a free port can be taken between probing and binding
		if s.port, err = freePort(); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		if startErr = s.start(); startErr == nil {
			break
		}
	}
	if startErr != nil {
		t.Fatalf("redistest: %v", startErr)
	}
	t.Cleanup(s.Stop)
	return s.Addr(), s.Stop, func() {
		t.Helper()
		s.Stop()
		if err := s.start(); err != nil {
			t.Fatalf("redistest: restart: %v", err)
		}
	}
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

// start runs redis-server and waits until it answers PING.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--daemonize", "no",
		"--protected-mode", "yes", "--loglevel", "warning", "--logfile", "")
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr()); err == nil {
			return nil
		}
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, strings.TrimSpace(out.String()))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stopLocked()
			return fmt.Errorf("redis-server on port %d did not answer PING within 10s", s.port)
		}
	}
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
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
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
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
