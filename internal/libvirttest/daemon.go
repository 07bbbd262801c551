// Package libvirttest runs a real libvirtd (with its virtlogd) for tests and
// boots lab guests in it as libvirt domains.
//
// Daemons: StartDaemons starts virtlogd and libvirtd in the foreground as
// root (no systemd), each with Pdeathsig and one goroutine that waits for it.
// libvirtd gets a private configuration file whose unix_sock_dir is a
// temporary directory, so its sockets never replace a system libvirtd's.
// Its QEMU state (/run/libvirt/qemu, /var/lib/libvirt/qemu) and virtlogd's
// socket have fixed paths for a root daemon, so StartDaemons refuses to run
// while a system libvirtd or virtlogd answers on the default sockets rather
// than disturb it. libvirtd also loads persistent domains defined in
// /etc/libvirt/qemu; the helper only ever destroys or undefines the domains
// it booted itself.
//
// Domains: Boot copies the kernel and initrd into the daemon's directory
// (libvirt takes ownership of the files it is given), starts the domain
// (transient, or defined then started when Spec.Persistent), and waits until
// its guest agent answers guest-ping through libvirt. Close destroys every
// booted domain (domains outlive libvirtd), undefines the persistent ones,
// stops libvirtd and virtlogd by pid and checks that the QEMU processes are
// gone.
//
// Env, Register and Stop share one set of daemons and domains per test
// binary (booted lazily on the first Env call), with the skip rule: when
// libvirtd is not on PATH (or the test does not run as root) a test skips,
// unless VMGATE_REQUIRE_VM is set, in which case it fails.
package libvirttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
)

// The binaries the helper starts, looked up on PATH.
const (
	LibvirtdBinary = "libvirtd"
	VirtlogdBinary = "virtlogd"
)

// The system sockets a root libvirtd and virtlogd use. A private libvirtd
// moves its own sockets, but not virtlogd's nor its QEMU state, so a live
// daemon on either means the helper must not start another.
const (
	systemLibvirtSocket  = "/run/libvirt/libvirt-sock"
	systemVirtlogdSocket = "/run/libvirt/virtlogd-sock"
)

// ReadyTimeout bounds the wait for libvirtd to answer an API call after its
// start (4–5 s cold on an idle machine, under 1 s once its capabilities
// cache exists; much more on a loaded one).
const ReadyTimeout = 60 * time.Second

// ErrDaemonRunning: a system libvirtd or virtlogd already answers, and the
// helper will not start a second one next to it.
var ErrDaemonRunning = errors.New("a system libvirt daemon is already running")

// Daemons is a running virtlogd + libvirtd pair. Its methods are safe for
// concurrent use.
type Daemons struct {
	// Dir is the private directory: configuration, sockets, logs, the
	// kernel and initrd copies and the domains' serial consoles.
	Dir string
	// Socket is libvirtd's read-write unix socket.
	Socket string

	log      *slog.Logger
	virtlogd *process
	libvirtd *process

	// mu guards domains and closed.
	mu      sync.Mutex
	domains map[string]*Domain
	closed  bool
}

// URI is the libvirt URI that reaches this libvirtd.
func (d *Daemons) URI() string { return "qemu:///system?socket=" + d.Socket }

// Pids returns the pids of virtlogd and libvirtd.
func (d *Daemons) Pids() (virtlogd, libvirtd int) { return d.virtlogd.pid(), d.libvirtd.pid() }

