package guestctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Archives through vmgate-guest (guest/agent/archive_read.go and
// archive_write.go): a directory tree out as a tar, a tar into a
// directory, entry by entry under the rules of single files.
//
// Policy per entry: ArchiveList lists, on the host, the path every entry
// of an archive goes to, with the same reader and name rules the guest
// uses; the server asks its policy about each and passes the indexes it
// refused as ArchiveWriteOptions.Skip. The guest reports those entries as
// refused (wire.ReasonPolicy), with nothing written beneath them, and the
// archive moves into the guest once. DryRun asks the guest instead: what
// each entry would do against the target as it is, nothing written.

// ArchiveReadOptions say how ArchiveRead archives.
type ArchiveReadOptions struct {
	Gzip   bool
	Limits ArchiveLimits // zero values: the defaults
	// Progress, when set, is told the bytes moved as pieces move (Command.Progress).
	Progress func(done, total int64)
}

// ArchiveRead archives the directory p names (opened following no
// symlink): regular files, directories and symlinks as symlinks; devices,
// FIFOs and sockets skipped and listed. Over its limits it fails.
func (h *Helper) ArchiveRead(ctx context.Context, vm, p string, o ArchiveReadOptions) (ArchiveRead, []byte, error) {
	const op = "archive read"
	if err := CheckPath(op, p); err != nil {
		return ArchiveRead{}, nil, err
	}
	lim := o.Limits.WithDefaults()
	if err := lim.Validate(); err != nil {
		return ArchiveRead{}, nil, invalid(op, "%v", err)
	}
	args := []string{"archive", "read", "--path", p, "--max-bytes", strconv.FormatInt(lim.MaxBytes, 10), "--max-entries", strconv.Itoa(lim.MaxEntries)}
	if o.Gzip {
		args = append(args, "--gzip")
	}
	maxTar := lim.MaxBytes + int64(lim.MaxEntries+2)*2048
	var out ArchiveRead
	data, err := h.callData(ctx, vm, Command{Op: op, Args: args, Out: true, MaxOut: maxTar, MaxReply: 1 << 20, Timeout: archiveTimeout(lim.MaxBytes), Progress: o.Progress}, &out)
	if err != nil {
		return ArchiveRead{}, nil, err
	}
	return out, data, nil
}

// archiveTimeout bounds an archive command: fileTimeout and two minutes
// for the entries.
func archiveTimeout(n int64) time.Duration { return fileTimeout(n) + 2*time.Minute }

// ArchiveWriteOptions say what ArchiveWrite may write.
type ArchiveWriteOptions struct {
	Limits       ArchiveLimits // zero values: the defaults
	SpecialBits  bool          // setuid, setgid and sticky bits
	Devices      bool          // character and block devices, FIFOs
	SymlinksOut  bool          // symlinks whose target leaves the directory
	AllOrNothing bool          // one refused entry: write nothing (Aborted)
	DryRun       bool          // plan only
	Create       bool          // create the directory (its parent must exist)
	// Skip are the indexes of entries the policy refused (ArchiveList).
	Skip []int
	// Progress, when set, is told the bytes moved as pieces move (Command.Progress).
	Progress func(done, total int64)
}

// maxSkipArg bounds --skip's length (it travels in the command line).
const maxSkipArg = 64 << 10

// ArchiveWrite extracts the tar data (gzip'd or not) into the directory
// p names, entry by entry (see guest/agent/archive_write.go): a refused
// entry is reported in ArchiveWritten.Entries and the others are written;
// a malformed or over-limit archive writes nothing.
func (h *Helper) ArchiveWrite(ctx context.Context, vm, p string, data []byte, o ArchiveWriteOptions) (ArchiveWritten, error) {
	const op = "archive write"
	if err := CheckPath(op, p); err != nil {
		return ArchiveWritten{}, err
	}
	lim := o.Limits.WithDefaults()
	if err := lim.Validate(); err != nil {
		return ArchiveWritten{}, invalid(op, "%v", err)
	}
	args := []string{"archive", "write", "--path", p, "--max-bytes", strconv.FormatInt(lim.MaxBytes, 10), "--max-entries", strconv.Itoa(lim.MaxEntries)}
	for _, f := range []struct {
		on   bool
		flag string
	}{{o.SpecialBits, "--special-bits"}, {o.Devices, "--devices"}, {o.SymlinksOut, "--symlinks-out"},
		{o.AllOrNothing, "--all-or-nothing"}, {o.DryRun, "--dry-run"}, {o.Create, "--create"}} {
		if f.on {
			args = append(args, f.flag)
		}
	}
	if len(o.Skip) > 0 {
		skip, err := indexRanges(o.Skip, lim.MaxEntries)
		if err != nil {
			return ArchiveWritten{}, invalid(op, "skip: %v", err)
		}
		args = append(args, "--skip", skip)
	}
	var out ArchiveWritten
	_, err := h.callData(ctx, vm, Command{Op: op, Args: args, In: data, MaxReply: int64(lim.MaxEntries)*1024 + 1<<20, Timeout: archiveTimeout(int64(len(data))), Progress: o.Progress}, &out)
	return out, err
}

// indexRanges writes sorted indexes as "1,4,7-9".
func indexRanges(idx []int, maxEntries int) (string, error) {
	s := slices.Clone(idx)
	slices.Sort(s)
	s = slices.Compact(s)
	if s[0] < 0 || s[len(s)-1] >= maxEntries {
		return "", fmt.Errorf("index out of range 0..%d", maxEntries-1)
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	if b.Len() > maxSkipArg {
		return "", fmt.Errorf("%d refused entries do not fit the command line; refuse the archive whole (all-or-nothing) or split it", len(s))
	}
	return b.String(), nil
}

// ArchiveList lists the entries of the tar data (gzip'd or not) as an
// archive write into target would take them: index, name, the path each
// goes to (what the policy decides on; "" with Action "refused" for a name
// that leaves the target), type, size, mode and link. It reads the whole
// archive on the host, within lim, as the guest will.
func ArchiveList(data []byte, target string, lim ArchiveLimits) ([]ArchiveEntry, error) {
	const op = "archive write"
	if err := CheckPath(op, target); err != nil {
		return nil, err
	}
	lim = lim.WithDefaults()
	if err := lim.Validate(); err != nil {
		return nil, invalid(op, "%v", err)
	}
	entries, err := wire.ListArchive(bytes.NewReader(data), target, lim)
	if errors.Is(err, wire.ErrArchiveLimit) {
		return nil, &Error{Op: op, Code: wire.CodeRefused, Reason: wire.ReasonLimit, Message: err.Error()}
	}
	if err != nil {
		return nil, invalid(op, "%v", err)
	}
	return entries, nil
}

// IsLimit reports whether err is the guest's refusal of an archive over
// one of its limits, the one whose message says what.
func IsLimit(err error, what string) bool {
	var he *Error
	return errors.As(err, &he) && he.Code == wire.CodeRefused && he.Reason == wire.ReasonLimit && strings.Contains(he.Message, what)
}
