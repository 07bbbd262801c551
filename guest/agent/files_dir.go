//go:build linux

package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Directories: dir list and archive read walk a tree the same way
// (walker): the top directory opened by path without following a symlink
// in any component, each directory below it opened by name under its
// parent's descriptor with O_NOFOLLOW|O_DIRECTORY (a directory swapped for
// a symlink meanwhile fails to open, it is not followed), every entry
// stat'ed without following, siblings in name order, depth first. A
// symlink is data: its target is reported, never visited.

// kindOf names a file type: file dir symlink fifo socket char block.
func kindOf(st *unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "char"
	case unix.S_IFBLK:
		return "block"
	}
	return "other"
}

// openDir opens the directory p for reading its names, following no
// symlink: a symlink or anything but a directory is refused.
func (a *Agent) openDir(op, p string) (*os.File, error) {
	pfd, err := openNoFollow(op, p, unix.O_PATH, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, fileErr(op, p, err)
	}
	switch kindOf(&st) {
	case "dir":
		return a.reopen(op, p, pfd, unix.O_RDONLY|unix.O_DIRECTORY)
	case "symlink":
		return nil, symlinkRefusal(op, p, p)
	}
	return nil, refused(wire.ReasonNotRegular, "%s: refused: %s is not a directory (it is a %s)", op, p, kindOf(&st))
}

// walkEntry is one entry the walker found.
type walkEntry struct {
	dir   *os.File // the directory holding it
	name  string
	rel   string // relative to the top directory
	st    unix.Stat_t
	level int // 1 for the top directory's own entries
}

// errStopWalk ends a walk early without an error.
var errStopWalk = errors.New("stop walking")

// walker walks a tree (see the top of this file).
type walker struct {
	ctx      context.Context
	maxLevel int // the deepest level visited
	maxNames int // the most names read from one directory
	// visit is called for each entry and says whether to descend into it
	// (only directories are, and only above maxLevel).
	visit func(e *walkEntry) (descend bool, err error)
	// fail is told about a directory that could not be opened or read.
	fail func(e *walkEntry, err error) error
	// truncated is told about a directory with more than maxNames names.
	truncated func(rel string) error
}

// walk visits the entries of dir (relative path rel, at level).
func (w *walker) walk(dir *os.File, rel string, level int) error {
	names, err := dir.Readdirnames(w.maxNames + 1)
	if err != nil && len(names) == 0 && !errors.Is(err, io.EOF) { // io.EOF: an empty directory
		return err
	}
	if len(names) > w.maxNames {
		names = names[:w.maxNames]
		if err := w.truncated(rel); err != nil {
			return err
		}
	}
	slices.Sort(names)
	dfd := int(dir.Fd())
	for _, n := range names {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		e := &walkEntry{dir: dir, name: n, rel: path.Join(rel, n), level: level}
		if err := unix.Fstatat(dfd, n, &e.st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
			continue // gone meanwhile
		} else if err != nil {
			if err := w.fail(e, err); err != nil {
				return err
			}
			continue
		}
		descend, err := w.visit(e)
		if err != nil {
			return err
		}
		if !descend || kindOf(&e.st) != "dir" || level >= w.maxLevel {
			continue
		}
		if err := w.descend(e); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) descend(e *walkEntry) error {
	fd, err := unix.Openat(int(e.dir.Fd()), e.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return w.fail(e, err)
	}
	sub := os.NewFile(uintptr(fd), e.rel)
	defer sub.Close()
	return w.walk(sub, e.rel, e.level+1)
}

// DirList lists the directory p down to depth levels (1: its own
// entries), at most maxEntries entries in all, following no symlink.
func (a *Agent) DirList(ctx context.Context, p string, depth, maxEntries int) (wire.DirList, error) {
	const op = "dir list"
	if err := checkFilePath(op, p); err != nil {
		return wire.DirList{}, err
	}
	if depth < 1 || depth > wire.MaxDirDepth || maxEntries < 1 || maxEntries > wire.MaxDirEntries {
		return wire.DirList{}, invalidf("%s: depth %d / max entries %d: want 1..%d and 1..%d", op, depth, maxEntries, wire.MaxDirDepth, wire.MaxDirEntries)
	}
	top, err := a.openDir(op, p)
	if err != nil {
		return wire.DirList{}, err
	}
	defer top.Close()
	out := wire.DirList{Path: p, Depth: depth, Entries: []wire.DirEntry{}}
	w := &walker{ctx: ctx, maxLevel: depth, maxNames: wire.MaxDirEntries,
		visit: func(e *walkEntry) (bool, error) {
			if len(out.Entries) == maxEntries {
				out.Truncated = true
				return false, errStopWalk
			}
			out.Entries = append(out.Entries, dirEntryOf(e))
			return true, nil
		},
		fail: func(e *walkEntry, err error) error {
			if n := len(out.Entries); n > 0 && out.Entries[n-1].Path == e.rel {
				out.Entries[n-1].Error = fileErr(op, path.Join(p, e.rel), err).Error()
			}
			return nil
		},
		truncated: func(string) error { out.Truncated = true; return nil },
	}
	if err := w.walk(top, "", 1); err != nil && !errors.Is(err, errStopWalk) {
		var we *wire.Error
		if errors.As(err, &we) || ctx.Err() != nil {
			return wire.DirList{}, err
		}
		return wire.DirList{}, fileErr(op, p, err)
	}
	return out, nil
}

// dirEntryOf is the listing of one entry (a symlink's target read as data).
func dirEntryOf(e *walkEntry) wire.DirEntry {
	d := wire.DirEntry{Path: e.rel, Type: kindOf(&e.st), Size: e.st.Size, Mode: e.st.Mode & 0o7777,
		MtimeMS: e.st.Mtim.Sec*1000 + e.st.Mtim.Nsec/1e6, UID: e.st.Uid, GID: e.st.Gid, Nlink: uint64(e.st.Nlink)}
	if d.Type == "symlink" {
		d.Target, _ = readlinkat(int(e.dir.Fd()), e.name)
	}
	return d
}

// readlinkat reads the target of the symlink name in dirfd.
func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		if len(buf) >= 1<<16 {
			return string(buf[:n]), nil
		}
		buf = make([]byte, 2*len(buf))
	}
}
