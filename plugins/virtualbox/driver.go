// Package virtualbox is vmgate's VirtualBox backend: a hypervisor.Driver
// that runs VBoxManage by argv (never through a shell).
//
// VMs come from `VBoxManage list vms` and `showvminfo <vm> --machinereadable`.
// Commands run with `guestcontrol <vm> run --verbose --wait-stdout
// --wait-stderr`: VBoxManage's own exit code cannot carry a guest exit code
// above 93 nor a signal number (guest codes 1-93 become 33-125, larger ones
// 126, a signal 18, a guest-side timeout 20), so the driver reads the exact
// status and the guest pid from the lines --verbose prints around the
// guest's output ("Process '…' (PID n) started", "Exit code=n (Status=s
// [...])"). `run` has no stdin and no working directory option in
// VirtualBox 7.0, so a request with Stdin or Cwd runs through a POSIX shell
// wrapper in the guest (/bin/sh; stdin is first copied into the guest with
// copyto). Files move with copyto/copyfrom through 0600 host temp files.
//
// VBoxManage has no asynchronous exec status, so ExecStart runs VBoxManage
// in a goroutine that owns the process; the handle names an entry of a
// bounded table whose results expire.
//
// Guest credentials come from the config: a user name and a password
// file, passed with --passwordfile (never a password on the command line).
// VM names and guest paths that begin with '-' or hold NUL or a line break
// are refused before any VBoxManage call.
package virtualbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/vmgate/vmgate/hypervisor"
)

// Driver defaults and limits.
const (
	// DefaultVBoxManage is the program looked up on PATH when Config.VBoxManage is empty.
	DefaultVBoxManage = "VBoxManage"
	// DefaultExecTimeout bounds a command whose request sets no Timeout.
	DefaultExecTimeout = 10 * time.Minute
	// DefaultMaxOutputBytes caps each output stream when a request sets no cap.
	DefaultMaxOutputBytes = 1 << 20
	// DefaultGuestTempDir is where stdin files are staged in the guest.
	DefaultGuestTempDir = "/tmp"
	// MaxExecs bounds the table of commands started with ExecStart.
	MaxExecs = 256
	// ResultTTL is how long a finished command's result waits for ExecStatus.
	ResultTTL = 10 * time.Minute
	// DefaultMaxFileBytes caps FileRead when maxBytes is 0.
	DefaultMaxFileBytes = 16 << 20
	// probeTTL is how long the guest-exec probe of AgentInfo is trusted.
	probeTTL = 5 * time.Second
	// cancelGrace is how long VBoxManage gets after SIGINT (it then closes
	// the guest session, which ends the guest process) before SIGKILL.
	cancelGrace = 5 * time.Second
)

// VBoxManage exit codes of `guestcontrol run` (frozen since VirtualBox 4.1/5.0).
const (
	exitFailure      = 1
	exitSyntax       = 2
	exitTermSignal   = 18
	exitTermAbend    = 19
	exitTimeout      = 20
	exitMappedFirst  = 33
	exitMappedLast   = 125
	exitMappedBig    = 126
	exitDisplacement = 32
)

