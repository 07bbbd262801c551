package hypervisortest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// localDriver is a real hypervisor.Driver whose "guest" is the test's own
// host: it runs argv with os/exec (never a shell) and reads and writes host
// files. It serves two VMs: vm, and noExecVM whose agent refuses guest-exec.
// The suite's self-tests run every check against it (all must pass) and
// against broken variants of it (each targeted check must fail).
type localDriver struct {
	vm, noExecVM string
	// killLeaderOnly makes a timeout kill only the command, not its process
	// group: the "timeout leaves the tree running" bug.
	killLeaderOnly bool

	mu     sync.Mutex // guards execs, next, groups
	execs  map[string]*localExec
	next   int
	groups []int // process groups started, killed again by Close

	// dir is the harness's scratch directory; snaps are snapshots of it
	// (local_caps_test.go).
	dir   string
	snaps localSnapshots
}

type localExec struct {
	pid  int64
	done chan struct{} // closed when res is final
	res  hypervisor.ExecResult
}

var _ hypervisor.Driver = (*localDriver)(nil)

func newLocalDriver(t *testing.T) *localDriver {
	d := &localDriver{vm: "local", noExecVM: "local-noexec", execs: map[string]*localExec{}}
	t.Cleanup(d.Close)
	return d
}

func (d *localDriver) harness(t *testing.T) Harness {
	d.dir = t.TempDir()
	return Harness{Driver: d, VM: d.vm, NoExecVM: d.noExecVM, Dir: d.dir, CallTimeout: 30 * time.Second,
		Capabilities: hypervisor.CapabilitiesOf(d)}
}

// Close kills every process group the driver started that still has members
// (only a broken variant leaves any) and waits for the commands to be reaped.
func (d *localDriver) Close() {
	d.mu.Lock()
	groups := d.groups
	var pending []*localExec
	for _, e := range d.execs {
		pending = append(pending, e)
	}
	d.mu.Unlock()
	for _, g := range groups {
		_ = syscall.Kill(-g, syscall.SIGKILL) // ESRCH for a group already gone
	}
	for _, e := range pending {
		<-e.done
	}
}

func (d *localDriver) check(ctx context.Context, vm string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if vm != d.vm && vm != d.noExecVM {
		return fmt.Errorf("%q: %w", vm, hypervisor.ErrUnknownVM)
	}
	return nil
}

func (d *localDriver) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("local: list VMs: %w", err)
	}
	return []hypervisor.VM{
		{Name: d.vm, State: hypervisor.StateRunning, Agent: true},
		{Name: d.noExecVM, State: hypervisor.StateRunning, Agent: true},
	}, nil
}

func (d *localDriver) Status(ctx context.Context, vm string) (hypervisor.Status, error) {
	if err := d.check(ctx, vm); err != nil {
		return hypervisor.Status{}, fmt.Errorf("local: status: %w", err)
	}
	return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, AgentConnected: true, AgentVersion: "local-1"}, nil
}

func (d *localDriver) AgentInfo(ctx context.Context, vm string) (hypervisor.AgentInfo, error) {
	if err := d.check(ctx, vm); err != nil {
		return hypervisor.AgentInfo{}, fmt.Errorf("local: agent info: %w", err)
	}
	return hypervisor.AgentInfo{Version: "local-1", Commands: []hypervisor.AgentCommand{
		{Name: "guest-exec", Enabled: vm != d.noExecVM},
		{Name: "guest-exec-status", Enabled: vm != d.noExecVM},
		{Name: "guest-file-open", Enabled: true},
	}}, nil
}

// capped keeps the first limit bytes written to it and notes whether more came.
type capped struct {
	limit     int64
	buf       bytes.Buffer
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.limit - int64(c.buf.Len())
	if int64(len(p)) > room {
		c.buf.Write(p[:max(room, 0)])
		c.truncated = true
		return len(p), nil
	}
	c.buf.Write(p)
	return len(p), nil
}

