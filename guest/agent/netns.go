//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// createNetNS makes a network namespace with only its loopback, up, and
// keeps it alive after this process exits by bind-mounting it on path (an
// empty file it creates, the way `ip netns add` does). Every run of the
// session enters it (confinement.enterNetNS), so its processes share one
// loopback across runs.
func createNetNS(path string) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	defer func() {
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	errc := make(chan error, 1)
	go func() {
		// The namespace is the thread's: the thread stays locked, and the
		// runtime ends it with this goroutine.
		runtime.LockOSThread()
		errc <- newNetNSOnThread(path)
	}()
	return <-errc
}

func newNetNSOnThread(path string) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
	if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", self, err)
	}
	return nil
}

// loopbackUp sets IFF_UP on lo in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// removeNetNS unmounts and removes a namespace made by createNetNS; a
// missing one is not an error. The namespace itself goes away with the
// last process in it.
func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