// Config configures the Driver.
type Config struct {
	// VBoxManage is the program to run; empty means DefaultVBoxManage on PATH.
	VBoxManage string
	// Username is the guest account guest control logs in as.
	Username string
	// PasswordFile holds that account's password (VBoxManage --passwordfile).
	PasswordFile string
	// GuestTempDir is an absolute guest directory for staged stdin files.
	GuestTempDir string
	// ExecTimeout bounds a command whose request has no Timeout.
	ExecTimeout time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Driver is the VirtualBox backend. It is safe for concurrent use.
type Driver struct {
	cfg Config
	bin string
	log *slog.Logger

	// mu guards execs and probes. Never held across a VBoxManage call.
	mu     sync.Mutex
	execs  map[string]*execEntry
	probes map[string]probe
	closed bool
}

var (
	_ hypervisor.Driver = (*Driver)(nil)
	_ hypervisor.Runner = (*Driver)(nil)
	_ hypervisor.Closer = (*Driver)(nil)
)

type probe struct {
	enabled bool
	at      time.Time
}

// New checks cfg and returns a Driver. VBoxManage is not run yet.
func New(cfg Config) (*Driver, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("virtualbox: config: %w", err)
	}
	if cfg.VBoxManage == "" {
		cfg.VBoxManage = DefaultVBoxManage
	}
	bin, err := exec.LookPath(cfg.VBoxManage)
	if err != nil {
		return nil, fmt.Errorf("virtualbox: config: vboxmanage: %w", err)
	}
	if abs, err := filepath.Abs(cfg.PasswordFile); err == nil {
		cfg.PasswordFile = abs
	}
	if _, err := os.ReadFile(cfg.PasswordFile); err != nil {
		return nil, fmt.Errorf("virtualbox: config: password file: %w", err)
	}
	if cfg.GuestTempDir == "" {
		cfg.GuestTempDir = DefaultGuestTempDir
	}
	if cfg.ExecTimeout == 0 {
		cfg.ExecTimeout = DefaultExecTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Driver{cfg: cfg, bin: bin, log: log.With("driver", "virtualbox"), execs: map[string]*execEntry{}, probes: map[string]probe{}}, nil
}

// Close cancels every command still running and forgets the table.
func (d *Driver) Close() error {
	d.mu.Lock()
	d.closed = true
	execs := d.execs
	d.execs = map[string]*execEntry{}
	d.mu.Unlock()
	for _, e := range execs {
		e.cancel()
		<-e.done
	}
	return nil
}

// CheckVMName refuses a VM name VBoxManage could take for an option or
// that could break its line-oriented output: empty, beginning with '-',
// holding NUL, CR or LF, or not UTF-8.
func CheckVMName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty VM name", hypervisor.ErrInvalidArgument)
	case strings.HasPrefix(name, "-"):
		return fmt.Errorf("%w: VM name %q begins with '-'", hypervisor.ErrInvalidArgument, name)
	case strings.ContainsAny(name, "\x00\r\n"):
		return fmt.Errorf("%w: VM name %q holds NUL or a line break", hypervisor.ErrInvalidArgument, name)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: VM name is not UTF-8", hypervisor.ErrInvalidArgument)
	}
	return nil
}

// checkGuestPath refuses a guest path that is not absolute, begins with
// '-', or holds NUL or a line break.
func checkGuestPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("%w: guest path %q is not absolute", hypervisor.ErrInvalidArgument, p)
	case strings.ContainsAny(p, "\x00\r\n"):
		return fmt.Errorf("%w: guest path %q holds NUL or a line break", hypervisor.ErrInvalidArgument, p)
	case !utf8.ValidString(p):
		return fmt.Errorf("%w: guest path is not UTF-8", hypervisor.ErrInvalidArgument)
	}
	return nil
}

func (d *Driver) checkName(op, name string) error {
	if err := CheckVMName(name); err != nil {
		return fmt.Errorf("virtualbox: %s: %w: %w", op, hypervisor.ErrUnknownVM, err)
	}
	return nil
}

// command builds VBoxManage with args, owned by the caller: SIGINT on
// cancel (VBoxManage then closes its guest session), SIGKILL after
// cancelGrace, SIGKILL if this process dies.
func (d *Driver) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, d.bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = cancelGrace
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// result of one VBoxManage run that is not guestcontrol run.
type result struct {
	stdout, stderr []byte
	code           int
}

// vbox runs VBoxManage args to completion (output bounded).
func (d *Driver) vbox(ctx context.Context, args ...string) (result, error) {
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	cmd := d.command(ctx, args...)
	out := &capped{limit: 4 << 20}
	errb := &capped{limit: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, errb
	err := cmd.Run()
	r := result{}
	r.stdout, _ = out.bytes()
	r.stderr, _ = errb.bytes()
	if err != nil {
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return r, err
		}
		r.code = ee.ExitCode()
	}
	return r, nil
}

