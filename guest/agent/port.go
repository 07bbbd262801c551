//go:build linux

package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sysPorts is where the kernel lists virtio-serial ports: <dir>/<vportNpM>/name, dev.
const sysPorts = "/sys/class/virtio-ports"

// openPort opens the virtio-serial port called name, for the resident
// helper alone: it finds the port's device in sysfs, opens the node
// devtmpfs made for it (/dev/<vportNpM>, checked to be that character
// device), and makes it root's, mode 0600, through the open descriptor;
// a /dev/virtio-ports/<name> node of the same device (a udev link, the
// lab image's mknod) gets the same owner and mode. The port is opened
// blocking: a read of nothing means the host's end is closed (mux's
// ServePort). It returns the file and the node's path; ErrNoPort when no
// port has that name.
func (a *Agent) openPort(name string) (*os.File, string, error) {
	vport, major, minor, err := findPort(name)
	if err != nil {
		return nil, "", err
	}
	dev := filepath.Join("/dev", vport)
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, "", fmt.Errorf("port %s: open %s: %w", name, dev, err)
	}
	f := os.NewFile(uintptr(fd), dev)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("port %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != major || unix.Minor(st.Rdev) != minor {
		f.Close()
		return nil, "", fmt.Errorf("port %s: %s is not the port's device %d:%d", name, dev, major, minor)
	}
	if err := unix.Fchown(fd, 0, 0); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("port %s: chown: %w", name, err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("port %s: chmod: %w", name, err)
	}
	a.privateNode(filepath.Join("/dev/virtio-ports", name), st.Rdev)
	return f, dev, nil
}

// findPort reads sysfs for the port called name: its vportNpM and device numbers.
func findPort(name string) (vport string, major, minor uint32, err error) {
	ents, err := os.ReadDir(sysPorts)
	if err != nil {
		return "", 0, 0, fmt.Errorf("port %s: %w (%w)", name, ErrNoPort, err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysPorts, e.Name(), "name"))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		d, err := os.ReadFile(filepath.Join(sysPorts, e.Name(), "dev"))
		if err != nil {
			return "", 0, 0, fmt.Errorf("port %s: %w", name, err)
		}
		ma, mi, ok := strings.Cut(strings.TrimSpace(string(d)), ":")
		m1, e1 := strconv.ParseUint(ma, 10, 32)
		m2, e2 := strconv.ParseUint(mi, 10, 32)
		if !ok || e1 != nil || e2 != nil {
			return "", 0, 0, fmt.Errorf("port %s: bad device numbers %q", name, d)
		}
		return e.Name(), uint32(m1), uint32(m2), nil
	}
	return "", 0, 0, fmt.Errorf("port %s: %w", name, ErrNoPort)
}

// privateNode gives the device node at p (not a symlink: a udev link
// points at the node openPort fixed) root's ownership and mode 0600 when it
// is the device rdev: one O_PATH|O_NOFOLLOW open, and the check, the chown
// and the chmod through that descriptor, so that nothing swapped in at p
// between them is changed. It reports whether it changed the node.
func (a *Agent) privateNode(p string, rdev uint64) bool {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != rdev {
		return false
	}
	return unix.Fchownat(fd, "", 0, 0, unix.AT_EMPTY_PATH) == nil && a.chmodFD(fd, 0o600) == nil
}
