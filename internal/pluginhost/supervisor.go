package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"

	"github.com/vmgate/vmgate/hypervisor"
)

// exitGrace is how long a call that failed at the transport level waits to
// see whether the plugin process has exited (the connection usually breaks
// a moment before the process is reaped).
const exitGrace = 500 * time.Millisecond

// envAllowed is the part of the server's environment a plugin inherits: what
// a driver needs to find binaries, state and sockets. Nothing else (tokens,
// keys, store URLs) crosses; settings travel through Configure.
var envAllowed = []string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "TZ",
	"XDG_STATE_HOME", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "VMGATE_STATE_DIR", "VMGATE_LOG_LEVEL"}

func pluginEnv() []string {
	var env []string
	for _, k := range envAllowed {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// remote is the host side of a plugin's driver (the plugin client): every
// call, Run included, is one RPC.
type remote interface {
	hypervisor.Driver
	hypervisor.Runner
	hypervisor.Configurer
}

// instance is one plugin process and its connection.
type instance struct {
	client  *plugin.Client
	drv     remote // the gRPC client side
	proc    *procRunner
	started time.Time

	// Set by noteExitLocked (under Supervisor.mu).
	noted bool
	up    time.Duration // how long it ran
	delay time.Duration // restart delay chosen at its exit

	killOnce sync.Once
}

// kill stops the plugin process and frees go-plugin's connection and socket
// directory, once: Close (on shutdown) and the instance's watcher (when the
// process has exited) both call it, and a second go-plugin Kill would close
// the already closed connection, take that for a failed graceful stop and
// log "plugin failed to exit gracefully" after a clean exit. A later caller
// waits for the first to finish.
func (inst *instance) kill() {
	inst.killOnce.Do(inst.client.Kill)
}

// Supervisor is a plugin driver that survives its plugin's death: it
// implements hypervisor.Driver and hypervisor.Runner by forwarding to the
// current plugin process, restarting it with backoff when it has exited.
//
// Calls never hold mu while they run; starting a plugin holds startSem
// (so one start at a time, waited for with the caller's context).
type Supervisor struct {
	opts Options
	log  *slog.Logger
	spec Spec
	cmd  command

	startSem chan struct{}
	restarts atomic.Int64
	// caps are the last started plugin's capabilities (capabilities.go).
	caps  atomic.Pointer[hypervisor.Capabilities]
	cache *stateCache // recent ListVMs and Status answers (cache.go)

	mu         sync.Mutex // mu guards the fields below
	cur        *instance  // the running plugin; nil when none
	ever       bool       // a plugin has started at least once
	backoff    time.Duration
	nextStart  time.Time
	closed     bool
	retryTimer *time.Timer
	watchers   sync.WaitGroup
	// told are the WatchProcess functions, called under mu (so in the
	// order the events happened).
	told []func(hypervisor.ProcessEvent)
}

var (
	_ hypervisor.Driver         = (*Supervisor)(nil)
	_ hypervisor.Runner         = (*Supervisor)(nil)
	_ hypervisor.ProcessWatcher = (*Supervisor)(nil)
)

// WatchProcess adds fn to be told of the plugin's exits, restarts and
// failed restarts. fn is called with the supervisor's lock held, in the
// order the events happened: it must not block nor call the supervisor.
func (s *Supervisor) WatchProcess(fn func(hypervisor.ProcessEvent)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.told = append(s.told, fn)
}

// tellLocked tells the WatchProcess functions of an event of kind (s.mu
// held); restartIn is when the next start is tried, for an exit or a
// failed restart.
func (s *Supervisor) tellLocked(kind hypervisor.ProcessEventKind, restartIn time.Duration) {
	ev := hypervisor.ProcessEvent{Driver: s.spec.Driver, Kind: kind, Restarts: s.restarts.Load(), RestartIn: restartIn}
	for _, fn := range s.told {
		fn(ev)
	}
}

func newSupervisor(opts Options, log *slog.Logger, spec Spec, cmd command) *Supervisor {
	return &Supervisor{opts: opts, log: log, spec: spec, cmd: cmd, startSem: make(chan struct{}, 1), backoff: opts.MinBackoff,
		cache: newStateCache(opts.StateTTL)}
}

// Restarts counts the plugin starts after the first (for metrics).
func (s *Supervisor) Restarts() int64 { return s.restarts.Load() }

// PID is the running plugin's pid, 0 when none is running.
func (s *Supervisor) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return 0
	}
	return s.cur.proc.PID()
}

