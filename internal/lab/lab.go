// Package lab boots and stops lab VMs: QEMU (TCG) guests running the image
// of package guest/image, each with a QMP socket and a guest-agent socket,
// laid out under <stateDir>/lab/<name>/:
//
//	qmp.sock      QMP monitor
//	qga.sock      QEMU guest agent (virtio-serial port org.qemu.guest_agent.0)
//	guest.sock    vmgate-guest's resident helper (virtio-serial port
//	              org.vmgate.guest.0, device id vmgate-helper), unless the
//	              spec leaves it out
//	events.sock   a second QMP monitor, with the helper's port: the QEMU
//	              driver holds it to hear VSERPORT_CHANGE (the guest
//	              closed the port: the helper died), leaving qmp.sock free
//	console.sock  the guest's serial console (ttyS0): a socket chardev
//	              (server, one client at a time) whose input is the
//	              console's keyboard; everything the guest writes to it
//	              is also logged to serial.log
//	vnc.sock      QEMU's VNC server for the display (std VGA), password
//	              on: no client gets in until a password is set over QMP
//	qemu.pid      written by QEMU
//	qemu.log      QEMU's own stderr
//	serial.log    the guest console's output since QEMU started
//	vm.json     name, pid, argv, sockets, start time, image hash
//	disk.qcow2  the VM's disk, an overlay made at Start (see disk.go)
//
// Ownership: a VM started in the foreground (Spec.Daemonize false, as in
// tests) is a child of this process; its *VM waits for it in a goroutine
// and QEMU gets SIGKILL when this process dies (Pdeathsig). A daemonized VM
// (vmgate lab up) is re-parented to init once QEMU's parent exits: nobody
// in vmgate owns it; it runs until Stop (vmgate lab down) or a guest
// poweroff, and List/Get find it again through vm.json, trusting a pid only
// when /proc/<pid>/cmdline equals the stored argv. VMs made on demand
// (Create, for vm_create) are daemonized lab VMs with an owner file; see
// create.go.
//
// The guest's kernel logs to the serial console (console=ttyS0, at
// loglevel 6: its banner and notices, not every driver's info line), a
// root shell runs there and another on the first virtual terminal, shown
// on the display (guest/image's /init).
//
// The guest is not started with -no-reboot: a guest reboot (vm_power
// reboot, guest-shutdown mode reboot) restarts the guest in the same QEMU
// process, as on real hardware; a guest poweroff ends QEMU.
package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/image"
	"github.com/vmgate/vmgate/internal/qmp"
)

// Sentinel errors.
var (
	// ErrInvalidSpec: a Spec was refused before any side effect.
	ErrInvalidSpec = errors.New("invalid lab VM spec")
	// ErrRunning: a VM of that name is already running.
	ErrRunning = errors.New("lab VM already running")
	// ErrNotFound: no lab VM of that name in the state directory.
	ErrNotFound = errors.New("no such lab VM")
	// ErrNoQEMU: qemu-system-x86_64 is not on PATH.
	ErrNoQEMU = errors.New("qemu-system-x86_64 not found on PATH")
)

// QEMUBinary is the emulator the lab runs (always TCG: no KVM assumed).
const QEMUBinary = "qemu-system-x86_64"

// DefaultMemoryMB is the guest memory when Spec.MemoryMB is 0.
const DefaultMemoryMB = 256

// MinMemoryMB and MaxMemoryMB bound Spec.MemoryMB. The lab image runs
// from its initramfs, which the kernel unpacks into memory: measured on
// 2026-12-03 (Debian 6.1 cloud kernel, a 6 MiB initramfs with qemu-ga and
// vmgate-guest), the guest booted with 88 MiB (53 MiB total, 21 available
// to commands) and panicked unpacking the initramfs with 84 ("System is
// deadlocked on memory"); 96 leaves a margin for a growing image.
// TestBootAtMinMemory boots a guest with MinMemoryMB.
const (
	MinMemoryMB = 96
	MaxMemoryMB = 65536
)

