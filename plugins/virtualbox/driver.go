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
// VBoxManage has no asynchronous exec status, so a started command is a
// VBoxManage process the driver owns (a goroutine waits for it), tracked
// like every driver's commands by agentexec's Tracker: the process is the
// agent the Tracker polls and kills through, the Tracker's watchdog kills
// the command's process tree in the guest at its timeout, and its results
// expire. Run is ExecStart and a wait for the process.
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
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
)

// Driver defaults and limits.
const (
	// DefaultVBoxManage is the program looked up on PATH when Config.VBoxManage is empty.
	DefaultVBoxManage = "VBoxManage"
	// DefaultExecTimeout bounds a command whose request sets no Timeout.
	DefaultExecTimeout = agentexec.DefaultExecTimeout
	// DefaultMaxOutputBytes caps each output stream when a request sets no cap.
	DefaultMaxOutputBytes = 1 << 20
	// DefaultGuestTempDir is where stdin files are staged in the guest.
	DefaultGuestTempDir = "/tmp"
	// MaxExecs bounds the commands running at once (each is a VBoxManage
	// process).
	MaxExecs = 256
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

	// execs tracks the commands ExecStart started (each a process).
	execs *agentexec.Tracker
	// ctx ends when the driver closes: the VBoxManage processes of started
	// commands run under it; procs counts their waiting goroutines.
	ctx    context.Context
	cancel context.CancelFunc
	procs  sync.WaitGroup

	// mu guards probes. Never held across a VBoxManage call.
	mu     sync.Mutex
	probes map[string]probe
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
	log = log.With("driver", "virtualbox")
	d := &Driver{cfg: cfg, bin: bin, log: log, probes: map[string]probe{},
		execs: agentexec.New(agentexec.Config{Logger: log, MaxTracked: MaxExecs})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d, nil
}

// Close cancels every command still running, waits for their VBoxManage
// processes and stops the Tracker.
func (d *Driver) Close() error {
	d.execs.Close()
	d.cancel()
	d.procs.Wait()
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

// request validates req by the rules every driver shares
// (agentexec.Request: argv, timeout, output cap, absolute cwd; the default
// timeout applied) and VBoxManage's own: a program that could pass for an
// option, NUL bytes, env entries that are not KEY=VALUE.
func (d *Driver) request(op string, req hypervisor.ExecRequest) (qga.ExecRequest, error) {
	bad := func(format string, args ...any) (qga.ExecRequest, error) {
		return qga.ExecRequest{}, fmt.Errorf("virtualbox: %s: %w: "+format, append([]any{op, hypervisor.ErrInvalidArgument}, args...)...)
	}
	q, err := agentexec.Request(req, d.cfg.ExecTimeout)
	if err != nil {
		return qga.ExecRequest{}, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	switch {
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
	return q, nil
}

// spec builds the run of q, a request checked by request; stdinPath is
// the guest file holding its stdin ("" for none).
func (d *Driver) spec(q qga.ExecRequest, stdinPath string) runSpec {
	limit := q.MaxOutputBytes
	if limit == 0 {
		limit = DefaultMaxOutputBytes
	}
	argv := append([]string{q.Path}, q.Args...)
	s := runSpec{exe: q.Path, argv: argv, env: q.Env, timeout: q.Timeout, limit: limit}
	if q.Cwd != "" || stdinPath != "" {
		s.exe = "/bin/sh"
		s.argv = append([]string{"sh", "-c", wrapperScript, "vmgate-exec", q.Cwd, stdinPath}, argv...)
	}
	return s
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
}

// backstop is how much later than the driver's own timeout VBoxManage's
// --timeout fires: the Tracker's watchdog kills the whole process tree at
// the timeout (VBoxService would kill only the process); VBoxService's
// kill is the fallback should that fail.
const backstop = 30 * time.Second

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
	return r, nil
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
// returns once the guest reported the pid.
func (d *Driver) ExecStart(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	h, _, err := d.start(ctx, "exec start", vm, req)
	return h, err
}

// start validates req and starts it through the Tracker.
func (d *Driver) start(ctx context.Context, op, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, *process, error) {
	if err := d.checkName(op, vm); err != nil {
		return hypervisor.ExecHandle{}, nil, err
	}
	q, err := d.request(op, req)
	if err != nil {
		return hypervisor.ExecHandle{}, nil, err
	}
	p := &process{d: d, op: op, vm: vm, done: make(chan struct{})}
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
// command only.
type process struct {
	d      *Driver
	op, vm string
	run    *running
	cancel context.CancelFunc
	done   chan struct{} // closed once res and err are set

	res hypervisor.ExecResult
	err error
}

var _ qga.Execer = (*process)(nil)

// ExecStart stages stdin, starts the VBoxManage process (under the
// driver's context: it outlives the call) and returns the guest pid once
// VBoxManage reported it.
func (p *process) ExecStart(ctx context.Context, req qga.ExecRequest) (int64, error) {
	pid, err := p.start(ctx, req)
	if err != nil {
		return 0, vboxErr{err}
	}
	return pid, nil
}

func (p *process) start(ctx context.Context, req qga.ExecRequest) (int64, error) {
	d, op := p.d, p.op
	stdinPath := ""
	if len(req.Stdin) > 0 {
		sp, err := d.stage(ctx, op, p.vm, req.Stdin)
		if err != nil {
			return 0, err
		}
		stdinPath = sp
	}
	s := d.spec(req, stdinPath)
	rctx, cancel := context.WithTimeout(d.ctx, s.timeout+backstop+time.Minute)
	r, err := d.startRun(rctx, p.vm, s)
	if err != nil {
		cancel()
		return 0, fmt.Errorf("virtualbox: %s: %w", op, err)
	}
	p.run, p.cancel = r, cancel
	d.procs.Add(1)
	go func() {
		defer d.procs.Done()
		<-r.done
		p.res, p.err = r.result("exec", s.limit)
		cancel()
		close(p.done)
	}()
	r.waitStarted(ctx)
	if ctx.Err() != nil {
		cancel()
		<-p.done
		return 0, ctxError(op, ctx.Err())
	}
	if pid := r.stdout.PID(); pid != 0 {
		return pid, nil
	}
	<-p.done
	if p.err != nil {
		return 0, p.err
	}
	return 0, fmt.Errorf("virtualbox: %s: VBoxManage reported no pid", op)
}

// ExecStatus reports the command: running until its VBoxManage process
// has ended, then its result. An error of the ended process is final
// (agentexec.Gone: the Tracker forgets the command).
func (p *process) ExecStatus(_ context.Context, pid int64, _ int64) (qga.ExecStatus, error) {
	if p.run == nil || pid != p.run.stdout.PID() {
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
	s := runSpec{exe: "/bin/sh", argv: []string{"sh", "-c", qga.KillTreeScript, "vmgate-kill", strconv.FormatInt(pid, 10)}, timeout: time.Minute, limit: 4096}
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
