//go:build linux

package agent

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// The command lines of the file, dir and archive commands (see
// cmd/vmgate-guest for the list).

// fileCommand runs `file read|write|stat|stage|unstage`.
func (a *Agent) fileCommand(ctx context.Context, args []string, d *dataIO) (any, error) {
	if len(args) == 0 {
		return nil, invalidf("usage: vmgate-guest file read|write|stat|stage|unstage --path P ...")
	}
	sub, rest := args[0], args[1:]
	fs := newFlags("file " + sub)
	switch sub {
	case "stat":
		path := fs.String("path", "", "absolute, clean path")
		follow := fs.Bool("follow-symlinks", false, "resolve symlinks and report the real path")
		forWrite := fs.Bool("write", false, "for a write: the last component is never followed and may be missing")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		return a.FileStat(ctx, *path, *follow, *forWrite)
	case "read":
		return a.fileReadCommand(ctx, fs, rest, d)
	case "write":
		return a.fileWriteCommand(ctx, fs, rest, d)
	case "stage":
		count := fs.Int("count", 0, "make this many staging files (the reply lists them)")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		if *count == 0 {
			return a.FileStage(ctx)
		}
		return a.FileStageN(ctx, *count)
	case "unstage":
		var paths listFlag
		fs.Var(&paths, "path", "a staging file to remove (repeatable)")
		if err := parseFlags(fs, rest); err != nil {
			return nil, err
		}
		n, err := a.FileUnstage(ctx, paths)
		return map[string]int{"removed": n}, err
	}
	return nil, invalidf("unknown file command %q", fmt.Sprint(sub))
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// fileReadCommand: with --offset, --length or --hash (or a data flag) a
// ranged read whose data is the command's output; otherwise the first
// --max-bytes of the file, base64 in the reply or, with --raw, after it.
func (a *Agent) fileReadCommand(ctx context.Context, fs *flag.FlagSet, rest []string, d *dataIO) (any, error) {
	path := fs.String("path", "", "absolute, clean path")
	maxBytes := fs.Int64("max-bytes", 1<<20, "read at most this many bytes from the start")
	raw := fs.Bool("raw", false, "the data after the reply's line, as it is, not base64 in it")
	var o ReadOptions
	fs.Int64Var(&o.Offset, "offset", 0, "where the range starts")
	fs.Int64Var(&o.Length, "length", wire.DefaultReadLength, "the most to read")
	fs.BoolVar(&o.Hash, "hash", false, "report the whole file's SHA-256, read in the same pass")
	if err := parseFlags(fs, rest); err != nil {
		return nil, err
	}
	ranged, legacy := d.mode != outDefault, *raw
	fs.Visit(func(f *flag.Flag) {
		ranged = ranged || f.Name == "offset" || f.Name == "length" || f.Name == "hash"
		legacy = legacy || f.Name == "max-bytes"
	})
	if !ranged {
		fr, err := a.FileRead(ctx, *path, *maxBytes)
		if err != nil || !*raw {
			fr.Bytes = 0
			return fr, err
		}
		d.mode = outInline
		_, err = d.writer("file read", *maxBytes).Write(fr.Data)
		fr.Data = nil
		return fr, err
	}
	if legacy {
		return nil, invalidf("file read: --max-bytes and --raw do not go with --offset, --length, --hash or --out")
	}
	if d.mode == outDefault {
		d.mode = outInline
	}
	if o.Length < 0 || o.Length > wire.MaxReadLength {
		return nil, invalidf("file read: --length %d: want 0..%d", o.Length, wire.MaxReadLength)
	}
	return a.FileReadRange(ctx, *path, o, d.writer("file read", o.Length))
}

// fileWriteCommand parses file write; the data is stdin, the --in pieces,
// or (older hosts) the staging file --from names.
func (a *Agent) fileWriteCommand(ctx context.Context, fs *flag.FlagSet, rest []string, d *dataIO) (any, error) {
	path := fs.String("path", "", "absolute, clean path")
	o := FileWriteOptions{Offset: -1}
	fs.Int64Var(&o.Mode, "mode", -1, "permission bits (decimal); -1 keeps an existing file's")
	createMode := fs.Uint("create-mode", 0o644, "permission bits of a new file without --mode (decimal)")
	fs.BoolVar(&o.SpecialBits, "special-bits", false, "allow setuid, setgid and sticky bits")
	fs.Int64Var(&o.Size, "size", -1, "the exact number of bytes of data")
	fs.Int64Var(&o.Offset, "offset", -1, "write into the existing file at this offset (no holes)")
	appendTo := fs.Bool("append", false, "append to the existing file")
	fs.StringVar(&o.ExpectSHA256, "expect-sha256", "", "refuse unless the file's SHA-256 is this")
	fs.BoolVar(&o.Hash, "hash", false, "report the file's SHA-256 after the write")
	from := fs.String("from", "", "a staging file of file stage to take the data from")
	if err := parseFlags(fs, rest); err != nil {
		return nil, err
	}
	if *createMode > 0o7777 || o.Size < 0 {
		return nil, invalidf("file write: --create-mode %d / --size %d out of range", *createMode, o.Size)
	}
	o.CreateMode = uint32(*createMode)
	switch {
	case *appendTo && o.Offset >= 0:
		return nil, invalidf("file write: --offset and --append do not go together")
	case *appendTo:
		o.Method = WriteAppend
	case o.Offset >= 0:
		o.Method = WriteAt
	}
	if o.ExpectSHA256 != "" {
		sum, err := wire.CheckSHA256(o.ExpectSHA256)
		if err != nil {
			return nil, invalidf("file write: --expect-sha256: %v", err)
		}
		o.ExpectSHA256 = sum
	}
	data := d.in
	if *from != "" {
		if d.staged() {
			return nil, invalidf("file write: --from does not go with --in")
		}
		f, err := a.openStaged("file write", *from, o.Size)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		data = &sizedReader{Reader: f, size: o.Size}
	}
	return a.FileWrite(ctx, *path, o, data)
}

// dirCommand runs `dir list`.
func (a *Agent) dirCommand(ctx context.Context, args []string) (any, error) {
	if len(args) == 0 || args[0] != "list" {
		return nil, invalidf("usage: vmgate-guest dir list --path P [--depth N] [--max-entries N]")
	}
	fs := newFlags("dir list")
	path := fs.String("path", "", "absolute, clean path of a directory")
	depth := fs.Int("depth", wire.DefaultDirDepth, "levels to list (1: the directory's own entries)")
	maxEntries := fs.Int("max-entries", wire.DefaultDirEntries, "the most entries to list")
	if err := parseFlags(fs, args[1:]); err != nil {
		return nil, err
	}
	return a.DirList(ctx, *path, *depth, *maxEntries)
}

// archiveCommand runs `archive read|write`.
func (a *Agent) archiveCommand(ctx context.Context, args []string, d *dataIO) (any, error) {
	if len(args) == 0 || args[0] != "read" && args[0] != "write" {
		return nil, invalidf("usage: vmgate-guest archive read|write --path DIR ...")
	}
	fs := newFlags("archive " + args[0])
	path := fs.String("path", "", "absolute, clean path of a directory")
	var lim wire.ArchiveLimits
	fs.Int64Var(&lim.MaxBytes, "max-bytes", wire.DefaultArchiveBytes, "the most content (regular files together)")
	fs.IntVar(&lim.MaxEntries, "max-entries", wire.DefaultArchiveEntries, "the most entries")
	if args[0] == "read" {
		gz := fs.Bool("gzip", false, "gzip the tar")
		if err := parseFlags(fs, args[1:]); err != nil {
			return nil, err
		}
		if err := lim.Validate(); err != nil { // 0 given is no default here
			return nil, invalidf("archive read: %v", err)
		}
		if d.mode == outDefault {
			d.mode = outInline
		}
		// The tar around the content: headers, padding, the end blocks.
		max := lim.MaxBytes + int64(lim.MaxEntries+2)*2048
		return a.ArchiveRead(ctx, *path, *gz, lim, d.writer("archive read", max))
	}
	var o ArchiveWriteOptions
	fs.BoolVar(&o.SpecialBits, "special-bits", false, "allow setuid, setgid and sticky bits")
	fs.BoolVar(&o.Devices, "devices", false, "allow devices and FIFOs")
	fs.BoolVar(&o.SymlinksOut, "symlinks-out", false, "allow symlinks whose target leaves the directory")
	fs.BoolVar(&o.AllOrNothing, "all-or-nothing", false, "write nothing when any entry is refused")
	fs.BoolVar(&o.DryRun, "dry-run", false, "plan only: say what each entry would do")
	fs.BoolVar(&o.Create, "create", false, "create the directory (its parent must exist)")
	skip := fs.String("skip", "", "entries the policy refused, by index: 1,4,7-9")
	if err := parseFlags(fs, args[1:]); err != nil {
		return nil, err
	}
	if err := lim.Validate(); err != nil {
		return nil, invalidf("archive write: %v", err)
	}
	var err error
	if o.Skip, err = parseIndexes(*skip); err != nil {
		return nil, invalidf("archive write: --skip: %v", err)
	}
	o.Limits = lim
	return a.ArchiveWrite(ctx, *path, o, a.archiveSource(d, lim))
}

// archiveSource reads the archive once per pass: the staged pieces again,
// stdin that is in memory already (the resident helper's, a whole
// message) again, or stdin kept in a spool (bounded: the compressed archive
// is at most as large as the tar its limits allow, with room for gzip's
// overhead).
func (a *Agent) archiveSource(d *dataIO, lim wire.ArchiveLimits) func() (io.Reader, error) {
	if d.staged() {
		return func() (io.Reader, error) { return d.reader(), nil }
	}
	max := 2*(lim.WithDefaults().MaxBytes+int64(lim.WithDefaults().MaxEntries+2)*2048) + 1<<20
	if in, ok := d.in.(*bytes.Reader); ok {
		if in.Size() > max {
			return func() (io.Reader, error) { return nil, archiveTooLarge(max) }
		}
		return func() (io.Reader, error) { return io.NewSectionReader(in, 0, in.Size()), nil }
	}
	var sp *spool
	return func() (io.Reader, error) {
		if sp != nil {
			return sp.reader(), nil
		}
		sp = &spool{a: a, op: "archive write"}
		n, err := io.Copy(sp, io.LimitReader(d.in, max+1))
		if err != nil {
			return nil, err
		}
		if n > max {
			return nil, archiveTooLarge(max)
		}
		return sp.reader(), nil
	}
}

func archiveTooLarge(max int64) error {
	return refused(wire.ReasonLimit, "archive write: refused: more than %d bytes of archive for its limits; nothing was written", max)
}

// parseIndexes reads "1,4,7-9" (at most wire.MaxArchiveEntries indexes).
func parseIndexes(s string) (map[int]bool, error) {
	out := map[int]bool{}
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b >= wire.MaxArchiveEntries || len(out)+b-a >= wire.MaxArchiveEntries {
			return nil, fmt.Errorf("%q: want indexes or ranges such as 1,4,7-9 below %d", part, wire.MaxArchiveEntries)
		}
		for i := a; i <= b; i++ {
			out[i] = true
		}
	}
	return out, nil
}