// DefaultBootTimeout bounds Start when its context has no deadline.
const DefaultBootTimeout = 120 * time.Second

// File names in a VM directory.
const (
	QMPSocketName     = "qmp.sock"
	QGASocketName     = "qga.sock"
	ConsoleSocketName = "console.sock"
	VNCSocketName     = "vnc.sock"
	// HelperSocketName is the host end of the virtio-serial port
	// HelperPortName, on which vmgate-guest's resident helper listens.
	HelperSocketName = "guest.sock"
	// EventsSocketName is a second QMP monitor of a VM with the helper's
	// port, for the QEMU driver's watch of the port's events.
	EventsSocketName = "events.sock"
	PIDFileName      = "qemu.pid"
	SerialLogName    = "serial.log"
	QEMULogName      = "qemu.log"
	StateFileName    = "vm.json"
)

// HelperPortName is the virtio-serial port of vmgate-guest's resident helper.
const HelperPortName = "org.vmgate.guest.0"

// HelperDeviceID is the QEMU device id of the helper's port: with an id,
// QEMU emits VSERPORT_CHANGE when the guest opens or closes the port
// (hw/char/virtio-console.c set_guest_connected).
const HelperDeviceID = "vmgate-helper"

// ConsoleChardev is the QEMU chardev id of the serial console.
const ConsoleChardev = "serial0"

// socketNames are the sockets QEMU makes in a VM directory.
var socketNames = []string{QMPSocketName, QGASocketName, ConsoleSocketName, VNCSocketName, HelperSocketName, EventsSocketName}

// DefaultStateDir is $VMGATE_STATE_DIR, else $XDG_STATE_HOME/vmgate, else
// ~/.local/state/vmgate.
func DefaultStateDir() (string, error) {
	if d := os.Getenv("VMGATE_STATE_DIR"); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "vmgate"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("lab: state dir: %w", err)
	}
	return filepath.Join(home, ".local", "state", "vmgate"), nil
}

// Spec describes a lab VM to start.
type Spec struct {
	// Name is the VM's name: 1–32 of [a-z0-9-], starting with a letter or digit.
	Name string
	// StateDir is the state directory; empty means DefaultStateDir().
	StateDir string
	// MemoryMB is the guest memory; 0 means DefaultMemoryMB.
	MemoryMB int
	// Cmdline adds KEY=VALUE words to the kernel command line; the guest's
	// /init sees them as environment (QGA_BLOCK=guest-exec, CGROUP2=0).
	// Keys are [A-Z][A-Z0-9_]*; values may not contain spaces or quotes.
	Cmdline map[string]string
	// Daemonize starts QEMU with -daemonize so it outlives this process.
	Daemonize bool
	// Image is a built image to boot; nil means image.Build with StateDir and Extra.
	Image *image.Image
	// Extra files for the image when Image is nil.
	Extra []image.File
	// Progress, when set, receives one line per step.
	Progress func(step string)
	// DiskMB is the virtual size of the VM's disk; 0 means DefaultDiskMB.
	DiskMB int
	// CPUs is the number of virtual CPUs; 0 means 1.
	CPUs int
	// NoHelperPort leaves out the resident helper's virtio-serial port
	// (HelperPortName): such a guest is served by a vmgate-guest process
	// per command.
	NoHelperPort bool
}

// State is what List reports about a VM.
type State string

// VM states.
const (
	StateRunning State = "running"
	StateStopped State = "stopped"
)

