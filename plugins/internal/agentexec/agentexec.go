// Package agentexec is the one exec road of vmgate's drivers. Its Tracker
// is the driver layer's one table of started commands, for every driver
// (qemu, libvirt and proxmox through a QEMU guest agent, virtualbox through
// VBoxManage): it turns a started command into a hypervisor.ExecHandle
// whose Token carries what a later poll needs, enforces the request's timeout with a watchdog that kills the
// command's process tree at its deadline even when nobody polls, and keeps
// the watchdog's final result for the caller's next poll for a while.
//
// A Tracker is given, per call, the VM's key (its backend-local name) and
// the agent to use (a qga.Execer); the agent that started a command is kept
// with it, so an agent may stand for one command only (VirtualBox's, a
// VBoxManage process per command). Errors are the agent's unchanged, or
// ErrInvalidArgument, ErrTooMany and ErrClosed; MapError maps them.
//
// Core is the whole exec road of the drivers that reach a QEMU guest agent
// (qemu, libvirt, proxmox) on top of one Tracker: they differ only in how
// they reach the agent (CoreConfig.Reach). Request validates exec
// requests, CheckEnabled is the exec preflight and AgentInfo converts
// guest-info.
package agentexec

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// Defaults of Config.
const (
	// DefaultResultTTL is how long a final result collected by the watchdog
	// waits for the caller's Status before it is forgotten.
	DefaultResultTTL = 10 * time.Minute
	// DefaultMaxTracked bounds the commands a Tracker tracks at once.
	DefaultMaxTracked = 1024
	// watchdogTimeout bounds one watchdog's kill and collection.
	watchdogTimeout = 30 * time.Second
)

// Sentinel errors.
var (
	// ErrTooMany: the tracker already tracks Config.MaxTracked commands.
	ErrTooMany = errors.New("too many commands tracked")
	// ErrClosed: the tracker was closed.
	ErrClosed = errors.New("exec tracker closed")
	// ErrGone marks an agent error after which the command cannot be polled
	// again (its host-side process ended in an error): the Tracker forgets
	// the command, as it does when the agent no longer knows the pid
	// (qga.ErrUnknownExec). See Gone.
	ErrGone = errors.New("command gone")
)

// goneError is an error marked with ErrGone; its text is the error's own.
type goneError struct{ err error }

func (e goneError) Error() string   { return e.err.Error() }
func (e goneError) Unwrap() []error { return []error{ErrGone, e.err} }

// Gone marks err as final for the command it is about (see ErrGone).
func Gone(err error) error { return goneError{err} }

// isFinal reports whether err ends the tracking of its command.
func isFinal(err error) bool {
	return errors.Is(err, ErrGone) || errors.Is(err, qga.ErrUnknownExec)
}

// Timer is a pending call of Clock.AfterFunc.
type Timer interface {
	Stop() bool
}

// Clock is the Tracker's time source; tests replace it.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Config configures a Tracker. The zero value is ready to use.
type Config struct {
	// Logger for watchdog failures; nil means slog.Default().
	Logger *slog.Logger
	// Clock; nil means the system clock.
	Clock Clock
	// ResultTTL; 0 means DefaultResultTTL.
	ResultTTL time.Duration
	// MaxTracked; 0 means DefaultMaxTracked.
	MaxTracked int
}

// Tracker tracks started commands. It is safe for concurrent use.
//
// Lock order: entry.mu before Tracker.mu. Tracker.mu is a leaf: it is never
// held across an agent call or a Clock callback, so Forget and Close may be
// called while holding a driver's own locks. entry.mu is held across agent
// calls (it serialises a command's polls with its watchdog).
type Tracker struct {
	log       *slog.Logger
	clock     Clock
	resultTTL time.Duration
	max       int

	// mu guards execs, closed and every entry's timer.
	mu     sync.Mutex
	execs  map[entryKey]*entry
	closed bool
}

type entryKey struct {
	vm  string
	pid int64
}

// entry is a command started by Start whose timeout the Tracker enforces.
type entry struct {
	key      entryKey
	agent    qga.Execer // the agent that started it: polls and the watchdog use it
	deadline time.Time
	maxOut   int64
	timer    Timer // guarded by Tracker.mu

	// mu serialises Status and the watchdog on this command and guards
	// final and finalErr.
	mu    sync.Mutex
	final *hypervisor.ExecResult // collected by the watchdog, waiting for Status
	// finalErr is a final error (isFinal) the watchdog met, waiting for Status.
	finalErr error
}