// vboxError turns VBoxManage's error lines into the hypervisor sentinels.
func vboxError(op string, r result) error {
	msg := errorText(r.stderr)
	switch {
	case strings.Contains(msg, "Could not find a registered machine"), strings.Contains(msg, "VBOX_E_OBJECT_NOT_FOUND"):
		return fmt.Errorf("virtualbox: %s: %w: %s", op, hypervisor.ErrUnknownVM, msg)
	case strings.Contains(msg, "The guest execution service is not available"):
		return fmt.Errorf("virtualbox: %s: %w (%s)", op, &hypervisor.CommandDisabledError{Command: "guest-exec"}, msg)
	case strings.Contains(msg, "The guest execution service is not ready"),
		strings.Contains(msg, "Guest Additions are not installed or not ready"),
		strings.Contains(msg, "Error starting guest session"):
		return fmt.Errorf("virtualbox: %s: %w: %s", op, hypervisor.ErrAgentUnavailable, msg)
	case strings.Contains(msg, "is not running"), strings.Contains(msg, "VMM device is not available"):
		return fmt.Errorf("virtualbox: %s: %w: %s", op, hypervisor.ErrVMNotRunning, msg)
	case r.code == exitSyntax:
		return fmt.Errorf("virtualbox: %s: VBoxManage refused its arguments (exit 2): %s", op, msg)
	}
	if msg == "" {
		msg = "no message"
	}
	return fmt.Errorf("virtualbox: %s: VBoxManage exit %d: %s", op, r.code, msg)
}

// errorText returns VBoxManage's "error:" lines, without the prefix.
func errorText(stderr []byte) string {
	var msgs []string
	for _, line := range strings.Split(string(stderr), "\n") {
		if i := strings.Index(line, ": error: "); i >= 0 {
			m := strings.TrimSpace(line[i+len(": error: "):])
			if strings.HasPrefix(m, "Details: ") || strings.HasPrefix(m, "Context: ") {
				continue
			}
			msgs = append(msgs, m)
		}
	}
	if len(msgs) == 0 {
		return strings.TrimSpace(string(stderr))
	}
	return strings.Join(msgs, "; ")
}

func ctxError(op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("virtualbox: %s: %w: %w", op, hypervisor.ErrTimeout, err)
	}
	return fmt.Errorf("virtualbox: %s: %w", op, err)
}

// machineInfo is the part of showvminfo --machinereadable the driver uses.
type machineInfo struct {
	State    string
	RunLevel int
	Version  string
}

// ParseMachineReadable parses `showvminfo --machinereadable` output:
// key=value lines, keys and string values in double quotes.
func ParseMachineReadable(out []byte) map[string]string {
	kv := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r"), "=")
		if !ok {
			continue
		}
		kv[unquote(k)] = unquote(v)
	}
	return kv
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

func (d *Driver) showVMInfo(ctx context.Context, op, name string) (machineInfo, error) {
	r, err := d.vbox(ctx, "showvminfo", name, "--machinereadable")
	if err != nil {
		return machineInfo{}, ctxError(op, err)
	}
	if r.code != 0 {
		return machineInfo{}, vboxError(op, r)
	}
	kv := ParseMachineReadable(r.stdout)
	mi := machineInfo{State: kv["VMState"], Version: kv["GuestAdditionsVersion"]}
	if mi.State == "" {
		return machineInfo{}, fmt.Errorf("virtualbox: %s: showvminfo printed no VMState", op)
	}
	mi.RunLevel, _ = strconv.Atoi(kv["GuestAdditionsRunLevel"])
	return mi, nil
}

func stateOf(vmState string) hypervisor.State {
	switch vmState {
	case "running":
		return hypervisor.StateRunning
	case "paused":
		return hypervisor.StatePaused
	case "poweroff", "saved", "aborted", "aborted-saved", "teleported":
		return hypervisor.StateStopped
	}
	return hypervisor.StateUnknown
}

// ParseListVMs parses `VBoxManage list vms`: one `"name" {uuid}` per line.
func ParseListVMs(out []byte) ([]string, error) {
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" {
			continue
		}
		i := strings.LastIndex(line, "\" {")
		if !strings.HasPrefix(line, "\"") || i < 1 || !strings.HasSuffix(line, "}") {
			return nil, fmt.Errorf("unexpected line %q", line)
		}
		names = append(names, line[1:i])
	}
	return names, nil
}