func (s *Supervisor) exited(err error) error {
	return &hypervisor.ExitedError{Driver: s.spec.Driver, Err: err}
}

// get returns the running plugin, starting one (after the backoff delay)
// when there is none.
func (s *Supervisor) get(ctx context.Context) (*instance, error) {
	if inst, err := s.current(); inst != nil || err != nil {
		return inst, err
	}
	select {
	case s.startSem <- struct{}{}:
	case <-ctx.Done():
		return nil, s.exited(ctx.Err())
	}
	defer func() { <-s.startSem }()

	inst, err := s.current()
	if inst != nil || err != nil {
		return inst, err
	}
	s.mu.Lock()
	wait, ever := time.Until(s.nextStart), s.ever
	s.mu.Unlock()
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, s.exited(ctx.Err())
		}
	}

	inst, err = s.start(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.nextStart = time.Now().Add(s.backoff)
		s.backoff = min(2*s.backoff, s.opts.MaxBackoff)
		if ever {
			return nil, s.exited(fmt.Errorf("restart: %w", err))
		}
		return nil, err
	}
	if s.closed {
		inst.kill()
		return nil, fmt.Errorf("driver %s: %w", s.spec.Driver, ErrClosed)
	}
	if s.ever {
		s.restarts.Add(1)
		s.log.Info("driver plugin restarted", "pid", inst.proc.PID(), "restarts", s.restarts.Load())
		s.tellLocked(hypervisor.ProcessRestarted, 0)
	}
	s.ever = true
	s.cur = inst
	s.watchers.Add(1)
	go s.watch(inst)
	return inst, nil
}

// current returns the running instance, nil if none, or ErrClosed.
func (s *Supervisor) current() (*instance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("driver %s: %w", s.spec.Driver, ErrClosed)
	}
	if s.cur != nil {
		select {
		case <-s.cur.proc.exited:
			s.noteExitLocked(s.cur) // its watcher has not run yet
		default:
		}
	}
	return s.cur, nil
}

// start launches one plugin process, completes the handshake and configures
// it. An external plugin is checked again (it may have changed since the
// last start) and run from the file the check opened.
func (s *Supervisor) start(ctx context.Context) (*instance, error) {
	var exe *os.File
	if s.cmd.external {
		f, err := openTrusted(s.cmd.path)
		if err != nil {
			s.log.Error("driver plugin refused: not trusted", "path", s.cmd.path, "err", err)
			return nil, fmt.Errorf("start %s: %w", s.cmd.path, err)
		}
		exe = f
		defer exe.Close() // the plugin process has its own copy once started
	}
	var proc *procRunner
	// No AutoMTLS: the plugin's sockets live in a directory go-plugin makes
	// for it (os.MkdirTemp, 0700), which both sides check is private to
	// this user before using the call socket there (hypervisor/callsocket.go).
	gp := &hypervisor.GRPCPlugin{Name: s.spec.Driver}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  hypervisor.Handshake(),
		Plugins:          plugin.PluginSet{hypervisor.PluginName: gp},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		SkipHostEnv:      true,
		StartTimeout:     s.opts.StartTimeout,
		Logger:           newHCLogAdapter(s.log),
		GRPCDialOptions:  hypervisor.GRPCDialOptions(),
		RunnerFunc: func(_ hclog.Logger, spec *exec.Cmd, socketDir string) (runner.Runner, error) {
			gp.SocketDir = socketDir
			env := append(pluginEnv(), spec.Env...) // spec.Env: go-plugin's handshake variables
			var err error
			proc, err = newProcRunner(s.cmd.path, s.cmd.args, env, exe)
			return proc, err
		},
	})
	fail := func(what string, err error) (*instance, error) {
		client.Kill()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	rpc, err := client.Client()
	if err != nil {
		tail := ""
		if proc != nil {
			tail = proc.tail.String()
		}
		s.log.Error("driver plugin refused: handshake failed", "path", s.cmd.path, "err", err, "stderr", tail)
		exited := false
		if proc != nil {
			select {
			case <-proc.exited:
				exited = true
			case <-time.After(exitGrace):
			}
		}
		// A plugin that quit explains itself on stderr (a wrong magic cookie does).
		if exited && tail != "" && !strings.Contains(err.Error(), tail) {
			err = fmt.Errorf("%w (plugin stderr: %s)", err, tail)
		}
		return fail(fmt.Sprintf("start %s", s.cmd.path), fmt.Errorf("%w: %w", ErrHandshake, err))
	}
	raw, err := rpc.Dispense(hypervisor.PluginName)
	if err != nil {
		return fail("dispense", err)
	}
	drv, ok := raw.(remote)
	if !ok {
		return fail("dispense", fmt.Errorf("plugin client %T is not a configurable driver", raw))
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.StartTimeout)
	defer cancel()
	if err := drv.Configure(cctx, s.spec.Config); err != nil {
		s.log.Error("driver plugin refused its configuration", "err", err)
		return fail("configure", err)
	}
	s.log.Info("driver plugin started", "pid", proc.PID(), "path", s.cmd.path, "transport", gp.Transport())
	return &instance{client: client, drv: drv, proc: proc, started: time.Now()}, nil
}

