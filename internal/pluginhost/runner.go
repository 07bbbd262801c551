package pluginhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-plugin/runner"
)

// procRunner runs one plugin process for go-plugin. It exists because
// go-plugin's own runner hands the plugin the host's stdin (the MCP stream)
// and sets no parent-death signal. Here the plugin's stdin is /dev/null, it
// gets SIGKILL when the host dies (Pdeathsig), and exited is closed once the
// process has been waited for (go-plugin calls Wait exactly once). An
// external plugin is executed from the file trust.go checked and opened:
// the child gets it as fd 3 and execs /proc/self/fd/3, so a file renamed
// into the plugin's place after the check is not what runs (argv[0] stays
// the plugin's path).
type procRunner struct {
	cmd    *exec.Cmd
	stdout io.ReadCloser
	stderr io.ReadCloser
	tail   *tailBuffer
	exited chan struct{}

	mu  sync.Mutex // mu guards pid and err
	pid int
	err error // the Wait result
}

var _ runner.Runner = (*procRunner)(nil)

func newProcRunner(path string, args, env []string, exe *os.File) (*procRunner, error) {
	cmd := exec.Command(path, args...)
	if exe != nil {
		cmd.Path = "/proc/self/fd/" + strconv.Itoa(execFD)
		cmd.ExtraFiles = []*os.File{exe} // fd 3 in the child
	}
	cmd.Env = env
	cmd.Stdin = nil // /dev/null: the host's stdin is the MCP stream
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	tail := &tailBuffer{max: 2048}
	return &procRunner{
		cmd: cmd, stdout: stdout, tail: tail, exited: make(chan struct{}),
		stderr: readCloser{io.TeeReader(stderr, tail), stderr},
	}, nil
}

func (r *procRunner) Start(context.Context) error {
	if err := r.cmd.Start(); err != nil {
		close(r.exited)
		if len(r.cmd.ExtraFiles) > 0 && errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w (the plugin runs from its open file through /proc/self/fd: is /proc mounted?)", err)
		}
		return err
	}
	r.mu.Lock()
	r.pid = r.cmd.Process.Pid
	r.mu.Unlock()
	return nil
}

func (r *procRunner) Wait(context.Context) error {
	err := r.cmd.Wait()
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
	close(r.exited)
	return err
}

func (r *procRunner) Kill(context.Context) error {
	if r.cmd.Process == nil {
		return nil
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *procRunner) Stdout() io.ReadCloser { return r.stdout }
func (r *procRunner) Stderr() io.ReadCloser { return r.stderr }
func (r *procRunner) Name() string          { return r.cmd.Args[0] }

func (r *procRunner) ID() string { return strconv.Itoa(r.PID()) }

// PID is the plugin's pid, 0 before Start.
func (r *procRunner) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pid
}

// exitErr is the Wait result; valid once exited is closed.
func (r *procRunner) exitErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *procRunner) Diagnose(context.Context) string {
	if t := r.tail.String(); t != "" {
		return "plugin stderr: " + t
	}
	return ""
}

func (r *procRunner) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

func (r *procRunner) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// tailBuffer keeps the last max bytes written to it (a plugin's last words
// on stderr, for the error of a failed start). mu guards buf.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// String is the tail as one line.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(strings.Fields(string(bytes.ToValidUTF8(t.buf, nil))), " ")
}
