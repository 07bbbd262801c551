// Package pluginhost launches and supervises vmgate's hypervisor drivers as
// go-plugin processes.
//
// A built-in driver (see Registry and Registered) runs as the vmgate binary itself
// (`vmgate plugin NAME`); an external driver is an executable named
// vmgate-plugin-NAME in the configured plugin directory. Either way the
// plugin gets its settings through the Configure RPC right after the
// handshake (never argv, never the environment), its stdin is /dev/null (the
// server's stdin is the MCP stream), its stderr goes into the server's slog,
// and it gets SIGKILL when the server dies (Pdeathsig). With
// Options.InProcess a built-in driver runs inside the server instead, for
// debugging.
//
// A Supervisor stands in for a plugin as a hypervisor.Driver: a call in
// flight when the plugin dies fails with hypervisor.ErrPluginExited ("driver
// NAME exited"), the plugin is restarted with backoff (in the background and
// on the next call), and the next call works. Its calls go through the
// plugin's call socket (hypervisor/callsocket.go) and its ListVMs and Status
// answers are reused for Options.StateTTL (cache.go). Host.Close stops every
// plugin and waits for it.
package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/registry"
)

// ExternalPrefix starts the file name of an external driver plugin.
const ExternalPrefix = "vmgate-plugin-"

// Defaults for Options.
const (
	DefaultStartTimeout = 30 * time.Second
	DefaultMinBackoff   = 100 * time.Millisecond
	DefaultMaxBackoff   = 5 * time.Second
	DefaultStableAfter  = 30 * time.Second
)

var (
	// ErrUnknownDriver: no built-in driver and no plugin executable by that name.
	ErrUnknownDriver = errors.New("unknown driver")
	// ErrClosed: the host or supervisor has been shut down.
	ErrClosed = errors.New("plugin host closed")
	// ErrHandshake: the plugin did not complete the go-plugin handshake
	// (wrong magic cookie, protocol version or protocol; not a plugin).
	ErrHandshake = errors.New("plugin handshake failed")
)

// Options configure a Host. The zero value runs built-ins as plugins of
// this executable with default timings.
type Options struct {
	// Logger receives the host's records and every plugin's stderr; nil
	// means slog.Default().
	Logger *slog.Logger
	// Registry is the built-in drivers (Registered() in vmgate);
	// nil means none: only external plugins can be launched.
	Registry Registry
	// PluginDir holds external plugins (vmgate-plugin-NAME); empty: none.
	PluginDir string
	// InProcess runs built-in drivers inside this process (debugging).
	// External drivers always run as plugins.
	InProcess bool
	// Executable and BuiltinArgs are how a built-in plugin is started:
	// Executable (default: this process's executable) with BuiltinArgs(name)
	// (default: "plugin", name).
	Executable  string
	BuiltinArgs func(name string) []string
	// StartTimeout bounds a plugin's start and handshake.
	StartTimeout time.Duration
	// MinBackoff, MaxBackoff: restart delays double from Min to Max; they are
	// reset once a plugin has stayed up for StableAfter.
	MinBackoff, MaxBackoff, StableAfter time.Duration
	// StateTTL is how long a plugin's ListVMs and Status answers are reused
	// (cache.go); 0 means DefaultStateTTL, negative never.
	StateTTL time.Duration
}

// Spec is a driver to launch.
type Spec struct {
	// Driver is a built-in name or NAME of an external vmgate-plugin-NAME:
	// 1–32 of [a-z0-9_-]. Errors name it ("driver qemu exited").
	Driver string
	// Backend is the backend this driver serves ("lab"), for logs.
	Backend string
	// Config is the driver's JSON configuration; empty means none.
	Config json.RawMessage
}

// Host launches drivers and stops them on Close. It is safe for concurrent use.
type Host struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex // mu guards closed and launched
	closed   bool
	launched []func() error // closers of running drivers
}

// New returns a Host. Nothing runs until Launch.
func New(opts Options) *Host {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = Registry{}
	}
	if opts.BuiltinArgs == nil {
		opts.BuiltinArgs = func(name string) []string { return []string{"plugin", name} }
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(DefaultMaxBackoff, opts.MinBackoff)
	}
	if opts.StableAfter <= 0 {
		opts.StableAfter = DefaultStableAfter
	}
	if opts.StateTTL == 0 {
		opts.StateTTL = DefaultStateTTL
	}
	return &Host{opts: opts, log: opts.Logger}
}

// command is how to start a plugin process.
type command struct {
	path string
	args []string
	// external: a vmgate-plugin-NAME of plugin_dir, checked (trust.go)
	// and run from its open file at every start.
	external bool
}

