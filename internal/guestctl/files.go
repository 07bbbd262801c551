package guestctl

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Files through vmgate-guest: the path is resolved in the guest without
// following symlinks (see guest/agent/files.go). Small data goes as the
// command's stdin (a write) or after its JSON reply (a read); larger data
// through staging files and the driver's file channel (transport.go).
//
// What a write guarantees, by method (guest/agent/files_write.go):
//   - whole (the default): atomic. Readers see the old file or the new one;
//     a write that fails (an error, the plugin or vmgate-guest killed, the
//     guest agent stopped) leaves the old file as it was and no temporary
//     file; when FileWrite returns, the new file and its name are synced.
//   - at an offset (WriteOptions.Offset): into an existing regular file,
//     no holes; bytes outside the range never change; the data is whole in
//     the guest before the file is opened, and an error vmgate-guest sees
//     puts the old bytes back; a kill mid-write can leave the range mixed.
//   - append: the file's bytes never change; an error cuts it back to its
//     old size; a kill mid-write can leave part of the data appended.
// ExpectSHA256 refuses, changing nothing, when the file's hash differs;
// the check and the write use one descriptor (for a whole-file write, the
// file being replaced, compared again just before the rename).

// The file wire types.
type (
	FileInfo       = wire.FileInfo
	FileRead       = wire.FileRead
	FileWritten    = wire.FileWritten
	DirList        = wire.DirList
	DirEntry       = wire.DirEntry
	ArchiveLimits  = wire.ArchiveLimits
	ArchiveEntry   = wire.ArchiveEntry
	ArchiveRead    = wire.ArchiveRead
	ArchiveWritten = wire.ArchiveWritten
)

// WriteOptions say how FileWrite treats the file.
type WriteOptions struct {
	// Mode is the permission bits to set; nil keeps an existing file's mode
	// and gives a new file CreateMode.
	Mode        *uint32
	CreateMode  uint32
	SpecialBits bool // setuid, setgid and sticky allowed
	// Offset, when set, writes into the existing file at this offset (at
	// most its size: no holes) instead of replacing it.
	Offset *int64
	// Append appends to the existing file.
	Append bool
	// ExpectSHA256, when set (64 hex digits), refuses the write unless the
	// file's SHA-256 is this.
	ExpectSHA256 string
	// Hash: FileWritten.SHA256 is the file's hash after the write.
	Hash bool
	// Progress, when set, is told the bytes moved as pieces move (Command.Progress).
	Progress func(done, total int64)
}

// fileTimeout bounds a file command: a minute plus one per 4 MiB.
func fileTimeout(n int64) time.Duration { return CommandTimeout + time.Duration(n>>22)*time.Second }

// CheckPath refuses what is not an absolute, clean path without NUL.
func CheckPath(op, p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return invalid(op, "%q is not absolute", p)
	case strings.IndexByte(p, 0) >= 0:
		return invalid(op, "contains a NUL byte")
	case len(p) > 4096:
		return invalid(op, "is %d bytes; the limit is 4096", len(p))
	case path.Clean(p) != p:
		return invalid(op, "%q is not clean (want %q): no \".\", \"..\", \"//\" or trailing \"/\"", p, path.Clean(p))
	}
	return nil
}

// FileStat reports the file p names in vm. With follow the guest resolves
// symlinks and Path is the real path; forWrite never follows the last
// component and reports a missing file as Exists false.
func (h *Helper) FileStat(ctx context.Context, vm, p string, follow, forWrite bool) (FileInfo, error) {
	if err := CheckPath("file stat", p); err != nil {
		return FileInfo{}, err
	}
	args := []string{"file", "stat", "--path", p}
	if follow {
		args = append(args, "--follow-symlinks")
	}
	if forWrite {
		args = append(args, "--write")
	}
	var out FileInfo
	err := h.call(ctx, vm, "file stat", args, nil, 0, 1<<16, &out)
	return out, err
}

