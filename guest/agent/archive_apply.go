//go:build linux

package agent

import (
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// The second pass of archive write (see archive_write.go): every entry the
// plan allowed is made beneath the target's descriptor.

// apply writes one entry.
func (x *extractor) apply(h wire.ArchiveHeader, body io.Reader) error {
	e := &x.entries[h.Index]
	if e.Action == wire.ActionRefused || h.Name == "" {
		return nil
	}
	if err := x.ctx.Err(); err != nil {
		return err
	}
	if h.Type != "file" && h.Type != "dir" || len(x.dirFDs) >= maxDirFDs {
		// A link or a node comes after the files before it are in place
		// (a hard link's source, a name it replaces); the directories a
		// batch's files are in stay open until they are.
		if err := x.flush(); err != nil {
			return err
		}
		if len(x.dirFDs) >= maxDirFDs {
			x.closeDirs()
		}
	}
	action, err := x.applyOne(h, body)
	if err := x.settle(h, action, err); err != nil {
		return err
	}
	if len(x.pending) >= x.batchFiles() || x.pendingBytes >= batchBytes {
		return x.flush()
	}
	return nil
}

func (x *extractor) batchFiles() int {
	if x.a.faults.archiveBatch > 0 {
		return x.a.faults.archiveBatch
	}
	return batchFiles
}

// settle records what writing entry h did: action, a refusal, or (an
// error that stops the extraction) the error, worded. An empty action
// is a file waiting for its batch.
func (x *extractor) settle(h wire.ArchiveHeader, action string, err error) error {
	e := &x.entries[h.Index]
	var r *entryRefusal
	switch {
	case errors.As(err, &r):
		e.Action, e.Reason, e.Message = wire.ActionRefused, r.reason, r.msg
	case err != nil:
		return fmt.Errorf("entry %d (%s): %w", h.Index, h.Header.Name, err)
	case action != "":
		e.Action = action
		if action != wire.ActionExists {
			x.written++
		}
	}
	return nil
}

func (x *extractor) applyOne(h wire.ArchiveHeader, body io.Reader) (string, error) {
	pfd, base, err := x.parent(h.Name)
	if err != nil {
		return "", err
	}
	switch h.Type {
	case "dir":
		return x.mkdir(pfd, base, h)
	case "file":
		return x.writeFile(pfd, base, h, body)
	case "symlink", "hardlink":
		return x.link(pfd, base, h)
	}
	return x.mknod(pfd, base, h)
}

// maxDirFDs bounds the directory descriptors an extraction keeps open.
const maxDirFDs = 256

// parent opens the directory name goes in (making missing ones) and
// keeps it open for the entries that follow (up to maxDirFDs: then apply
// puts the pending files in place and closes them).
func (x *extractor) parent(name string) (int, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		return x.root, base, nil
	}
	if d, ok := x.dirFDs[dir]; ok {
		return d.fd, base, nil
	}
	fd, err := x.openBeneath(dir, true)
	if err != nil {
		return -1, "", err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, "", fmt.Errorf("%s: %w", dir, err)
	}
	x.dirFDs[dir] = dirFD{fd: fd, dev: st.Dev}
	return fd, base, nil
}

// dirFD is a directory descriptor parent keeps, and its filesystem.
type dirFD struct {
	fd  int
	dev uint64
}

func (x *extractor) closeDirs() {
	for rel, d := range x.dirFDs {
		unix.Close(d.fd)
		delete(x.dirFDs, rel)
	}
}

// openBeneath opens the directory rel beneath the target following no
// symlink: openat2 where it can, else (or when a directory is missing and
// create is set, making it 0755) one O_NOFOLLOW open per component.
func (x *extractor) openBeneath(rel string, create bool) (int, error) {
	if useOpenat2 {
		how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		fd, err := unix.Openat2(x.root, rel, &how)
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			return -1, x.walkErr(rel, err)
		}
	}
	cur := x.root
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		next, err := unix.Openat(cur, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && create {
			next, err = x.mkdirOnTheWay(cur, c)
		}
		if cur != x.root {
			unix.Close(cur)
		}
		if err != nil {
			return -1, x.walkErr(strings.Join(comps[:i+1], "/"), err)
		}
		cur = next
	}
	return cur, nil
}