// VM is a lab VM. The exported fields are what vm.json stores.
type VM struct {
	Name      string   `json:"name"`
	PID       int      `json:"pid"`
	Argv      []string `json:"argv"`
	Dir       string   `json:"dir"`
	QMPSocket string   `json:"qmp_socket"`
	QGASocket string   `json:"qga_socket"`
	// HelperSocket is the host end of the helper's port, "" without one.
	HelperSocket string `json:"helper_socket,omitempty"`
	// EventsSocket is the second QMP monitor of a VM with the helper's
	// port, "" without one.
	EventsSocket string `json:"events_socket,omitempty"`
	SerialLog    string `json:"serial_log"`
	// ConsoleSocket and VNCSocket are empty for a VM an older vmgate
	// started (its console went to SerialLog alone, it had no display).
	ConsoleSocket string    `json:"console_socket,omitempty"`
	VNCSocket     string    `json:"vnc_socket,omitempty"`
	Started       time.Time `json:"started"`
	ImageHash     string    `json:"image_hash"`
	Daemonized    bool      `json:"daemonized"`
	// State is set by List and Get (not stored).
	State State `json:"-"`
	// BootTime is how long Start took from launching QEMU to the first
	// guest-ping (not stored; zero for VMs found by List).
	BootTime time.Duration `json:"-"`

	// done is closed once the foreground QEMU has been waited for; nil
	// for a daemonized VM or one loaded from vm.json.
	done chan struct{}
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	keyRE    = regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)
	valueRE  = regexp.MustCompile(`^[A-Za-z0-9_.,:/+=@-]{0,256}$`)
	reserved = map[string]bool{"LAB_NAME": true, "PATH": true, "HOME": true, "TERM": true}
)

// maxSocketPath is the limit of sun_path minus its NUL.
const maxSocketPath = 107

// Validate checks the spec without side effects (Start calls it too).
// An empty StateDir is checked as DefaultStateDir().
func (s Spec) Validate() error {
	if s.StateDir == "" {
		d, err := DefaultStateDir()
		if err != nil {
			return err
		}
		s.StateDir = d
	}
	if !nameRE.MatchString(s.Name) {
		return fmt.Errorf("%w: name %q: want 1-32 of [a-z0-9-], not starting with '-'", ErrInvalidSpec, s.Name)
	}
	if s.MemoryMB != 0 && (s.MemoryMB < MinMemoryMB || s.MemoryMB > MaxMemoryMB) {
		return fmt.Errorf("%w: memory %d MiB: want %d..%d (the lab image needs %d MiB to boot)", ErrInvalidSpec, s.MemoryMB, MinMemoryMB, MaxMemoryMB, MinMemoryMB)
	}
	if s.DiskMB != 0 && (s.DiskMB < 16 || s.DiskMB > 1<<20) {
		return fmt.Errorf("%w: disk %d MiB: want 16..1048576", ErrInvalidSpec, s.DiskMB)
	}
	if s.CPUs < 0 || s.CPUs > MaxCPUs {
		return fmt.Errorf("%w: %d CPUs: want 1..%d", ErrInvalidSpec, s.CPUs, MaxCPUs)
	}
	for k, v := range s.Cmdline {
		if !keyRE.MatchString(k) || reserved[k] {
			return fmt.Errorf("%w: kernel command line key %q: want [A-Z][A-Z0-9_]*, not LAB_NAME, PATH, HOME or TERM", ErrInvalidSpec, k)
		}
		if !valueRE.MatchString(v) {
			return fmt.Errorf("%w: kernel command line %s=%q: value has characters outside [A-Za-z0-9_.,:/+=@-]", ErrInvalidSpec, k, v)
		}
	}
	dir := filepath.Join(s.StateDir, "lab", s.Name)
	for _, sock := range socketNames {
		if n := len(filepath.Join(dir, sock)); n > maxSocketPath {
			return fmt.Errorf("%w: socket path %s is %d bytes, over the %d a unix socket allows", ErrInvalidSpec, filepath.Join(dir, sock), n, maxSocketPath)
		}
	}
	return nil
}

