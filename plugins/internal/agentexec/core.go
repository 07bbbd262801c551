package agentexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
)

// The drivers' defaults.
const (
	// DefaultExecTimeout bounds a command whose request sets no timeout,
	// on every driver unless its settings say otherwise.
	DefaultExecTimeout = 10 * time.Minute
	// DefaultInfoTTL is how long guest-info is trusted for the exec
	// preflight when CoreConfig.InfoTTL is zero.
	DefaultInfoTTL = 5 * time.Second
)

// Agent is how the core reaches one VM's guest agent. qga.Agent (over any
// qga.Caller: the agent's socket, libvirt's agent command, a REST relay)
// and *qga.Client implement it. A driver whose backend offers typed agent
// calls instead (a hypervisor's REST API for exec and exec-status)
// implements it directly, with qga.Exec and qga.KillTree over its own
// ExecStart and ExecStatus: the core does not change.
type Agent interface {
	qga.Execer
	// Info is guest-info.
	Info(ctx context.Context) (qga.Info, error)
	// Exec runs a command to completion (qga.Exec semantics).
	Exec(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error)
}

var (
	_ Agent = qga.Agent{}
	_ Agent = (*qga.Client)(nil)
)

// Target is one VM as the core reaches it.
type Target struct {
	// Key names the VM to the core (its backend-local name): the commands
	// it started and its cached guest-info are kept per key.
	Key string
	// Agent reaches the VM's guest agent.
	Agent Agent
	// Why, when set, is asked why the agent is unavailable; a non-nil
	// answer is added to the error (qemu: QEMU itself is gone; libvirt:
	// the domain is not running).
	Why func(ctx context.Context, err error) error
}

// CoreConfig configures a Core.
type CoreConfig struct {
	// Driver starts every error ("qemu: exec: ...").
	Driver string
	// Reach finds the VM called name for operation op and how to reach its
	// agent. An unknown VM is hypervisor.ErrUnknownVM; its errors carry the
	// driver's prefix already.
	Reach func(ctx context.Context, op, name string) (Target, error)
	// MapErr, when set, maps an error of the agent for op to the driver
	// contract with the driver's prefix, for a backend whose relay adds
	// errors of its own (Proxmox's API answers); nil means MapError with
	// the prefix "Driver: op: ".
	MapErr func(op string, err error) error
	// ExecTimeout bounds a command whose request has no timeout; required.
	ExecTimeout time.Duration
	// InfoTTL is how long guest-info is trusted for the exec preflight;
	// zero means DefaultInfoTTL.
	InfoTTL time.Duration
	// MaxStdin, when positive, is the most stdin a request may carry
	// (a relay's own limit, checked before anything is sent).
	MaxStdin int
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Tracker configures the exec tracker (its Logger defaults to Logger).
	Tracker Config
}

// Core is the exec road of the drivers that reach a QEMU guest agent
// (qemu, libvirt, proxmox): request checks, the exec preflight from cached
// guest-info, run to completion, start and status through one Tracker, and
// the mapping of agent errors to the driver contract. The drivers differ
// only in CoreConfig.Reach. It is safe for concurrent use; mu is a leaf
// lock, never held across an agent call.
type Core struct {
	cfg   CoreConfig
	execs *Tracker

	mu    sync.Mutex // mu guards infos
	infos map[string]cachedInfo
}

type cachedInfo struct {
	info qga.Info
	at   time.Time
}

