//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Files: read, write and stat a file by a path that means that file. Every
// open walks the path without following a symlink in any component: openat2
// with RESOLVE_NO_SYMLINKS (Linux 5.6+), else one openat with O_NOFOLLOW per
// component from "/". A refused path names the component that is a symlink.
// Following is the host's decision: it asks file stat --follow-symlinks for
// the real path, lets the policy decide on that, and then reads or writes the
// real path, which must still resolve without a symlink (so a link swapped in
// between is refused, not followed).
//
// A read opens the file O_PATH first and reopens it for reading through
// /proc/self/fd only when it is a regular file, so a FIFO cannot block it and
// opening a device (a watchdog, a tape) never happens. A write never follows
// the last component, even when the host followed the directories: a new file
// is created O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600 until the data is in, then
// given its mode exactly (no umask); an existing one must be a regular file
// with one link and without setuid or setgid bits unless those are allowed.

// useOpenat2 is cleared when the kernel has no openat2 (and by tests, to
// exercise the per-component walk).
var useOpenat2 = true

// checkFilePath refuses what is not an absolute, clean path.
func checkFilePath(op, p string) error {
	switch {
	case p == "":
		return invalidf("%s: --path is required", op)
	case len(p) > 4096:
		return invalidf("%s: path is %d bytes; the limit is 4096", op, len(p))
	case strings.IndexByte(p, 0) >= 0:
		return invalidf("%s: path contains NUL", op)
	case !filepath.IsAbs(p):
		return invalidf("%s: path %q is not absolute", op, p)
	case filepath.Clean(p) != p:
		return invalidf("%s: path %q is not clean (want %q): no \".\", \"..\", \"//\" or trailing \"/\"", op, p, filepath.Clean(p))
	}
	return nil
}

// openNoFollow opens p (absolute, clean) with flags, following no symlink
// in any component. With O_PATH|O_NOFOLLOW a symlink last component gives
// a descriptor of the link itself.
func openNoFollow(op, p string, flags int, mode uint32) (int, error) {
	fd, err := openNoFollowRaw(p, flags, mode)
	if err == nil {
		return fd, nil
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
		if c := symlinkComponent(p); c != "" {
			return -1, symlinkRefusal(op, p, c)
		}
	}
	return -1, fileErr(op, p, err)
}

func openNoFollowRaw(p string, flags int, mode uint32) (int, error) {
	if useOpenat2 {
		how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Mode: uint64(mode), Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		for range 8 {
			fd, err := unix.Openat2(unix.AT_FDCWD, p, &how)
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			if !errors.Is(err, unix.ENOSYS) {
				return fd, err
			}
			useOpenat2 = false // before Linux 5.6 (or filtered): walk
			break
		}
	}
	return walkNoFollow(p, flags, mode)
}

// walkNoFollow opens p one component at a time from "/", each with O_NOFOLLOW.
func walkNoFollow(p string, flags int, mode uint32) (int, error) {
	dir, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil || p == "/" {
		if err == nil && flags&unix.O_PATH == 0 {
			unix.Close(dir)
			return unix.Open("/", flags|unix.O_CLOEXEC, mode)
		}
		return dir, err
	}
	comps := strings.Split(p[1:], "/")
	for _, c := range comps[:len(comps)-1] {
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(dir)
		if err != nil {
			return -1, err
		}
		dir = next
	}
	defer unix.Close(dir)
	return unix.Openat(dir, comps[len(comps)-1], flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
}

// symlinkComponent is the first component of p that is a symlink ("" for none).
func symlinkComponent(p string) string {
	cur := ""
	for _, c := range strings.Split(p[1:], "/") {
		cur += "/" + c
		var st unix.Stat_t
		if err := unix.Lstat(cur, &st); err != nil {
			return ""
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return cur
		}
	}
	return ""
}

func symlinkRefusal(op, p, component string) error {
	target, _ := os.Readlink(component)
	where := "a directory in it"
	if component == p {
		where = "its last component"
	}
	return refused(wire.ReasonSymlink, "%s: refused: %s is a symlink (to %q), %s of %s; vmgate follows no symlink the policy does not allow (files.follow_symlinks), and never the last component of a write", op, component, target, where, p)
}

// fileErr words a failed open or I/O on p.
func fileErr(op, p string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return notFoundf("%s: %s: no such file or directory", op, p)
	case errors.Is(err, unix.ENOTDIR):
		return invalidf("%s: %s: a component of the path is not a directory", op, p)
	case errors.Is(err, unix.EISDIR):
		return refused(wire.ReasonNotRegular, "%s: refused: %s is a directory", op, p)
	}
	return fmt.Errorf("%s: %s: %w", op, p, err)
}

