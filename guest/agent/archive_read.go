//go:build linux

package agent

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Archive read: a tar (gzip optional) of the tree under a directory, in
// the walker's order (files_dir.go): directories, regular files and
// symlinks as symlinks (their target as data, never followed); devices,
// FIFOs and sockets are skipped and listed. Each regular file is opened
// O_PATH|O_NOFOLLOW under its directory's descriptor, checked to be the
// regular file that was listed, and reopened for reading through
// /proc/self/fd (so a device swapped in is never opened). Hard links are
// stored as separate files. Entries and content are capped: over a cap the
// command fails (a partial archive is not returned).

// archiveDepth bounds the directory levels archive read descends.
const archiveDepth = 256

// ArchiveRead writes a tar of the directory p to w (gzip'd when gz).
func (a *Agent) ArchiveRead(ctx context.Context, p string, gz bool, lim wire.ArchiveLimits, w io.Writer) (wire.ArchiveRead, error) {
	const op = "archive read"
	if err := checkFilePath(op, p); err != nil {
		return wire.ArchiveRead{}, err
	}
	lim = lim.WithDefaults()
	if err := lim.Validate(); err != nil {
		return wire.ArchiveRead{}, invalidf("%s: %v", op, err)
	}
	top, err := a.openDir(op, p)
	if err != nil {
		return wire.ArchiveRead{}, err
	}
	defer top.Close()
	out := w
	var zw *gzip.Writer
	if gz {
		zw, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
		out = zw
	}
	ar := &archiver{a: a, op: op, top: p, lim: lim, tw: tar.NewWriter(out), res: wire.ArchiveRead{Path: p, Gzip: gz}}
	wk := &walker{ctx: ctx, maxLevel: archiveDepth, maxNames: lim.MaxEntries, visit: ar.visit,
		fail: func(e *walkEntry, err error) error {
			ar.skip(wire.ArchiveSkip{Path: e.rel, Type: kindOf(&e.st), Reason: err.Error()})
			return nil
		},
		truncated: func(rel string) error {
			return ar.limit("a directory (%q) with more than %d names", rel, lim.MaxEntries)
		},
	}
	if err := wk.walk(top, "", 1); err != nil {
		var we *wire.Error
		if errors.As(err, &we) || ctx.Err() != nil {
			return wire.ArchiveRead{}, err
		}
		return wire.ArchiveRead{}, fileErr(op, p, err)
	}
	if err := ar.tw.Close(); err != nil {
		return wire.ArchiveRead{}, err
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return wire.ArchiveRead{}, err
		}
	}
	return ar.res, nil
}

// archiver writes the entries the walker visits.
type archiver struct {
	a   *Agent
	op  string
	top string
	lim wire.ArchiveLimits
	tw  *tar.Writer
	res wire.ArchiveRead
}

func (ar *archiver) limit(format string, args ...any) error {
	return refused(wire.ReasonLimit, "%s: refused: %s is over the archive's limits: %s (ask for a subdirectory or larger limits)", ar.op, ar.top, fmt.Sprintf(format, args...))
}

func (ar *archiver) visit(e *walkEntry) (bool, error) {
	kind := kindOf(&e.st)
	switch kind {
	case "dir", "symlink", "file":
	default:
		ar.skip(wire.ArchiveSkip{Path: e.rel, Type: kind, Reason: wire.ReasonSpecial})
		return false, nil
	}
	if ar.res.Entries == ar.lim.MaxEntries {
		return false, ar.limit("more than %d entries", ar.lim.MaxEntries)
	}
	hdr := &tar.Header{Name: e.rel, Mode: int64(e.st.Mode & 0o7777), Uid: int(e.st.Uid), Gid: int(e.st.Gid),
		ModTime: time.Unix(e.st.Mtim.Unix()).Truncate(time.Second)}
	switch kind {
	case "dir":
		hdr.Typeflag, hdr.Name = tar.TypeDir, e.rel+"/"
	case "symlink":
		target, err := readlinkat(int(e.dir.Fd()), e.name)
		if err != nil {
			ar.skip(wire.ArchiveSkip{Path: e.rel, Type: kind, Reason: err.Error()})
			return false, nil
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case "file":
		return false, ar.file(e, hdr)
	}
	ar.res.Entries++
	return kind == "dir", ar.tw.WriteHeader(hdr)
}

// file archives the regular file e, exactly the size it was listed with.
func (ar *archiver) file(e *walkEntry, hdr *tar.Header) error {
	f, st, err := ar.openListed(e)
	if err != nil {
		ar.skip(wire.ArchiveSkip{Path: e.rel, Type: "file", Reason: err.Error()})
		return nil
	}
	defer f.Close()
	if ar.res.Bytes+st.Size > ar.lim.MaxBytes {
		return ar.limit("%s takes the content past %d bytes", e.rel, ar.lim.MaxBytes)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	if err := ar.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(ar.tw, io.LimitReader(f, st.Size), make([]byte, readChunk))
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: %s: %w", ar.op, e.rel, err)
	}
	changed := n < st.Size
	if changed {
		// It shrank: pad to the size in the header.
		if _, err := io.CopyN(ar.tw, zeros{}, st.Size-n); err != nil {
			return err
		}
	} else if m, _ := f.Read(make([]byte, 1)); m > 0 {
		changed = true // it grew: cut at the size in the header
	}
	if changed {
		ar.res.Changed = append(ar.res.Changed, e.rel)
	}
	ar.res.Entries++
	ar.res.Bytes += st.Size
	return nil
}

// openListed opens the regular file e for reading: O_PATH without
// following, the same file the walker stat'ed, reopened through
// /proc/self/fd.
func (ar *archiver) openListed(e *walkEntry) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	pfd, err := unix.Openat(int(e.dir.Fd()), e.name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, st, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, st, err
	}
	if kindOf(&st) != "file" || st.Ino != e.st.Ino || st.Dev != e.st.Dev {
		return nil, st, errors.New("replaced while listed")
	}
	f, err := ar.a.reopen(ar.op, e.rel, pfd, unix.O_RDONLY)
	return f, st, err
}

// skip lists an entry left out (the first wire.MaxSkipped, then a count).
func (ar *archiver) skip(s wire.ArchiveSkip) {
	if len(ar.res.Skipped) == wire.MaxSkipped {
		ar.res.SkippedMore++
		return
	}
	ar.res.Skipped = append(ar.res.Skipped, s)
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
