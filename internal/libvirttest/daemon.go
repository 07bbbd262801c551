// Package libvirttest runs a real libvirtd (with its virtlogd) for tests and
// boots lab guests in it as libvirt domains.
//
// Daemons: StartDaemons starts virtlogd and libvirtd in the foreground as
// root (no systemd), each with Pdeathsig and one goroutine that waits for
// it, stopped by pid. A root libvirtd keeps its sockets, its QEMU state and
// its configuration at fixed system paths (/run/libvirt, /var/lib/libvirt,
// /var/log/libvirt, /var/cache/libvirt, /etc/libvirt), and virtlogd its
// socket, so two of them on one machine would share them. Each Daemons
// therefore runs in a mount namespace of its own: one locked OS thread
// unshares it (mounts made private), mounts an empty tmpfs on /run and
// bind-mounts directories under Dir on those five paths (namespace.go),
// and starts both daemons; the QEMU processes libvirtd starts inherit the
// namespace. So the daemons see only their own sockets, state and
// configuration (etc/: a minimal libvirtd.conf, virtlogd.conf and
// qemu.conf), no host's persistent domains, no system D-Bus (no machined,
// no firewalld); a system libvirtd, or another test run's, neither
// disturbs them nor is disturbed, and the tests never look for one. Paths
// under Dir are the same inside and outside the namespace, which is how
// the test process reaches the sockets (Dir/run/libvirt-sock) and QEMU's
// pid files. What stays shared is the host's cgroup tree, where libvirt
// names a domain's cgroup after the domain: domain names must differ
// between runs (Name adds the run's id).
//
// libvirtd also runs in a PID namespace of its own (pidns.go), so that a
// test process killed with SIGKILL takes libvirtd and its domains' QEMU
// processes with it: QEMU under libvirt has no Pdeathsig.
//
// Why a namespace and not libvirtd in session mode under a private uid with
// private XDG directories: session mode would not test the qemu:///system
// road vmgate's users take (a root daemon, its sockets and DAC handling),
// and the namespace costs nothing measurable: StartDaemons took 0.3–1.4 s
// at load 20 on two cores, the daemons on the shared system paths
// 0.2–0.5 s in the same minutes.
//
// Domains: Boot copies the kernel and initrd into the daemon's directory
// (libvirt takes ownership of the files it is given), starts the domain
// (transient, or defined then started when Spec.Persistent), and waits until
// its guest agent answers guest-ping through libvirt. Close destroys every
// booted domain (domains outlive libvirtd), undefines the persistent ones,
// stops libvirtd and virtlogd by pid, checks that the QEMU processes are
// gone and ends the namespace's thread.
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

	"github.com/vmgate/vmgate/internal/testload"
)

// The binaries the helper starts, looked up on PATH.
const (
	LibvirtdBinary = "libvirtd"
	VirtlogdBinary = "virtlogd"
)

// ReadyTimeout bounds the wait for libvirtd to answer an API call after its
// start (4–5 s cold on an idle machine, under 1 s once its capabilities
// cache exists; much more on a loaded one, so the wait scales it with the
// machine's load: package testload).
const ReadyTimeout = 60 * time.Second

// Daemons is a running virtlogd + libvirtd pair. Its methods are safe for
// concurrent use.
type Daemons struct {
	// Dir is the private directory: the daemons' system directories
	// (run/, lib/, log/, cache/, etc/; see systemDirs), their logs, the
	// kernel and initrd copies and the domains' serial consoles.
	Dir string
	// Socket is libvirtd's read-write unix socket (Dir/run/libvirt-sock).
	Socket string

	log        *slog.Logger
	sharedCaps string // the QEMU capabilities kept between runs (capscache.go)
	ns         *nsThread
	virtlogd   *process
	libvirtd   *process

	// mu guards domains and closed.
	mu      sync.Mutex
	domains map[string]*Domain
	closed  bool
}

// URI is the libvirt URI that reaches this libvirtd.
func (d *Daemons) URI() string { return "qemu:///system?socket=" + d.Socket }

// Pids returns the pids of virtlogd and of libvirtd's wrapper: the unshare
// process whose end takes libvirtd's PID namespace, libvirtd and every
// QEMU in it (pidns.go).
func (d *Daemons) Pids() (virtlogd, libvirtd int) { return d.virtlogd.pid(), d.libvirtd.pid() }

// hostPID translates a pid of libvirtd's PID namespace (from its pid files)
// into this process's view; 0 when the process is not (or no longer) there.
func (d *Daemons) hostPID(nspid int) int {
	if d.libvirtd == nil {
		return 0
	}
	return hostPID(nsInit(d.libvirtd.pid()), nspid)
}

// process is one daemon the helper started and waits for.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returned
	err  error         // cmd.Wait's result, set before done is closed
	// termPID, when set, returns the pid stop sends SIGTERM to (the
	// daemon inside a PID namespace's wrapper; 0: not found).
	termPID func() int
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
	if p.termPID == nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	} else if pid := p.termPID(); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	} else {
		grace = 0 // the daemon is not found in its wrapper: kill the wrapper, and so the namespace
	}
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