// typeOf is FileInfo.Type: file, dir, symlink, or other (kindOf in
// files_dir.go tells the others apart).
func typeOf(st *unix.Stat_t) string {
	switch k := kindOf(st); k {
	case "file", "dir", "symlink":
		return k
	}
	return "other"
}

func infoOf(p string, st *unix.Stat_t) wire.FileInfo {
	return wire.FileInfo{Path: p, Exists: true, Type: typeOf(st), Mode: st.Mode & 0o7777, Size: st.Size, Nlink: uint64(st.Nlink)}
}

// regularOnly refuses a descriptor that is not a regular file.
func regularOnly(op, p string, st *unix.Stat_t) error {
	switch typeOf(st) {
	case "file":
		return nil
	case "symlink":
		return symlinkRefusal(op, p, p)
	case "dir":
		return refused(wire.ReasonNotRegular, "%s: refused: %s is a directory", op, p)
	}
	return refused(wire.ReasonNotRegular, "%s: refused: %s is not a regular file (mode %#o): devices, FIFOs and sockets are not read or written", op, p, st.Mode&unix.S_IFMT)
}

// reopen opens the file an O_PATH descriptor names, for I/O, through /proc/self/fd.
func (a *Agent) reopen(op, p string, pathFD, flags int) (*os.File, error) {
	fd, err := unix.Open(filepath.Join(a.cfg.ProcDir, "self/fd", strconv.Itoa(pathFD)), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fileErr(op, p, err)
	}
	return os.NewFile(uintptr(fd), p), nil
}

// FileStat reports the file p names. With follow, symlinks in p are
// resolved first and Path is the real path; without, a symlink anywhere is
// refused. With forWrite only the directories may be followed: a symlink
// last component is refused, and a missing file (in a directory that
// exists) is Exists false, not an error.
func (a *Agent) FileStat(ctx context.Context, p string, follow, forWrite bool) (wire.FileInfo, error) {
	const op = "file stat"
	if err := checkFilePath(op, p); err != nil {
		return wire.FileInfo{}, err
	}
	if follow {
		real, err := resolveReal(op, p, forWrite)
		if err != nil {
			return wire.FileInfo{}, err
		}
		p = real
	}
	if forWrite {
		dir, base := filepath.Dir(p), filepath.Base(p)
		if p == "/" {
			return wire.FileInfo{}, refused(wire.ReasonNotRegular, "%s: refused: / is a directory", op)
		}
		dfd, err := openNoFollow(op, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return wire.FileInfo{}, err
		}
		defer unix.Close(dfd)
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
			return wire.FileInfo{Path: p}, nil
		} else if err != nil {
			return wire.FileInfo{}, fileErr(op, p, err)
		}
		if typeOf(&st) == "symlink" {
			return wire.FileInfo{}, symlinkRefusal(op, p, p)
		}
		return infoOf(p, &st), nil
	}
	fd, err := openNoFollow(op, p, unix.O_PATH, 0)
	if err != nil {
		return wire.FileInfo{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return wire.FileInfo{}, fileErr(op, p, err)
	}
	if typeOf(&st) == "symlink" {
		return wire.FileInfo{}, symlinkRefusal(op, p, p)
	}
	return infoOf(p, &st), nil
}

// resolveReal is p with every symlink resolved (for a write, every symlink
// but the last component's, which stays as it is).
func resolveReal(op, p string, forWrite bool) (string, error) {
	target := p
	if forWrite {
		target = filepath.Dir(p)
	}
	real, err := filepath.EvalSymlinks(target)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", fileErr(op, target, err)
	}
	if forWrite {
		real = filepath.Join(real, filepath.Base(p))
	}
	return real, nil
}

// FileRead reads at most maxBytes of the regular file p names; Truncated
// says whether there was more.
func (a *Agent) FileRead(ctx context.Context, p string, maxBytes int64) (wire.FileRead, error) {
	if maxBytes < 1 || maxBytes > wire.MaxFileReadBytes {
		return wire.FileRead{}, invalidf("file read: --max-bytes %d: want 1..%d", maxBytes, wire.MaxFileReadBytes)
	}
	var buf bytes.Buffer
	fr, err := a.FileReadRange(ctx, p, ReadOptions{Length: maxBytes}, &buf)
	fr.Data = buf.Bytes()
	return fr, err
}