// process is one daemon the helper started and waits for.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returned
	err  error         // cmd.Wait's result, set before done is closed
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// start starts argv with Pdeathsig, output to logPath, and one goroutine
// that waits for it.
func start(name, logPath string, argv ...string) (*process, error) {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("libvirttest: %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("libvirttest: start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM, waits up to grace, then SIGKILL, and waits for the
// process to be reaped.
func (p *process) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return fmt.Errorf("libvirttest: %s (pid %d) ignored SIGTERM for %v and was killed", p.name, p.pid(), grace)
	case <-time.After(10 * time.Second):
		return fmt.Errorf("libvirttest: %s (pid %d) survived SIGKILL", p.name, p.pid())
	}
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// socketAnswers reports whether something accepts connections on path.
func socketAnswers(path string) bool {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// StartDaemons starts virtlogd and libvirtd with their files under a new
// private directory and waits (bounded by ctx and ReadyTimeout) until
// libvirtd answers an API call. On error nothing is left running. log may
// be nil.
func StartDaemons(ctx context.Context, log *slog.Logger) (_ *Daemons, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, s := range []string{systemLibvirtSocket, systemVirtlogdSocket} {
		if socketAnswers(s) {
			return nil, fmt.Errorf("libvirttest: %w: %s answers", ErrDaemonRunning, s)
		}
	}
	libvirtd, err := exec.LookPath(LibvirtdBinary)
	if err != nil {
		return nil, fmt.Errorf("libvirttest: %w", err)
	}
	virtlogd, err := exec.LookPath(VirtlogdBinary)
	if err != nil {
		return nil, fmt.Errorf("libvirttest: %w", err)
	}
	dir, err := os.MkdirTemp("", "vmgate-libvirttest-")
	if err != nil {
		return nil, fmt.Errorf("libvirttest: %w", err)
	}
	// QEMU runs as libvirt-qemu and must reach the kernel, initrd and
	// console files below dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("libvirttest: %w", err)
	}
	d := &Daemons{Dir: dir, Socket: filepath.Join(dir, "libvirt-sock"), log: log, domains: map[string]*Domain{}}
	defer func() {
		if err != nil {
			if cerr := d.Close(); cerr != nil {
				log.Warn("libvirttest: cleanup after failed start", "err", cerr)
			}
		}
	}()
	conf := filepath.Join(dir, "libvirtd.conf")
	confText := fmt.Sprintf("unix_sock_dir = %q\nauth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\n", dir)
	if err := os.WriteFile(conf, []byte(confText), 0o644); err != nil {
		return nil, fmt.Errorf("libvirttest: %w", err)
	}
	if d.virtlogd, err = start("virtlogd", filepath.Join(dir, "virtlogd.log"),
		virtlogd, "--pid-file", filepath.Join(dir, "virtlogd.pid")); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, "virtlogd socket", d.virtlogd, func() error {
		if !socketAnswers(systemVirtlogdSocket) {
			return errors.New("not answering yet")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if d.libvirtd, err = start("libvirtd", filepath.Join(dir, "libvirtd.log"),
		libvirtd, "--config", conf, "--pid-file", filepath.Join(dir, "libvirtd.pid")); err != nil {
		return nil, err
	}
	// The socket appears before the daemon is usable: wait for an API call.
	if err := waitFor(ctx, "libvirtd API", d.libvirtd, func() error {
		return d.withConn(func(l *golibvirt.Libvirt) error {
			_, err := l.ConnectGetLibVersion()
			return err
		})
	}); err != nil {
		return nil, err
	}
	log.Info("libvirttest: daemons up", "dir", dir, "virtlogd", d.virtlogd.pid(), "libvirtd", d.libvirtd.pid())
	return d, nil
}

// waitFor polls ready until it succeeds, p exits, ctx ends or ReadyTimeout passes.
func waitFor(ctx context.Context, what string, p *process, ready func() error) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	wait := 20 * time.Millisecond
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("libvirttest: waiting for %s: %s exited: %v", what, p.name, p.err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("libvirttest: waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(wait*2, 500*time.Millisecond)
	}
}

// withConn runs fn on a fresh connection to libvirtd, closed afterwards.
func (d *Daemons) withConn(fn func(*golibvirt.Libvirt) error) error {
	l, err := d.connect()
	if err != nil {
		return err
	}
	defer l.Disconnect()
	return fn(l)
}

// Close destroys (and undefines) every domain Boot started, stops libvirtd
// and virtlogd by pid, checks that the domains' QEMU processes are gone
// (killing any that are not, and reporting it) and removes Dir. It is
// idempotent.
func (d *Daemons) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	doms := make([]*Domain, 0, len(d.domains))
	for _, dom := range d.domains {
		doms = append(doms, dom)
	}
	d.mu.Unlock()

	var errs []error
	if len(doms) > 0 && d.libvirtd != nil && !d.libvirtd.exited() {
		errs = append(errs, d.withConn(func(l *golibvirt.Libvirt) error {
			var errs []error
			for _, dom := range doms {
				errs = append(errs, dom.destroy(l))
			}
			return errors.Join(errs...)
		}))
	}
	errs = append(errs, d.libvirtd.stop(15*time.Second), d.virtlogd.stop(10*time.Second))
	for _, dom := range doms {
		if dom.QEMUPID > 0 && processAlive(dom.QEMUPID) {
			errs = append(errs, fmt.Errorf("libvirttest: domain %s: qemu pid %d outlived libvirtd; killing it", dom.Name, dom.QEMUPID))
			_ = syscall.Kill(dom.QEMUPID, syscall.SIGKILL)
		}
	}
	if d.Dir != "" {
		errs = append(errs, os.RemoveAll(d.Dir))
	}
	return errors.Join(errs...)
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

// Logs returns the tails of libvirtd's and virtlogd's logs, for failure messages.
func (d *Daemons) Logs() string {
	var b strings.Builder
	for _, name := range []string{"libvirtd.log", "virtlogd.log"} {
		fmt.Fprintf(&b, "--- %s ---\n%s\n", name, tailFile(filepath.Join(d.Dir, name), 2000))
	}
	return b.String()
}

func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}
