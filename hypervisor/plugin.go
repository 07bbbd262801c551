package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// The plugin handshake. A host and a plugin talk only when both the magic
// cookie and the protocol version match; ProtocolVersion changes whenever
// proto/driver.proto changes incompatibly.
const (
	ProtocolVersion  = 1
	MagicCookieKey   = "VMGATE_DRIVER_PLUGIN"
	MagicCookieValue = "b3e1c7a2-vmgate-hypervisor-driver"
	// PluginName is the single plugin a driver process serves.
	PluginName = "driver"
	// MaxMessageBytes bounds one gRPC message each way (file contents and
	// exec output travel whole).
	MaxMessageBytes = 64 << 20
)

// Handshake is the go-plugin handshake configuration host and plugins share.
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion:  ProtocolVersion,
		MagicCookieKey:   MagicCookieKey,
		MagicCookieValue: MagicCookieValue,
	}
}

// ErrNotConfigured: a call reached a Deferred driver before Configure.
var ErrNotConfigured = errors.New("driver not configured")

// Configurer is an optional capability: a driver that takes settings. The
// plugin host sends them (JSON) through the Configure RPC once, right after
// the handshake, and before any other call; never through argv or the
// environment.
type Configurer interface {
	Configure(ctx context.Context, config []byte) error
}

// ExitedError is the error of a call whose driver plugin process is gone.
// It matches ErrPluginExited with errors.Is; its message names the driver.
type ExitedError struct {
	Driver string
	// Err is what the transport said (may be nil).
	Err error
}

func (e *ExitedError) Error() string { return fmt.Sprintf("driver %s exited", e.Driver) }

// Unwrap makes errors.Is(err, ErrPluginExited) true and keeps the cause.
func (e *ExitedError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrPluginExited}
	}
	return []error{ErrPluginExited, e.Err}
}

// ProcessWatcher is an optional capability of a host-side driver that runs
// its backend's driver in a process of its own and starts it again when
// it dies (the plugin host's supervisor). WatchProcess adds fn, which is
// told of every exit, restart and failed restart after it happened, in
// the order they happened. fn runs on the driver's own goroutines without
// its locks held, and must not block.
type ProcessWatcher interface {
	WatchProcess(fn func(ProcessEvent))
}

// ProcessEventKind is what happened to a driver plugin process.
type ProcessEventKind string

// The kinds of ProcessEvent.
const (
	ProcessExited        ProcessEventKind = "exited"         // the process died; calls fail until a restart
	ProcessRestarted     ProcessEventKind = "restarted"      // a new process took over
	ProcessRestartFailed ProcessEventKind = "restart_failed" // starting a new one failed; it is tried again
)

// ProcessEvent is one exit, restart or failed restart of a driver plugin.
type ProcessEvent struct {
	Driver   string
	Kind     ProcessEventKind
	Restarts int64 // restarts so far
	// RestartIn is, for an exit or a failed restart, how long until the
	// next start is tried.
	RestartIn time.Duration
}

// TransportError is a failure of the plugin connection that carried no
// driver error (no ErrorDetail), other than the call's own context ending
// and other than the plugin being unreachable (that is an ExitedError).
// A supervisor that sees one checks whether the process has exited.
type TransportError struct {
	Driver string
	Op     string
	Err    error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("driver %s: %s: plugin transport: %v", e.Driver, e.Op, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// GRPCPlugin is the go-plugin glue for the Driver service. On the plugin
// side Impl is the driver served; on the host side Name is the driver's name
// used in errors ("driver qemu exited"). The dispensed value implements
// Driver, Runner and Configurer.
//
// The plugin side also serves the driver on its call socket (see
// callsocket.go) in the socket directory go-plugin gave it; the host side
// makes its calls there when SocketDir is set and the plugin offers one,
// and over gRPC otherwise. A GRPCPlugin serves or dispenses once.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Driver
	Name string
	// SocketDir (host side) is the plugin process's socket directory: the
	// directory go-plugin passes a ClientConfig.RunnerFunc.
	SocketDir string
	// GRPCOnly (plugin side) offers no call socket, as a plugin built before
	// it existed (for tests of the gRPC fallback).
	GRPCOnly bool

	calls     *callServer // plugin side: the call socket served, if any
	transport string      // host side: what the dispensed driver calls through
}

// Transport names what the dispensed driver's calls go through: "call
// socket" or "grpc" (empty before GRPCClient).
func (p *GRPCPlugin) Transport() string { return p.transport }

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the Driver service for p.Impl.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("hypervisor: plugin: no driver to serve")
	}
	registerServer(s, p.Impl)
	dir := os.Getenv(plugin.EnvUnixSocketDir)
	if dir == "" || p.GRPCOnly || !callSocketSupported {
		return nil
	}
	cs, err := listenCallSocket(dir, slog.Default())
	if err != nil {
		slog.Warn("no call socket: driver calls go over gRPC", "err", err)
		return nil
	}
	registerServer(cs, p.Impl)
	cs.start()
	p.calls = cs
	return nil
}