// Start boots a lab VM and returns once its guest agent answers guest-ping.
// When ctx has no deadline, DefaultBootTimeout applies. On failure the VM
// is stopped again and the error carries the tail of the guest console.
func Start(ctx context.Context, spec Spec) (*VM, error) {
	if spec.StateDir == "" {
		d, err := DefaultStateDir()
		if err != nil {
			return nil, err
		}
		spec.StateDir = d
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("lab: start: %w", err)
	}
	progress := spec.Progress
	if progress == nil {
		progress = func(string) {}
	}
	qemu, err := startable(spec)
	if err != nil {
		return nil, fmt.Errorf("lab: start %s: %w", spec.Name, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultBootTimeout)
		defer cancel()
	}

	img := spec.Image
	if img == nil {
		progress("building image")
		built, err := image.Build(ctx, image.Options{StateDir: spec.StateDir, Extra: spec.Extra, Progress: progress})
		if err != nil {
			return nil, fmt.Errorf("lab: start %s: %w", spec.Name, err)
		}
		img = &built
	}

	v, logf, err := setUp(ctx, spec, qemu, img)
	if err != nil {
		return nil, fmt.Errorf("lab: start %s: %w", spec.Name, err)
	}
	defer logf.Close()
	cmd := exec.Command(v.Argv[0], v.Argv[1:]...)
	cmd.Args = v.Argv
	cmd.Stdout, cmd.Stderr = logf, logf
	progress("booting " + spec.Name)
	v.Started = time.Now().UTC()
	// vm.json goes first (pid 0): a process that dies between launching a
	// daemonized QEMU and recording its pid leaves a VM that Get still
	// finds, through qemu.pid and the argv, and that Stop can end.
	if err := writeState(v); err != nil {
		return nil, fmt.Errorf("lab: start %s: %w", spec.Name, err)
	}
	if err := launch(cmd, v, spec.Daemonize); err != nil {
		// Stop ends a QEMU that got as far as its pid file and removes
		// vm.json.
		_ = v.Stop(context.Background())
		return nil, fmt.Errorf("lab: start %s: %w", spec.Name, err)
	}
	if err := writeState(v); err != nil {
		v.kill()
		return nil, fmt.Errorf("lab: start %s: %w", spec.Name, err)
	}
	if err := v.waitReady(ctx); err != nil {
		_ = v.Stop(context.Background())
		return nil, fmt.Errorf("lab: start %s: %w; guest console: %s", spec.Name, err, tail(v.SerialLog))
	}
	if err := v.privateSockets(); err != nil {
		_ = v.Stop(context.Background())
		return nil, fmt.Errorf("lab: start %s: %w", spec.Name, err)
	}
	v.BootTime = time.Since(v.Started)
	v.State = StateRunning
	progress(fmt.Sprintf("%s ready in %.1fs (pid %d)", spec.Name, v.BootTime.Seconds(), v.PID))
	return v, nil
}

// startable finds QEMU (its absolute path) and checks that spec's VM does
// not run already.
func startable(spec Spec) (string, error) {
	qemu, err := exec.LookPath(QEMUBinary)
	if err != nil {
		return "", ErrNoQEMU
	}
	if qemu, err = filepath.Abs(qemu); err != nil {
		return "", err
	}
	if old, err := Get(spec.StateDir, spec.Name); err == nil && old.State == StateRunning {
		return "", fmt.Errorf("%w (pid %d)", ErrRunning, old.PID)
	} else if err != nil && !errors.Is(err, ErrNotFound) {
		return "", err
	}
	return qemu, nil
}