// mkdirOnTheWay makes a directory an entry's name implies (0755) and opens it.
func (x *extractor) mkdirOnTheWay(dfd int, name string) (int, error) {
	if err := unix.Mkdirat(dfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := x.a.chmodFD(fd, 0o755); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// walkErr words a failed open of the directory rel: a symlink or a
// non-directory in the way refuses the entry; anything else stops.
func (x *extractor) walkErr(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return refuseEntry(wire.ReasonSymlink, "a symlink is in the way in %s; nothing is written through one", rel)
	case errors.Is(err, unix.ENOTDIR):
		st, serr := x.lstat(rel)
		if serr == nil && kindOf(st) == "symlink" {
			return refuseEntry(wire.ReasonSymlink, "%s is a symlink; nothing is written through one", rel)
		}
		return refuseEntry(wire.ReasonConflict, "%s is not a directory", rel)
	}
	return fmt.Errorf("%s: %w", rel, err)
}

// existingAt is what is at base in pfd before an entry replaces it: nil
// when nothing, the stat of a regular file or symlink it may replace, or a
// refusal.
func (x *extractor) existingAt(pfd int, base, name, typ string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if r := x.over(name, typ, &st); r != nil {
		return nil, r
	}
	return &st, nil
}

// put gives the temporary name tmp in pfd the name base: a new name, or in
// place of old (a regular file or symlink). On failure tmp is removed.
func putName(pfd int, tmp, base string, old *unix.Stat_t) error {
	var err error
	if old == nil {
		err = unix.Renameat2(pfd, tmp, pfd, base, unix.RENAME_NOREPLACE)
	} else {
		err = unix.Renameat(pfd, tmp, pfd, base)
	}
	if err != nil {
		_ = unix.Unlinkat(pfd, tmp, 0)
	}
	if errors.Is(err, unix.EEXIST) {
		return refuseEntry(wire.ReasonConflict, "%s appeared while it was written", base)
	}
	return err
}

func actionFor(old *unix.Stat_t) string {
	if old == nil {
		return wire.ActionCreate
	}
	return wire.ActionReplace
}

func timespecOf(h wire.ArchiveHeader) []unix.Timespec {
	ts := unix.NsecToTimespec(h.Header.ModTime.UnixNano())
	return []unix.Timespec{ts, ts}
}

// mkdir makes a directory entry (or finds it there).
func (x *extractor) mkdir(pfd int, base string, h wire.ArchiveHeader) (string, error) {
	err := unix.Mkdirat(pfd, base, 0o700)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || kindOf(&st) != "dir" {
			return "", refuseEntry(wire.ReasonConflict, "%s is not a directory", h.Name)
		}
		return wire.ActionExists, nil
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", h.Name, err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", x.walkErr(h.Name, err)
	}
	defer unix.Close(fd)
	if err := x.a.chmodFD(fd, uint32(h.Header.Mode&0o7777)); err != nil {
		return "", fmt.Errorf("%s: %w", h.Name, err)
	}
	x.dirs = append(x.dirs, dirTime{rel: h.Name, ts: timespecOf(h)[0]})
	return wire.ActionCreate, nil
}

// writeFile writes a regular file entry into an unnamed (or temporary)
// file with its mode and mtime, and leaves it for the batch: flush puts it
// in place once its data is on disk.
func (x *extractor) writeFile(pfd int, base string, h wire.ArchiveHeader, body io.Reader) (string, error) {
	p := wire.ArchivePath(x.target, h.Name)
	tmp, err := x.a.newTemp(x.op, p, pfd)
	if err != nil {
		return "", err
	}
	if x.buf == nil {
		x.buf = make([]byte, readChunk) // one for all the files: TCG guests pay dearly for fresh memory
	}
	// The writer alone: os.File's ReadFrom would take a buffer of its own per file.
	n, err := io.CopyBuffer(struct{ io.Writer }{tmp.f}, io.LimitReader(body, h.Header.Size), x.buf)
	if err == nil && n != h.Header.Size {
		err = fmt.Errorf("%w: %d of %d bytes", io.ErrUnexpectedEOF, n, h.Header.Size)
	}
	fd := int(tmp.f.Fd())
	if err == nil {
		err = unix.Fchmod(fd, uint32(h.Header.Mode&0o7777))
	}
	if err != nil {
		tmp.discard()
		return "", fmt.Errorf("%s: %w", h.Name, err)
	}
	_ = futimens(fd, timespecOf(h))
	x.pending = append(x.pending, pendingFile{tmp: tmp, pfd: pfd, base: base, h: h})
	x.pendingBytes += n
	return "", nil
}

