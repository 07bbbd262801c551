package virtualbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
)

// runSpec is one `guestcontrol run`.
type runSpec struct {
	argv    []string // argv[0], which is also the image, first
	env     []string
	cwd     string // passed with --cwd (7.1); empty otherwise
	timeout time.Duration
	limit   int64
}

// wrapperScript runs "$@" in directory $1 (when not empty) with stdin from
// file $2 (when not empty, removed once open). Everything is argv: nothing
// is interpolated. A directory or file that cannot be opened exits 2 with
// the shell's message on stderr. It is used for stdin (run has none: "@todo
// stdin handling" in gctlHandleRunCommon) and for a working directory
// where run has no --cwd (before 7.1, or Guest Additions older than 7.1).
const wrapperScript = `f=$2; if [ -n "$f" ]; then exec <"$f" || exit 2; rm -f -- "$f"; fi; [ -z "$1" ] || cd -- "$1" || exit 2; shift 2; exec "$@"`

// checkRequest validates req before anything runs: every driver's checks
// (agentexec.Request), then VBoxManage's.
func checkRequest(req hypervisor.ExecRequest) error {
	if _, err := agentexec.Request(req, time.Minute); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{hypervisor.ErrInvalidArgument}, args...)...)
	}
	switch {
	case req.Cwd != "" && checkGuestPath(req.Cwd) != nil:
		return bad("cwd: %v", checkGuestPath(req.Cwd))
	case strings.HasPrefix(req.Argv[0], "-") || strings.ContainsAny(req.Argv[0], "\x00\r\n"):
		return bad("program %q begins with '-' or holds NUL or a line break", req.Argv[0])
	}
	for i, a := range req.Argv {
		// VBoxManage hands arguments to the API as UTF-16: they must be UTF-8.
		if strings.ContainsRune(a, 0) || !utf8.ValidString(a) {
			return bad("argv[%d] holds NUL or is not UTF-8", i)
		}
	}
	for i, e := range req.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsRune(e, 0) || !utf8.ValidString(e) {
			return bad("env[%d] %q is not KEY=VALUE in UTF-8", i, e)
		}
	}
	return nil
}

// spec builds the run of req: argv as given; the working directory with
// --cwd where VBoxManage and the Additions have it, else through
// wrapperScript, which also feeds a staged stdin file.
func (d *Driver) spec(req hypervisor.ExecRequest, stdinPath string, useCwd bool) runSpec {
	timeout := req.Timeout
	if timeout == 0 {
		timeout = d.cfg.ExecTimeout
	}
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = DefaultMaxOutputBytes
	}
	s := runSpec{argv: req.Argv, env: req.Env, timeout: timeout, limit: limit}
	wrapCwd := req.Cwd
	if useCwd {
		s.cwd, wrapCwd = req.Cwd, ""
	}
	if wrapCwd != "" || stdinPath != "" {
		s.argv = append([]string{"/bin/sh", "-c", wrapperScript, "vmgate-exec", wrapCwd, stdinPath}, req.Argv...)
	}
	return s
}

// runArgs is the argv of `guestcontrol run` for s. The image is the first
// positional argument, without --exe: 6.1 then uses it as the image and
// argv[0]; 7.0 and 7.1 use it as the image and put it in front of the
// other positional arguments (gctlHandleRunCommon). With --exe, 7.x would
// run the image with argv[0] twice ("/bin/sh sh -c ...").
func (d *Driver) runArgs(vm string, s runSpec) []string {
	args := []string{"guestcontrol", vm, "run",
		"--username", d.cfg.Username, "--passwordfile", d.cfg.PasswordFile,
		"--verbose", "--wait-stdout", "--wait-stderr",
		"--timeout", strconv.FormatInt(vboxTimeout(s.timeout), 10)}
	for _, e := range s.env {
		args = append(args, "--putenv", e)
	}
	if s.cwd != "" {
		args = append(args, "--cwd", s.cwd)
	}
	args = append(args, "--")
	return append(args, s.argv...)
}

// vboxTimeout is VBoxManage's own --timeout in ms: the driver's plus a
// backstop, so the Tracker's watchdog (which kills the whole process tree)
// or the driver's interrupt at the deadline comes first; VBoxManage's own
// host deadline ("Process monitor loop timed out", the process only) is
// the fallback.
func vboxTimeout(t time.Duration) int64 { return max(1, (t + backstop).Milliseconds()) }

// backstop is how much later than the driver's own timeout VBoxManage's
// --timeout fires.
const backstop = 30 * time.Second