// GRPCClient returns the host-side Driver speaking to the plugin: through
// its call socket in SocketDir when it offers one, else over c. A call
// socket that is there but not private or not answering fails the start.
// The call socket's connections are closed when ctx (go-plugin's: it ends
// with the plugin process) ends.
func (p *GRPCPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	p.transport = "grpc"
	if p.SocketDir == "" {
		return newClient(p.Name, c), nil
	}
	dctx, cancel := context.WithTimeout(ctx, callDialTimeout)
	cc, err := dialCallSocket(dctx, p.SocketDir)
	cancel()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return newClient(p.Name, c), nil
	case err != nil:
		return nil, fmt.Errorf("driver %s: %w", p.Name, err)
	}
	context.AfterFunc(ctx, func() { cc.Close() })
	p.transport = "call socket"
	return newClient(p.Name, cc), nil
}

// callDialTimeout bounds connecting to a new plugin's call socket.
const callDialTimeout = 10 * time.Second

// PluginSet is the host-side plugin set for a driver called name.
func PluginSet(name string) plugin.PluginSet {
	return plugin.PluginSet{PluginName: &GRPCPlugin{Name: name}}
}

// GRPCDialOptions are the options a host uses to dial a driver plugin.
func GRPCDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes))}
}

// Serve serves d as a driver plugin on this process's stdout handshake and
// returns when the host shuts the plugin down (closing d if it is a Closer).
// It is the whole main of a plugin: `func main() { hypervisor.Serve(drv) }`.
// A process not started by a vmgate host (wrong or missing magic cookie)
// prints an explanation to stderr and exits 1.
//
// Serve routes slog's default logger to stderr as JSON lines that the host
// re-emits, with their levels and attributes, into its own log. Stdout
// belongs to the handshake: nothing else may write there.
func Serve(d Driver) {
	slog.SetDefault(slog.New(NewPluginLogHandler(os.Stderr, slog.LevelDebug)))
	gp := &GRPCPlugin{Impl: d}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake(),
		Plugins:         plugin.PluginSet{PluginName: gp},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			opts = append(opts, grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes))
			return grpc.NewServer(opts...)
		},
		Logger: hclog.New(&hclog.LoggerOptions{
			Name: "plugin", Level: hclog.Info, Output: os.Stderr, JSONFormat: true,
		}),
	})
	if gp.calls != nil {
		gp.calls.Close()
	}
	if c, ok := d.(Closer); ok {
		if err := c.Close(); err != nil {
			slog.Warn("driver close", "err", err)
		}
	}
}

// NewPluginLogHandler returns a slog handler writing JSON lines in the shape
// go-plugin hosts parse (@level, @message, @timestamp): a plugin's log records
// keep their level and attributes in the host's log.
func NewPluginLogHandler(w io.Writer, level slog.Leveler) slog.Handler {
	return slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				return slog.String("@timestamp", a.Value.Time().Format("2006-01-02T15:04:05.000000Z07:00"))
			case slog.LevelKey:
				return slog.String("@level", hclogLevel(a.Value.Any()))
			case slog.MessageKey:
				return slog.String("@message", a.Value.String())
			}
			return a
		},
	})
}

func hclogLevel(v any) string {
	l, ok := v.(slog.Level)
	if !ok {
		return "info"
	}
	switch {
	case l < slog.LevelDebug:
		return "trace"
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warn"
	}
	return "error"
}