// NewCore returns a Core; cfg.Driver, cfg.Reach and a positive
// cfg.ExecTimeout are required (a driver's own defaults apply before).
func NewCore(cfg CoreConfig) *Core {
	if cfg.Driver == "" || cfg.Reach == nil || cfg.ExecTimeout <= 0 {
		panic("agentexec: NewCore needs Driver, Reach and a positive ExecTimeout")
	}
	if cfg.InfoTTL <= 0 {
		cfg.InfoTTL = DefaultInfoTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Tracker.Logger == nil {
		cfg.Tracker.Logger = cfg.Logger
	}
	return &Core{cfg: cfg, execs: New(cfg.Tracker), infos: map[string]cachedInfo{}}
}

// Exec is the view of a Core a driver embeds: the four methods of
// hypervisor.Driver and hypervisor.Runner that the core implements.
type Exec struct{ c *Core }

// Exec returns the embeddable view of c.
func (c *Core) Exec() Exec { return Exec{c} }

// Err maps an agent error of op on t to the hypervisor sentinels (see
// MapError, or CoreConfig.MapErr) with the driver's prefix, and says why an
// unavailable agent is unavailable when t knows (Target.Why).
func (c *Core) Err(ctx context.Context, t Target, op string, err error) error {
	var mapped error
	if c.cfg.MapErr != nil {
		mapped = c.cfg.MapErr(op, err)
	} else {
		mapped = fmt.Errorf("%s: %s: %w", c.cfg.Driver, op, MapError(err))
	}
	if t.Why == nil || !errors.Is(mapped, hypervisor.ErrAgentUnavailable) {
		return mapped
	}
	if why := t.Why(ctx, err); why != nil {
		return fmt.Errorf("%w; %w", mapped, why)
	}
	return mapped
}

// Info returns t's guest-info, from the cache unless fresh is set or it is
// older than the TTL. Errors are the agent's, unmapped.
func (c *Core) Info(ctx context.Context, t Target, fresh bool) (qga.Info, error) {
	c.mu.Lock()
	ci, ok := c.infos[t.Key]
	c.mu.Unlock()
	if ok && !fresh && time.Since(ci.at) < c.cfg.InfoTTL {
		return ci.info, nil
	}
	info, err := t.Agent.Info(ctx)
	if err != nil {
		return qga.Info{}, err
	}
	c.mu.Lock()
	c.infos[t.Key] = cachedInfo{info: info, at: time.Now()}
	c.mu.Unlock()
	return info, nil
}

// Preflight checks, from cached guest-info, that t's agent has the exec
// commands enabled: a guest that forbids exec gets a clear
// *hypervisor.CommandDisabledError, not a hang.
func (c *Core) Preflight(ctx context.Context, t Target, op string) error {
	info, err := c.Info(ctx, t, false)
	if err != nil {
		return c.Err(ctx, t, op, err)
	}
	if err := CheckEnabled(info); err != nil {
		return fmt.Errorf("%s: %s: %w", c.cfg.Driver, op, err)
	}
	return nil
}

// ForgetInfo drops the cached guest-info of the VM key (its guest may
// have changed: a power action, another domain by the same name).
func (c *Core) ForgetInfo(key string) {
	c.mu.Lock()
	delete(c.infos, key)
	c.mu.Unlock()
}

// Forget drops everything the core keeps of the VM key: the watchdogs of
// its commands (their handles can still be polled) and its guest-info.
func (c *Core) Forget(key string) {
	c.execs.Forget(key)
	c.ForgetInfo(key)
}

// Close stops every watchdog; later ExecStart calls fail.
func (c *Core) Close() { c.execs.Close() }

// request validates req and converts it; errors have the driver's prefix.
func (c *Core) request(op string, req hypervisor.ExecRequest) (qga.ExecRequest, error) {
	if c.cfg.MaxStdin > 0 && len(req.Stdin) > c.cfg.MaxStdin {
		return qga.ExecRequest{}, fmt.Errorf("%s: %s: %w: stdin of %d bytes is over the backend's limit of %d",
			c.cfg.Driver, op, hypervisor.ErrInvalidArgument, len(req.Stdin), c.cfg.MaxStdin)
	}
	q, err := Request(req, c.cfg.ExecTimeout)
	if err != nil {
		return q, fmt.Errorf("%s: %s: %w", c.cfg.Driver, op, err)
	}
	return q, nil
}

// prepare is the common start of Run and ExecStart: find the VM, check
// the request, run the preflight.
func (c *Core) prepare(ctx context.Context, op, name string, req hypervisor.ExecRequest) (Target, qga.ExecRequest, error) {
	t, err := c.cfg.Reach(ctx, op, name)
	if err != nil {
		return Target{}, qga.ExecRequest{}, err
	}
	q, err := c.request(op, req)
	if err != nil {
		return Target{}, qga.ExecRequest{}, err
	}
	if err := c.Preflight(ctx, t, op); err != nil {
		return Target{}, qga.ExecRequest{}, err
	}
	return t, q, nil
}

// AgentInfo implements hypervisor.Driver: fresh guest-info.
func (e Exec) AgentInfo(ctx context.Context, name string) (hypervisor.AgentInfo, error) {
	const op = "agent info"
	t, err := e.c.cfg.Reach(ctx, op, name)
	if err != nil {
		return hypervisor.AgentInfo{}, err
	}
	info, err := e.c.Info(ctx, t, true)
	if err != nil {
		return hypervisor.AgentInfo{}, e.c.Err(ctx, t, op, err)
	}
	return AgentInfo(info), nil
}

// Run implements hypervisor.Runner: the command runs to completion next to
// the agent (qga.Exec: adaptive polling, the timeout, the kill of its tree).
func (e Exec) Run(ctx context.Context, name string, req hypervisor.ExecRequest) (hypervisor.ExecResult, error) {
	const op = "exec"
	t, q, err := e.c.prepare(ctx, op, name, req)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	st, err := t.Agent.Exec(ctx, q)
	if err != nil {
		return hypervisor.ExecResult{}, e.c.Err(ctx, t, op, err)
	}
	return Result(st), nil
}

// ExecStart implements hypervisor.Driver: it starts req and returns at
// once; the Tracker's watchdog kills the command's tree at its timeout,
// even if nobody polls.
func (e Exec) ExecStart(ctx context.Context, name string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	const op = "exec start"
	t, q, err := e.c.prepare(ctx, op, name, req)
	if err != nil {
		return hypervisor.ExecHandle{}, err
	}
	h, err := e.c.execs.Start(ctx, t.Key, t.Agent, q)
	if err != nil {
		return hypervisor.ExecHandle{}, e.c.Err(ctx, t, op, err)
	}
	return h, nil
}

// ExecStatus implements hypervisor.Driver: it polls a command ExecStart
// started.
func (e Exec) ExecStatus(ctx context.Context, name string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	const op = "exec status"
	t, err := e.c.cfg.Reach(ctx, op, name)
	if err != nil {
		return hypervisor.ExecResult{}, err
	}
	res, err := e.c.execs.Status(ctx, t.Key, t.Agent, h)
	if err != nil {
		return hypervisor.ExecResult{}, e.c.Err(ctx, t, op, err)
	}
	return res, nil
}