// FileRead reads at most maxBytes of the regular file p names, following
// no symlink.
func (h *Helper) FileRead(ctx context.Context, vm, p string, maxBytes int64) (FileRead, error) {
	if err := CheckPath("file read", p); err != nil {
		return FileRead{}, err
	}
	if maxBytes < 1 || maxBytes > wire.MaxFileReadBytes {
		return FileRead{}, invalid("file read", "max_bytes %d out of range 1..%d", maxBytes, wire.MaxFileReadBytes)
	}
	args := []string{"file", "read", "--path", p, "--max-bytes", strconv.FormatInt(maxBytes, 10), "--raw"}
	res, err := h.run(ctx, vm, "file read", args, nil, fileTimeout(maxBytes), maxBytes+1<<20)
	if err != nil {
		return FileRead{}, err
	}
	// The reply's line, then (on success) exactly Bytes bytes of data.
	line, data, _ := bytes.Cut(res.Stdout, []byte("\n"))
	var out FileRead
	if err := decodeReply("file read", res, line, &out); err != nil {
		return FileRead{}, err
	}
	if int64(len(data)) != out.Bytes || out.Bytes > maxBytes || len(out.Data) != 0 {
		return FileRead{}, &ReplyError{Op: "file read", ExitCode: res.ExitCode, Stdout: line, Stderr: res.Stderr,
			Cause: fmt.Errorf("%d bytes of data after the reply, which says %d (at most %d asked)", len(data), out.Bytes, maxBytes)}
	}
	out.Data, out.Bytes = data, 0
	return out, nil
}

// FileWrite writes data to the file p names, following no symlink: by
// default it creates or replaces the whole file atomically (a new file
// gets o.Mode or o.CreateMode exactly; a replaced one keeps its owner and,
// without o.Mode, its mode); with o.Offset or o.Append it writes into the
// existing file. Data of any size moves in pieces (transport.go).
func (h *Helper) FileWrite(ctx context.Context, vm, p string, data []byte, o WriteOptions) (FileWritten, error) {
	args, err := writeArgs(p, len(data), o)
	if err != nil {
		return FileWritten{}, err
	}
	var out FileWritten
	_, err = h.callData(ctx, vm, Command{Op: "file write", Args: args, In: data, MaxReply: 1 << 16, Timeout: fileTimeout(int64(len(data))), Progress: o.Progress}, &out)
	return out, err
}

// writeArgs checks a write's arguments and builds its command line.
func writeArgs(p string, size int, o WriteOptions) ([]string, error) {
	const op = "file write"
	if err := CheckPath(op, p); err != nil {
		return nil, err
	}
	for _, m := range []*uint32{o.Mode, &o.CreateMode} {
		if m == nil {
			continue
		}
		if *m > 0o7777 {
			return nil, invalid(op, "mode %#o out of range 0..07777", *m)
		}
		if *m&0o7000 != 0 && !o.SpecialBits {
			return nil, invalid(op, "mode %#o has setuid, setgid or sticky bits", *m)
		}
	}
	args := []string{"file", "write", "--path", p, "--size", strconv.Itoa(size), "--create-mode", strconv.FormatUint(uint64(o.CreateMode), 10)}
	if o.Mode != nil {
		args = append(args, "--mode", strconv.FormatUint(uint64(*o.Mode), 10))
	}
	if o.SpecialBits {
		args = append(args, "--special-bits")
	}
	switch {
	case o.Offset != nil && o.Append:
		return nil, invalid(op, "offset and append do not go together")
	case o.Offset != nil && *o.Offset < 0:
		return nil, invalid(op, "offset %d is negative", *o.Offset)
	case o.Offset != nil:
		args = append(args, "--offset", strconv.FormatInt(*o.Offset, 10))
	case o.Append:
		args = append(args, "--append")
	}
	if o.ExpectSHA256 != "" {
		sum, err := wire.CheckSHA256(o.ExpectSHA256)
		if err != nil {
			return nil, invalid(op, "expect_sha256: %v", err)
		}
		args = append(args, "--expect-sha256", sum)
	}
	if o.Hash {
		args = append(args, "--hash")
	}
	return args, nil
}

