// Package guestctl is the host side of vmgate-guest, the in-guest helper:
// it makes sure the helper binary is in the guest (pushing it through the
// driver's file channel when it is missing or its SHA-256 differs, cached
// per VM) and runs its commands through the driver's exec channel with
// typed results and typed errors. It lives on the host side because it
// drives a hypervisor.Driver; nothing under guest/ imports hypervisor.
//
// A guard's refusal is a *Error with Code "refused" (errors.Is(err,
// ErrRefused)) and a Reason (wire.ReasonInit, ReasonKernelThread,
// ReasonGuestAgent, ReasonPidReused, ...); a bad argument wraps
// hypervisor.ErrInvalidArgument and is found before anything reaches the
// guest; driver failures come back as the driver returned them (wrapped),
// and a reply that is not vmgate-guest's JSON is a *ReplyError.
package guestctl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/keylock"
)

// GuestPath is where the helper lives in the guest.
const GuestPath = "/usr/local/bin/vmgate-guest"

// The wire types, re-exported so callers need only this package.
type (
	Process       = wire.Process
	RunRequest    = wire.RunRequest
	RunResult     = wire.RunResult
	KillResult    = wire.KillResult
	Limits        = wire.Limits
	SessionCreate = wire.SessionCreate
	Sandbox       = wire.Sandbox
	Enforced      = wire.Enforced
	Session       = wire.Session
	DestroyResult = wire.DestroyResult
	ReapResult    = wire.ReapResult
	Metrics       = wire.Metrics
	RestoreResult = wire.RestoreResult
)

// Sentinel errors: a *Error unwraps to the one matching its code.
var (
	// ErrRefused: a guard refused (Error.Reason says which).
	ErrRefused = errors.New("refused")
	// ErrNotFound: no such process or session in the guest.
	ErrNotFound = errors.New("not found")
	// ErrExists: the session exists already.
	ErrExists = errors.New("already exists")
	// ErrGuest: vmgate-guest failed in the guest (I/O, cgroup, kill loop).
	ErrGuest = errors.New("guest helper failed")
)

// Error is vmgate-guest's own error reply.
type Error struct {
	Op      string // "kill", "session destroy", ...
	Code    string // wire.CodeRefused, ...
	Reason  string // for refusals: wire.ReasonInit, ...
	Message string
}

func (e *Error) Error() string { return "helper: " + e.Op + ": " + e.Message }

// Unwrap maps the code to a sentinel (invalid arguments to hypervisor.ErrInvalidArgument).
func (e *Error) Unwrap() error {
	switch e.Code {
	case wire.CodeRefused:
		return ErrRefused
	case wire.CodeNotFound:
		return ErrNotFound
	case wire.CodeExists:
		return ErrExists
	case wire.CodeInvalid:
		return hypervisor.ErrInvalidArgument
	}
	return ErrGuest
}

// ReplyError: vmgate-guest's output was not one JSON reply (a protocol failure).
type ReplyError struct {
	Op       string
	ExitCode int
	Signal   int
	Stdout   []byte
	Stderr   []byte
	Cause    error
}

func (e *ReplyError) Error() string {
	return fmt.Sprintf("helper: %s: bad reply from vmgate-guest (exit %d, signal %d): %v; stderr %q",
		e.Op, e.ExitCode, e.Signal, e.Cause, truncate(e.Stderr, 512))
}

func (e *ReplyError) Unwrap() error { return e.Cause }

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// CommandTimeout bounds every command but run (destroy's kill loop included).
const CommandTimeout = 60 * time.Second

// runMargin is added to a run's own timeout for the exec that carries it,
// so the guest side kills its tree and replies before the driver gives up.
const runMargin = 15 * time.Second

// Helper runs vmgate-guest on a driver's VMs, by the road each VM has
// (road.go). Safe for concurrent use.
type Helper struct {
	d        hypervisor.Driver
	bins     Binaries
	callRoad bool // WithCallRoad

	mu      sync.Mutex        // mu guards ensured, roads and tr
	ensured map[string]string // vm -> SHA-256 verified in the guest; Forget drops a VM
	roads   map[string]*Road  // vm -> its road, once decided; Forget drops a VM
	// vmLocks: one Ensure per VM at a time (key vm), one road decision
	// per VM at a time (key roadLockKey+vm, taken first, never while
	// holding vm's); an entry lives only while held or waited for.
	vmLocks  keylock.Map
	tr       Transport       // the file, dir and archive commands' (transport.go)
	pushHook func(vm string) // tests: called after each push
}

