//go:build linux

package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Root-side work on a tree a session has touched goes by file descriptor:
// every entry is reached from the descriptor of the directory that holds
// it, by its single name, never following a symlink (openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, O_PATH|O_NOFOLLOW), and acted on
// through the descriptor that lookup gave (fchownat with AT_EMPTY_PATH,
// unlinkat under the directory's descriptor). A name is looked up once: a
// symlink swapped in afterwards is at most what the action lands on
// itself (chowned, or unlinked), never followed.
//
// A tree can be deeper than the descriptors a process may hold (a session
// makes a/a/a/... as deep as it likes): the walk keeps at most
// dirWalk.maxOpen directories open and closes the ones above them; it
// climbs back through "..", checking that it found the directory it left
// (device and inode), so a directory moved meanwhile stops the walk with
// an error instead of leading it elsewhere. Nothing recurses.

// errDirMoved: a directory was not where the walk left it.
var errDirMoved = errors.New("a directory moved during the walk")

// defaultMaxOpen is how many directory descriptors a walk holds at most.
const defaultMaxOpen = 32

// dirWalk visits the tree below one directory, depth first.
type dirWalk struct {
	// maxOpen bounds the open directory descriptors (defaultMaxOpen when 0).
	maxOpen int
	// enter is called for every entry, a directory before its own
	// entries, with the descriptor of the directory holding it, its name,
	// an O_PATH descriptor of the entry itself (a symlink's own) and its
	// stat. It must not close fd. errSkip leaves a directory unvisited.
	enter func(dirfd int, name string, fd int, st *unix.Stat_t) error
	// leave, when set, is called for a directory after its entries, with
	// the descriptor of its parent and its name.
	leave func(dirfd int, name string) error
	// hook, for tests, runs at named points: "listed" after a directory's
	// names were read (with its depth, 1 for the top's entries).
	hook func(point string, depth int)
}

// errSkip, from enter, leaves a directory's entries unvisited.
var errSkip = errors.New("skip this directory")

// walkFrame is one directory on the walk's path.
type walkFrame struct {
	fd       int // O_RDONLY|O_DIRECTORY; -1 while closed to bound the descriptors
	dev, ino uint64
	name     string   // its name in its parent ("" for the top)
	names    []string // entries still to visit
}

// walk visits every entry below the directory top (an open directory
// descriptor, which stays the caller's). An entry on another file system
// than top (a mount point) is neither visited nor descended into.
func (w *dirWalk) walk(top int) (err error) {
	var st unix.Stat_t
	if err := unix.Fstat(top, &st); err != nil {
		return err
	}
	fd, err := unix.Openat(top, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	dev := st.Dev
	var stack []*walkFrame
	defer func() {
		for _, f := range stack {
			if f.fd >= 0 {
				unix.Close(f.fd)
			}
		}
	}()
	push := func(fd int, name string, st *unix.Stat_t) error {
		f := &walkFrame{fd: fd, dev: st.Dev, ino: st.Ino, name: name}
		stack = append(stack, f)
		names, err := readNames(fd)
		if err != nil {
			return fmt.Errorf("reading %s: %w", name, err)
		}
		f.names = names
		if w.hook != nil {
			w.hook("listed", len(stack))
		}
		if i := len(stack) - 1 - w.maxOpenDirs(); i >= 0 && stack[i].fd >= 0 {
			unix.Close(stack[i].fd)
			stack[i].fd = -1
		}
		return nil
	}
	if err := push(fd, "", &st); err != nil {
		return err
	}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		if len(f.names) == 0 {
			if err := w.pop(&stack); err != nil {
				return err
			}
			continue
		}
		name := f.names[0]
		f.names = f.names[1:]
		child, cst, err := w.visit(f.fd, name, dev)
		if err != nil {
			return err
		}
		if child >= 0 {
			if err := push(child, name, &cst); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *dirWalk) maxOpenDirs() int {
	if w.maxOpen <= 0 {
		return defaultMaxOpen
	}
	return w.maxOpen
}

// visit looks name up once in dirfd and calls enter; for a directory on
// dev it returns a descriptor to read it by (else -1).
func (w *dirWalk) visit(dirfd int, name string, dev uint64) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := openBeneath(dirfd, name, unix.O_PATH)
	if errors.Is(err, unix.ENOENT) {
		return -1, st, nil // gone since the listing
	}
	if err != nil {
		return -1, st, fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return -1, st, fmt.Errorf("stat %s: %w", name, err)
	}
	if st.Dev != dev {
		return -1, st, nil // a mount point: another file system's, left alone
	}
	err = w.enter(dirfd, name, fd, &st)
	if err != nil && !errors.Is(err, errSkip) {
		return -1, st, err
	}
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return -1, st, nil
	}
	// "." of the O_PATH descriptor: the directory just stat'ed, not the
	// name again.
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, st, fmt.Errorf("open %s: %w", name, err)
	}
	return dfd, st, nil
}

