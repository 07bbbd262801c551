package libvirttest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// The system directories a root libvirtd and virtlogd (and the QEMU
// processes libvirtd starts) read and write, and the directory under
// Daemons.Dir each is a bind mount of in the private mount namespace.
// /run as a whole is an empty tmpfs there (see privateMounts).
var systemDirs = []struct{ system, private string }{
	{"/run/libvirt", "run"},
	{"/var/lib/libvirt", "lib"},
	{"/var/log/libvirt", "log"},
	{"/var/cache/libvirt", "cache"},
	{"/etc/libvirt", "etc"},
}

// nsThread is one OS thread in a mount namespace of its own, where the
// daemons are started. Pdeathsig fires when the thread that started a
// child ends, not the process, so the thread must outlive the daemons; and
// since its namespace differs from the process's, the Go runtime must never
// hand it to another goroutine: its goroutine never unlocks it. Nor does
// the thread ever end, even after stop: it was one of the runtime's
// threads before it was locked, and children other tests started from it
// then (a lab VM's QEMU, with Pdeathsig) would get SIGKILL when it ended.
// So after stop its goroutine parks for the life of the process, holding
// one idle thread per StartDaemons.
type nsThread struct {
	calls  chan func()
	done   chan struct{} // closed when the thread's work ended
	parked chan struct{} // closed when its goroutine parks for good

	mu      sync.Mutex // held while a call runs and by stop
	stopped bool
}

// newNSThread starts the thread and makes the namespace (privateMounts
// with dir's subdirectories). On error the thread has already ended.
func newNSThread(dir string) (*nsThread, error) {
	t := &nsThread{calls: make(chan func()), done: make(chan struct{}), parked: make(chan struct{})}
	ready := make(chan error, 1)
	goOnOwnThread(func() {
		defer parkForever(t.parked)
		defer close(t.done)
		if err := privateMounts(dir); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for f := range t.calls {
			f()
		}
	})
	if err := <-ready; err != nil {
		<-t.done
		return nil, err
	}
	return t, nil
}

// parkForever closes parked and blocks the calling goroutine for the life
// of the process, so that its locked thread never ends (see nsThread).
func parkForever(parked chan struct{}) {
	close(parked)
	select {}
}

// goOnOwnThread runs f in a new goroutine locked to an OS thread other than
// the process's main thread, and never unlocked (f must not return while
// children it started may live: see nsThread).
// Not the main thread, because the process's view of itself (/proc/self is
// the main thread's) must stay the host's; a goroutine that lands on it
// holds it while the next one, which then cannot, takes another thread.
func goOnOwnThread(f func()) {
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			started := make(chan struct{})
			goOnOwnThread(func() {
				close(started)
				f()
			})
			<-started
			runtime.UnlockOSThread()
			return
		}
		f()
	}()
}

// privateMounts runs on the locked thread: it gives the thread a mount
// namespace of its own whose mounts propagate nowhere, mounts an empty
// tmpfs on /run (no system daemon's socket is reachable there: not
// libvirtd's, virtlogd's, D-Bus's, so no machined or firewalld either),
// and bind-mounts dir's subdirectories on systemDirs.
func privateMounts(dir string) error {
	// unshare(CLONE_NEWNS) also unshares the thread's filesystem
	// attributes (CLONE_FS), which Go's threads otherwise share.
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("libvirttest: unshare the mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("libvirttest: make the mounts private: %w", err)
	}
	if err := unix.Mount("vmgate-libvirttest", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("libvirttest: tmpfs on /run: %w", err)
	}
	// /run/lock (/var/lock links there): libvirtd locks a console's pty
	// in it (LCK.._pts_N) before it hands the console out.
	for _, d := range []string{"/run/libvirt", "/run/lock"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("libvirttest: %w", err)
		}
	}
	for _, s := range systemDirs {
		// The mount points outside /run come with the libvirt packages;
		// nothing is created on the host's file systems.
		if _, err := os.Stat(s.system); err != nil {
			return fmt.Errorf("libvirttest: mount point: %w (is Debian's libvirt-daemon-system installed?)", err)
		}
		if err := unix.Mount(filepath.Join(dir, s.private), s.system, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("libvirttest: bind %s on %s: %w", s.private, s.system, err)
		}
	}
	return nil
}

// errNSStopped: a call after stop.
var errNSStopped = errors.New("libvirttest: the namespace thread has stopped")

// do runs f on the thread and waits for it.
func (t *nsThread) do(f func()) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return errNSStopped
	}
	ran := make(chan struct{})
	t.calls <- func() { f(); close(ran) }
	<-ran
	return nil
}

// stop ends the thread's work; the thread itself parks for the life of
// the process (see nsThread), and its namespace ends when the process
// does. Call it only after the daemons it started have exited. It is
// idempotent.
func (t *nsThread) stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if !t.stopped {
		t.stopped = true
		close(t.calls)
	}
	t.mu.Unlock()
	<-t.done
}