// New returns a Tracker configured by cfg.
func New(cfg Config) *Tracker {
	t := &Tracker{log: cfg.Logger, clock: cfg.Clock, resultTTL: cfg.ResultTTL, max: cfg.MaxTracked, execs: map[entryKey]*entry{}}
	if t.log == nil {
		t.log = slog.Default()
	}
	if t.clock == nil {
		t.clock = realClock{}
	}
	if t.resultTTL <= 0 {
		t.resultTTL = DefaultResultTTL
	}
	if t.max <= 0 {
		t.max = DefaultMaxTracked
	}
	return t
}

// Result converts the agent's status into the driver contract's result.
func Result(s qga.ExecStatus) hypervisor.ExecResult {
	return hypervisor.ExecResult{
		PID: s.PID, Exited: s.Exited, ExitCode: s.ExitCode, Signal: s.Signal,
		Stdout: s.Stdout, Stderr: s.Stderr,
		StdoutTruncated: s.StdoutTruncated, StderrTruncated: s.StderrTruncated,
		TimedOut: s.TimedOut,
	}
}

// token is the state Status needs, carried in ExecHandle.Token so that a
// restarted driver can still poll (it then enforces an overdue timeout on
// the next poll rather than by a watchdog).
type token struct {
	VM       string `json:"vm"`
	PID      int64  `json:"pid"`
	Deadline int64  `json:"deadline"` // unix nanoseconds
	MaxOut   int64  `json:"max_out"`
}

func (t token) encode() string {
	b, _ := json.Marshal(t) // cannot fail: strings and integers only
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeToken(s string) (token, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return token{}, err
	}
	var t token
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return token{}, err
	}
	if dec.More() {
		return token{}, errors.New("trailing data")
	}
	if t.VM == "" || t.PID <= 0 || t.MaxOut < 0 || t.Deadline < 0 {
		return token{}, errors.New("bad values")
	}
	return t, nil
}

// Start starts req in the guest through a and returns at once. req.Timeout
// must be positive (the driver applies its default): a watchdog kills the
// command's process tree when it fires, even if nobody polls. key names the
// VM; Status must be called with the same key.
func (t *Tracker) Start(ctx context.Context, key string, a qga.Execer, req qga.ExecRequest) (hypervisor.ExecHandle, error) {
	switch {
	case key == "":
		return hypervisor.ExecHandle{}, fmt.Errorf("%w: empty VM key", hypervisor.ErrInvalidArgument)
	case req.Timeout <= 0:
		return hypervisor.ExecHandle{}, fmt.Errorf("%w: timeout %v is not positive", hypervisor.ErrInvalidArgument, req.Timeout)
	case req.MaxOutputBytes < 0:
		return hypervisor.ExecHandle{}, fmt.Errorf("%w: negative max output bytes", hypervisor.ErrInvalidArgument)
	}
	t.mu.Lock()
	closed, n := t.closed, len(t.execs)
	t.mu.Unlock()
	if closed {
		return hypervisor.ExecHandle{}, ErrClosed
	}
	if n >= t.max {
		return hypervisor.ExecHandle{}, fmt.Errorf("%w: %d already; poll or wait for them", ErrTooMany, n)
	}
	started := t.clock.Now()
	pid, err := a.ExecStart(ctx, req)
	if err != nil {
		return hypervisor.ExecHandle{}, err
	}
	deadline := started.Add(req.Timeout)
	tok := token{VM: key, PID: pid, Deadline: deadline.UnixNano(), MaxOut: req.MaxOutputBytes}
	e := &entry{key: entryKey{key, pid}, agent: a, deadline: time.Unix(0, tok.Deadline), maxOut: tok.MaxOut}
	t.mu.Lock()
	if !t.closed {
		if old, ok := t.execs[e.key]; ok {
			old.timer.Stop() // a reused pid: the agent collected the old command
		}
		t.execs[e.key] = e
		// At the deadline, however long the agent took to start it.
		e.timer = t.clock.AfterFunc(e.deadline.Sub(t.clock.Now()), func() { t.watchdog(e) })
	}
	t.mu.Unlock()
	return hypervisor.ExecHandle{PID: pid, Token: tok.encode(), StartedAt: started}, nil
}