// Option configures a Helper.
type Option func(*Helper)

// WithCallRoad sends every command to VMs the driver has no channel to
// through `vmgate-guest call` (the agent's exec to the resident helper's
// socket) rather than a vmgate-guest process per command. Jobs take that
// road on such VMs either way.
func WithCallRoad(on bool) Option { return func(h *Helper) { h.callRoad = on } }

// New returns a Helper running on d with builds from bins.
func New(d hypervisor.Driver, bins Binaries, opts ...Option) *Helper {
	h := &Helper{d: d, bins: bins, ensured: map[string]string{}, roads: map[string]*Road{}}
	h.tr = &execTransport{h: h}
	for _, o := range opts {
		o(h)
	}
	return h
}

// NewSessionID mints an unguessable session id (32 lowercase hex digits, 128 bits).
func NewSessionID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Forget drops the cached check of vm and its road, so the next call
// checks (and pushes) again and looks for its resident helper: after an
// exec failure, and when the VM is deleted (vm_delete), so that the cache
// holds only VMs that exist.
func (h *Helper) Forget(vm string) {
	h.mu.Lock()
	delete(h.ensured, vm)
	delete(h.roads, vm)
	h.mu.Unlock()
}

// forgetBinary drops the cached check of vm's binary only.
func (h *Helper) forgetBinary(vm string) {
	h.mu.Lock()
	delete(h.ensured, vm)
	h.mu.Unlock()
}

// Ensure makes sure GuestPath in vm is the build for the guest's
// architecture: it asks `uname -m`, compares `sha256sum GuestPath` with the
// build's SHA-256 and, when missing or different, writes the build to a
// temporary name (mode 0755) and renames it into place, so a half-written
// helper never runs; then it checks the hash again. The result is cached
// per VM until Forget or an exec failure.
func (h *Helper) Ensure(ctx context.Context, vm string) error {
	_, err := h.ensure(ctx, vm)
	return err
}

// ensure reports whether it pushed.
func (h *Helper) ensure(ctx context.Context, vm string) (pushed bool, err error) {
	h.mu.Lock()
	_, ok := h.ensured[vm]
	h.mu.Unlock()
	if ok {
		return false, nil
	}
	unlock, err := h.vmLocks.Lock(ctx, vm)
	if err != nil {
		return false, fmt.Errorf("helper: ensure %s: waiting for another check of the helper: %w", vm, err)
	}
	defer unlock()
	h.mu.Lock()
	_, ok = h.ensured[vm]
	h.mu.Unlock()
	if ok {
		return false, nil
	}
	arch, err := h.guestArch(ctx, vm)
	if err != nil {
		return false, err
	}
	bin, err := h.bins.Binary(arch)
	if err != nil {
		return false, fmt.Errorf("helper: ensure %s: %w", vm, err)
	}
	sum, err := h.guestSHA256(ctx, vm)
	if err != nil {
		return false, err
	}
	if sum != bin.SHA256 {
		if err := h.push(ctx, vm, bin); err != nil {
			return false, err
		}
		pushed = true
		if sum, err = h.guestSHA256(ctx, vm); err != nil {
			return true, err
		}
		if sum != bin.SHA256 {
			return true, fmt.Errorf("helper: ensure %s: %w: pushed %s but the guest has sha256 %q", vm, ErrGuest, bin.SHA256, sum)
		}
		if h.pushHook != nil {
			h.pushHook(vm)
		}
	}
	h.mu.Lock()
	h.ensured[vm] = bin.SHA256
	h.mu.Unlock()
	return pushed, nil
}

