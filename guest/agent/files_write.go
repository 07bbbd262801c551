//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Writes, by method:
//
//   - whole (the default): atomic (files_atomic.go). The data goes to a
//     temporary file in the same directory, which is synced, given the
//     final mode (exactly, no umask) and, replacing a file, the old file's
//     owner and group (and its mode unless one is given), then renamed
//     over the old file (or linked as a new one, which fails when the name
//     appeared meanwhile), and the directory is synced.
//   - at an offset, into an existing regular file: no holes (an offset past
//     the end is refused); the bytes outside the range never change.
//   - append, to an existing regular file, on an O_APPEND descriptor.
//
// For offset and append the data is whole in the guest (a staged input,
// or stdin read first) before the file is opened for writing, and the old
// bytes of the range (the old size, for append) are kept so that an error
// vmgate-guest sees puts them back. Every method opens the existing file
// once, by descriptor under the directory's no-follow descriptor, takes an
// flock on it (a second vmgate write of the same file waits), and with
// expect_sha256 hashes that descriptor before anything is written: a
// mismatch refuses with nothing changed. For a whole-file write the file
// replaced is the one hashed: just before the rename its size, mtime and
// ctime are compared again and its name must still lead to it. What stays
// open is a writer that takes no flock and changes the file between that
// comparison and the rename (microseconds), or within one tick of the
// kernel's coarse clock before it, unseen by mtime and ctime.

// WriteMethod says how file write puts the data in the file.
type WriteMethod int

// Write methods.
const (
	WriteWhole  WriteMethod = iota // replace the whole file, atomically
	WriteAt                        // write into an existing file at Offset
	WriteAppend                    // append to an existing file
)

// FileWriteOptions say how file write treats the file.
type FileWriteOptions struct {
	// Mode is the permission bits to set; -1 keeps an existing file's
	// mode and gives a new file CreateMode.
	Mode        int64
	CreateMode  uint32
	SpecialBits bool  // setuid, setgid and sticky allowed
	Size        int64 // the exact number of bytes on the data reader
	Method      WriteMethod
	Offset      int64 // WriteAt
	// ExpectSHA256 (lowercase hex), when set, is the SHA-256 the file must
	// have before the write.
	ExpectSHA256 string
	// Hash: report the file's SHA-256 after the write.
	Hash bool
}

// lockWait bounds the wait for another vmgate write of the same file.
const lockWait = 30 * time.Second

// FileWrite writes exactly o.Size bytes from data to the file p names, by
// o.Method (see above and files.go for what it refuses).
func (a *Agent) FileWrite(ctx context.Context, p string, o FileWriteOptions, data io.Reader) (wire.FileWritten, error) {
	const op = "file write"
	if err := checkWrite(op, p, o); err != nil {
		return wire.FileWritten{}, err
	}
	dfd, err := openNoFollow(op, filepath.Dir(p), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return wire.FileWritten{}, err
	}
	defer unix.Close(dfd)
	data = ctxReader{ctx, data}
	if o.Method == WriteWhole {
		return a.writeWhole(ctx, op, p, dfd, o, data)
	}
	return a.writeInPlace(ctx, op, p, dfd, o, data)
}

// checkWrite validates a write before any side effect.
func checkWrite(op, p string, o FileWriteOptions) error {
	if err := checkFilePath(op, p); err != nil {
		return err
	}
	if p == "/" {
		return refused(wire.ReasonNotRegular, "%s: refused: / is a directory", op)
	}
	if o.Mode < -1 || o.Mode > 0o7777 || o.CreateMode > 0o7777 {
		return invalidf("%s: mode %#o / create mode %#o: want 0..07777", op, o.Mode, o.CreateMode)
	}
	if o.Size < 0 {
		return invalidf("%s: --size %d is negative", op, o.Size)
	}
	if o.Method < WriteWhole || o.Method > WriteAppend || o.Method == WriteAt && o.Offset < 0 {
		return invalidf("%s: method %d / offset %d: want an offset of 0 or more", op, o.Method, o.Offset)
	}
	if o.ExpectSHA256 != "" {
		if _, err := wire.CheckSHA256(o.ExpectSHA256); err != nil {
			return invalidf("%s: --expect-sha256: %v", op, err)
		}
	}
	for _, m := range []int64{o.Mode, int64(o.CreateMode)} {
		if m > 0 && m&0o7000 != 0 && !o.SpecialBits {
			return refused(wire.ReasonSpecialBits, "%s: refused: mode %#o has setuid, setgid or sticky bits, which the policy does not allow (files.special_bits)", op, m)
		}
	}
	return nil
}

