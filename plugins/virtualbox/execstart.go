package virtualbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
)

// Run runs req to completion: ExecStart, then a wait for its VBoxManage
// process (no polling). When ctx ends first the process is interrupted,
// which ends the guest process with its guest session.
func (d *Driver) Run(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecResult, error) {
	const op = "exec"
	h, p, err := d.start(ctx, op, vm, req)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	var cerr error
	select {
	case <-p.done:
	case <-ctx.Done():
		cerr = ctxError(op, ctx.Err())
		p.cancel()
		<-p.done
	}
	res, err := d.execs.Status(context.WithoutCancel(ctx), vm, lost{d, vm}, h)
	if cerr != nil {
		return hypervisor.ExecResult{}, cerr
	}
	if err != nil {
		return hypervisor.ExecResult{}, trackerError(op, err)
	}
	return res, nil
}

// ExecStart starts req in a VBoxManage process owned by the driver and
// returns once the guest pid is known: it comes with VBoxManage's buffered
// --verbose text, with its first full block or at its exit.
func (d *Driver) ExecStart(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	h, _, err := d.start(ctx, "exec start", vm, req)
	return h, err
}

// start validates req, learns the version, stages stdin and starts the
// command through the Tracker.
func (d *Driver) start(ctx context.Context, op, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, *process, error) {
	stdinPath, ver, err := d.prepare(ctx, op, vm, req)
	if err != nil {
		return hypervisor.ExecHandle{}, nil, err
	}
	p := &process{d: d, op: op, vm: vm, req: req, stdinPath: stdinPath, ver: ver, done: make(chan struct{})}
	s := d.spec(req, stdinPath, false)
	q := qga.ExecRequest{Path: s.argv[0], Args: s.argv[1:], Env: s.env, Timeout: s.timeout, MaxOutputBytes: s.limit}
	h, err := d.execs.Start(ctx, vm, p, q)
	if err != nil {
		return hypervisor.ExecHandle{}, nil, trackerError(op, err)
	}
	return h, p, nil
}

// ExecStatus reads the state of a command started by ExecStart. Once the
// final result was returned the handle is forgotten.
func (d *Driver) ExecStatus(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	const op = "exec status"
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.ExecResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return hypervisor.ExecResult{}, ctxError(op, err)
	}
	res, err := d.execs.Status(ctx, vm, lost{d, vm}, h)
	if err != nil {
		var own vboxErr
		if !errors.As(err, &own) && errors.Is(err, hypervisor.ErrInvalidArgument) {
			// A malformed handle: tell an unknown VM from it.
			if _, verr := d.showVMInfo(ctx, op, vm); verr != nil {
				return hypervisor.ExecResult{}, verr
			}
		}
		return hypervisor.ExecResult{}, trackerError(op, err)
	}
	return res, nil
}

// vboxErr marks an error of the driver's own (it has the "virtualbox: op:"
// prefix) on its way through the Tracker.
type vboxErr struct{ error }

func (e vboxErr) Unwrap() error { return e.error }

// trackerError gives the Tracker's own errors (a full table, a closed
// driver, a malformed handle) the driver's prefix; the driver's own come
// back as they were.
func trackerError(op string, err error) error {
	var own vboxErr
	if errors.As(err, &own) {
		return own.error
	}
	return fmt.Errorf("virtualbox: %s: %w", op, err)
}

// process is one command started through the Tracker: its VBoxManage
// process, the only handle VirtualBox gives on a guest process. It is the
// qga.Execer the Tracker keeps with the command, so it answers for that
// command only. The driver builds the run itself (from req, not from the
// Tracker's qga.ExecRequest, which only carries the timeout and cap).
type process struct {
	d         *Driver
	op, vm    string
	req       hypervisor.ExecRequest
	stdinPath string
	ver       vboxVersion

	run    *running
	cancel context.CancelFunc
	done   chan struct{} // closed once res and err are set

	res hypervisor.ExecResult
	err error
}

var _ qga.Execer = (*process)(nil)

// ExecStart starts the VBoxManage process (under the driver's context: it
// outlives the call) and returns the guest pid once VBoxManage reported
// it. When the Additions turn out not to take --cwd (nothing ran), it
// starts again with the directory changed by the shell wrapper.
func (p *process) ExecStart(ctx context.Context, _ qga.ExecRequest) (int64, error) {
	d := p.d
	pid, err := p.launch(ctx, d.spec(p.req, p.stdinPath, d.cwdOption(p.vm, p.ver)))
	if errors.Is(err, errCwdUnsupported) {
		d.noteNoCwd(p.vm)
		p.done = make(chan struct{})
		pid, err = p.launch(ctx, d.spec(p.req, p.stdinPath, false))
	}
	if err != nil {
		return 0, vboxErr{err}
	}
	return pid, nil
}