// Deferred is a Driver built only when its configuration arrives: the body
// of a plugin whose settings come through Configure. Calls before Configure
// fail with ErrNotConfigured; Configure succeeds at most once. Served as a
// plugin, its Run RPC goes to the built driver (see Run).
type Deferred struct {
	build func(ctx context.Context, config []byte) (Driver, error)
	mu    sync.Mutex // mu serializes Configure
	d     atomic.Pointer[Driver]
}

var (
	_ Driver     = (*Deferred)(nil)
	_ Configurer = (*Deferred)(nil)
	_ Closer     = (*Deferred)(nil)
)

// NewDeferred returns a Deferred that builds its driver with build.
func NewDeferred(build func(ctx context.Context, config []byte) (Driver, error)) *Deferred {
	return &Deferred{build: build}
}

// Configure builds the driver from config. A second call is ErrInvalidArgument.
func (f *Deferred) Configure(ctx context.Context, config []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.d.Load() != nil {
		return fmt.Errorf("configure: %w: already configured", ErrInvalidArgument)
	}
	d, err := f.build(ctx, config)
	if err != nil {
		// Unprefixed: the host's client names the operation ("configure: …").
		return err
	}
	if d == nil {
		return errors.New("configure: constructor returned no driver")
	}
	f.d.Store(&d)
	return nil
}

func (f *Deferred) driver() (Driver, error) {
	p := f.d.Load()
	if p == nil {
		return nil, ErrNotConfigured
	}
	return *p, nil
}

// served is the driver behind d: the one a Deferred built (ErrNotConfigured
// before Configure), else d itself. A Deferred is no Runner: Run asks the
// built driver, so the question is asked once.
func served(d Driver) (Driver, error) {
	if f, ok := d.(*Deferred); ok {
		return f.driver()
	}
	return d, nil
}

// ListVMs implements Driver.
func (f *Deferred) ListVMs(ctx context.Context) ([]VM, error) {
	d, err := f.driver()
	if err != nil {
		return nil, err
	}
	return d.ListVMs(ctx)
}

// Status implements Driver.
func (f *Deferred) Status(ctx context.Context, vm string) (Status, error) {
	d, err := f.driver()
	if err != nil {
		return Status{}, err
	}
	return d.Status(ctx, vm)
}

// AgentInfo implements Driver.
func (f *Deferred) AgentInfo(ctx context.Context, vm string) (AgentInfo, error) {
	d, err := f.driver()
	if err != nil {
		return AgentInfo{}, err
	}
	return d.AgentInfo(ctx, vm)
}

// ExecStart implements Driver.
func (f *Deferred) ExecStart(ctx context.Context, vm string, req ExecRequest) (ExecHandle, error) {
	d, err := f.driver()
	if err != nil {
		return ExecHandle{}, err
	}
	return d.ExecStart(ctx, vm, req)
}

// ExecStatus implements Driver.
func (f *Deferred) ExecStatus(ctx context.Context, vm string, h ExecHandle) (ExecResult, error) {
	d, err := f.driver()
	if err != nil {
		return ExecResult{}, err
	}
	return d.ExecStatus(ctx, vm, h)
}

// FileRead implements Driver.
func (f *Deferred) FileRead(ctx context.Context, vm, path string, maxBytes int64) (FileContent, error) {
	d, err := f.driver()
	if err != nil {
		return FileContent{}, err
	}
	return d.FileRead(ctx, vm, path, maxBytes)
}

// FileWrite implements Driver.
func (f *Deferred) FileWrite(ctx context.Context, vm, path string, data []byte, mode uint32) error {
	d, err := f.driver()
	if err != nil {
		return err
	}
	return d.FileWrite(ctx, vm, path, data, mode)
}

// Power implements Driver.
func (f *Deferred) Power(ctx context.Context, vm string, action PowerAction) error {
	d, err := f.driver()
	if err != nil {
		return err
	}
	return d.Power(ctx, vm, action)
}

// Close closes the built driver if it is a Closer.
func (f *Deferred) Close() error {
	p := f.d.Load()
	if p == nil {
		return nil
	}
	if c, ok := (*p).(Closer); ok {
		return c.Close()
	}
	return nil
}