// setUp lays out the VM's directory for a boot: the directory (DirMode),
// no stale sockets, pid file or vm.json, a fresh disk overlay and empty
// logs, all private (FileMode). It returns the VM to launch and QEMU's log,
// open for QEMU's stderr.
func setUp(ctx context.Context, spec Spec, qemu string, img *image.Image) (*VM, *os.File, error) {
	progress := spec.Progress
	if progress == nil {
		progress = func(string) {}
	}
	dir := filepath.Join(spec.StateDir, "lab", spec.Name)
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return nil, nil, err
	}
	for _, f := range append([]string{PIDFileName, StateFileName}, socketNames...) {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, nil, err
		}
	}
	progress("making the disk")
	disk, err := prepareDisk(ctx, spec, dir)
	if err != nil {
		return nil, nil, err
	}
	v := &VM{
		Name:       spec.Name,
		Dir:        dir,
		QMPSocket:  filepath.Join(dir, QMPSocketName),
		QGASocket:  filepath.Join(dir, QGASocketName),
		SerialLog:  filepath.Join(dir, SerialLogName),
		ImageHash:  img.Hash,
		Daemonized: spec.Daemonize,

		ConsoleSocket: filepath.Join(dir, ConsoleSocketName),
		VNCSocket:     filepath.Join(dir, VNCSocketName),
	}
	if !spec.NoHelperPort {
		v.HelperSocket = filepath.Join(dir, HelperSocketName)
		v.EventsSocket = filepath.Join(dir, EventsSocketName)
	}
	v.Argv = append(qemuArgv(qemu, v, spec, img), diskArgv(disk)...)
	logf, err := v.createLogs()
	if err != nil {
		return nil, nil, err
	}
	return v, logf, nil
}

// createLogs makes the VM's log files private (FileMode), empty: QEMU's
// own log, returned open for QEMU's stderr, and the console log, which
// QEMU opens itself without changing the mode of a file that exists.
func (v *VM) createLogs() (*os.File, error) {
	serial, err := createPrivate(v.SerialLog)
	if err != nil {
		return nil, err
	}
	serial.Close()
	return createPrivate(filepath.Join(v.Dir, QEMULogName))
}

// privateSockets gives the sockets, which QEMU made with its umask, mode
// FileMode (the VM directory keeps others out already).
func (v *VM) privateSockets() error {
	for _, sock := range []string{v.QMPSocket, v.QGASocket, v.ConsoleSocket, v.VNCSocket, v.HelperSocket, v.EventsSocket} {
		if sock == "" {
			continue
		}
		if err := os.Chmod(sock, FileMode); err != nil {
			return err
		}
	}
	return nil
}

// launch starts QEMU: daemonized, it returns once the launcher has exited
// and the daemon has written its pid file; in the foreground, QEMU is this
// process's child and v.done closes when it has been waited for.
func launch(cmd *exec.Cmd, v *VM, daemonize bool) error {
	if daemonize {
		// The parent exits once the daemon is set up and has written the
		// pid file; the daemon then belongs to init (see the package doc).
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("qemu: %w: %s", err, tail(filepath.Join(v.Dir, QEMULogName)))
		}
		if v.PID = readPIDFile(filepath.Join(v.Dir, PIDFileName)); v.PID == 0 {
			return fmt.Errorf("no valid pid in %s", PIDFileName)
		}
		return nil
	}
	// Own process group (a terminal's ^C reaches vmgate, which stops the
	// VM) and SIGKILL when this process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	v.PID = cmd.Process.Pid
	v.done = make(chan struct{})
	go func() {
		err := cmd.Wait()
		slog.Debug("lab: qemu exited", "vm", v.Name, "pid", v.PID, "err", err)
		close(v.done)
	}()
	return nil
}