// running is one `guestcontrol run` in progress. Its stdout goes through
// the wrapper's warnings filter and the verbose filter, which hands the
// guest's output to stdout and learns the pid; stderr is the guest's.
type running struct {
	cmd    *exec.Cmd
	wrap   *wrapperFilter
	filter *vfilter
	stdout *capped
	stderr *capped
	done   chan struct{} // closed after Wait and the filters' end
	err    error         // Wait's error, set before done is closed

	pid       atomic.Int64
	started   chan struct{} // closed when the pid is known
	startOnce sync.Once
	// interrupted is set when the driver interrupted VBoxManage at the
	// command's deadline (its pid was unknown then: see deadline).
	interrupted atomic.Bool
}

func (d *Driver) startRun(ctx context.Context, vm string, s runSpec, ver vboxVersion) (*running, error) {
	cmd := d.command(ctx, d.runArgs(vm, s)...)
	r := &running{cmd: cmd, stdout: &capped{limit: s.limit}, stderr: &capped{limit: max(s.limit, 64<<10)},
		done: make(chan struct{}), started: make(chan struct{})}
	g := newVerboseGrammar(ver.atLeast(7, 0), runSpecText{user: d.cfg.Username, image: s.argv[0], args: s.argv, timeout: vboxTimeout(s.timeout)})
	r.filter = newVFilter(&g, r.stdout, d.cfg.StdioBlock, func(pid int64) {
		r.pid.Store(pid)
		r.startOnce.Do(func() { close(r.started) })
	})
	r.wrap = &wrapperFilter{next: r.filter}
	cmd.Stdout, cmd.Stderr = r.wrap, r.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		r.err = cmd.Wait()
		r.wrap.Close()
		r.filter.Close()
		close(r.done)
	}()
	go r.deadline(s.timeout)
	return r, nil
}

// waitPID waits for the pid (or the end of VBoxManage, or the bound) and
// returns it, 0 when unknown.
func (r *running) waitPID(ctx context.Context) int64 {
	select {
	case <-r.started:
	case <-r.done:
	case <-ctx.Done():
	}
	return r.pid.Load()
}

// deadline interrupts VBoxManage when timeout passes before it is done
// and the guest pid is still unknown. The pid is in VBoxManage's --verbose
// text, which goes through its buffered stdout: the run loop's lines fill
// a block within a moment while the process runs (it spins: see verbose.go),
// but a VBoxManage that spins slowly, or not at all, hands the text over
// only at exit. So at the deadline the driver waits up to pidGrace for the
// pid (the Tracker's watchdog, due at the deadline, then kills the process
// tree); without it, nothing can kill the guest process by pid, and SIGINT
// makes VBoxManage close its guest session, which terminates the process
// (VBoxManageGuestCtrl.cpp: gctlSignalHandler sets g_fGuestCtrlCanceled,
// gctlHandleRunCommon prints "Process execution aborted!" and returns
// EXITCODEEXEC_CANCELED; VBoxService kills the process, not its
// children). The guest's output so far is kept: VBoxManage wrote it
// straight through.
func (r *running) deadline(timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.done:
		return
	case <-t.C:
	}
	t.Reset(pidGrace)
	select {
	case <-r.done:
		return
	case <-r.started:
		return
	case <-t.C:
	}
	r.interrupted.Store(true)
	if err := r.cmd.Process.Signal(os.Interrupt); err != nil {
		r.interrupted.Store(false) // it ended meanwhile
	}
}

// pidGrace is how long after a command's deadline the driver waits for its
// pid before it interrupts VBoxManage.
const pidGrace = 5 * time.Second

// result maps a finished run to an ExecResult or an error.
func (r *running) result(op string, limit int64) (hypervisor.ExecResult, error) {
	code := 0
	if r.err != nil {
		var ee *exec.ExitError
		if !errors.As(r.err, &ee) {
			return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: %w", op, r.err)
		}
		code = ee.ExitCode()
	}
	stderr, _ := r.stderr.bytes()
	if !r.filter.done() {
		// VBoxManage failed around the process, or printed what the driver
		// cannot read (its messages in another language).
		if code == 0 || errorText(stderr) == "" {
			return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: VBoxManage exit %d, and its --verbose text did not parse (is it printing in a language other than English?)", op, code)
		}
		return hypervisor.ExecResult{}, vboxError(op, result{stderr: stderr, code: code})
	}
	stdout, outTrunc := r.stdout.bytes()
	errTrunc := int64(len(stderr)) > limit
	if errTrunc {
		stderr = stderr[:limit]
	}
	m := r.filter.m
	res := hypervisor.ExecResult{PID: m.pid, Exited: true, Stdout: stdout, Stderr: stderr, StdoutTruncated: outTrunc, StderrTruncated: errTrunc}
	return res, r.outcome(op, code, m, &res)
}

