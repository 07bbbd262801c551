package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/plugins/internal/agentexec"
	"github.com/vmgate/vmgate/plugins/internal/helperchan"
)

// Driver defaults.
const (
	// DefaultExecTimeout bounds a command whose request sets no Timeout.
	DefaultExecTimeout = agentexec.DefaultExecTimeout
	// DefaultInfoTTL is how long a guest-info answer is trusted for the exec preflight.
	DefaultInfoTTL = agentexec.DefaultInfoTTL
	// statusPing bounds the guest-ping of Status and the QMP query of ListVMs.
	statusPing = 2 * time.Second
	// agentFirst bounds the agent's attempt at shutdown or reboot before the QMP fallback.
	agentFirst = 3 * time.Second
)

// Config configures the Driver.
type Config struct {
	// VMs are QEMU VMs given by their sockets.
	VMs []VMConfig
	// LabDir is <stateDir>/lab: every <LabDir>/<name>/vm.json is a lab VM
	// whose sockets are <LabDir>/<name>/qmp.sock and qga.sock. Empty: none.
	LabDir string
	// ExecTimeout bounds a command whose request has no Timeout.
	// Default DefaultExecTimeout.
	ExecTimeout time.Duration
	// InfoTTL is how long guest-info is cached for the exec preflight.
	// Default DefaultInfoTTL.
	InfoTTL time.Duration
	// HelperSilenceLimit is how long a resident helper may send nothing
	// while it owes an answer before its channel's connection is given up
	// (helperchan.Options.SilenceLimit). Zero means mux.DefaultSilenceLimit
	// (30 s); otherwise between helperchan.MinSilenceLimit and
	// helperchan.MaxSilenceLimit.
	HelperSilenceLimit time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// VMConfig is one configured VM.
type VMConfig struct {
	Name      string
	QMPSocket string
	QGASocket string
	// HelperSocket is the host end of the VM's virtio-serial port
	// org.vmgate.guest.0 (vmgate-guest's resident helper); "" for none.
	HelperSocket string
	// EventsSocket is a second QMP monitor of the VM (-mon
	// chardev=...,mode=control) that the driver holds to hear the helper's
	// port close (helperwatch.go); "" for none.
	EventsSocket string
	// ConsoleSocket and ConsoleLog are the VM's serial console: the
	// socket and the logfile of its socket chardev (console.go). Empty:
	// the console tools say what to configure.
	ConsoleSocket string
	ConsoleLog    string
}

// agent is what the driver needs of a guest agent; *qga.Client implements it.
type agent interface {
	Ping(ctx context.Context) error
	Info(ctx context.Context) (qga.Info, error)
	Exec(ctx context.Context, req qga.ExecRequest) (qga.ExecStatus, error)
	ExecStart(ctx context.Context, req qga.ExecRequest) (int64, error)
	ExecStatus(ctx context.Context, pid int64, maxOutputBytes int64) (qga.ExecStatus, error)
	KillTree(ctx context.Context, pid int64) error
	FileRead(ctx context.Context, path string, maxBytes int64) ([]byte, bool, error)
	FileWrite(ctx context.Context, path string, data []byte, mode uint32) error
	Shutdown(ctx context.Context, mode string) error
	Close() error
}

// monitor is what the driver needs of a QMP connection; *Monitor implements it.
type monitor interface {
	ConnectContext(ctx context.Context) error
	RunContext(ctx context.Context, command []byte) ([]byte, error)
	Disconnect() error
}

// eventsMonitor is a monitor that also delivers events; *Monitor
// implements it.
type eventsMonitor interface {
	monitor
	Events(ctx context.Context) (<-chan qmp.Event, error)
}

// Driver is the QEMU backend. It is safe for concurrent use; every VM has its
// own agent client, monitor and locks, so a hung VM delays only calls to itself.
type Driver struct {
	// Exec is the exec road shared with the other guest-agent drivers:
	// AgentInfo, Run, ExecStart and ExecStatus (see agentexec.Core).
	agentexec.Exec

	cfg        Config
	log        *slog.Logger
	configured map[string]VMConfig

	// newAgent and newMonitor make the per-VM clients; tests replace them.
	newAgent   func(sockPath string) agent
	newMonitor func(sockPath string) monitor
	// startProcess runs a lab VM's argv (with -daemonize) and waits for the
	// launcher to exit; tests replace it.
	startProcess func(ctx context.Context, argv []string) error

	// core is the exec road; it tracks the commands ExecStart started and
	// caches guest-info per VM.
	core *agentexec.Core
	// helpers are the resident helpers' channels (helper.go).
	helpers *helperchan.Pool
	// newEventsMonitor makes a helper port watch's monitor (tests
	// replace it); ctx ends with Close, which waits for the watches.
	newEventsMonitor func(sockPath string) eventsMonitor
	ctx              context.Context
	cancel           context.CancelFunc
	watchers         sync.WaitGroup

	// mu guards vms and closed. It is never held across I/O.
	mu     sync.Mutex
	vms    map[string]*vmState
	closed bool
}

var (
	_ hypervisor.Driver       = (*Driver)(nil)
	_ hypervisor.Runner       = (*Driver)(nil)
	_ hypervisor.Closer       = (*Driver)(nil)
	_ hypervisor.HelperCaller = (*Driver)(nil)
)

// vmState is one VM's clients and caches.
type vmState struct {
	name    string
	qmpPath string
	qgaPath string
	// helperPath is the host end of the resident helper's port ("" for none).
	helperPath string
	// eventsPath is a QMP monitor of the driver's own for the port's
	// events ("" for none; helperwatch.go).
	eventsPath string
	labDir     string // non-empty for a lab VM

	// qmpMu serialises QMP operations on this VM: QEMU's QMP socket serves
	// one client at a time, so the driver connects per operation and
	// disconnects after, leaving the socket free for other tools.
	qmpMu sync.Mutex
	mon   monitor

	// mu guards agent and watching. Never held across I/O.
	mu    sync.Mutex
	agent agent
	// watching: the helper port's watch runs; watchAgain: not before
	// then after one that could not start (helperwatch.go).
	watching   bool
	watchAgain time.Time
	// snap serialises snapshot operations (snapshot.go).
	snap snapState

	// consoleSock and consoleLog are a configured VM's console (a lab
	// VM's are in labDir); consoleMu serialises console writes.
	consoleSock, consoleLog string
	consoleMu               sync.Mutex
}

// New checks cfg and returns a Driver. Nothing is connected yet.
func New(cfg Config) (*Driver, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("qemu: config: %w", err)
	}
	if cfg.ExecTimeout == 0 {
		cfg.ExecTimeout = DefaultExecTimeout
	}
	if cfg.InfoTTL == 0 {
		cfg.InfoTTL = DefaultInfoTTL
	}
	configured := make(map[string]VMConfig, len(cfg.VMs))
	for _, vm := range cfg.VMs {
		configured[vm.Name] = vm
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("driver", "qemu")
	d := &Driver{
		cfg:        cfg,
		log:        log,
		configured: configured,
		vms:        make(map[string]*vmState),
	}
	d.core = agentexec.NewCore(agentexec.CoreConfig{Driver: "qemu", Reach: d.reach,
		ExecTimeout: cfg.ExecTimeout, InfoTTL: cfg.InfoTTL, Logger: log})
	d.Exec = d.core.Exec()
	d.helpers = helperchan.New(helperchan.Options{SilenceLimit: cfg.HelperSilenceLimit})
	d.newAgent = func(p string) agent { return qga.New(p, qga.WithLogger(log)) }
	d.newMonitor = func(p string) monitor { return NewMonitor("unix", p, MonitorOptions{Logger: log}) }
	d.newEventsMonitor = func(p string) eventsMonitor { return NewMonitor("unix", p, MonitorOptions{Logger: log}) }
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.startProcess = startDaemonized
	return d, nil
}

// Close closes every agent client and stops the exec watchdogs.
func (d *Driver) Close() error {
	d.mu.Lock()
	d.closed = true
	vms := d.vms
	d.vms = map[string]*vmState{}
	d.mu.Unlock()
	d.core.Close()
	d.cancel()
	d.watchers.Wait()
	d.helpers.Close()
	var errs []error
	for _, vm := range vms {
		errs = append(errs, d.closeVM(vm))
	}
	return errors.Join(errs...)
}

// closeVM stops vm's exec watchdogs and closes its agent client.
func (d *Driver) closeVM(vm *vmState) error {
	d.core.Forget(vm.name)
	if vm.helperPath != "" {
		d.helpers.Forget(vm.helperPath)
	}
	vm.mu.Lock()
	a := vm.agent
	vm.agent = nil
	vm.mu.Unlock()
	if a != nil {
		return a.Close()
	}
	return nil
}

// lookup finds the VM called name: a configured VM, else a lab VM whose
// vm.json exists now.
func (d *Driver) lookup(op, name string) (*vmState, error) {
	if !vmName.MatchString(name) {
		return nil, fmt.Errorf("qemu: %s: %w: %q is not a valid VM name", op, hypervisor.ErrUnknownVM, name)
	}
	cfg, isConfigured := d.configured[name]
	labDir := ""
	if !isConfigured {
		if d.cfg.LabDir == "" {
			return nil, fmt.Errorf("qemu: %s: %w: %q", op, hypervisor.ErrUnknownVM, name)
		}
		labDir = filepath.Join(d.cfg.LabDir, name)
		if _, err := os.Stat(filepath.Join(labDir, "vm.json")); err != nil {
			d.forget(name)
			return nil, fmt.Errorf("qemu: %s: %w: %q", op, hypervisor.ErrUnknownVM, name)
		}
		cfg.EventsSocket = filepath.Join(labDir, lab.EventsSocketName)
		if _, err := os.Stat(cfg.EventsSocket); err != nil {
			cfg.EventsSocket = "" // a VM an older vmgate started
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("qemu: %s: driver closed", op)
	}
	if vm, ok := d.vms[name]; ok {
		return vm, nil
	}
	vm := &vmState{name: name, qmpPath: cfg.QMPSocket, qgaPath: cfg.QGASocket, helperPath: cfg.HelperSocket, eventsPath: cfg.EventsSocket, labDir: labDir,
		consoleSock: cfg.ConsoleSocket, consoleLog: cfg.ConsoleLog}
	if labDir != "" {
		vm.qmpPath = filepath.Join(labDir, "qmp.sock")
		vm.qgaPath = filepath.Join(labDir, "qga.sock")
		vm.helperPath = filepath.Join(labDir, lab.HelperSocketName)
	}
	vm.mon = d.newMonitor(vm.qmpPath)
	d.vms[name] = vm
	return vm, nil
}

// forget drops a lab VM that no longer exists.
func (d *Driver) forget(name string) {
	d.mu.Lock()
	vm, ok := d.vms[name]
	delete(d.vms, name)
	d.mu.Unlock()
	if ok {
		d.closeVM(vm)
	}
}

// reach is the core's way to a VM: the VM called name and its agent.
func (d *Driver) reach(_ context.Context, op, name string) (agentexec.Target, error) {
	vm, err := d.lookup(op, name)
	if err != nil {
		return agentexec.Target{}, err
	}
	return d.target(vm), nil
}

// target is vm as the core reaches it; an unavailable agent is explained
// by QEMU itself being gone.
func (d *Driver) target(vm *vmState) agentexec.Target {
	return agentexec.Target{Key: vm.name, Agent: d.agentOf(vm), Why: vm.gone}
}

// gone reports (ErrVMNotRunning) when no QEMU listens on vm's QMP socket
// any more: then its agent is unavailable because the VM is gone.
func (vm *vmState) gone(ctx context.Context, _ error) error {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := vm.queryStatus(qctx); errors.Is(err, hypervisor.ErrVMNotRunning) {
		return fmt.Errorf("%w: no QEMU listens on %s", hypervisor.ErrVMNotRunning, vm.qmpPath)
	}
	return nil
}

// agentOf returns vm's agent client, creating it on first use.
func (d *Driver) agentOf(vm *vmState) agent {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.agent == nil {
		vm.agent = d.newAgent(vm.qgaPath)
	}
	return vm.agent
}

// qmp runs one QMP command on vm over a fresh connection.
func (vm *vmState) qmp(ctx context.Context, command string) ([]byte, error) {
	vm.qmpMu.Lock()
	defer vm.qmpMu.Unlock()
	if err := vm.mon.ConnectContext(ctx); err != nil {
		return nil, err
	}
	defer vm.mon.Disconnect()
	return vm.mon.RunContext(ctx, []byte(`{"execute":"`+command+`"}`))
}

// queryStatus returns QMP's status word, or ErrVMNotRunning when nothing
// listens on the QMP socket.
func (vm *vmState) queryStatus(ctx context.Context) (string, error) {
	out, err := vm.qmp(ctx, "query-status")
	if err != nil {
		if isRefused(err) {
			return "", fmt.Errorf("%w: %w", hypervisor.ErrVMNotRunning, err)
		}
		return "", err
	}
	var r struct {
		Return struct {
			Status string `json:"status"`
		} `json:"return"`
	}
	if err := json.Unmarshal(out, &r); err != nil || r.Return.Status == "" {
		return "", fmt.Errorf("query-status: unexpected reply %.200s", out)
	}
	return r.Return.Status, nil
}

// isRefused reports whether err means no QEMU listens (socket missing or refused).
func isRefused(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, errConnRefused)
}

// stateOf maps QMP's RunState to a hypervisor.State.
func stateOf(status string) hypervisor.State {
	switch status {
	case "running":
		return hypervisor.StateRunning
	case "shutdown":
		return hypervisor.StateStopped
	case "paused", "suspended", "debug", "prelaunch", "inmigrate", "postmigrate",
		"finish-migrate", "save-vm", "restore-vm", "io-error", "watchdog",
		"guest-panicked", "internal-error", "colo":
		return hypervisor.StatePaused
	}
	return hypervisor.StateUnknown
}

// vmError maps a QMP error to the hypervisor sentinels.
func vmError(op string, err error) error {
	switch {
	case errors.Is(err, hypervisor.ErrVMNotRunning):
		return fmt.Errorf("qemu: %s: %w", op, err)
	case isRefused(err):
		return fmt.Errorf("qemu: %s: %w: %w", op, hypervisor.ErrVMNotRunning, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("qemu: %s: %w: %w", op, hypervisor.ErrTimeout, err)
	}
	return fmt.Errorf("qemu: %s: %w", op, err)
}

// ListVMs returns the configured VMs and the lab VMs, sorted by name, each
// with its state from query-status (queried concurrently, each bounded).
func (d *Driver) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	names := make([]string, 0, len(d.configured))
	for name := range d.configured {
		names = append(names, name)
	}
	if d.cfg.LabDir != "" {
		entries, err := os.ReadDir(d.cfg.LabDir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("qemu: list: %w", err)
		}
		for _, e := range entries {
			if !e.IsDir() || !vmName.MatchString(e.Name()) || d.configured[e.Name()] != (VMConfig{}) {
				continue
			}
			if _, err := os.Stat(filepath.Join(d.cfg.LabDir, e.Name(), "vm.json")); err == nil {
				names = append(names, e.Name())
			}
		}
	}
	sort.Strings(names)
	out := make([]hypervisor.VM, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		out[i] = hypervisor.VM{Name: name, State: hypervisor.StateUnknown, Agent: true, Info: "configured"}
		vm, err := d.lookup("list", name)
		if err != nil {
			continue // vanished meanwhile
		}
		if vm.labDir != "" {
			out[i].Info = "lab VM"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			qctx, cancel := context.WithTimeout(ctx, statusPing)
			defer cancel()
			status, err := vm.queryStatus(qctx)
			switch {
			case err == nil:
				out[i].State = stateOf(status)
			case errors.Is(err, hypervisor.ErrVMNotRunning):
				out[i].State = hypervisor.StateStopped
			default:
				d.log.Debug("query-status failed", "vm", name, "err", err)
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("qemu: list: %w: %w", hypervisor.ErrTimeout, err)
	}
	return slices.DeleteFunc(out, func(v hypervisor.VM) bool { return v.Name == "" }), nil
}

// Status reports the VM's QMP state and whether its agent answers a ping.
func (d *Driver) Status(ctx context.Context, name string) (hypervisor.Status, error) {
	vm, err := d.lookup("status", name)
	if err != nil {
		return hypervisor.Status{}, err
	}
	st := hypervisor.Status{Name: name}
	status, err := vm.queryStatus(ctx)
	switch {
	case errors.Is(err, hypervisor.ErrVMNotRunning):
		st.State = hypervisor.StateStopped
		st.Detail = "no QEMU listening on the QMP socket"
		return st, nil
	case err != nil:
		return hypervisor.Status{}, vmError("status", err)
	}
	st.State, st.Detail = stateOf(status), status
	if st.State != hypervisor.StateRunning {
		return st, nil // a paused guest cannot answer
	}
	pctx, cancel := context.WithTimeout(ctx, statusPing)
	defer cancel()
	a := d.agentOf(vm)
	if err := a.Ping(pctx); err != nil {
		d.log.Debug("guest-ping failed", "vm", name, "err", err)
		return st, nil
	}
	st.AgentConnected = true
	if info, err := d.core.Info(pctx, d.target(vm), false); err == nil {
		st.AgentVersion = info.Version
	}
	return st, nil
}

// FileRead reads at most maxBytes of path in the guest.
func (d *Driver) FileRead(ctx context.Context, name string, path string, maxBytes int64) (hypervisor.FileContent, error) {
	vm, err := d.lookup("file read", name)
	if err != nil {
		return hypervisor.FileContent{}, err
	}
	if err := checkPath("file read", path); err != nil {
		return hypervisor.FileContent{}, err
	}
	if maxBytes < 0 {
		return hypervisor.FileContent{}, fmt.Errorf("qemu: file read: %w: negative max bytes", hypervisor.ErrInvalidArgument)
	}
	data, truncated, err := d.agentOf(vm).FileRead(ctx, path, maxBytes)
	if err != nil {
		return hypervisor.FileContent{}, d.core.Err(ctx, d.target(vm), "file read", err)
	}
	return hypervisor.FileContent{Data: data, Truncated: truncated}, nil
}

// FileWrite creates or replaces path in the guest.
func (d *Driver) FileWrite(ctx context.Context, name string, path string, data []byte, mode uint32) error {
	vm, err := d.lookup("file write", name)
	if err != nil {
		return err
	}
	if err := checkPath("file write", path); err != nil {
		return err
	}
	if mode > 0o7777 {
		return fmt.Errorf("qemu: file write: %w: mode %#o", hypervisor.ErrInvalidArgument, mode)
	}
	if err := d.agentOf(vm).FileWrite(ctx, path, data, mode); err != nil {
		return d.core.Err(ctx, d.target(vm), "file write", err)
	}
	return nil
}

func checkPath(op, path string) error {
	if path == "" || !filepath.IsAbs(path) {
		return fmt.Errorf("qemu: %s: %w: path %q must be absolute", op, hypervisor.ErrInvalidArgument, path)
	}
	for _, r := range path {
		if r == 0 {
			return fmt.Errorf("qemu: %s: %w: path contains NUL", op, hypervisor.ErrInvalidArgument)
		}
	}
	return nil
}

// Power performs action: shutdown and reboot through the agent with a QMP
// fallback, reset and stop through QMP, start only for lab VMs.
func (d *Driver) Power(ctx context.Context, name string, action hypervisor.PowerAction) error {
	if !action.Valid() {
		return fmt.Errorf("qemu: power: %w: unknown action %q", hypervisor.ErrInvalidArgument, action)
	}
	op := "power " + string(action)
	vm, err := d.lookup(op, name)
	if err != nil {
		return err
	}
	defer d.core.ForgetInfo(vm.name)
	switch action {
	case hypervisor.PowerShutdown:
		return d.agentThenQMP(ctx, op, vm, "powerdown", "system_powerdown")
	case hypervisor.PowerReboot:
		return d.agentThenQMP(ctx, op, vm, "reboot", "system_reset")
	case hypervisor.PowerReset:
		if _, err := vm.qmp(ctx, "system_reset"); err != nil {
			return vmError(op, err)
		}
		return nil
	case hypervisor.PowerStop:
		return d.stop(ctx, op, vm)
	default: // hypervisor.PowerStart
		return d.start(ctx, op, vm)
	}
}

// agentThenQMP asks the agent (bounded by agentFirst) and falls back to a
// QMP command when the agent is unavailable, refuses or does not answer.
func (d *Driver) agentThenQMP(ctx context.Context, op string, vm *vmState, mode, fallback string) error {
	status, err := vm.queryStatus(ctx)
	if err != nil {
		return vmError(op, err)
	}
	if stateOf(status) == hypervisor.StateRunning {
		actx, cancel := context.WithTimeout(ctx, agentFirst)
		err := d.agentOf(vm).Shutdown(actx, mode)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return d.core.Err(ctx, agentexec.Target{Key: vm.name}, op, err)
		}
		d.log.Info("guest agent did not take the request; using QMP", "vm", vm.name, "op", op, "err", err)
	}
	if _, err := vm.qmp(ctx, fallback); err != nil {
		return vmError(op, err)
	}
	return nil
}

// stop quits QEMU; for a lab VM it then waits until the process is gone.
func (d *Driver) stop(ctx context.Context, op string, vm *vmState) error {
	pid := 0
	if vm.labDir != "" {
		pid = readPID(vm.labDir)
	}
	if _, err := vm.qmp(ctx, "quit"); err != nil && !errors.Is(err, ErrNotConnected) {
		// ErrNotConnected: QEMU closed the socket before its reply reached us.
		return vmError(op, err)
	}
	d.closeVM(vm) // the agent channel went with QEMU
	if pid <= 0 {
		return nil
	}
	var b hypervisor.Backoff
	for processAlive(pid) {
		if b.Sleep(ctx, 0) != nil {
			return fmt.Errorf("qemu: %s: %w: pid %d still alive: %w", op, hypervisor.ErrTimeout, pid, ctx.Err())
		}
	}
	return nil
}

// start re-runs a lab VM's stored argv with -daemonize.
func (d *Driver) start(ctx context.Context, op string, vm *vmState) error {
	if vm.labDir == "" {
		return fmt.Errorf("qemu: %s: %w: %s was not launched by vmgate", op, hypervisor.ErrNotSupported, vm.name)
	}
	if _, err := vm.queryStatus(ctx); err == nil {
		return nil // already running
	} else if !errors.Is(err, hypervisor.ErrVMNotRunning) {
		return vmError(op, err)
	}
	argv, err := readArgv(vm.labDir, vm.qmpPath)
	if err != nil {
		return fmt.Errorf("qemu: %s: %w", op, err)
	}
	if !slices.Contains(argv, "-daemonize") {
		argv = append(argv, "-daemonize")
	}
	if err := d.startProcess(ctx, argv); err != nil {
		return fmt.Errorf("qemu: %s: %w", op, err)
	}
	d.closeVM(vm)
	var b hypervisor.Backoff
	for {
		_, err := vm.queryStatus(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return vmError(op, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(b.Next()):
		}
	}
}