// pop ends the directory on top of the stack: its parent is reopened
// through ".." when it was closed (and must be the directory left), then
// leave runs.
func (w *dirWalk) pop(stack *[]*walkFrame) error {
	s := *stack
	f := s[len(s)-1]
	defer func() {
		unix.Close(f.fd)
		*stack = s[:len(s)-1]
	}()
	if len(s) == 1 {
		return nil
	}
	parent := s[len(s)-2]
	if parent.fd < 0 {
		fd, err := unix.Openat(f.fd, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("reopening the parent of %s: %w", f.name, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Dev != parent.dev || st.Ino != parent.ino {
			unix.Close(fd)
			return fmt.Errorf("%w: the parent of %s is not the directory it was", errDirMoved, f.name)
		}
		parent.fd = fd
	}
	if w.leave != nil {
		return w.leave(parent.fd, f.name)
	}
	return nil
}

// readNames lists a directory's entries (without "." and "..").
func readNames(fd int) ([]string, error) {
	buf := make([]byte, 16<<10)
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// openBeneath opens the single name in dirfd, never following a symlink
// (a symlink itself comes back with O_PATH; otherwise ELOOP): openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, or openat with O_NOFOLLOW before
// Linux 5.6 (the same for one name that is neither "." nor "..").
func openBeneath(dirfd int, name string, flags int) (int, error) {
	if name == "" || name == "." || name == ".." || strings.IndexByte(name, '/') >= 0 {
		return -1, fmt.Errorf("%q is not one name: %w", name, unix.EINVAL)
	}
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if useOpenat2 {
		how := unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		for range 8 {
			fd, err := unix.Openat2(dirfd, name, &how)
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			if !errors.Is(err, unix.ENOSYS) {
				return fd, err
			}
			useOpenat2 = false
			break
		}
	}
	return unix.Openat(dirfd, name, flags, 0)
}

// removeTree removes name from the directory parent and, when it is a
// directory, everything below it, by descriptor (unlinkat under the
// holding directory's descriptor; a symlink is unlinked, never followed).
// A missing name is not an error. The caller makes sure nothing adds to
// the tree meanwhile (its session's processes are gone).
func removeTree(parent int, name string) error {
	err := unix.Unlinkat(parent, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("unlink %s: %w", name, err)
	}
	dfd, err := openBeneath(parent, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	defer unix.Close(dfd)
	w := dirWalk{
		enter: func(dirfd int, name string, _ int, st *unix.Stat_t) error {
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return nil
			}
			return unlinkName(dirfd, name, 0)
		},
		leave: func(dirfd int, name string) error { return unlinkName(dirfd, name, unix.AT_REMOVEDIR) },
	}
	if err := w.walk(dfd); err != nil {
		return fmt.Errorf("removing %s: %w", name, err)
	}
	return unlinkName(parent, name, unix.AT_REMOVEDIR)
}

func unlinkName(dirfd int, name string, flags int) error {
	if err := unix.Unlinkat(dirfd, name, flags); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unlink %s: %w", name, err)
	}
	return nil
}

// removePath removes dir (absolute; its parent must be root's alone, as
// vmgate-guest's state directories are) with removeTree.
func removePath(dir string) error {
	parent, name := filepath.Dir(dir), filepath.Base(dir)
	pfd, err := openNoFollowRaw(parent, unix.O_PATH|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", parent, err)
	}
	defer unix.Close(pfd)
	if err := removeTree(pfd, name); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	return nil
}