// ListVMs lists the registered VMs with their states, sorted by name. VMs
// whose names the driver refuses (see CheckVMName) are left out.
func (d *Driver) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	r, err := d.vbox(ctx, "list", "vms")
	if err != nil {
		return nil, ctxError("list vms", err)
	}
	if r.code != 0 {
		return nil, vboxError("list vms", r)
	}
	names, err := ParseListVMs(r.stdout)
	if err != nil {
		return nil, fmt.Errorf("virtualbox: list vms: %w", err)
	}
	sort.Strings(names)
	var vms []hypervisor.VM
	for _, name := range names {
		if CheckVMName(name) != nil {
			d.log.Warn("skipping a VM whose name vmgate refuses", "name", name)
			continue
		}
		mi, err := d.showVMInfo(ctx, "list vms", name)
		if errors.Is(err, hypervisor.ErrUnknownVM) {
			continue // unregistered meanwhile
		}
		if err != nil {
			return nil, err
		}
		vms = append(vms, hypervisor.VM{Name: name, State: stateOf(mi.State), Info: "VMState " + mi.State, Agent: mi.RunLevel > 0})
	}
	return vms, nil
}

// Status reports VMState and whether the Guest Additions run.
func (d *Driver) Status(ctx context.Context, name string) (hypervisor.Status, error) {
	if err := d.checkName("status", name); err != nil {
		return hypervisor.Status{}, err
	}
	mi, err := d.showVMInfo(ctx, "status", name)
	if err != nil {
		return hypervisor.Status{}, err
	}
	st := hypervisor.Status{Name: name, State: stateOf(mi.State), Detail: mi.State}
	if st.State == hypervisor.StateRunning && mi.RunLevel > 0 {
		st.AgentConnected = true
		st.AgentVersion = mi.Version
	}
	return st, nil
}

// AgentInfo reports the Guest Additions version and the operations the
// driver offers. Guest Additions have no command list: whether guest
// control works is probed by running `/bin/sh -c :` in the guest (cached
// for a few seconds); the file commands use the same service.
func (d *Driver) AgentInfo(ctx context.Context, name string) (hypervisor.AgentInfo, error) {
	if err := d.checkName("agent info", name); err != nil {
		return hypervisor.AgentInfo{}, err
	}
	mi, err := d.showVMInfo(ctx, "agent info", name)
	if err != nil {
		return hypervisor.AgentInfo{}, err
	}
	if stateOf(mi.State) != hypervisor.StateRunning || mi.RunLevel == 0 {
		return hypervisor.AgentInfo{}, fmt.Errorf("virtualbox: agent info: %w: VMState %s, Guest Additions run level %d", hypervisor.ErrAgentUnavailable, mi.State, mi.RunLevel)
	}
	enabled, err := d.probe(ctx, name, true)
	if err != nil {
		return hypervisor.AgentInfo{}, err
	}
	info := hypervisor.AgentInfo{Version: mi.Version}
	if info.Version == "" {
		info.Version = "run level " + strconv.Itoa(mi.RunLevel)
	}
	for _, c := range []string{"guest-exec", "guest-exec-status", "guest-file-read", "guest-file-write"} {
		info.Commands = append(info.Commands, hypervisor.AgentCommand{Name: c, Enabled: enabled})
	}
	return info, nil
}

// probe reports whether guest control can run a process in vm.
func (d *Driver) probe(ctx context.Context, vm string, fresh bool) (bool, error) {
	d.mu.Lock()
	p, ok := d.probes[vm]
	d.mu.Unlock()
	if ok && !fresh && time.Since(p.at) < probeTTL {
		return p.enabled, nil
	}
	res, err := d.runOnce(ctx, "agent info", vm, runSpec{exe: "/bin/sh", argv: []string{"sh", "-c", ":"}, timeout: time.Minute, limit: 4096})
	enabled := true
	switch {
	case errors.Is(err, hypervisor.ErrCommandDisabled):
		enabled = false
	case err != nil:
		return false, err
	case !res.Exited || res.ExitCode != 0:
		return false, fmt.Errorf("virtualbox: agent info: probe `/bin/sh -c :` ended with exit %d, signal %d", res.ExitCode, res.Signal)
	}
	d.mu.Lock()
	d.probes[vm] = probe{enabled: enabled, at: time.Now()}
	d.mu.Unlock()
	return enabled, nil
}