// existing is the file a write goes to, open, checked and locked.
type existing struct {
	f  *os.File
	st unix.Stat_t // when it was locked, before it was hashed
}

func (e *existing) close() {
	if e != nil {
		e.f.Close()
	}
}

// openExisting opens base in dfd, when it exists (nil, nil when it does
// not): a regular file with one link and, unless allowed, without setuid
// or setgid bits, reopened with flags, locked and, with o.ExpectSHA256,
// hashed on that descriptor.
func (a *Agent) openExisting(ctx context.Context, op, p string, dfd int, base string, flags int, o FileWriteOptions) (*existing, error) {
	pfd, err := unix.Openat(dfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fileErr(op, p, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, fileErr(op, p, err)
	}
	if err := writableFile(op, p, &st, o.SpecialBits); err != nil {
		return nil, err
	}
	f, err := a.reopen(op, p, pfd, flags)
	if err != nil {
		return nil, err
	}
	e := &existing{f: f}
	if err := lockFile(ctx, int(f.Fd())); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %s: waiting for another write of it: %w", op, p, err)
	}
	if err := unix.Fstat(int(f.Fd()), &e.st); err != nil {
		f.Close()
		return nil, fileErr(op, p, err)
	}
	if o.ExpectSHA256 == "" {
		return e, nil
	}
	sum, err := hashFile(ctx, f)
	if err != nil {
		f.Close()
		return nil, fileErr(op, p, err)
	}
	if sum != o.ExpectSHA256 {
		f.Close()
		return nil, refused(wire.ReasonChanged, "%s: refused: %s changed: its SHA-256 is %s, not the expected %s; nothing was written (read it again)", op, p, sum, o.ExpectSHA256)
	}
	return e, nil
}

// writableFile refuses what a write must not change: anything but a
// regular file, one with other hard links, setuid or setgid unless allowed.
func writableFile(op, p string, st *unix.Stat_t, special bool) error {
	if err := regularOnly(op, p, st); err != nil {
		return err
	}
	if st.Nlink > 1 {
		return refused(wire.ReasonHardlink, "%s: refused: %s has %d hard links, so writing it would change the file under its other names too", op, p, st.Nlink)
	}
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 && !special {
		return refused(wire.ReasonSpecialBits, "%s: refused: %s is setuid or setgid (mode %#o), and the policy does not allow writing such files (files.special_bits)", op, p, st.Mode&0o7777)
	}
	return nil
}