// resolve validates spec and finds how to run it. No side effect.
func (h *Host) resolve(spec Spec) (command, Builtin, error) {
	if !registry.ValidName(spec.Driver) {
		return command{}, nil, fmt.Errorf("%w: bad driver name %q (want 1-32 of [a-z0-9_-])", hypervisor.ErrInvalidArgument, spec.Driver)
	}
	if len(spec.Config) > 0 && !json.Valid(spec.Config) {
		return command{}, nil, fmt.Errorf("%w: driver %s: config is not valid JSON", hypervisor.ErrInvalidArgument, spec.Driver)
	}
	if b, ok := h.opts.Registry[spec.Driver]; ok {
		exe := h.opts.Executable
		if exe == "" {
			var err error
			if exe, err = os.Executable(); err != nil {
				return command{}, nil, fmt.Errorf("find own executable: %w", err)
			}
		}
		return command{path: exe, args: h.opts.BuiltinArgs(spec.Driver)}, b, nil
	}
	if h.opts.PluginDir == "" {
		return command{}, nil, fmt.Errorf("%w: %q is not built in and no plugin directory is configured", ErrUnknownDriver, spec.Driver)
	}
	dir, err := filepath.Abs(h.opts.PluginDir)
	if err != nil {
		return command{}, nil, fmt.Errorf("plugin directory: %w", err)
	}
	path := filepath.Join(dir, ExternalPrefix+spec.Driver)
	if err := checkExecutable(path); errors.Is(err, ErrUntrustedPlugin) {
		return command{}, nil, fmt.Errorf("driver %s: %w", spec.Driver, err)
	} else if err != nil {
		return command{}, nil, fmt.Errorf("%w: %q: %w", ErrUnknownDriver, spec.Driver, err)
	}
	return command{path: path, external: true}, nil, nil
}

// checkExecutable accepts an executable file that root or this user owns
// and nobody else can change, on a path nobody else can change (trust.go).
func checkExecutable(path string) error {
	f, err := openTrusted(path)
	if err != nil {
		return err
	}
	return f.Close()
}

// Discover lists the external drivers in dir: the NAMEs of its executable
// vmgate-plugin-NAME files that Launch would run (trust.go), sorted.
func Discover(dir string) ([]string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("pluginhost: discover: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("pluginhost: discover: %w", err)
	}
	var names []string
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), ExternalPrefix)
		if !ok || !registry.ValidName(name) {
			continue
		}
		if checkExecutable(filepath.Join(dir, e.Name())) == nil {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// Launch starts spec's driver and returns it once it has been configured. A
// plugin driver is a *Supervisor; with Options.InProcess a built-in driver is
// returned as its constructor built it. Launch fails (and leaves nothing
// running) when the driver is unknown, its config is refused, or the plugin
// does not complete the handshake.
func (h *Host) Launch(ctx context.Context, spec Spec) (hypervisor.Driver, error) {
	cmd, builtin, err := h.resolve(spec)
	if err != nil {
		return nil, fmt.Errorf("pluginhost: launch: %w", err)
	}
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("pluginhost: launch %s: %w", spec.Driver, ErrClosed)
	}
	log := h.log.With("driver", spec.Driver)
	if spec.Backend != "" {
		log = log.With("backend", spec.Backend)
	}

	var d hypervisor.Driver
	var closeFn func() error
	if builtin != nil && h.opts.InProcess {
		d, err = builtin(ctx, spec.Config)
		if err != nil {
			return nil, fmt.Errorf("pluginhost: launch %s in process: %w", spec.Driver, err)
		}
		log.Info("driver running in process")
		closeFn = func() error {
			if c, ok := d.(hypervisor.Closer); ok {
				return c.Close()
			}
			return nil
		}
	} else {
		s := newSupervisor(h.opts, log, spec, cmd)
		if _, err := s.get(ctx); err != nil {
			s.Close()
			return nil, fmt.Errorf("pluginhost: launch %s: %w", spec.Driver, err)
		}
		d, closeFn = s, s.Close
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		closeFn()
		return nil, fmt.Errorf("pluginhost: launch %s: %w", spec.Driver, ErrClosed)
	}
	h.launched = append(h.launched, closeFn)
	return d, nil
}

// Close stops every launched driver (plugins are killed and waited for) and
// refuses later launches. It is safe to call more than once.
func (h *Host) Close() error {
	h.mu.Lock()
	h.closed = true
	closers := h.launched
	h.launched = nil
	h.mu.Unlock()

	errs := make([]error, len(closers))
	var wg sync.WaitGroup
	for i, c := range closers {
		wg.Go(func() { errs[i] = c() })
	}
	wg.Wait()
	return errors.Join(errs...)
}