func qemuArgv(qemu string, v *VM, spec Spec, img *image.Image) []string {
	mem := spec.MemoryMB
	if mem == 0 {
		mem = DefaultMemoryMB
	}
	// no_timer_check: under TCG on a loaded host the kernel's IO-APIC timer
	// check can fail and panic the boot ("8254 timer not connected").
	// loglevel=6 puts the kernel's notices on the console (its banner,
	// "Linux version ...") but not its info lines, which would slow a TCG
	// boot down.
	words := []string{"console=ttyS0", "loglevel=6", "panic=-1", "no_timer_check", "LAB_NAME=" + spec.Name}
	keys := make([]string, 0, len(spec.Cmdline))
	for k := range spec.Cmdline {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		words = append(words, k+"="+spec.Cmdline[k])
	}
	argv := []string{qemu,
		"-name", "vmgate-lab-" + spec.Name,
		"-accel", "tcg", "-machine", "pc",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-device", "VGA",
		"-vnc", "unix:" + optValue(v.VNCSocket) + ",password=on",
		"-chardev", "socket,id=" + ConsoleChardev + ",path=" + optValue(v.ConsoleSocket) + ",server=on,wait=off,logfile=" + optValue(v.SerialLog),
		"-serial", "chardev:" + ConsoleChardev,
		"-m", strconv.Itoa(mem), "-smp", strconv.Itoa(max(spec.CPUs, 1)),
		"-kernel", img.Kernel, "-initrd", img.Initrd,
		"-append", strings.Join(words, " "),
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=qga0,path=" + v.QGASocket + ",server=on,wait=off",
		"-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
	}
	if v.HelperSocket != "" {
		argv = append(argv,
			"-chardev", "socket,id=vmgate0,path="+v.HelperSocket+",server=on,wait=off",
			"-device", "virtserialport,chardev=vmgate0,id="+HelperDeviceID+",name="+HelperPortName,
			"-chardev", "socket,id=vmgate-events,path="+optValue(v.EventsSocket)+",server=on,wait=off",
			"-mon", "chardev=vmgate-events,mode=control")
	}
	argv = append(argv,
		"-qmp", "unix:"+v.QMPSocket+",server=on,wait=off",
		"-pidfile", filepath.Join(v.Dir, PIDFileName),
	)
	if spec.Daemonize {
		argv = append(argv, "-daemonize")
	}
	return argv
}

// optValue escapes s for a QEMU option list (a comma is doubled).
func optValue(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// waitReady waits until the guest agent answers, QEMU exits or ctx ends.
func (v *VM) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited := make(chan struct{})
	go func() { // watch the process: a dead QEMU ends the wait at once
		defer close(exited)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-v.done:
				cancel()
				return
			case <-t.C:
				if !v.alive() {
					cancel()
					return
				}
			}
		}
	}()
	var last error
	for ctx.Err() == nil {
		if last = v.Ping(ctx); last == nil {
			return nil
		}
		select { // the socket may not exist yet
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	<-exited
	if !v.alive() {
		return fmt.Errorf("qemu exited during boot: %s", tail(filepath.Join(v.Dir, QEMULogName)))
	}
	return fmt.Errorf("guest agent not ready: %w", last)
}

// alive reports whether the VM's pid is still this QEMU.
func (v *VM) alive() bool {
	if v.done != nil {
		select {
		case <-v.done:
			return false
		default:
		}
	}
	return pidIsArgv(v.PID, v.Argv)
}

// pidIsArgv reports whether /proc/<pid>/cmdline is argv: a pid file or
// vm.json may be stale and the pid reused by another process.
func pidIsArgv(pid int, argv []string) bool {
	if pid <= 1 || len(argv) == 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || len(b) == 0 {
		return false
	}
	return sameQEMUArgv(strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), argv)
}

// sameQEMUArgv reports whether two QEMU command lines are the same VM: equal
// but for -daemonize, which a relaunch (the driver's power start) adds to
// the stored argv of a VM that ran in the foreground.
func sameQEMUArgv(a, b []string) bool {
	drop := func(s string) bool { return s == "-daemonize" }
	a = slices.DeleteFunc(slices.Clone(a), drop)
	b = slices.DeleteFunc(slices.Clone(b), drop)
	return slices.Equal(a, b)
}