// outcome fills res from the verbose trailer (VBoxManageGuestCtrl.cpp
// gctlHandleRunCommon's report of the process) and checks VBoxManage's exit
// code against it (gctlRunCalculateExitCode).
func (r *running) outcome(op string, code int, m *vmatcher, res *hypervisor.ExecResult) error {
	switch m.trailer {
	case "exit":
		switch m.status {
		case statusTerminatedNormally:
			res.ExitCode = m.code
			if want := mappedExit(m.code); code != want {
				return fmt.Errorf("virtualbox: %s: VBoxManage exit %d disagrees with its verbose exit code %d (want %d)", op, code, m.code, want)
			}
		case statusTerminatedSignal:
			res.Signal, res.ExitCode = m.code, -1
		default:
			return fmt.Errorf("virtualbox: %s: guest process terminated abnormally (status %d, exit code %d)", op, m.status, m.code)
		}
	case "guest-timeout", "host-timeout":
		// "Process timed out (guest side) and was terminated" or "Process
		// monitor loop timed out": exit 20 either way.
		res.TimedOut, res.Signal, res.ExitCode = true, 9, -1
	case "aborted":
		if r.interrupted.Load() {
			// The driver's own interrupt at the deadline: the session
			// close terminated the guest process.
			res.TimedOut, res.Signal, res.ExitCode = true, 9, -1
			return nil
		}
		return fmt.Errorf("virtualbox: %s: VBoxManage was interrupted and closed the guest session", op)
	default:
		return fmt.Errorf("virtualbox: %s: VBoxManage lost the guest process (%s, exit %d)", op, m.trailer, code)
	}
	return nil
}

// ProcessStatus values of the VirtualBox API (ProcessStatus_T) that the
// verbose "Exit code=" line reports.
const (
	statusTerminatedNormally = 500
	statusTerminatedSignal   = 510
)

// VBoxManage exit codes of `guestcontrol run` (frozen since VirtualBox 4.1/5.0).
const (
	exitSyntax       = 2
	exitMappedLast   = 125
	exitMappedBig    = 126
	exitDisplacement = 32
)

// mappedExit is VBoxManage's exit code for a guest exit code.
func mappedExit(guest int) int {
	switch {
	case guest == 0:
		return 0
	case guest <= exitMappedLast-exitDisplacement:
		return guest + exitDisplacement
	}
	return exitMappedBig
}

// runOnce runs s to completion.
func (d *Driver) runOnce(ctx context.Context, op, vm string, s runSpec) (hypervisor.ExecResult, error) {
	if err := ctx.Err(); err != nil {
		return hypervisor.ExecResult{}, ctxError(op, err)
	}
	ver, err := d.version(ctx)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	r, err := d.startRun(ctx, vm, s, ver)
	if err != nil {
		return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	<-r.done
	if ctx.Err() != nil {
		return hypervisor.ExecResult{}, ctxError(op, ctx.Err())
	}
	res, err := r.result(op, s.limit)
	return res, d.disabledOrUnavailable(ctx, op, vm, err)
}

// stage copies stdin into the guest and returns its guest path.
func (d *Driver) stage(ctx context.Context, op, vm string, stdin []byte) (string, error) {
	var b [12]byte
	rand.Read(b[:])
	guest := path.Join(d.cfg.GuestTempDir, "vmgate-stdin-"+hex.EncodeToString(b[:]))
	if err := d.copyTo(ctx, op, vm, stdin, guest); err != nil {
		return "", err
	}
	return guest, nil
}

// prepare validates req, checks the VM name, learns the version and
// stages stdin; it returns the guest path of the staged stdin ("" for none).
func (d *Driver) prepare(ctx context.Context, op, vm string, req hypervisor.ExecRequest) (string, vboxVersion, error) {
	if err := d.checkName(op, vm); err != nil {
		return "", vboxVersion{}, err
	}
	if err := checkRequest(req); err != nil {
		return "", vboxVersion{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	ver, err := d.version(ctx)
	if err != nil {
		return "", vboxVersion{}, err
	}
	stdinPath := ""
	if len(req.Stdin) > 0 {
		if stdinPath, err = d.stage(ctx, op, vm, req.Stdin); err != nil {
			return "", vboxVersion{}, d.disabledOrUnavailable(ctx, op, vm, err)
		}
	}
	return stdinPath, ver, nil
}

// cwdOption reports whether run's --cwd is used for vm: VBoxManage 7.1
// has it, unless the VM's Additions said they cannot.
func (d *Driver) cwdOption(vm string, ver vboxVersion) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return ver.atLeast(7, 1) && !d.noCwd[vm]
}

// noteNoCwd remembers that vm's Additions cannot take --cwd.
func (d *Driver) noteNoCwd(vm string) {
	d.mu.Lock()
	d.noCwd[vm] = true
	d.mu.Unlock()
}