// lockFile takes an exclusive flock on fd, waiting (at most lockWait) while
// another holds it.
func lockFile(ctx context.Context, fd int) error {
	deadline := time.Now().Add(lockWait)
	wait := time.Millisecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still locked after %v", lockWait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// unchanged reports whether the file is as it was when locked and still
// has the name base in dfd.
func (e *existing) unchanged(dfd int, base string) bool {
	var now, named unix.Stat_t
	if unix.Fstat(int(e.f.Fd()), &now) != nil || unix.Fstatat(dfd, base, &named, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return false
	}
	return now.Size == e.st.Size && now.Mtim == e.st.Mtim && now.Ctim == e.st.Ctim &&
		named.Dev == e.st.Dev && named.Ino == e.st.Ino
}

// writeWhole replaces (or creates) the file atomically.
func (a *Agent) writeWhole(ctx context.Context, op, p string, dfd int, o FileWriteOptions, data io.Reader) (wire.FileWritten, error) {
	base := filepath.Base(p)
	a.cleanTemps(dfd)
	old, err := a.openExisting(ctx, op, p, dfd, base, unix.O_RDONLY, o)
	if err != nil {
		return wire.FileWritten{}, err
	}
	defer old.close()
	if old == nil && o.ExpectSHA256 != "" {
		return wire.FileWritten{}, notFoundf("%s: %s does not exist, so it cannot have the expected SHA-256 %s", op, p, o.ExpectSHA256)
	}
	tmp, err := a.newTemp(op, p, dfd)
	if err != nil {
		return wire.FileWritten{}, err
	}
	defer tmp.discard()
	var h hash.Hash
	if o.Hash {
		h = sha256.New()
	}
	n, err := copyExact(op, p, tmp.f, data, o.Size, h)
	if err != nil {
		return wire.FileWritten{}, err
	}
	if err := a.finishTemp(op, p, tmp, old, o); err != nil {
		return wire.FileWritten{}, err
	}
	if a.faults.rename != nil {
		if err := a.faults.rename(); err != nil {
			return wire.FileWritten{}, fileErr(op, p, err)
		}
	}
	if old != nil {
		if o.ExpectSHA256 != "" && !old.unchanged(dfd, base) {
			return wire.FileWritten{}, refused(wire.ReasonChanged, "%s: refused: %s changed while the new content was written; nothing was replaced (read it again)", op, p)
		}
		err = tmp.replace(base)
	} else if err = tmp.linkTo(base); errors.Is(err, unix.EEXIST) {
		return wire.FileWritten{}, &wire.Error{Code: wire.CodeExists, Message: fmt.Sprintf("%s: %s appeared while the new file was written; nothing was replaced (write again to replace it)", op, p)}
	}
	if err != nil {
		return wire.FileWritten{}, fileErr(op, p, err)
	}
	if err := a.syncDir(dfd); err != nil {
		return wire.FileWritten{}, fmt.Errorf("%s: %s is written and in place, but syncing its directory failed (a power cut could still lose the new name): %w", op, p, err)
	}
	return writtenOf(op, p, tmp.f, wire.FileWritten{Bytes: n, Created: old == nil, Atomic: true}, h)
}

// finishTemp gives the temporary file its owner and mode and syncs it.
func (a *Agent) finishTemp(op, p string, tmp *tempFile, old *existing, o FileWriteOptions) error {
	fd := int(tmp.f.Fd())
	mode := o.Mode
	if old != nil {
		// Owner first: a chown clears setuid and setgid bits.
		if err := unix.Fchown(fd, int(old.st.Uid), int(old.st.Gid)); err != nil {
			return fileErr(op, p, err)
		}
		if mode < 0 {
			mode = int64(old.st.Mode & 0o7777)
		}
	} else if mode < 0 {
		mode = int64(o.CreateMode)
	}
	// fchmod, not the open's mode: the umask must not change it.
	if err := unix.Fchmod(fd, uint32(mode)); err != nil {
		return fileErr(op, p, err)
	}
	if err := a.fsync("file", fd); err != nil {
		return fmt.Errorf("%s: %s: syncing the new content: %w (nothing was replaced)", op, p, err)
	}
	return nil
}

// syncDir syncs the directory dfd names (an O_PATH descriptor cannot be synced).
func (a *Agent) syncDir(dfd int) error {
	fd, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return a.fsync("dir", fd)
}

// writtenOf is the reply of a write of f (h, when set, hashed the data of a
// whole-file write; otherwise Hash reads the file back).
func writtenOf(op, p string, f *os.File, w wire.FileWritten, h hash.Hash) (wire.FileWritten, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return wire.FileWritten{}, fileErr(op, p, err)
	}
	w.FileInfo = infoOf(p, &st)
	if h != nil {
		w.SHA256 = hex.EncodeToString(h.Sum(nil))
	}
	return w, nil
}