// Stop ends the VM: QMP quit, then SIGKILL by pid (only while the pid is
// still this QEMU) when it has not exited by ctx's deadline or 5 s, then
// removes the sockets, the pid file and vm.json. Stopping a VM that is not
// running only removes those files.
func (v *VM) Stop(ctx context.Context) error {
	if !v.alive() {
		// The QEMU this VM started is gone, but the VM may have been
		// relaunched since (the driver's power start): its pid file then
		// names a QEMU with this VM's argv. Stop that one instead.
		if pid := readPIDFile(filepath.Join(v.Dir, PIDFileName)); pid != v.PID && pidIsArgv(pid, v.Argv) {
			v.PID, v.done = pid, nil
		}
	}
	if v.alive() {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		quitCtx, quitCancel := context.WithTimeout(qctx, 3*time.Second)
		if _, err := qmp.Call(quitCtx, v.QMPSocket, "quit", nil); err != nil {
			slog.Debug("lab: qmp quit failed; killing", "vm", v.Name, "err", err)
		}
		quitCancel()
		v.waitExit(qctx)
		cancel()
		if v.alive() {
			v.kill()
			kctx, kcancel := context.WithTimeout(context.Background(), 5*time.Second)
			v.waitExit(kctx)
			kcancel()
		}
		if v.alive() {
			return fmt.Errorf("lab: stop %s: pid %d did not exit", v.Name, v.PID)
		}
	}
	var errs []error
	for _, f := range append([]string{PIDFileName, StateFileName, DiskName}, socketNames...) {
		if err := os.Remove(filepath.Join(v.Dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	v.State = StateStopped
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lab: stop %s: %w", v.Name, err)
	}
	return nil
}

// kill sends SIGKILL to the VM's pid if it is still this QEMU.
func (v *VM) kill() {
	if v.alive() {
		_ = syscall.Kill(v.PID, syscall.SIGKILL)
	}
}

// waitExit waits until QEMU is gone (reaped, for a foreground VM) or ctx ends.
func (v *VM) waitExit(ctx context.Context) {
	if v.done != nil {
		select {
		case <-v.done:
		case <-ctx.Done():
		}
		return
	}
	for v.alive() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Done is closed when a foreground VM's QEMU has exited and been reaped.
// It is nil for daemonized VMs and VMs found by List or Get.
func (v *VM) Done() <-chan struct{} { return v.done }

func writeState(v *VM) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(v.Dir, StateFileName+".tmp")
	f, err := createPrivate(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(v.Dir, StateFileName))
}

// createPrivate creates or truncates the file p with mode FileMode, also
// when it existed with another mode (which O_CREAT would keep), never
// following a symlink at p.
func createPrivate(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, FileMode)
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(FileMode); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Get reads the named VM's vm.json and checks whether it runs.
func Get(stateDir, name string) (*VM, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("lab: get: %w: name %q", ErrInvalidSpec, name)
	}
	dir := filepath.Join(stateDir, "lab", name)
	b, err := os.ReadFile(filepath.Join(dir, StateFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("lab: get %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("lab: get %s: %w", name, err)
	}
	var v VM
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("lab: get %s: %s: %w", name, filepath.Join(dir, StateFileName), err)
	}
	if v.Name != name || v.Dir != dir {
		return nil, fmt.Errorf("lab: get %s: %s describes %q in %s", name, StateFileName, v.Name, v.Dir)
	}
	// vm.json's pid, else qemu.pid (rewritten when the same argv is run
	// again, for example by a driver's power start); either only counts
	// when that process is this QEMU.
	v.State = StateStopped
	for _, pid := range []int{v.PID, readPIDFile(filepath.Join(dir, PIDFileName))} {
		if pidIsArgv(pid, v.Argv) {
			v.PID, v.State = pid, StateRunning
			break
		}
	}
	return &v, nil
}

// List returns every VM with a vm.json in stateDir, sorted by name. A VM
// whose pid is gone or belongs to another process is StateStopped.
func List(stateDir string) ([]VM, error) {
	ents, err := os.ReadDir(filepath.Join(stateDir, "lab"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lab: list: %w", err)
	}
	var out []VM
	for _, e := range ents {
		if !e.IsDir() || !nameRE.MatchString(e.Name()) {
			continue
		}
		v, err := Get(stateDir, e.Name())
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lab: list: %w", err)
		}
		out = append(out, *v)
	}
	return out, nil
}

// tail returns the last lines of a log file, for error messages.
func tail(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	b = bytes.TrimSpace(b)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	if len(b) == 0 {
		return "(empty)"
	}
	return strconv.Quote(string(b))
}

// readPIDFile returns the pid in a QEMU pid file, 0 when there is none.
func readPIDFile(p string) int {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	return pid
}