// runSpec is one `guestcontrol run`.
type runSpec struct {
	exe     string
	argv    []string // argv[0] first
	env     []string
	timeout time.Duration
	limit   int64
}

// wrapperScript runs "$@" in directory $1 (when not empty) with stdin from
// file $2 (when not empty, removed once open). Everything is argv: nothing
// is interpolated. A directory or file that cannot be opened exits 2 with
// the shell's message on stderr.
const wrapperScript = `f=$2; if [ -n "$f" ]; then exec <"$f" || exit 2; rm -f -- "$f"; fi; [ -z "$1" ] || cd -- "$1" || exit 2; shift 2; exec "$@"`

// spec validates req and builds the run.
func (d *Driver) spec(op string, req hypervisor.ExecRequest, stdinPath string) (runSpec, error) {
	bad := func(format string, args ...any) (runSpec, error) {
		return runSpec{}, fmt.Errorf("virtualbox: %s: %w: "+format, append([]any{op, hypervisor.ErrInvalidArgument}, args...)...)
	}
	switch {
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return bad("empty argv")
	case req.Timeout < 0:
		return bad("negative timeout")
	case req.MaxOutputBytes < 0:
		return bad("negative max output bytes")
	case req.Cwd != "" && checkGuestPath(req.Cwd) != nil:
		return bad("cwd: %v", checkGuestPath(req.Cwd))
	case strings.HasPrefix(req.Argv[0], "-") || strings.ContainsAny(req.Argv[0], "\x00\r\n"):
		return bad("program %q begins with '-' or holds NUL or a line break", req.Argv[0])
	}
	for i, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return bad("argv[%d] holds NUL", i)
		}
	}
	for i, e := range req.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsAny(e, "\x00") {
			return bad("env[%d] %q is not KEY=VALUE", i, e)
		}
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = d.cfg.ExecTimeout
	}
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = DefaultMaxOutputBytes
	}
	s := runSpec{exe: req.Argv[0], argv: req.Argv, env: req.Env, timeout: timeout, limit: limit}
	if req.Cwd != "" || stdinPath != "" {
		s.exe = "/bin/sh"
		s.argv = append([]string{"sh", "-c", wrapperScript, "vmgate-exec", req.Cwd, stdinPath}, req.Argv...)
	}
	return s, nil
}

// runArgs is the argv of `guestcontrol run` for s.
func (d *Driver) runArgs(vm string, s runSpec) []string {
	args := []string{"guestcontrol", vm, "run",
		"--username", d.cfg.Username, "--passwordfile", d.cfg.PasswordFile,
		"--verbose", "--wait-stdout", "--wait-stderr",
		"--timeout", strconv.FormatInt(max(1, s.timeout.Milliseconds()), 10)}
	for _, e := range s.env {
		args = append(args, "--putenv", e)
	}
	args = append(args, "--exe", s.exe, "--")
	return append(args, s.argv...)
}

// running is one `guestcontrol run` in progress.
type running struct {
	cmd    *exec.Cmd
	stdout *verboseStdout
	stderr *capped
	done   chan struct{} // closed after Wait
	err    error         // Wait's error, set before done is closed
	// killed is set when the driver's timeout killed the process tree.
	killed atomic.Bool
}

// backstop is how much later than the driver's own timeout VBoxManage's
// --timeout fires: the driver kills the whole process tree at the timeout
// (VBoxService would kill only the process); VBoxService's kill is the
// fallback should that fail.
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

func (d *Driver) startRun(ctx context.Context, vm string, s runSpec) (*running, error) {
	vs := s
	vs.timeout = s.timeout + backstop
	cmd := d.command(ctx, d.runArgs(vm, vs)...)
	r := &running{cmd: cmd, stdout: newVerboseStdout(s.limit), stderr: &capped{limit: max(s.limit, 64<<10)}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.stdout, r.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		r.err = cmd.Wait()
		close(r.done)
	}()
	go d.watchdog(vm, r, s.timeout)
	return r, nil
}