func (d *localDriver) ExecStart(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	if err := d.check(ctx, vm); err != nil {
		return hypervisor.ExecHandle{}, fmt.Errorf("local: exec start: %w", err)
	}
	if vm == d.noExecVM {
		return hypervisor.ExecHandle{}, fmt.Errorf("local: exec start: %w", &hypervisor.CommandDisabledError{Command: "guest-exec"})
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return hypervisor.ExecHandle{}, fmt.Errorf("local: exec start: empty argv: %w", hypervisor.ErrInvalidArgument)
	}
	limit := req.MaxOutputBytes
	if limit <= 0 {
		limit = 1 << 20
	}
	stdout, stderr := &capped{limit: limit}, &capped{limit: limit}
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Env = append(os.Environ(), req.Env...)
	cmd.Dir = req.Cwd
	cmd.Stdin = bytes.NewReader(req.Stdin)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second // a leftover child holding the pipes must not block Wait
	if err := cmd.Start(); err != nil {
		return hypervisor.ExecHandle{}, fmt.Errorf("local: exec start: %w", err)
	}
	pid := cmd.Process.Pid
	e := &localExec{pid: int64(pid), done: make(chan struct{})}
	d.mu.Lock()
	d.next++
	token := strconv.Itoa(d.next)
	d.execs[token] = e
	d.groups = append(d.groups, pid)
	d.mu.Unlock()

	var timedOut atomic.Bool
	var timer *time.Timer
	if req.Timeout > 0 {
		timer = time.AfterFunc(req.Timeout, func() {
			timedOut.Store(true)
			if d.killLeaderOnly {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			} else {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
		})
	}
	go func() {
		_ = cmd.Wait() // the outcome is in ProcessState
		if timer != nil {
			timer.Stop()
		}
		res := hypervisor.ExecResult{
			PID: int64(pid), Exited: true,
			Stdout: stdout.buf.Bytes(), Stderr: stderr.buf.Bytes(),
			StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated,
			TimedOut: timedOut.Load(),
		}
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			res.Signal, res.ExitCode = int(ws.Signal()), -1
		} else {
			res.ExitCode = ws.ExitStatus()
		}
		e.res = res
		close(e.done)
	}()
	return hypervisor.ExecHandle{PID: int64(pid), Token: token, StartedAt: time.Now()}, nil
}

func (d *localDriver) ExecStatus(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	if err := d.check(ctx, vm); err != nil {
		return hypervisor.ExecResult{}, fmt.Errorf("local: exec status: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.execs[h.Token]
	if !ok || e.pid != h.PID {
		return hypervisor.ExecResult{}, fmt.Errorf("local: exec status: pid %d: %w", h.PID, hypervisor.ErrUnknownExec)
	}
	select {
	case <-e.done:
		delete(d.execs, h.Token)
		return e.res, nil
	default:
		return hypervisor.ExecResult{PID: e.pid}, nil
	}
}

func (d *localDriver) FileRead(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
	if err := d.check(ctx, vm); err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("local: file read: %w", err)
	}
	if maxBytes <= 0 {
		return hypervisor.FileContent{}, fmt.Errorf("local: file read: max bytes %d: %w", maxBytes, hypervisor.ErrInvalidArgument)
	}
	f, err := os.Open(path)
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("local: file read: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("local: file read: %w", err)
	}
	if int64(len(data)) > maxBytes {
		return hypervisor.FileContent{Data: data[:maxBytes], Truncated: true}, nil
	}
	return hypervisor.FileContent{Data: data}, nil
}

func (d *localDriver) FileWrite(ctx context.Context, vm, path string, data []byte, mode uint32) error {
	if err := d.check(ctx, vm); err != nil {
		return fmt.Errorf("local: file write: %w", err)
	}
	if mode&^0o777 != 0 {
		return fmt.Errorf("local: file write: mode %o: %w", mode, hypervisor.ErrInvalidArgument)
	}
	perm := os.FileMode(0o644)
	if mode != 0 {
		perm = os.FileMode(mode)
	}
	if err := os.WriteFile(path, data, perm); err != nil {
		return fmt.Errorf("local: file write: %w", err)
	}
	if mode != 0 { // WriteFile's perm is masked by the umask and ignored for an existing file
		if err := os.Chmod(path, perm); err != nil {
			return fmt.Errorf("local: file write: %w", err)
		}
	}
	return nil
}

func (d *localDriver) Power(ctx context.Context, vm string, action hypervisor.PowerAction) error {
	if err := d.check(ctx, vm); err != nil {
		return fmt.Errorf("local: power: %w", err)
	}
	if !action.Valid() {
		return fmt.Errorf("local: power: action %q: %w", action, hypervisor.ErrInvalidArgument)
	}
	return fmt.Errorf("local: power %s: the host is not a VM: %w", action, hypervisor.ErrNotSupported)
}
