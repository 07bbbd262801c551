package lab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The state directory holds what only vmgate's own user may read: the lab
// VMs' disks (with their snapshots, the guest's memory included), the
// store (the full arguments of calls waiting for an operator), the audit
// log and its key, the operator socket. So it is 0700, and nothing in it
// has a permission bit for group or others: directories 0700, files 0600
// (DirMode, FileMode). PrepareStateDir makes it so (vmgate lab up, which
// owns the directory, tightens one an older version left open);
// CheckStateDir refuses one that is not (vmgate serve, which says how to
// fix it rather than change the operator's directory behind their back).

// Modes of what vmgate makes in the state directory.
const (
	DirMode  fs.FileMode = 0o700
	FileMode fs.FileMode = 0o600
)

// openBits are the permission bits of group and others.
const openBits = 0o077

// ErrStateDirOpen: the state directory, or something in it, can be read,
// written or entered by users other than vmgate's own.
var ErrStateDirOpen = errors.New("the state directory is open to other users")

// CheckStateDir returns nil when dir is a directory owned by this process's
// user that grants nothing to group or others, and otherwise an error
// (wrapping ErrStateDirOpen) naming dir, its owner and mode, and the fix.
// It follows a symlink at dir itself: the operator chose that path.
func CheckStateDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	return stateDirProblem(dir, &st, false)
}

// stateDirProblem says what is wrong with the state directory dir (or a
// directory in it, when inside) as st describes it; nil when nothing is.
func stateDirProblem(dir string, st *unix.Stat_t, inside bool) error {
	what := "state directory"
	if inside {
		what = "directory"
	}
	mode := st.Mode & 0o7777
	switch uid := os.Geteuid(); {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%w: %s %s is not a directory", ErrStateDirOpen, what, dir)
	case int(st.Uid) != uid:
		return fmt.Errorf("%w: %s %s belongs to uid %d, not to vmgate's user (uid %d), who could not keep it private: "+
			"check what is in it, then run \"chown -R %d %s && chmod 0700 %s\" (or choose another state directory)",
			ErrStateDirOpen, what, dir, st.Uid, uid, uid, dir, dir)
	case mode&0o022 != 0:
		return fmt.Errorf("%w: %s %s has mode %04o: other users can write it, so what is in it may not be vmgate's own: "+
			"check what is in it, then run \"chmod 0700 %s\"", ErrStateDirOpen, what, dir, mode, dir)
	case mode&openBits != 0:
		return fmt.Errorf("%w: %s %s has mode %04o: other users can read it (the lab VMs' disks with their memory snapshots, "+
			"the store with the arguments of parked calls, the audit log): run \"chmod 0700 %s\"", ErrStateDirOpen, what, dir, mode, dir)
	}
	return nil
}

// PrepareStateDir makes dir the state directory vmgate wants: created
// (with missing parents, 0700) when it does not exist; when it does, owned
// by this user and writable by nobody else, and then every group and
// other permission bit is taken off it and off everything in it (an older
// `vmgate lab up` made it 0755 and its disks 0644). The walk goes by file
// descriptor and follows no symlink (a symlink's own mode means nothing,
// and its target is not the state directory's). A directory in the tree
// that another user owns or can write is refused, as dir is: someone else
// may have put things in it.
func PrepareStateDir(dir string) error {
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	return tightenTree(fd, dir, &st, 0)
}

// untrusted reports whether a directory may hold what another user put
// there: another user owns it or can write it (or it is no directory).
func untrusted(st *unix.Stat_t) bool {
	return st.Mode&0o022 != 0 || int(st.Uid) != os.Geteuid() || st.Mode&unix.S_IFMT != unix.S_IFDIR
}

// maxStateDepth bounds the walk (the state directory is three levels deep).
const maxStateDepth = 16

// tightenTree takes group and other bits off the directory fd (at path p,
// described by st) and, depth first, off everything in it.
func tightenTree(fd int, p string, st *unix.Stat_t, depth int) error {
	if untrusted(st) {
		return stateDirProblem(p, st, depth > 0)
	}
	if st.Mode&openBits != 0 {
		if err := unix.Fchmod(fd, st.Mode&0o7777&^openBits); err != nil {
			return fmt.Errorf("state directory: chmod %s: %w", p, err)
		}
	}
	if depth >= maxStateDepth {
		return fmt.Errorf("state directory: %s is more than %d levels deep", p, maxStateDepth)
	}
	names, err := readDirNames(fd, p)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := tightenEntry(fd, p, name, depth); err != nil {
			return err
		}
	}
	return nil
}

// tightenEntry tightens name in the directory dirfd (at path p).
func tightenEntry(dirfd int, p, name string, depth int) error {
	path := filepath.Join(p, name)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone meanwhile
		}
		return fmt.Errorf("state directory: %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return nil
	case unix.S_IFDIR:
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("state directory: %s: %w", path, err)
		}
		defer unix.Close(fd)
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("state directory: %s: %w", path, err)
		}
		return tightenTree(fd, path, &st, depth+1)
	}
	if st.Mode&openBits == 0 {
		return nil
	}
	// Not a symlink (checked above), in a directory only this user can
	// change: the name cannot be swapped for one between the two calls.
	if err := unix.Fchmodat(dirfd, name, st.Mode&0o7777&^openBits, 0); err != nil {
		return fmt.Errorf("state directory: chmod %s: %w", path, err)
	}
	return nil
}

// readDirNames lists the directory fd (at path p) without moving fd's own
// offset for later readers: it reads through a duplicate.
func readDirNames(fd int, p string) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("state directory: %s: %w", p, err)
	}
	f := os.NewFile(uintptr(dup), p)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("state directory: %s: %w", p, err)
	}
	return names, nil
}