// StartDaemons starts virtlogd and libvirtd in a private mount namespace
// with their system directories under a new private directory, and waits
// (bounded by ctx and ReadyTimeout) until libvirtd answers an API call. It
// neither looks for nor touches any other libvirtd. On error nothing is
// left running. log may be nil.
func StartDaemons(ctx context.Context, log *slog.Logger) (_ *Daemons, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	libvirtd, err := exec.LookPath(LibvirtdBinary)
	if err != nil {
		return nil, fmt.Errorf("libvirttest: %w", err)
	}
	virtlogd, err := exec.LookPath(VirtlogdBinary)
	if err != nil {
		return nil, fmt.Errorf("libvirttest: %w", err)
	}
	dir, err := privateDir()
	if err != nil {
		return nil, err
	}
	d := &Daemons{Dir: dir, Socket: filepath.Join(dir, "run", "libvirt-sock"), log: log,
		sharedCaps: sharedCapsDir(), domains: map[string]*Domain{}}
	defer func() {
		if err != nil {
			if cerr := d.Close(); cerr != nil {
				log.Warn("libvirttest: cleanup after failed start", "err", cerr)
			}
		}
	}()
	if err := seedCaps(d.sharedCaps, dir); err != nil {
		log.Warn("libvirttest: QEMU capabilities not seeded; libvirtd probes them", "err", err)
	}
	if d.ns, err = newNSThread(dir); err != nil {
		return nil, err
	}
	if d.virtlogd, err = d.start("virtlogd", virtlogd, "--config", "/etc/libvirt/virtlogd.conf",
		"--pid-file", filepath.Join(dir, "virtlogd.pid")); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, "virtlogd socket", d.virtlogd, func() error {
		if !socketAnswers(filepath.Join(dir, "run", "virtlogd-sock")) {
			return errors.New("not answering yet")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	argv, err := pidNSArgv(libvirtd, "--config", "/etc/libvirt/libvirtd.conf",
		"--pid-file", filepath.Join(dir, "libvirtd.pid"))
	if err != nil {
		return nil, err
	}
	if d.libvirtd, err = d.start("libvirtd", argv...); err != nil {
		return nil, err
	}
	d.libvirtd.termPID = func() int { return d.hostPID(readPID(filepath.Join(dir, "libvirtd.pid"))) }
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

// The daemons' configuration files, in etc/ (the private /etc/libvirt).
// Sockets stay in /run/libvirt (the private run/), only root reaches them
// and they ask for no authentication; logs go to stderr (the log files in
// Dir). QEMU runs without a MAC security driver, so no AppArmor profile is
// written to or loaded from the host's /etc/apparmor.d, and as root:
// libvirtd trusts its cached QEMU capabilities only while "KVM was found
// when probing" matches "the QEMU user can open /dev/kvm now", and where
// /dev/kvm is root's alone (no udev rule gives it to group kvm) while the
// probe found KVM, every capabilities lookup (each define, each start)
// probed QEMU again: 5 s on an idle machine, over a minute on a loaded one
// (one DomainDefineXML took 65 s at load 18; 0.5 s with QEMU as root).
var configFiles = map[string]string{
	"libvirtd.conf": `auth_unix_rw = "none"
auth_unix_ro = "none"
unix_sock_rw_perms = "0700"
unix_sock_ro_perms = "0700"
unix_sock_admin_perms = "0700"
log_outputs = "3:stderr"
`,
	"virtlogd.conf": `log_outputs = "3:stderr"
`,
	"qemu.conf": `security_driver = "none"
user = "root"
group = "root"
`,
}

// privateDir makes the private directory: the subdirectories systemDirs
// mounts, with the modes of their system counterparts (QEMU runs as
// libvirt-qemu and must reach the files under Dir), and the configuration.
func privateDir() (string, error) {
	dir, err := os.MkdirTemp("", "vmgate-libvirttest-")
	if err != nil {
		return "", fmt.Errorf("libvirttest: %w", err)
	}
	err = os.Chmod(dir, 0o755)
	for _, s := range systemDirs {
		if err == nil {
			err = os.Mkdir(filepath.Join(dir, s.private), 0o755)
		}
	}
	for name, text := range configFiles {
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "etc", name), []byte(text), 0o644)
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("libvirttest: %w", err)
	}
	return dir, nil
}

// start starts a daemon from the namespace thread, its output to
// Dir/NAME.log.
func (d *Daemons) start(name string, argv ...string) (p *process, err error) {
	if nerr := d.ns.do(func() { p, err = start(name, filepath.Join(d.Dir, name+".log"), argv...) }); nerr != nil {
		return nil, nerr
	}
	return p, err
}

// waitFor polls ready until it succeeds, p exits, ctx ends or ReadyTimeout passes.
func waitFor(ctx context.Context, what string, p *process, ready func() error) error {
	ctx, cancel := testload.WithTimeout(ctx, ReadyTimeout)
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
			return fmt.Errorf("libvirttest: waiting for %s: %w (last: %v)", what, context.Cause(ctx), err)
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
	d.ns.stop()
	for _, dom := range doms {
		if dom.QEMUPID > 0 && processAlive(dom.QEMUPID) {
			errs = append(errs, fmt.Errorf("libvirttest: domain %s: qemu pid %d outlived libvirtd; killing it", dom.Name, dom.QEMUPID))
			_ = syscall.Kill(dom.QEMUPID, syscall.SIGKILL)
		}
	}
	if d.Dir != "" {
		if err := saveCaps(d.Dir, d.sharedCaps); err != nil {
			d.log.Warn("libvirttest: QEMU capabilities not kept for the next run", "err", err)
		}
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
