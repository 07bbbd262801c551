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
// following symlinks (see guest/agent/files.go). The data goes as the
// command's raw stdin (a write) or base64 in the JSON reply (a read); the
// guest streams it to and from the file in chunks.

// The file wire types.
type (
	FileInfo    = wire.FileInfo
	FileRead    = wire.FileRead
	FileWritten = wire.FileWritten
)

// WriteOptions say how FileWrite treats the file.
type WriteOptions struct {
	// Mode is the permission bits to set; nil keeps an existing file's mode
	// and gives a new file CreateMode.
	Mode        *uint32
	CreateMode  uint32
	SpecialBits bool // setuid, setgid and sticky allowed
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

// FileWrite creates or replaces the file p names with data, following no
// symlink: a new file gets o.Mode or o.CreateMode exactly.
func (h *Helper) FileWrite(ctx context.Context, vm, p string, data []byte, o WriteOptions) (FileWritten, error) {
	if err := CheckPath("file write", p); err != nil {
		return FileWritten{}, err
	}
	for _, m := range []*uint32{o.Mode, &o.CreateMode} {
		if m == nil {
			continue
		}
		if *m > 0o7777 {
			return FileWritten{}, invalid("file write", "mode %#o out of range 0..07777", *m)
		}
		if *m&0o7000 != 0 && !o.SpecialBits {
			return FileWritten{}, invalid("file write", "mode %#o has setuid, setgid or sticky bits", *m)
		}
	}
	args := []string{"file", "write", "--path", p, "--size", strconv.Itoa(len(data)), "--create-mode", strconv.FormatUint(uint64(o.CreateMode), 10)}
	if o.Mode != nil {
		args = append(args, "--mode", strconv.FormatUint(uint64(*o.Mode), 10))
	}
	if o.SpecialBits {
		args = append(args, "--special-bits")
	}
	if len(data) > StdinMax {
		return h.fileWriteStaged(ctx, vm, args, data)
	}
	var out FileWritten
	err := h.call(ctx, vm, "file write", args, data, fileTimeout(int64(len(data))), 1<<16, &out)
	return out, err
}

// StdinMax is the most data FileWrite sends as the command's stdin; more
// goes through the driver's file channel into a staging file of the
// helper's (Proxmox relays at most 64 KiB of stdin, and the file channel
// moves large data in chunks).
const StdinMax = 48 << 10

// fileWriteStaged writes data to a staging file vmgate-guest made (its
// own private directory, not the agent's path), then has it copied to the
// destination with every check of a write.
func (h *Helper) fileWriteStaged(ctx context.Context, vm string, args []string, data []byte) (FileWritten, error) {
	var st FileInfo
	if err := h.call(ctx, vm, "file stage", []string{"file", "stage"}, nil, 0, 1<<16, &st); err != nil {
		return FileWritten{}, err
	}
	if !stagePath.MatchString(st.Path) {
		return FileWritten{}, &ReplyError{Op: "file stage", Cause: fmt.Errorf("staging path %q is not one of vmgate-guest's", st.Path)}
	}
	if err := h.d.FileWrite(ctx, vm, st.Path, data, 0o600); err != nil {
		_ = h.mustRun(context.WithoutCancel(ctx), vm, "file stage", []string{"rm", "-f", st.Path})
		return FileWritten{}, fmt.Errorf("helper: file write: staging %d bytes: %w", len(data), err)
	}
	var out FileWritten
	err := h.call(ctx, vm, "file write", append(args, "--from", st.Path), nil, fileTimeout(int64(len(data))), 1<<16, &out)
	return out, err
}

// stagePath is what file stage answers: <root>/xfer/x-<32 hex digits>.
var stagePath = regexp.MustCompile(`^/[^\x00]*/xfer/x-[0-9a-f]{32}$`)