// exec runs argv in vm and returns the result of a command that exited.
func (h *Helper) exec(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecResult, error) {
	if req.Timeout == 0 {
		req.Timeout = CommandTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, req.Timeout+5*time.Second)
	defer cancel()
	res, err := hypervisor.Run(ctx, h.d, vm, req)
	if err != nil {
		return res, err
	}
	if res.TimedOut {
		return res, fmt.Errorf("%w: %s ran longer than %v", hypervisor.ErrTimeout, req.Argv[0], req.Timeout)
	}
	return res, nil
}

func (h *Helper) guestArch(ctx context.Context, vm string) (string, error) {
	res, err := h.exec(ctx, vm, hypervisor.ExecRequest{Argv: []string{"uname", "-m"}, MaxOutputBytes: 256})
	if err != nil {
		return "", fmt.Errorf("helper: ensure %s: uname: %w", vm, err)
	}
	m := strings.TrimSpace(string(res.Stdout))
	switch {
	case res.ExitCode != 0:
		return "", fmt.Errorf("helper: ensure %s: uname -m exited %d: %s", vm, res.ExitCode, truncate(res.Stderr, 256))
	case m == "x86_64" || m == "amd64":
		return "amd64", nil
	case m == "aarch64" || m == "arm64":
		return "arm64", nil
	}
	return "", fmt.Errorf("helper: ensure %s: %w: guest machine %q", vm, ErrNoBinary, m)
}

// guestSHA256 is the hash of GuestPath in the guest, "" when it is missing.
func (h *Helper) guestSHA256(ctx context.Context, vm string) (string, error) {
	res, err := h.exec(ctx, vm, hypervisor.ExecRequest{Argv: []string{"sha256sum", GuestPath}, MaxOutputBytes: 4096})
	if err != nil {
		return "", fmt.Errorf("helper: ensure %s: sha256sum: %w", vm, err)
	}
	if res.ExitCode != 0 || res.Signal != 0 {
		return "", nil // missing or unreadable: push
	}
	f := strings.Fields(string(res.Stdout))
	if len(f) == 0 || len(f[0]) != 64 {
		return "", fmt.Errorf("helper: ensure %s: sha256sum: unexpected output %q", vm, truncate(res.Stdout, 256))
	}
	return strings.ToLower(f[0]), nil
}

func (h *Helper) push(ctx context.Context, vm string, bin Binary) error {
	dir := GuestPath[:strings.LastIndexByte(GuestPath, '/')]
	tmp := GuestPath + ".tmp-" + NewSessionID()[:12]
	if err := h.mustRun(ctx, vm, "push", []string{"mkdir", "-p", dir}); err != nil {
		return err
	}
	if err := h.d.FileWrite(ctx, vm, tmp, bin.Data, 0o755); err != nil {
		_ = h.mustRun(context.WithoutCancel(ctx), vm, "push", []string{"rm", "-f", tmp})
		return fmt.Errorf("helper: push %s to %s: %w", bin.Source, vm, err)
	}
	if err := h.mustRun(ctx, vm, "push", []string{"mv", "-f", tmp, GuestPath}); err != nil {
		_ = h.mustRun(context.WithoutCancel(ctx), vm, "push", []string{"rm", "-f", tmp})
		return err
	}
	return nil
}

func (h *Helper) mustRun(ctx context.Context, vm, op string, argv []string) error {
	res, err := h.exec(ctx, vm, hypervisor.ExecRequest{Argv: argv, MaxOutputBytes: 4096})
	if err != nil {
		return fmt.Errorf("helper: %s %s: %s: %w", op, vm, argv[0], err)
	}
	if res.ExitCode != 0 || res.Signal != 0 {
		return fmt.Errorf("helper: %s %s: %s exited %d: %s", op, vm, strings.Join(argv, " "), res.ExitCode, truncate(res.Stderr, 256))
	}
	return nil
}

// call ensures the helper, runs it with args (and stdin), and decodes the
// reply's result into out. An exec failure drops the cached check; when the
// re-check pushed a new helper the call is tried once more.
func (h *Helper) call(ctx context.Context, vm, op string, args []string, stdin []byte, timeout time.Duration, maxOut int64, out any) error {
	res, err := h.run(ctx, vm, op, args, stdin, timeout, maxOut)
	if err != nil {
		return err
	}
	return decodeReply(op, res, res.Stdout, out)
}

