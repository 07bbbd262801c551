//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// FileWrite creates or replaces the file p names with exactly o.Size bytes
// from data (see files.go for what it refuses). A new file that cannot be
// written whole is removed again.
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
	base := filepath.Base(p)
	f, created, err := a.openForWrite(op, p, dfd, base, o)
	if err != nil {
		return wire.FileWritten{}, err
	}
	defer f.Close()
	res, err := fillFile(op, p, f, created, o, data)
	if err != nil && created {
		removeIfSame(dfd, base, f)
	}
	return res, err
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
	for _, m := range []int64{o.Mode, int64(o.CreateMode)} {
		if m > 0 && m&0o7000 != 0 && !o.SpecialBits {
			return refused(wire.ReasonSpecialBits, "%s: refused: mode %#o has setuid, setgid or sticky bits, which the policy does not allow (files.special_bits)", op, m)
		}
	}
	return nil
}

// openForWrite creates base in dfd exclusively, or opens the existing
// regular file there after its checks, truncated.
func (a *Agent) openForWrite(op, p string, dfd int, base string, o FileWriteOptions) (f *os.File, created bool, err error) {
	fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), p), true, nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return nil, false, fileErr(op, p, err)
	}
	pfd, err := unix.Openat(dfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fileErr(op, p, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, false, fileErr(op, p, err)
	}
	if err := regularOnly(op, p, &st); err != nil {
		return nil, false, err
	}
	if st.Nlink > 1 {
		return nil, false, refused(wire.ReasonHardlink, "%s: refused: %s has %d hard links, so writing it would change the file under its other names too", op, p, st.Nlink)
	}
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 && !o.SpecialBits {
		return nil, false, refused(wire.ReasonSpecialBits, "%s: refused: %s is setuid or setgid (mode %#o), and the policy does not allow writing such files (files.special_bits)", op, p, st.Mode&0o7777)
	}
	f, err = a.reopen(op, p, pfd, unix.O_WRONLY)
	if err != nil {
		return nil, false, err
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, false, fileErr(op, p, err)
	}
	return f, false, nil
}

// fillFile copies exactly o.Size bytes into f and sets the mode.
func fillFile(op, p string, f *os.File, created bool, o FileWriteOptions, data io.Reader) (wire.FileWritten, error) {
	n, err := io.CopyBuffer(f, io.LimitReader(data, o.Size), make([]byte, 256<<10))
	if err != nil {
		return wire.FileWritten{}, fileErr(op, p, err)
	}
	if n != o.Size {
		return wire.FileWritten{}, invalidf("%s: got %d bytes of data; want %d (nothing kept of a new file)", op, n, o.Size)
	}
	if extra, _ := data.Read(make([]byte, 1)); extra > 0 {
		return wire.FileWritten{}, invalidf("%s: more data than --size %d", op, o.Size)
	}
	mode := o.Mode
	if mode < 0 && created {
		mode = int64(o.CreateMode)
	}
	if mode >= 0 {
		// fchmod, not the open's mode: the umask must not change it.
		if err := unix.Fchmod(int(f.Fd()), uint32(mode)); err != nil {
			return wire.FileWritten{}, fileErr(op, p, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return wire.FileWritten{}, fileErr(op, p, err)
	}
	return wire.FileWritten{FileInfo: infoOf(p, &st), Bytes: n, Created: created}, nil
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

// fileCommand runs `file read|write|stat`.
func (a *Agent) fileCommand(ctx context.Context, args []string, stdin io.Reader) (any, error) {
	if len(args) == 0 {
		return nil, invalidf("usage: vmgate-guest file read|write|stat --path P ...")
	}
	sub, rest := args[0], args[1:]
	fs := newFlags("file " + sub)
	path := fs.String("path", "", "absolute, clean path")
	switch sub {
	case "stat":
		follow := fs.Bool("follow-symlinks", false, "resolve symlinks and report the real path")
		forWrite := fs.Bool("write", false, "for a write: the last component is never followed and may be missing")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return a.FileStat(ctx, *path, *follow, *forWrite)
	case "read":
		maxBytes := fs.Int64("max-bytes", 1<<20, "read at most this many bytes")
		raw := fs.Bool("raw", false, "the data after the reply's line, as it is, not base64 in it")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		fr, err := a.FileRead(ctx, *path, *maxBytes)
		if err != nil || !*raw {
			return fr, err
		}
		data := fr.Data
		fr.Data = nil
		return rawData{reply: wire.FileRead{FileInfo: fr.FileInfo, Truncated: fr.Truncated, Bytes: int64(len(data))}, data: data}, nil
	case "write":
		var o FileWriteOptions
		fs.Int64Var(&o.Mode, "mode", -1, "permission bits (decimal); -1 keeps an existing file's")
		createMode := fs.Uint("create-mode", 0o644, "permission bits of a new file without --mode (decimal)")
		fs.BoolVar(&o.SpecialBits, "special-bits", false, "allow setuid, setgid and sticky bits")
		fs.Int64Var(&o.Size, "size", -1, "the exact number of bytes on stdin")
		from := fs.String("from", "", "a staging file of file stage to take the data from, instead of stdin")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		if *createMode > 0o7777 || o.Size < 0 {
			return nil, invalidf("file write: --create-mode %d / --size %d out of range", *createMode, o.Size)
		}
		o.CreateMode = uint32(*createMode)
		if *from != "" {
			f, err := a.openStaged("file write", *from, o.Size)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			stdin = f
		}
		return a.FileWrite(ctx, *path, o, stdin)
	case "stage":
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return a.FileStage(ctx)
	}
	return nil, invalidf("unknown file command %q", fmt.Sprint(sub))
}