// futimens sets the times of the file fd is open on (utimensat with no
// path: the descriptor itself, no name looked up).
func futimens(fd int, ts []unix.Timespec) error {
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// A batch: the regular files written and not yet named, at most
// batchFiles of them or batchBytes of data.
const (
	batchFiles = 256
	batchBytes = 64 << 20
)

// pendingFile is a regular file entry written and waiting for its batch.
type pendingFile struct {
	tmp  *tempFile
	pfd  int
	base string
	h    wire.ArchiveHeader
}

// flush puts the pending files in place: one syncfs for each filesystem
// they are on (their data and mode on disk before any of them has its
// name, so that a crash leaves no named file with missing data), then,
// in the archive's order, the write-time check of what is there and the
// link or rename. A failed sync names none of them; an error stops with
// those after it unnamed (removed).
func (x *extractor) flush() error {
	pending := x.pending
	x.pending, x.pendingBytes = x.pending[:0], 0
	defer func() {
		for _, p := range pending {
			p.tmp.discard()
		}
	}()
	if len(pending) == 0 {
		return nil
	}
	if err := x.syncDirs(pending); err != nil {
		return fmt.Errorf("syncing %d files before naming them: %w", len(pending), err)
	}
	for i := range pending {
		p := &pending[i]
		action, err := x.place(p)
		if err := x.settle(p.h, action, err); err != nil {
			return err
		}
	}
	return nil
}

// syncDirs syncs each filesystem the pending files are on, once.
func (x *extractor) syncDirs(pending []pendingFile) error {
	synced := map[int]bool{}
	devs := map[uint64]bool{}
	for _, p := range pending {
		if synced[p.pfd] {
			continue
		}
		synced[p.pfd] = true
		dev, known := x.devOf(p.pfd)
		if known && devs[dev] {
			continue
		}
		devs[dev] = true
		if err := x.a.syncFS(p.pfd); err != nil {
			return err
		}
	}
	return nil
}

// devOf is the filesystem of a directory descriptor parent keeps (or the target).
func (x *extractor) devOf(fd int) (uint64, bool) {
	for _, d := range x.dirFDs {
		if d.fd == fd {
			return d.dev, true
		}
	}
	return x.rootDev, fd == x.root
}

// place checks what is at a pending file's name now and links or renames
// the file there (a file it replaces keeps its owner).
func (x *extractor) place(p *pendingFile) (string, error) {
	h := p.h
	old, err := x.existingAt(p.pfd, p.base, h.Name, "file")
	if err != nil {
		return "", err
	}
	fd := int(p.tmp.f.Fd())
	if old != nil && kindOf(old) == "file" {
		// chown clears setuid and setgid bits: the mode again after it.
		if err := unix.Fchown(fd, int(old.Uid), int(old.Gid)); err != nil {
			return "", fmt.Errorf("%s: %w", h.Name, err)
		}
		if err := unix.Fchmod(fd, uint32(h.Header.Mode&0o7777)); err != nil {
			return "", fmt.Errorf("%s: %w", h.Name, err)
		}
	}
	if x.a.faults.rename != nil {
		if err := x.a.faults.rename(); err != nil {
			return "", fmt.Errorf("%s: %w", h.Name, err)
		}
	}
	if old == nil {
		err = p.tmp.linkTo(p.base)
		if errors.Is(err, unix.EEXIST) {
			return "", refuseEntry(wire.ReasonConflict, "%s appeared while it was written", h.Name)
		}
	} else {
		err = p.tmp.replace(p.base)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", h.Name, err)
	}
	x.bytes += h.Header.Size
	if x.linkSources[h.Name] {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err == nil {
			x.files[h.Name] = fileID{dev: st.Dev, ino: st.Ino}
		}
	}
	return actionFor(old), nil
}

// link makes a symlink entry, or a hard link entry to a file this archive
// wrote, under a temporary name, then renames it into place.
func (x *extractor) link(pfd int, base string, h wire.ArchiveHeader) (string, error) {
	tmp := tempPrefix + randomHex(8)
	if h.Type == "symlink" {
		if err := unix.Symlinkat(h.Header.Linkname, pfd, tmp); err != nil {
			return "", fmt.Errorf("%s: %w", h.Name, err)
		}
		_ = unix.UtimesNanoAt(pfd, tmp, timespecOf(h), unix.AT_SYMLINK_NOFOLLOW)
	} else if err := x.hardlink(pfd, tmp, h); err != nil {
		return "", err
	}
	old, err := x.existingAt(pfd, base, h.Name, h.Type)
	if err == nil {
		err = putName(pfd, tmp, base, old)
	} else {
		_ = unix.Unlinkat(pfd, tmp, 0)
	}
	if err != nil {
		return "", err
	}
	return actionFor(old), nil
}

// hardlink links tmp in pfd to the regular file this archive wrote as the
// entry's link name, and keeps it only if it is still that file.
func (x *extractor) hardlink(pfd int, tmp string, h wire.ArchiveHeader) error {
	src, _, _ := wire.CleanArchiveName(h.Header.Linkname)
	id, ok := x.files[src]
	if !ok {
		return refuseEntry(wire.ReasonLinkOut, "hard link to %q, which this archive did not write", h.Header.Linkname)
	}
	sdir, sbase := path.Split(src)
	sfd := x.root
	if sdir = strings.TrimSuffix(sdir, "/"); sdir != "" {
		fd, err := x.openBeneath(sdir, false)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sfd = fd
	}
	if err := unix.Linkat(sfd, sbase, pfd, tmp, 0); err != nil {
		return refuseEntry(wire.ReasonLinkOut, "hard link to %q: %v", h.Header.Linkname, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, tmp, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Dev != id.dev || st.Ino != id.ino {
		_ = unix.Unlinkat(pfd, tmp, 0)
		return refuseEntry(wire.ReasonLinkOut, "hard link to %q: it is no longer the file this archive wrote", h.Header.Linkname)
	}
	return nil
}

// mknod makes a device or FIFO entry (allowed by the policy).
func (x *extractor) mknod(pfd int, base string, h wire.ArchiveHeader) (string, error) {
	kind := map[string]uint32{"char": unix.S_IFCHR, "block": unix.S_IFBLK, "fifo": unix.S_IFIFO}[h.Type]
	dev := unix.Mkdev(uint32(h.Header.Devmajor), uint32(h.Header.Devminor))
	err := unix.Mknodat(pfd, base, kind|0o600, int(dev))
	if errors.Is(err, unix.EEXIST) {
		return "", refuseEntry(wire.ReasonConflict, "%s exists already", h.Name)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", h.Name, err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("%s: %w", h.Name, err)
	}
	defer unix.Close(fd)
	if err := x.a.chmodFD(fd, uint32(h.Header.Mode&0o7777)); err != nil {
		return "", fmt.Errorf("%s: %w", h.Name, err)
	}
	_ = unix.UtimesNanoAt(pfd, base, timespecOf(h), unix.AT_SYMLINK_NOFOLLOW)
	return wire.ActionCreate, nil
}

// finishDirs gives the directories the extraction made their mtimes
// (writing into them changed them), deepest first.
func (x *extractor) finishDirs() {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		dir, base := path.Split(d.rel)
		pfd := x.root
		if dir = strings.TrimSuffix(dir, "/"); dir != "" {
			fd, err := x.openBeneath(dir, false)
			if err != nil {
				continue
			}
			pfd = fd
		}
		_ = unix.UtimesNanoAt(pfd, base, []unix.Timespec{d.ts, d.ts}, unix.AT_SYMLINK_NOFOLLOW)
		if pfd != x.root {
			unix.Close(pfd)
		}
	}
}