// copyExact copies exactly size bytes from data to dst (and h), and
// refuses data that is shorter or longer.
func copyExact(op, p string, dst io.Writer, data io.Reader, size int64, h hash.Hash) (int64, error) {
	if h != nil {
		dst = io.MultiWriter(dst, h)
	}
	n, err := io.CopyBuffer(dst, io.LimitReader(data, size), make([]byte, readChunk))
	if err != nil {
		return n, fileErr(op, p, err)
	}
	if n != size {
		return n, invalidf("%s: got %d bytes of data; want %d (nothing was changed)", op, n, size)
	}
	if extra, _ := data.Read(make([]byte, 1)); extra > 0 {
		return n, invalidf("%s: more data than --size %d (nothing was changed)", op, size)
	}
	return n, nil
}

// ctxReader stops reading when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Size passes on the wrapped reader's exact length, when it has one.
func (c ctxReader) Size() int64 {
	if s, ok := c.r.(interface{ Size() int64 }); ok {
		return s.Size()
	}
	return -1
}

// writeInPlace writes into an existing file at an offset, or appends.
func (a *Agent) writeInPlace(ctx context.Context, op, p string, dfd int, o FileWriteOptions, data io.Reader) (wire.FileWritten, error) {
	src, err := a.wholeInput(op, p, data, o.Size)
	if err != nil {
		return wire.FileWritten{}, err
	}
	flags := unix.O_RDWR
	if o.Method == WriteAppend {
		flags |= unix.O_APPEND
	}
	t, err := a.openExisting(ctx, op, p, dfd, filepath.Base(p), flags, o)
	if err != nil {
		return wire.FileWritten{}, err
	}
	if t == nil {
		return wire.FileWritten{}, notFoundf("%s: %s does not exist: an offset or append write goes into an existing file (write it whole first)", op, p)
	}
	defer t.close()
	var at int64
	if o.Method == WriteAt {
		at, err = a.writeAt(ctx, op, p, t, o, src)
	} else {
		at, err = a.appendTo(op, p, t, o.Size, src)
	}
	if err != nil {
		return wire.FileWritten{}, err
	}
	if err := a.fsync("file", int(t.f.Fd())); err != nil {
		return wire.FileWritten{}, fmt.Errorf("%s: %s: written, but syncing it failed: %w", op, p, err)
	}
	w := wire.FileWritten{Bytes: o.Size, Offset: at}
	if o.Hash {
		if w.SHA256, err = hashFile(ctx, t.f); err != nil {
			return wire.FileWritten{}, fileErr(op, p, err)
		}
	}
	return writtenOf(op, p, t.f, w, nil)
}

// wholeInput is data as a reader of exactly size bytes that are all in the
// guest already: data itself when its length is known (staged pieces), or
// stdin read first (into memory up to spoolMem, beyond that into an
// unnamed file in the staging directory). Short or long data is refused
// before the file is touched.
func (a *Agent) wholeInput(op, p string, data io.Reader, size int64) (io.Reader, error) {
	if s, ok := data.(interface{ Size() int64 }); ok && s.Size() >= 0 {
		if s.Size() != size {
			return nil, invalidf("%s: got %d bytes of data; want %d (nothing was changed)", op, s.Size(), size)
		}
		return data, nil
	}
	sp := &spool{a: a, op: op}
	if _, err := copyExact(op, p, sp, data, size, nil); err != nil {
		return nil, err
	}
	return sp.reader(), nil
}

// spoolMem is the most a spool keeps in memory.
const spoolMem = 4 << 20

// spool holds data to read again: in memory up to spoolMem, beyond that
// in an unnamed file of the staging directory (gone when the process ends).
type spool struct {
	a   *Agent
	op  string
	buf bytes.Buffer
	f   *os.File
	n   int64
}

