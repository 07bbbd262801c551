package virtualbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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
// backstop, so the driver's watchdog (which kills the whole process tree)
// fires first; VBoxService's kill (of the process only) is the fallback.
func vboxTimeout(t time.Duration) int64 { return max(1, (t + backstop).Milliseconds()) }

// backstop is how much later than the driver's own timeout VBoxManage's
// --timeout fires.
const backstop = 30 * time.Second

// killTreeScript kills the process tree rooted at "$1" with SIGKILL: it
// stops the root so it cannot fork, adds (and stops) every process whose
// parent is in the set until the set stops growing, then kills them all.
// The pid is an argument, never interpolated; POSIX sh and kill only.
const killTreeScript = `root=$1
case "$root" in ''|*[!0-9]*) exit 2;; esac
kill -STOP "$root" 2>/dev/null || exit 0
all=" $root "
grown=1
while [ "$grown" = 1 ]; do
  grown=0
  for s in /proc/[0-9]*/stat; do
    p=${s#/proc/}; p=${p%/stat}
    case "$all" in *" $p "*) continue;; esac
    read -r line <"$s" 2>/dev/null || continue
    set -- ${line##*) }
    case "$all" in *" $2 "*) kill -STOP "$p" 2>/dev/null; all="$all$p "; grown=1;; esac
  done
done
kill -KILL $all 2>/dev/null
exit 0`

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
	// killed is set when the driver's timeout killed the process tree.
	killed atomic.Bool
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
	go d.watchdog(vm, r, s.timeout)
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

// watchdog kills the command's process tree in the guest when timeout
// passes before VBoxManage is done. The pid comes with the first block of
// VBoxManage's verbose text, which its wait loop fills within a moment of
// the start; VBoxManage's own deadline (a backstop later) covers the rest.
func (d *Driver) watchdog(vm string, r *running, timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.done:
		return
	case <-t.C:
	}
	ctx, cancel := context.WithTimeout(context.Background(), backstop)
	defer cancel()
	pid := r.waitPID(ctx)
	if pid == 0 {
		return
	}
	select {
	case <-r.done:
		return
	default:
	}
	r.killed.Store(true)
	s := runSpec{argv: []string{"/bin/sh", "-c", killTreeScript, "vmgate-kill", strconv.FormatInt(pid, 10)}, timeout: time.Minute, limit: 4096}
	if _, err := d.runOnce(ctx, "exec timeout", vm, s); err != nil {
		d.log.Warn("killing a timed-out command's process tree failed; VBoxManage's own timeout follows", "vm", vm, "pid", pid, "err", err)
	}
}

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
			res.TimedOut = r.killed.Load()
		default:
			return fmt.Errorf("virtualbox: %s: guest process terminated abnormally (status %d, exit code %d)", op, m.status, m.code)
		}
	case "guest-timeout", "host-timeout":
		// "Process timed out (guest side) and was terminated" or "Process
		// monitor loop timed out": exit 20 either way.
		res.TimedOut, res.Signal, res.ExitCode = true, 9, -1
	case "aborted":
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

// Run runs req to completion with one VBoxManage process (two when the
// Additions turn out not to take --cwd: nothing ran then, and the second
// run changes directory in a shell wrapper).
func (d *Driver) Run(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecResult, error) {
	stdinPath, ver, err := d.prepare(ctx, "exec", vm, req)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	res, err := d.runOnce(ctx, "exec", vm, d.spec(req, stdinPath, d.cwdOption(vm, ver)))
	if errors.Is(err, errCwdUnsupported) {
		d.noteNoCwd(vm)
		res, err = d.runOnce(ctx, "exec", vm, d.spec(req, stdinPath, false))
	}
	return res, err
}