// watchdog kills the command's process tree in the guest when timeout
// passes before VBoxManage is done.
func (d *Driver) watchdog(vm string, r *running, timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-r.done:
		return
	case <-t.C:
	}
	pid := r.stdout.PID()
	if pid == 0 {
		return // not started yet: VBoxManage's own --timeout covers it
	}
	r.killed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), backstop)
	defer cancel()
	s := runSpec{exe: "/bin/sh", argv: []string{"sh", "-c", killTreeScript, "vmgate-kill", strconv.FormatInt(pid, 10)}, timeout: time.Minute, limit: 4096}
	if _, err := d.runOnce(ctx, "exec timeout", vm, s); err != nil {
		d.log.Warn("killing a timed-out command's process tree failed; VBoxService's timeout follows", "vm", vm, "pid", pid, "err", err)
	}
}

// waitStarted waits for the pid line or the end of VBoxManage.
func (r *running) waitStarted(ctx context.Context) {
	select {
	case <-r.stdout.started:
	case <-r.done:
	case <-ctx.Done():
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
	stdout, outTrunc, o := r.stdout.finish()
	stderr, _ := r.stderr.bytes()
	pid := r.stdout.PID()
	if pid == 0 || !o.ok {
		// The process never started, or VBoxManage failed around it.
		return hypervisor.ExecResult{}, vboxError(op, result{stdout: []byte(r.stdout.preamble()), stderr: stderr, code: code})
	}
	errTrunc := int64(len(stderr)) > limit
	if errTrunc {
		stderr = stderr[:limit]
	}
	res := hypervisor.ExecResult{PID: pid, Exited: true, Stdout: stdout, Stderr: stderr, StdoutTruncated: outTrunc, StderrTruncated: errTrunc}
	switch {
	case o.timedOut:
		res.TimedOut, res.Signal, res.ExitCode = true, 9, -1
	case r.killed.Load() && o.status == statusTerminatedSignal:
		res.TimedOut, res.Signal, res.ExitCode = true, o.code, -1
	case o.status == statusTerminatedNormally:
		res.ExitCode = o.code
		if want := mappedExit(o.code); code != want {
			return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: VBoxManage exit %d disagrees with its verbose exit code %d (want %d)", op, code, o.code, want)
		}
	case o.status == statusTerminatedSignal:
		res.Signal, res.ExitCode = o.code, -1
	case o.status == statusTerminatedAbnormally:
		return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: guest process terminated abnormally (exit code %d)", op, o.code)
	default:
		return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: guest process status %d", op, o.status)
	}
	return res, nil
}

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
	r, err := d.startRun(ctx, vm, s)
	if err != nil {
		return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	<-r.done
	if ctx.Err() != nil {
		return hypervisor.ExecResult{}, ctxError(op, ctx.Err())
	}
	return r.result(op, s.limit)
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

// prepare validates req, checks the VM name and stages stdin.
func (d *Driver) prepare(ctx context.Context, op, vm string, req hypervisor.ExecRequest) (runSpec, error) {
	if err := d.checkName(op, vm); err != nil {
		return runSpec{}, err
	}
	if _, err := d.spec(op, req, ""); err != nil {
		return runSpec{}, err
	}
	stdinPath := ""
	if len(req.Stdin) > 0 {
		p, err := d.stage(ctx, op, vm, req.Stdin)
		if err != nil {
			return runSpec{}, err
		}
		stdinPath = p
	}
	return d.spec(op, req, stdinPath)
}

// Run runs req to completion with one VBoxManage process.
func (d *Driver) Run(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecResult, error) {
	s, err := d.prepare(ctx, "exec", vm, req)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	return d.runOnce(ctx, "exec", vm, s)
}

// execEntry is a command started by ExecStart: a goroutine owns its
// VBoxManage process.
type execEntry struct {
	vm     string
	pid    int64
	limit  int64
	run    *running
	cancel context.CancelFunc
	done   chan struct{} // closed when the result is in

	// res and err are set before done is closed.
	res hypervisor.ExecResult
	err error
	// expires is guarded by Driver.mu.
	expires time.Time
}

// ExecStart starts req in a VBoxManage process owned by the driver and
// returns once the guest reported the pid.
func (d *Driver) ExecStart(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	const op = "exec start"
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.ExecHandle{}, err
	}
	if _, err := d.spec(op, req, ""); err != nil {
		return hypervisor.ExecHandle{}, err
	}
	d.mu.Lock()
	d.expireLocked()
	full, closed := len(d.execs) >= MaxExecs, d.closed
	d.mu.Unlock()
	switch {
	case closed:
		return hypervisor.ExecHandle{}, fmt.Errorf("virtualbox: %s: driver closed", op)
	case full:
		return hypervisor.ExecHandle{}, fmt.Errorf("virtualbox: %s: %d commands already tracked; poll or wait for them", op, MaxExecs)
	}
	s, err := d.prepare(ctx, op, vm, req)
	if err != nil {
		return hypervisor.ExecHandle{}, err
	}
	// The process outlives this call: its context is the driver's, bounded
	// by the command's own timeout plus a margin.
	rctx, cancel := context.WithTimeout(context.Background(), s.timeout+time.Minute)
	started := time.Now()
	r, err := d.startRun(rctx, vm, s)
	if err != nil {
		cancel()
		return hypervisor.ExecHandle{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	e := &execEntry{vm: vm, limit: s.limit, run: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		<-r.done
		e.res, e.err = r.result("exec", s.limit)
		cancel()
		d.mu.Lock()
		e.expires = time.Now().Add(ResultTTL)
		d.mu.Unlock()
		close(e.done)
	}()
	r.waitStarted(ctx)
	if ctx.Err() != nil {
		cancel()
		<-e.done
		return hypervisor.ExecHandle{}, ctxError(op, ctx.Err())
	}
	e.pid = r.stdout.PID()
	if e.pid == 0 {
		<-e.done
		if e.err != nil {
			return hypervisor.ExecHandle{}, e.err
		}
		return hypervisor.ExecHandle{}, fmt.Errorf("virtualbox: %s: VBoxManage reported no pid", op)
	}
	var kb [16]byte
	rand.Read(kb[:])
	key := hex.EncodeToString(kb[:])
	d.mu.Lock()
	d.execs[key] = e
	d.mu.Unlock()
	return hypervisor.ExecHandle{PID: e.pid, Token: key, StartedAt: started}, nil
}

// expireLocked drops finished results nobody collected in time.
func (d *Driver) expireLocked() {
	now := time.Now()
	for k, e := range d.execs {
		if !e.expires.IsZero() && now.After(e.expires) {
			delete(d.execs, k)
		}
	}
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
	d.mu.Lock()
	d.expireLocked()
	e := d.execs[h.Token]
	d.mu.Unlock()
	if e == nil || e.vm != vm || e.pid != h.PID {
		// Tell an unknown VM from an unknown handle.
		if _, err := d.showVMInfo(ctx, op, vm); err != nil {
			return hypervisor.ExecResult{}, err
		}
		return hypervisor.ExecResult{}, fmt.Errorf("virtualbox: %s: %w: pid %d", op, hypervisor.ErrUnknownExec, h.PID)
	}
	select {
	case <-e.done:
	default:
		return hypervisor.ExecResult{PID: e.pid}, nil
	}
	d.mu.Lock()
	delete(d.execs, h.Token)
	d.mu.Unlock()
	return e.res, e.err
}

// copyTo writes data into the guest file dst through a 0600 host temp file.
func (d *Driver) copyTo(ctx context.Context, op, vm string, data []byte, dst string) error {
	dir, err := os.MkdirTemp("", "vmgate-vbox-")
	if err != nil {
		return fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "data")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		return fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	r, err := d.vbox(ctx, "guestcontrol", vm, "copyto",
		"--username", d.cfg.Username, "--passwordfile", d.cfg.PasswordFile,
		src, dst)
	if err != nil {
		return ctxError(op, err)
	}
	if r.code != 0 {
		return vboxError(op, r)
	}
	return nil
}

// FileRead copies path out of the guest (copyfrom into a private host
// directory) and returns at most maxBytes of it.
func (d *Driver) FileRead(ctx context.Context, vm string, p string, maxBytes int64) (hypervisor.FileContent, error) {
	const op = "file read"
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.FileContent{}, err
	}
	if err := checkGuestPath(p); err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	if maxBytes < 0 {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: %w: negative max bytes", op, hypervisor.ErrInvalidArgument)
	}
	if maxBytes == 0 {
		maxBytes = DefaultMaxFileBytes
	}
	dir, err := os.MkdirTemp("", "vmgate-vbox-")
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	defer os.RemoveAll(dir)
	r, err := d.vbox(ctx, "guestcontrol", vm, "copyfrom",
		"--username", d.cfg.Username, "--passwordfile", d.cfg.PasswordFile,
		"--target-directory", dir, p)
	if err != nil {
		return hypervisor.FileContent{}, ctxError(op, err)
	}
	if r.code != 0 {
		return hypervisor.FileContent{}, vboxError(op, r)
	}
	f, err := os.Open(filepath.Join(dir, path.Base(p)))
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: copyfrom left no file: %w", op, err)
	}
	defer f.Close()
	buf := make([]byte, maxBytes+1)
	n, err := readFull(f, buf)
	if err != nil {
		return hypervisor.FileContent{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	if int64(n) > maxBytes {
		return hypervisor.FileContent{Data: buf[:maxBytes], Truncated: true}, nil
	}
	return hypervisor.FileContent{Data: buf[:n]}, nil
}

func readFull(f *os.File, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return n, err
			}
			return n, nil // EOF
		}
	}
	return n, nil
}