// run runs the helper command args (and stdin) by vm's road: through
// the resident helper, or a process per command. A resident helper that
// did not take the call is looked for again (started again) and sent the
// call once more; so is one lost during a call that only reads (retrySafe);
// without one, the call goes per command.
func (h *Helper) run(ctx context.Context, vm, op string, args []string, stdin []byte, timeout time.Duration, maxOut int64) (hypervisor.ExecResult, error) {
	res, err := h.runResident(ctx, vm, op, "", args, stdin, timeout, maxOut)
	if !errors.Is(err, errNotSent) {
		return res, err
	}
	return h.perCommand(ctx, vm, op, args, stdin, timeout, maxOut)
}

// runResident is run's resident half: the call through vm's resident
// helper, by way of via when it is not "" (ViaChannel: only the channel).
// It fails with errNotSent when no resident helper took the call (none,
// another way, or one that did not answer, twice), so the caller may send
// it another way.
func (h *Helper) runResident(ctx context.Context, vm, op, via string, args []string, stdin []byte, timeout time.Duration, maxOut int64) (hypervisor.ExecResult, error) {
	for range 2 {
		r := h.road(ctx, vm)
		if r.Kind != RoadResident || via != "" && r.Via != via {
			break
		}
		res, err := h.viaResident(ctx, vm, r.Via, nil, args, stdin, timeout, maxOut)
		if errors.Is(err, hypervisor.ErrHelperLost) && retrySafe(args) {
			h.dropRoad(vm, r)
			continue
		}
		if !errors.Is(err, errNotSent) {
			if err != nil {
				return res, fmt.Errorf("helper: %s: %w", op, err)
			}
			return res, nil
		}
		h.dropRoad(vm, r)
	}
	return hypervisor.ExecResult{}, errNotSent
}

// retrySafe reports whether the command only reads, so that sending it
// again after a lost call changes nothing.
func retrySafe(args []string) bool {
	if len(args) == 0 {
		return false
	}
	cmd := args[0]
	if len(args) > 1 && (cmd == "session" || cmd == "job" || cmd == "file") {
		cmd += " " + args[1]
	}
	switch cmd {
	case "hello", "version", "ps", "metrics", "session list", "job status", "job list", "file stat", "file read":
		return true
	}
	return false
}

// perCommand ensures the helper binary and runs it with args (and stdin).
func (h *Helper) perCommand(ctx context.Context, vm, op string, args []string, stdin []byte, timeout time.Duration, maxOut int64) (hypervisor.ExecResult, error) {
	if err := h.Ensure(ctx, vm); err != nil {
		return hypervisor.ExecResult{}, err
	}
	req := hypervisor.ExecRequest{Argv: append([]string{GuestPath}, args...), Stdin: stdin, Timeout: timeout, MaxOutputBytes: maxOut}
	res, err := h.exec(ctx, vm, req)
	if err != nil && ctx.Err() == nil && !errors.Is(err, hypervisor.ErrTimeout) {
		h.forgetBinary(vm)
		pushed, eerr := h.ensure(ctx, vm)
		if eerr != nil {
			return res, fmt.Errorf("helper: %s: %w (and re-checking the helper: %w)", op, err, eerr)
		}
		if pushed {
			res, err = h.exec(ctx, vm, req)
		}
	}
	if err != nil {
		return res, fmt.Errorf("helper: %s: %w", op, err)
	}
	if res.StdoutTruncated {
		return res, &ReplyError{Op: op, ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Cause: errors.New("reply truncated")}
	}
	return res, nil
}

// decodeReply decodes reply, vmgate-guest's JSON reply in res, into out.
func decodeReply(op string, res hypervisor.ExecResult, reply []byte, out any) error {
	var r struct {
		OK     bool            `json:"ok"`
		Result json.RawMessage `json:"result"`
		Error  *wire.Error     `json:"error"`
	}
	if err := json.Unmarshal(reply, &r); err != nil {
		return &ReplyError{Op: op, ExitCode: res.ExitCode, Signal: res.Signal, Stdout: res.Stdout, Stderr: res.Stderr, Cause: err}
	}
	if !r.OK {
		if r.Error == nil {
			return &ReplyError{Op: op, ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Cause: errors.New("ok false without error")}
		}
		return &Error{Op: op, Code: r.Error.Code, Reason: r.Error.Reason, Message: r.Error.Message}
	}
	if err := json.Unmarshal(r.Result, out); err != nil {
		return &ReplyError{Op: op, ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, Cause: err}
	}
	return nil
}