// watch waits for inst's process to exit, then forgets it (scheduling a
// restart) and releases go-plugin's resources.
func (s *Supervisor) watch(inst *instance) {
	defer s.watchers.Done()
	<-inst.proc.exited
	s.mu.Lock()
	s.noteExitLocked(inst)
	closed := s.closed
	s.mu.Unlock()
	inst.kill() // the process is gone; this frees the connection and socket dir
	if !closed {
		s.log.Warn("driver plugin exited", "pid", inst.proc.PID(), "status", exitStatus(inst.proc.exitErr()),
			"up", inst.up.Round(time.Millisecond), "restart_in", inst.delay)
	}
}

// noteExitLocked records that inst has exited, once: it stops being current,
// the restart delay is chosen (reset to MinBackoff when it had stayed up for
// StableAfter, else doubled) and a background restart is scheduled.
func (s *Supervisor) noteExitLocked(inst *instance) {
	if inst.noted {
		return
	}
	inst.noted = true
	if s.cur == inst {
		s.cur = nil
	}
	inst.up = time.Since(inst.started)
	if inst.up >= s.opts.StableAfter {
		s.backoff = s.opts.MinBackoff
	}
	inst.delay = s.backoff
	s.nextStart = time.Now().Add(inst.delay)
	s.backoff = min(2*s.backoff, s.opts.MaxBackoff)
	if !s.closed {
		s.scheduleRetryLocked(inst.delay)
		s.tellLocked(hypervisor.ProcessExited, inst.delay)
	}
}

// scheduleRetryLocked restarts the plugin in the background after delay, and
// again after each failure, until one start succeeds or s is closed.
func (s *Supervisor) scheduleRetryLocked(delay time.Duration) {
	if s.retryTimer != nil {
		s.retryTimer.Stop()
	}
	s.retryTimer = time.AfterFunc(delay, func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.StartTimeout)
		defer cancel()
		if _, err := s.get(ctx); err != nil && !errors.Is(err, ErrClosed) {
			s.log.Error("driver plugin restart failed", "err", err)
			s.mu.Lock()
			if !s.closed && s.cur == nil {
				s.scheduleRetryLocked(time.Until(s.nextStart))
				s.tellLocked(hypervisor.ProcessRestartFailed, time.Until(s.nextStart))
			}
			s.mu.Unlock()
		}
	})
}

func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// Close stops the plugin (kill, then wait for it) and refuses later calls.
func (s *Supervisor) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.retryTimer != nil {
		s.retryTimer.Stop()
	}
	inst := s.cur
	s.cur = nil
	s.mu.Unlock()
	if inst != nil {
		inst.kill()
	}
	// A start in progress finishes (bounded by StartTimeout), sees closed and
	// kills its plugin.
	s.startSem <- struct{}{}
	<-s.startSem
	s.watchers.Wait()
	return nil
}