// FileWrite copies data into the guest file p (copyto), then applies mode
// with chmod through guestcontrol run.
func (d *Driver) FileWrite(ctx context.Context, vm string, p string, data []byte, mode uint32) error {
	const op = "file write"
	if err := d.checkName(op, vm); err != nil {
		return err
	}
	if err := checkGuestPath(p); err != nil {
		return fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	if mode > 0o7777 {
		return fmt.Errorf("virtualbox: %s: %w: mode %#o", op, hypervisor.ErrInvalidArgument, mode)
	}
	if err := d.copyTo(ctx, op, vm, data, p); err != nil {
		return err
	}
	if mode == 0 {
		return nil
	}
	s := runSpec{exe: "/bin/chmod", argv: []string{"chmod", strconv.FormatUint(uint64(mode), 8), "--", p}, timeout: time.Minute, limit: 4096}
	res, err := d.runOnce(ctx, op, vm, s)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Signal != 0 {
		return fmt.Errorf("virtualbox: %s: chmod: exit %d: %s", op, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return nil
}

// Power maps shutdown to the ACPI power button, reset and stop to
// controlvm reset and poweroff, start to startvm --type headless. VirtualBox
// has no guest reboot: reboot is ErrNotSupported.
func (d *Driver) Power(ctx context.Context, vm string, action hypervisor.PowerAction) error {
	if !action.Valid() {
		return fmt.Errorf("virtualbox: power: %w: unknown action %q", hypervisor.ErrInvalidArgument, action)
	}
	op := "power " + string(action)
	if err := d.checkName(op, vm); err != nil {
		return err
	}
	var args []string
	switch action {
	case hypervisor.PowerShutdown:
		args = []string{"controlvm", vm, "acpipowerbutton"}
	case hypervisor.PowerReset:
		args = []string{"controlvm", vm, "reset"}
	case hypervisor.PowerStop:
		args = []string{"controlvm", vm, "poweroff"}
	case hypervisor.PowerStart:
		args = []string{"startvm", vm, "--type", "headless"}
	case hypervisor.PowerReboot:
		if _, err := d.showVMInfo(ctx, op, vm); err != nil {
			return err
		}
		return fmt.Errorf("virtualbox: %s: %w: VirtualBox has no guest reboot (use shutdown then start, or reset)", op, hypervisor.ErrNotSupported)
	}
	r, err := d.vbox(ctx, args...)
	if err != nil {
		return ctxError(op, err)
	}
	if r.code != 0 {
		return vboxError(op, r)
	}
	return nil
}
