// Package virtualbox is vmgate's VirtualBox backend: a hypervisor.Driver
// that runs VBoxManage by argv (never through a shell).
//
// The driver asks `VBoxManage --version` once and follows the release: it
// knows 6.1, 7.0 and 7.1, which differ in how `guestcontrol run` builds the
// guest's argv, in what --verbose prints, and in --cwd (7.1 only).
//
// VMs come from `VBoxManage list vms` and `showvminfo <vm> --machinereadable`.
// Commands run with `guestcontrol <vm> run --verbose --wait-stdout
// --wait-stderr -- argv...`, the image as the first positional argument in
// every release (with --exe, 7.x would pass argv[0] twice). VBoxManage's own
// exit code cannot carry a guest exit code above 93 nor a signal number
// (guest codes 1-93 become 33-125, larger ones 126, a signal 18, a timeout
// 20), so the driver reads the exact status and the guest pid from the text
// --verbose prints. That text goes through the C library's buffered stdout
// and reaches the pipe in buffer-sized blocks between the guest's output
// and at exit; a filter (verbose.go) takes it out wherever it falls, so the
// result's stdout is exactly the guest's.
//
// `run` has no stdin, and no working directory before 7.1, so a request
// with Stdin (or Cwd before 7.1, or with Guest Additions that cannot) runs
// through a POSIX shell wrapper in the guest (/bin/sh; stdin is first
// copied into the guest with copyto). Files move with copyto/copyfrom
// through 0600 host temp files.
//
// VBoxManage has no asynchronous exec status, so a started command is a
// VBoxManage process the driver owns (a goroutine waits for it), tracked
// like every driver's commands by agentexec's Tracker: the process is the
// agent the Tracker polls and kills through, the Tracker's watchdog kills
// the command's process tree in the guest at its timeout, and its results
// expire. Run is ExecStart and a wait for the process. The guest pid is in
// VBoxManage's buffered --verbose text, which may reach the driver only
// when VBoxManage exits: a command whose pid is still unknown at its
// deadline is interrupted (VBoxManage then closes its guest session, which
// ends the guest process), so the timeout holds either way.
//
// Snapshots (snapshot.go) go through `VBoxManage snapshot`; they always
// hold the machine's memory, as VirtualBox takes them of a running machine.
// VMs on demand (create.go) are clonevm clones of a template VM, marked
// with the lease in their extra data; the guest's network (network.go)
// comes from the guest properties the Guest Additions publish, which hold
// the non-loopback interfaces with an IPv4 address.
//
// Guest credentials come from the config: a user name and a password
// file, passed with --passwordfile (never a password on the command line).
// VM names and guest paths that begin with '-' or hold NUL or a line break
// are refused before any VBoxManage call.
package virtualbox

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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
	// maxStdioBlock bounds Config.StdioBlock.
	maxStdioBlock = 1 << 20
	// cancelGrace is how long VBoxManage gets after SIGINT (it then closes
	// the guest session, which ends the guest process) before SIGKILL.
	cancelGrace = 5 * time.Second
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
	// StdioBlock is the size of VBoxManage's stdout buffer on a pipe; 0
	// means DefaultStdioBlock (glibc on Linux).
	StdioBlock int
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Driver is the VirtualBox backend. It is safe for concurrent use.
type Driver struct {
	cfg Config
	bin string
	log *slog.Logger

	// user is the effective user's name, for VBoxManage's environment.
	user string

	// execs tracks the commands ExecStart started (each a process).
	execs *agentexec.Tracker
	// ctx ends when the driver closes: the VBoxManage processes of started
	// commands run under it; procs counts their waiting goroutines.
	ctx    context.Context
	cancel context.CancelFunc
	procs  sync.WaitGroup

	// mu guards everything below. Never held across a VBoxManage call.
	mu    sync.Mutex
	ver   vboxVersion // valid when verOK
	verOK bool
	noCwd map[string]bool // VMs whose Additions cannot take run --cwd
}

var (
	_ hypervisor.Driver = (*Driver)(nil)
	_ hypervisor.Runner = (*Driver)(nil)
	_ hypervisor.Closer = (*Driver)(nil)
)

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
	d := &Driver{cfg: cfg, bin: bin, log: log, noCwd: map[string]bool{},
		execs: agentexec.New(agentexec.Config{Logger: log, MaxTracked: MaxExecs})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	if u, err := user.Current(); err == nil {
		d.user = u.Username
	}
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