// ReadOptions say what FileReadRange reads.
type ReadOptions struct {
	Offset int64
	// Length is the most to read (0..wire.MaxReadLength).
	Length int64
	// Hash: report the whole file's SHA-256, read in the same pass.
	Hash bool
}

// readChunk is the buffer of ranged reads and hashing.
const readChunk = 256 << 10

// FileReadRange copies the range [o.Offset, o.Offset+o.Length) of the
// regular file p names to w, stopping at its end. With o.Hash it reads the
// whole file once, hashing all of it and copying the range on the way, so
// the hash and the range come from one pass over one descriptor; the file
// is never held in memory. An offset at or past the end reads nothing and
// reports EOF.
func (a *Agent) FileReadRange(ctx context.Context, p string, o ReadOptions, w io.Writer) (wire.FileRead, error) {
	const op = "file read"
	if err := checkFilePath(op, p); err != nil {
		return wire.FileRead{}, err
	}
	if o.Offset < 0 || o.Length < 0 || o.Length > wire.MaxReadLength {
		return wire.FileRead{}, invalidf("%s: offset %d / length %d: want an offset of 0 or more and a length of 0..%d", op, o.Offset, o.Length, wire.MaxReadLength)
	}
	fd, err := openNoFollow(op, p, unix.O_PATH, 0)
	if err != nil {
		return wire.FileRead{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return wire.FileRead{}, fileErr(op, p, err)
	}
	if err := regularOnly(op, p, &st); err != nil {
		return wire.FileRead{}, err
	}
	f, err := a.reopen(op, p, fd, unix.O_RDONLY)
	if err != nil {
		return wire.FileRead{}, err
	}
	defer f.Close()
	out := wire.FileRead{FileInfo: infoOf(p, &st), Offset: o.Offset}
	var n int64
	var more bool
	if o.Hash {
		n, more, out.SHA256, err = hashRange(ctx, f, o.Offset, o.Length, w)
	} else {
		n, more, err = copyRange(ctx, f, o.Offset, o.Length, w)
	}
	if err != nil {
		var we *wire.Error
		if errors.As(err, &we) || errors.Is(err, errOverMax) || ctx.Err() != nil {
			return wire.FileRead{}, err
		}
		return wire.FileRead{}, fileErr(op, p, err)
	}
	out.Bytes, out.Truncated, out.EOF = n, more, !more
	return out, nil
}

// copyRange copies at most length bytes of f from off to w and reports
// whether the file has more after them.
func copyRange(ctx context.Context, f *os.File, off, length int64, w io.Writer) (n int64, more bool, err error) {
	buf := make([]byte, min(length+1, readChunk))
	for n < length {
		if err := ctx.Err(); err != nil {
			return n, false, err
		}
		m, rerr := f.ReadAt(buf[:min(int64(len(buf)), length-n)], off+n)
		if m > 0 {
			if _, err := w.Write(buf[:m]); err != nil {
				return n, false, err
			}
			n += int64(m)
		}
		if errors.Is(rerr, io.EOF) {
			return n, false, nil
		}
		if rerr != nil {
			return n, false, rerr
		}
	}
	m, rerr := f.ReadAt(buf[:1], off+n)
	if rerr != nil && !errors.Is(rerr, io.EOF) {
		return n, false, rerr
	}
	return n, m > 0, nil
}

// hashRange reads f from the start to its end, hashing everything and
// copying [off, off+length) to w.
func hashRange(ctx context.Context, f *os.File, off, length int64, w io.Writer) (n int64, more bool, sum string, err error) {
	h := sha256.New()
	buf := make([]byte, readChunk)
	var pos int64
	for {
		if err := ctx.Err(); err != nil {
			return 0, false, "", err
		}
		m, rerr := f.Read(buf)
		if m > 0 {
			h.Write(buf[:m])
			// The part of this chunk inside the range.
			lo, hi := max(off, pos), min(off+length, pos+int64(m))
			if lo < hi {
				if _, err := w.Write(buf[lo-pos : hi-pos]); err != nil {
					return 0, false, "", err
				}
				n += hi - lo
			}
			pos += int64(m)
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return 0, false, "", rerr
		}
	}
	return n, pos > off+length, hex.EncodeToString(h.Sum(nil)), nil
}

// hashFile is the SHA-256 of what f holds, read from the start through its
// own offsets (pread), so f's file position is left alone.
func hashFile(ctx context.Context, f *os.File) (string, error) {
	h := sha256.New()
	if _, _, err := copyRange(ctx, f, 0, math.MaxInt64-1, h); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