// classify turns a transport failure of inst into ErrPluginExited when its
// process has exited, and then forgets inst at once (so the next call starts
// a new plugin rather than meeting the dead connection again).
func (s *Supervisor) classify(ctx context.Context, inst *instance, err error) error {
	var te *hypervisor.TransportError
	var ee *hypervisor.ExitedError
	if !errors.As(err, &te) && !errors.As(err, &ee) {
		return err
	}
	t := time.NewTimer(exitGrace)
	defer t.Stop()
	select {
	case <-inst.proc.exited:
		s.mu.Lock()
		s.noteExitLocked(inst)
		s.mu.Unlock()
		if ee != nil {
			return err
		}
		return s.exited(err)
	case <-t.C:
	case <-ctx.Done():
	}
	return err
}

func call[T any](s *Supervisor, ctx context.Context, fn func(remote) (T, error)) (T, error) {
	inst, err := s.get(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := fn(inst.drv)
	if err != nil {
		return v, s.classify(ctx, inst, err)
	}
	return v, nil
}

// ListVMs implements hypervisor.Driver; a fresh answer comes from the
// state cache (cache.go), copied.
func (s *Supervisor) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	return cachedCall(s, ctx, listKey, cloneVMs, func(d remote) ([]hypervisor.VM, error) { return d.ListVMs(ctx) })
}

// ListVMsShared is ListVMs without the copy (vmpage.SharedLister): the
// list the state cache keeps, shared with every caller until it expires,
// so a fleet's list_vms pages cost no copy of the whole fleet. The caller
// must not change the slice or its elements.
func (s *Supervisor) ListVMsShared(ctx context.Context) ([]hypervisor.VM, error) {
	return cachedCall(s, ctx, listKey, nil, func(d remote) ([]hypervisor.VM, error) { return d.ListVMs(ctx) })
}

// Status implements hypervisor.Driver; a fresh answer comes from the state
// cache (cache.go).
func (s *Supervisor) Status(ctx context.Context, vm string) (hypervisor.Status, error) {
	return cachedCall(s, ctx, statusKey(vm), nil, func(d remote) (hypervisor.Status, error) { return d.Status(ctx, vm) })
}

// AgentInfo implements hypervisor.Driver.
func (s *Supervisor) AgentInfo(ctx context.Context, vm string) (hypervisor.AgentInfo, error) {
	return call(s, ctx, func(d remote) (hypervisor.AgentInfo, error) { return d.AgentInfo(ctx, vm) })
}

// ExecStart implements hypervisor.Driver.
func (s *Supervisor) ExecStart(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	return inGuest(s, ctx, vm, func(d remote) (hypervisor.ExecHandle, error) { return d.ExecStart(ctx, vm, req) })
}

// ExecStatus implements hypervisor.Driver.
func (s *Supervisor) ExecStatus(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	return call(s, ctx, func(d remote) (hypervisor.ExecResult, error) { return d.ExecStatus(ctx, vm, h) })
}

// Run implements hypervisor.Runner: one RPC; the plugin decides how the
// command runs (see hypervisor.Run) and polls next to the guest.
func (s *Supervisor) Run(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecResult, error) {
	return inGuest(s, ctx, vm, func(d remote) (hypervisor.ExecResult, error) { return d.Run(ctx, vm, req) })
}

// FileRead implements hypervisor.Driver.
func (s *Supervisor) FileRead(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
	return call(s, ctx, func(d remote) (hypervisor.FileContent, error) { return d.FileRead(ctx, vm, path, maxBytes) })
}

// FileWrite implements hypervisor.Driver.
func (s *Supervisor) FileWrite(ctx context.Context, vm, path string, data []byte, mode uint32) error {
	_, err := inGuest(s, ctx, vm, func(d remote) (struct{}, error) { return struct{}{}, d.FileWrite(ctx, vm, path, data, mode) })
	return err
}

// Power implements hypervisor.Driver.
func (s *Supervisor) Power(ctx context.Context, vm string, action hypervisor.PowerAction) error {
	_, err := changing(s, ctx, func(d remote) (struct{}, error) { return struct{}{}, d.Power(ctx, vm, action) })
	return err
}

// String names the supervised driver.
func (s *Supervisor) String() string {
	return "driver " + s.spec.Driver + " (" + strings.Join(append([]string{s.cmd.path}, s.cmd.args...), " ") + ")"
}