// watchdog runs at a command's deadline: unless it already exited, it is
// killed; the final result is kept for the caller's next Status.
func (t *Tracker) watchdog(e *entry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.final != nil || e.finalErr != nil || !t.tracked(e) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), watchdogTimeout)
	defer cancel()
	res, err := collect(ctx, e.agent, e.key.pid, e.maxOut, true)
	switch {
	case err != nil && !isFinal(err):
		t.log.Warn("exec timeout watchdog failed", "vm", e.key.vm, "pid", e.key.pid, "err", err)
		return // the next Status retries
	case err != nil:
		e.finalErr = err // nothing left to kill or to collect: the caller learns why
	default:
		e.final = &res
	}
	t.mu.Lock()
	if t.execs[e.key] == e {
		e.timer = t.clock.AfterFunc(t.resultTTL, func() { t.untrack(e) })
	}
	t.mu.Unlock()
}

func (t *Tracker) tracked(e *entry) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.execs[e.key] == e
}

func (t *Tracker) untrack(e *entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.execs[e.key] == e {
		delete(t.execs, e.key)
		e.timer.Stop()
	}
}

// collect polls pid; when kill is set and it still runs, it kills its tree
// and waits for the final status (TimedOut set).
func collect(ctx context.Context, a qga.Execer, pid, maxOut int64, kill bool) (hypervisor.ExecResult, error) {
	st, err := a.ExecStatus(ctx, pid, maxOut)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	if st.Exited || !kill {
		return Result(st), nil
	}
	if err := a.KillTree(ctx, pid); err != nil {
		return hypervisor.ExecResult{}, err
	}
	var b hypervisor.Backoff
	for {
		st, err := a.ExecStatus(ctx, pid, maxOut)
		if err != nil {
			return hypervisor.ExecResult{}, err
		}
		if st.Exited {
			res := Result(st)
			res.TimedOut = true
			return res, nil
		}
		if b.Sleep(ctx, 0) != nil {
			return hypervisor.ExecResult{}, ctx.Err()
		}
	}
}

// Status polls a command started by Start on the VM key, through the agent
// that started it. A final result the watchdog collected is returned once
// and forgotten; a handle this Tracker does not know (another driver
// instance started it, or it was collected) is polled through a, and killed
// first when its deadline passed.
func (t *Tracker) Status(ctx context.Context, key string, a qga.Execer, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	if h.PID <= 0 {
		return hypervisor.ExecResult{}, fmt.Errorf("%w: pid %d", hypervisor.ErrInvalidArgument, h.PID)
	}
	tok, err := decodeToken(h.Token)
	if err != nil || tok.PID != h.PID || tok.VM != key {
		return hypervisor.ExecResult{}, fmt.Errorf("%w: bad handle token", hypervisor.ErrInvalidArgument)
	}
	t.mu.Lock()
	e := t.execs[entryKey{key, h.PID}]
	t.mu.Unlock()
	if e == nil {
		overdue := tok.Deadline != 0 && t.clock.Now().After(time.Unix(0, tok.Deadline))
		return collect(ctx, a, h.PID, tok.MaxOut, overdue)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.final != nil || e.finalErr != nil {
		t.untrack(e)
		if e.finalErr != nil {
			return hypervisor.ExecResult{}, e.finalErr
		}
		return *e.final, nil
	}
	res, err := collect(ctx, e.agent, e.key.pid, e.maxOut, t.clock.Now().After(e.deadline))
	if err != nil {
		if isFinal(err) {
			t.untrack(e)
		}
		return hypervisor.ExecResult{}, err
	}
	if res.Exited {
		t.untrack(e)
	}
	return res, nil
}

// Forget stops the watchdogs of every command tracked for the VM key and
// forgets them (the VM stopped, or its agent channel went away); their
// handles can still be polled like those of another driver instance.
func (t *Tracker) Forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.execs {
		if k.vm == key {
			e.timer.Stop()
			delete(t.execs, k)
		}
	}
}

// Tracked reports how many commands are tracked.
func (t *Tracker) Tracked() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.execs)
}

// Close stops every watchdog and forgets every command; Start then fails
// with ErrClosed.
func (t *Tracker) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for k, e := range t.execs {
		e.timer.Stop()
		delete(t.execs, k)
	}
}