func (s *spool) Write(p []byte) (int, error) {
	if s.f == nil && s.buf.Len()+len(p) > spoolMem {
		if err := s.a.checkXferDir(s.op); err != nil {
			return 0, err
		}
		fd, err := unix.Open(s.a.xferDir(), unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return 0, fileErr(s.op, s.a.xferDir(), err)
		}
		s.f = os.NewFile(uintptr(fd), "spool")
		if _, err := s.f.Write(s.buf.Bytes()); err != nil {
			return 0, fileErr(s.op, s.a.xferDir(), err)
		}
		s.buf = bytes.Buffer{}
	}
	var n int
	var err error
	if s.f != nil {
		n, err = s.f.Write(p)
	} else {
		n, err = s.buf.Write(p)
	}
	s.n += int64(n)
	return n, err
}

// reader reads the spool from the start.
func (s *spool) reader() io.Reader {
	if s.f != nil {
		return io.NewSectionReader(s.f, 0, s.n)
	}
	return bytes.NewReader(s.buf.Bytes())
}

// writeAt writes src into t at o.Offset, keeping the old bytes of the
// range to put back on an error. It returns the offset.
func (a *Agent) writeAt(ctx context.Context, op, p string, t *existing, o FileWriteOptions, src io.Reader) (int64, error) {
	size := t.st.Size
	if o.Offset > size {
		return 0, invalidf("%s: offset %d is past the end of %s (%d bytes): vmgate writes no holes; write at %d at most, or append", op, o.Offset, p, size, size)
	}
	keep := min(o.Size, size-o.Offset)
	old := &spool{a: a, op: op}
	if _, err := io.Copy(old, io.NewSectionReader(t.f, o.Offset, keep)); err != nil {
		return 0, fileErr(op, p, err)
	}
	if _, err := io.CopyBuffer(&offsetWriter{f: t.f, off: o.Offset}, src, make([]byte, readChunk)); err != nil {
		// Put the old bytes back and the old size.
		_, rerr := io.Copy(&offsetWriter{f: t.f, off: o.Offset}, old.reader())
		if rerr == nil {
			rerr = t.f.Truncate(size)
		}
		if rerr != nil {
			return 0, fmt.Errorf("%s: %s: writing at %d failed (%w), and putting the old bytes back failed too: %v", op, p, o.Offset, err, rerr)
		}
		return 0, fmt.Errorf("%s: %s: writing at %d failed (the old bytes are back): %w", op, p, o.Offset, err)
	}
	return o.Offset, nil
}

type offsetWriter struct {
	f   *os.File
	off int64
}

func (w *offsetWriter) Write(p []byte) (int, error) {
	n, err := w.f.WriteAt(p, w.off)
	w.off += int64(n)
	return n, err
}

// appendTo appends size bytes of src to t (O_APPEND); on an error it cuts
// the file back to its old size unless another writer appended meanwhile.
// It returns the old size, where the data went.
func (a *Agent) appendTo(op, p string, t *existing, size int64, src io.Reader) (int64, error) {
	var now unix.Stat_t
	if err := unix.Fstat(int(t.f.Fd()), &now); err != nil {
		return 0, fileErr(op, p, err)
	}
	start := now.Size
	n, err := io.CopyBuffer(t.f, io.LimitReader(src, size), make([]byte, readChunk))
	if err == nil && n != size {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		var st unix.Stat_t
		if unix.Fstat(int(t.f.Fd()), &st) == nil && st.Size == start+n {
			if terr := t.f.Truncate(start); terr == nil {
				return 0, fmt.Errorf("%s: %s: appending failed (cut back to its old %d bytes): %w", op, p, start, err)
			}
		}
		return 0, fmt.Errorf("%s: %s: appending failed after %d bytes: %w", op, p, n, err)
	}
	return start, nil
}

// removeIfSame unlinks base from dfd when it is still the file f.
func removeIfSame(dfd int, base string, f *os.File) {
	var a, b unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil || unix.Fstatat(dfd, base, &b, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return
	}
	if a.Dev == b.Dev && a.Ino == b.Ino {
		_ = unix.Unlinkat(dfd, base, 0)
	}
}