// launch starts s and waits for its pid or its end.
func (p *process) launch(ctx context.Context, s runSpec) (int64, error) {
	d, op := p.d, p.op
	rctx, cancel := context.WithTimeout(d.ctx, s.timeout+backstop+time.Minute)
	r, err := d.startRun(rctx, p.vm, s, p.ver)
	if err != nil {
		cancel()
		return 0, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	p.run, p.cancel = r, cancel
	done := p.done
	d.procs.Add(1)
	go func() {
		defer d.procs.Done()
		<-r.done
		p.res, p.err = r.result("exec", s.limit)
		p.err = d.disabledOrUnavailable(context.Background(), "exec", p.vm, p.err)
		cancel()
		close(done)
	}()
	pid := r.waitPID(ctx)
	if ctx.Err() != nil {
		cancel()
		<-done
		return 0, ctxError(op, ctx.Err())
	}
	if pid != 0 {
		return pid, nil
	}
	<-done
	if p.err != nil {
		return 0, p.err
	}
	return 0, fmt.Errorf("virtualbox: %s: VBoxManage reported no pid", op)
}

// ExecStatus reports the command: running until its VBoxManage process
// has ended, then its result. An error of the ended process is final
// (agentexec.Gone: the Tracker forgets the command).
func (p *process) ExecStatus(_ context.Context, pid int64, _ int64) (qga.ExecStatus, error) {
	if p.run == nil || pid != p.run.pid.Load() {
		return qga.ExecStatus{}, vboxErr{fmt.Errorf("virtualbox: exec status: %w: pid %d", hypervisor.ErrUnknownExec, pid)}
	}
	select {
	case <-p.done:
	default:
		return qga.ExecStatus{PID: pid}, nil
	}
	if p.err != nil {
		return qga.ExecStatus{}, agentexec.Gone(vboxErr{p.err})
	}
	r := p.res
	return qga.ExecStatus{PID: r.PID, Exited: r.Exited, ExitCode: r.ExitCode, Signal: r.Signal, Stdout: r.Stdout, Stderr: r.Stderr,
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, TimedOut: r.TimedOut}, nil
}

// KillTree kills pid's process tree in the guest with qga.KillTreeScript,
// run by a VBoxManage of its own; the command's process then ends.
func (p *process) KillTree(ctx context.Context, pid int64) error {
	if p.run != nil && p.run.interrupted.Load() {
		// The driver interrupted VBoxManage at the deadline (see
		// running.deadline): the session close ends the guest process.
		select {
		case <-p.done:
			return nil
		case <-ctx.Done():
			return vboxErr{ctxError("exec timeout", ctx.Err())}
		}
	}
	s := runSpec{argv: []string{"/bin/sh", "-c", qga.KillTreeScript, "vmgate-kill", strconv.FormatInt(pid, 10)}, timeout: time.Minute, limit: 4096}
	if _, err := p.d.runOnce(ctx, "exec timeout", p.vm, s); err != nil {
		return vboxErr{err}
	}
	return nil
}

// lost is what the Tracker polls a handle through when it does not know
// the command: a command this driver did not start (or one whose result
// was collected) has no VBoxManage process here, so it is unknown, once
// the VM is known.
type lost struct {
	d  *Driver
	vm string
}

func (l lost) ExecStart(context.Context, qga.ExecRequest) (int64, error) {
	return 0, vboxErr{fmt.Errorf("virtualbox: exec start: %w: no process", hypervisor.ErrNotSupported)}
}

func (l lost) ExecStatus(ctx context.Context, pid int64, _ int64) (qga.ExecStatus, error) {
	if _, err := l.d.showVMInfo(ctx, "exec status", l.vm); err != nil {
		return qga.ExecStatus{}, vboxErr{err}
	}
	return qga.ExecStatus{}, vboxErr{fmt.Errorf("virtualbox: exec status: %w: pid %d", hypervisor.ErrUnknownExec, pid)}
}

func (l lost) KillTree(context.Context, int64) error {
	return vboxErr{fmt.Errorf("virtualbox: exec timeout: %w: no process", hypervisor.ErrUnknownExec)}
}