// ReadOptions say what FileReadRange reads.
type ReadOptions struct {
	Offset int64
	// Length is the most to read: 0..wire.MaxReadLength (the caller passes
	// its policy's cap; wire.DefaultReadLength is the usual one). 0 with
	// Hash reads only the hash.
	Length int64
	// Hash: FileRead.SHA256 is the whole file's hash, read in the same
	// pass as the range.
	Hash bool
	// Progress, when set, is told the bytes moved as pieces move (Command.Progress).
	Progress func(done, total int64)
}

// FileReadRange reads [o.Offset, o.Offset+o.Length) of the regular file p
// names, following no symlink; FileRead says the file's size, where the
// range starts, whether it reached the end (EOF) and, with o.Hash, the
// whole file's SHA-256. An offset at or past the end reads nothing, EOF.
func (h *Helper) FileReadRange(ctx context.Context, vm, p string, o ReadOptions) (FileRead, error) {
	const op = "file read"
	if err := CheckPath(op, p); err != nil {
		return FileRead{}, err
	}
	if o.Offset < 0 || o.Length < 0 || o.Length > wire.MaxReadLength {
		return FileRead{}, invalid(op, "offset %d / length %d: want an offset of 0 or more and a length of 0..%d", o.Offset, o.Length, wire.MaxReadLength)
	}
	args := []string{"file", "read", "--path", p, "--offset", strconv.FormatInt(o.Offset, 10), "--length", strconv.FormatInt(o.Length, 10)}
	if o.Hash {
		args = append(args, "--hash")
	}
	var out FileRead
	data, err := h.callData(ctx, vm, Command{Op: op, Args: args, Out: true, MaxOut: o.Length, MaxReply: 1 << 16, Timeout: fileTimeout(o.Length), Progress: o.Progress}, &out)
	if err != nil {
		return FileRead{}, err
	}
	if int64(len(data)) != out.Bytes || len(out.Data) != 0 {
		return FileRead{}, &ReplyError{Op: op, Cause: fmt.Errorf("%d bytes of data; the reply says %d", len(data), out.Bytes)}
	}
	out.Data = data
	return out, nil
}

// DirOptions bound a listing; zero values are the defaults.
type DirOptions struct {
	Depth      int // levels (1: the directory's own entries); wire.DefaultDirDepth
	MaxEntries int // wire.DefaultDirEntries; at most wire.MaxDirEntries
}

// DirList lists the directory p names (opened following no symlink) down
// to o.Depth levels, at most o.MaxEntries entries, siblings sorted by
// name, symlinks with their targets as data, never followed.
func (h *Helper) DirList(ctx context.Context, vm, p string, o DirOptions) (DirList, error) {
	const op = "dir list"
	if err := CheckPath(op, p); err != nil {
		return DirList{}, err
	}
	if o.Depth == 0 {
		o.Depth = wire.DefaultDirDepth
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = wire.DefaultDirEntries
	}
	if o.Depth < 1 || o.Depth > wire.MaxDirDepth || o.MaxEntries < 1 || o.MaxEntries > wire.MaxDirEntries {
		return DirList{}, invalid(op, "depth %d / max_entries %d: want 1..%d and 1..%d", o.Depth, o.MaxEntries, wire.MaxDirDepth, wire.MaxDirEntries)
	}
	args := []string{"dir", "list", "--path", p, "--depth", strconv.Itoa(o.Depth), "--max-entries", strconv.Itoa(o.MaxEntries)}
	var out DirList
	_, err := h.callData(ctx, vm, Command{Op: op, Args: args, MaxReply: int64(o.MaxEntries)*512 + 1<<16, Timeout: CommandTimeout}, &out)
	return out, err
}

// StdinMax is the most data a command takes as its stdin; more goes
// through the driver's file channel into staging files of the helper's
// (Proxmox relays at most 64 KiB of stdin, and the file channel moves large
// data in chunks).
const StdinMax = 48 << 10

// stagePath is what file stage answers: <root>/xfer/x-<32 hex digits>.
var stagePath = regexp.MustCompile(`^/[^\x00]*/xfer/x-[0-9a-f]{32}$`)