func invalid(op, format string, args ...any) error {
	return fmt.Errorf("helper: %s: %w: %s", op, hypervisor.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// replyCap is the exec output cap for a reply of up to n bytes of payload
// (base64 in JSON: 4/3, two streams) plus room for the envelope.
func replyCap(n int64) int64 { return n/3*4*2 + 1<<20 }

// PS lists vm's processes; with a session only that session's.
func (h *Helper) PS(ctx context.Context, vm, session string) ([]Process, error) {
	args := []string{"ps"}
	if session != "" {
		if err := wire.ValidateSessionID(session); err != nil {
			return nil, invalid("ps", "%v", err)
		}
		args = append(args, "--session", session)
	}
	var out []Process
	err := h.call(ctx, vm, "ps", args, nil, 0, 16<<20, &out)
	return out, err
}

// Run runs req through vmgate-guest (tree kill on timeout, output caps,
// session tracking). req is validated before anything reaches the guest.
func (h *Helper) Run(ctx context.Context, vm string, req RunRequest) (RunResult, error) {
	stdin, err := checkRun(req)
	if err != nil {
		return RunResult{}, err
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout == 0 {
		timeout = wire.DefaultRunTimeoutMS * time.Millisecond
	}
	maxOut := req.MaxOutputBytes
	if maxOut == 0 {
		maxOut = wire.DefaultMaxOutputBytes
	}
	var out RunResult
	err = h.call(ctx, vm, "run", []string{"run"}, stdin, timeout+runMargin, replyCap(maxOut), &out)
	return out, err
}

// Kill sends signal (TERM when "") to pid after the guest's guards (pid 1,
// kernel threads, the guest agent, vmgate-guest, a reused pid: all in
// guest/agent, none here); with startedAt (ms since the epoch, from PS) a
// reused pid is refused. Only the arguments are checked on the host.
func (h *Helper) Kill(ctx context.Context, vm string, pid int, signal string, startedAt int64) (KillResult, error) {
	name, _, err := wire.ParseSignal(signal)
	if err != nil {
		return KillResult{}, invalid("kill", "%v", err)
	}
	if pid < 1 || startedAt < 0 {
		return KillResult{}, invalid("kill", "pid %d / started_at %d out of range", pid, startedAt)
	}
	args := []string{"kill", "--pid", strconv.Itoa(pid), "--signal", name}
	if startedAt > 0 {
		args = append(args, "--started-at", strconv.FormatInt(startedAt, 10))
	}
	var out KillResult
	err = h.call(ctx, vm, "kill", args, nil, 0, 1<<16, &out)
	return out, err
}

// SessionCreate creates a session; req.ID must come from NewSessionID (or
// any [a-z0-9]{16,64} the server minted).
func (h *Helper) SessionCreate(ctx context.Context, vm string, req SessionCreate) (Session, error) {
	if err := wire.ValidateSessionID(req.ID); err != nil {
		return Session{}, invalid("session create", "%v", err)
	}
	if err := req.Limits.Validate(); err != nil {
		return Session{}, invalid("session create", "limits: %v", err)
	}
	if req.TTLS < 0 || req.IdleS < 0 {
		return Session{}, invalid("session create", "ttl_s %d / idle_s %d negative", req.TTLS, req.IdleS)
	}
	args := []string{"session", "create", "--id", req.ID}
	if req.Sandbox != nil {
		if err := req.Sandbox.Validate(); err != nil {
			return Session{}, invalid("session create", "%v", err)
		}
		b, err := json.Marshal(req.Sandbox)
		if err != nil {
			return Session{}, invalid("session create", "sandbox: %v", err)
		}
		args = append(args, "--sandbox", string(b))
	}
	for _, f := range []struct {
		flag string
		v    int64
	}{{"--ttl-s", req.TTLS}, {"--idle-s", req.IdleS}, {"--memory-mb", req.Limits.MemoryMB}, {"--pids", req.Limits.Pids}, {"--cpu-percent", req.Limits.CPUPercent}} {
		if f.v != 0 {
			args = append(args, f.flag, strconv.FormatInt(f.v, 10))
		}
	}
	var out Session
	err := h.call(ctx, vm, "session create", args, nil, 0, 1<<16, &out)
	return out, err
}

// SessionList lists vm's sessions with member counts and expiry.
func (h *Helper) SessionList(ctx context.Context, vm string) ([]Session, error) {
	var out []Session
	err := h.call(ctx, vm, "session list", []string{"session", "list"}, nil, 0, 4<<20, &out)
	return out, err
}

// SessionDestroy kills every process of the session and removes its files.
// Idempotent: an unknown session gives Existed false, not an error.
func (h *Helper) SessionDestroy(ctx context.Context, vm, id string) (DestroyResult, error) {
	if err := wire.ValidateSessionID(id); err != nil {
		return DestroyResult{}, invalid("session destroy", "%v", err)
	}
	var out DestroyResult
	err := h.call(ctx, vm, "session destroy", []string{"session", "destroy", "--id", id}, nil, 0, 1<<16, &out)
	return out, err
}

// SessionReap destroys vm's sessions past their ttl or idle time.
func (h *Helper) SessionReap(ctx context.Context, vm string) (ReapResult, error) {
	var out ReapResult
	err := h.call(ctx, vm, "session reap", []string{"session", "reap"}, nil, 0, 4<<20, &out)
	return out, err
}

// Metrics reads the guest's own figures (CPU over a sample of sampleMS
// milliseconds, 0 for the default; memory, load, disks, network) with
// `vmgate-guest metrics`, the same on every backend.
func (h *Helper) Metrics(ctx context.Context, vm string, sampleMS int64) (Metrics, error) {
	if sampleMS < 0 || sampleMS > wire.MaxMetricsSampleMS {
		return Metrics{}, invalid("metrics", "sample_ms %d out of range 0..%d", sampleMS, wire.MaxMetricsSampleMS)
	}
	args := []string{"metrics"}
	if sampleMS > 0 {
		args = append(args, "--sample-ms", strconv.FormatInt(sampleMS, 10))
	}
	var out Metrics
	err := h.call(ctx, vm, "metrics", args, nil, 0, 4<<20, &out)
	return out, err
}

// SessionTrash is SessionDestroy that moves the session's workdir to the
// guest's trash for keep (at most wire.MaxTrashS seconds) instead of
// removing it; SessionRestore brings the files back. keep 0 removes them.
func (h *Helper) SessionTrash(ctx context.Context, vm, id string, keep time.Duration) (DestroyResult, error) {
	if err := wire.ValidateSessionID(id); err != nil {
		return DestroyResult{}, invalid("session destroy", "%v", err)
	}
	secs := int64(keep / time.Second)
	if keep < 0 || secs > wire.MaxTrashS || keep > 0 && secs == 0 {
		return DestroyResult{}, invalid("session destroy", "trash %v out of range 1s..%ds", keep, wire.MaxTrashS)
	}
	args := []string{"session", "destroy", "--id", id}
	if secs > 0 {
		args = append(args, "--trash-s", strconv.FormatInt(secs, 10))
	}
	var out DestroyResult
	err := h.call(ctx, vm, "session destroy", args, nil, 0, 1<<16, &out)
	return out, err
}

// SessionRestore moves the files destroyed session from left in the trash
// into the live session id's workdir.
func (h *Helper) SessionRestore(ctx context.Context, vm, id, from string) (RestoreResult, error) {
	for _, s := range []string{id, from} {
		if err := wire.ValidateSessionID(s); err != nil {
			return RestoreResult{}, invalid("session restore", "%v", err)
		}
	}
	var out RestoreResult
	err := h.call(ctx, vm, "session restore", []string{"session", "restore", "--id", id, "--from", from}, nil, 0, 4<<20, &out)
	return out, err
}
