//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Archive write: a tar (gzip'd or not, found by its magic bytes) extracted
// into a target directory under the rules of single files, entry by entry.
//
// It reads the archive twice. The first pass (plan) writes nothing: it
// checks the limits (entries, content, and a decompressed stream that may
// not outgrow them: a gzip bomb stops there), every name (absolute, "..",
// NUL: refused), every type (devices and FIFOs only with leave; sockets and
// unknown types never), modes (setuid, setgid, sticky only with leave),
// symlinks (one whose target leaves the target directory only with leave),
// hard links (only to a regular file this same archive writes earlier),
// the entries the host's policy refused (--skip), and what the target
// already holds (a symlink in the way, a directory where a file goes, a
// file with other hard links or setuid bits). A malformed or over-limit
// archive writes nothing; with --all-or-nothing neither does one refused
// entry; --dry-run stops after the plan and returns it.
//
// The second pass writes the entries the plan allowed, each beneath the
// target's descriptor: its parent directory is opened with openat2
// (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) or, where that fails, by a walk of
// O_NOFOLLOW opens that creates missing directories (0755) on the way; the
// entry itself is made with *at calls on that descriptor that follow
// nothing. A regular file is written like a whole-file write (an unnamed
// or .vmgate-tmp- temporary file, its mode, its mtime, then a link or a
// rename into place: never half written under its name; a file it
// replaces keeps its owner), in batches (flush in archive_apply.go): up to
// batchFiles files are written, their filesystem is synced once, and only
// then do they get their names, in the archive's order; so no file has its
// name before its data is on disk, at one sync per batch rather than one
// fsync per file. A symlink or a hard link waits for the files before it
// to be in place; it is made under a temporary name and renamed into
// place, a hard link kept only if it is the file this archive wrote. The
// checks run again at write time: what changed meanwhile refuses that
// entry. An I/O error (disk full) stops the extraction with the entries
// already in place kept, every file of them complete, and the batch's
// files not yet named removed. The filesystem is synced once more at the
// end (the names, the directories' times). New entries belong to root;
// tar owners are not applied.

// ArchiveWriteOptions say what archive write may write.
type ArchiveWriteOptions struct {
	Limits       wire.ArchiveLimits
	SpecialBits  bool // setuid, setgid and sticky bits
	Devices      bool // character and block devices, FIFOs
	SymlinksOut  bool // symlinks whose target leaves the target directory
	AllOrNothing bool // one refused entry: write nothing
	DryRun       bool // plan only
	Create       bool // create the target directory (its parent must exist)
	// Skip holds the indexes of entries the host's policy refused.
	Skip map[int]bool
}

// ArchiveWrite extracts the archive src returns (once per pass) into the
// directory target.
func (a *Agent) ArchiveWrite(ctx context.Context, target string, o ArchiveWriteOptions, src func() (io.Reader, error)) (wire.ArchiveWritten, error) {
	const op = "archive write"
	if err := checkFilePath(op, target); err != nil {
		return wire.ArchiveWritten{}, err
	}
	o.Limits = o.Limits.WithDefaults()
	if err := o.Limits.Validate(); err != nil {
		return wire.ArchiveWritten{}, invalidf("%s: %v", op, err)
	}
	root, err := openNoFollow(op, target, unix.O_PATH|unix.O_DIRECTORY, 0)
	var we *wire.Error
	if errors.As(err, &we) && we.Code == wire.CodeNotFound && o.Create {
		root, err = -1, nil // planned against an empty target; made before the writes
	}
	if err != nil {
		return wire.ArchiveWritten{}, err
	}
	x := &extractor{a: a, ctx: ctx, op: op, target: target, o: o, root: root, dirFDs: map[string]dirFD{},
		planned: map[string]string{}, files: map[string]fileID{}, refusedNames: map[string]bool{}, linkSources: map[string]bool{}}
	defer x.close()
	r, err := src()
	if err != nil {
		return wire.ArchiveWritten{}, err
	}
	if _, err := wire.ScanArchive(r, o.Limits, x.plan); err != nil {
		return wire.ArchiveWritten{}, archiveErr(op, target, err)
	}
	res := x.result()
	if o.DryRun || o.AllOrNothing && res.Refused > 0 {
		res.DryRun, res.Aborted = o.DryRun, !o.DryRun
		return res, nil
	}
	if x.root < 0 {
		if x.root, err = a.makeTarget(op, target); err != nil {
			return wire.ArchiveWritten{}, err
		}
	}
	if r, err = src(); err != nil {
		return wire.ArchiveWritten{}, err
	}
	if err := x.write(r); err != nil {
		return wire.ArchiveWritten{}, fmt.Errorf("%s: %s: stopped after writing %d entries (each complete; nothing half written, no temporary file left): %w", op, target, x.written, err)
	}
	if err := x.syncAll(); err != nil {
		return wire.ArchiveWritten{}, fmt.Errorf("%s: %s: written, but syncing the filesystem failed: %w", op, target, err)
	}
	return x.result(), nil
}

// write is the second pass: every entry the plan allowed, the last batch
// of files put in place, the directories' times.
func (x *extractor) write(r io.Reader) error {
	var st unix.Stat_t
	if err := unix.Fstat(x.root, &st); err != nil {
		return err
	}
	x.rootDev, x.applied = st.Dev, true
	if _, err := wire.ScanArchive(r, x.o.Limits, x.apply); err != nil {
		return err
	}
	if err := x.flush(); err != nil {
		return err
	}
	x.finishDirs()
	return nil
}

// syncAll syncs the target's filesystem and those of the directories
// still open, once each.
func (x *extractor) syncAll() error {
	devs := map[uint64]bool{x.rootDev: true}
	if err := x.a.syncFS(x.root); err != nil {
		return err
	}
	for _, d := range x.dirFDs {
		if !devs[d.dev] {
			devs[d.dev] = true
			if err := x.a.syncFS(d.fd); err != nil {
				return err
			}
		}
	}
	return nil
}

// syncFS syncs the filesystem holding the directory dfd (an O_PATH
// descriptor, which syncfs refuses, so through a reopen of ".").
func (a *Agent) syncFS(dfd int) error {
	if a.faults.fsync != nil {
		if err := a.faults.fsync("fs"); err != nil {
			return err
		}
	}
	fd, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// archiveErr words a limit or format error of the plan.
func archiveErr(op, target string, err error) error {
	switch {
	case errors.Is(err, wire.ErrArchiveLimit):
		return refused(wire.ReasonLimit, "%s: refused: %v; nothing was written to %s", op, err, target)
	case errors.Is(err, wire.ErrArchiveFormat):
		return invalidf("%s: %v; nothing was written to %s", op, err, target)
	}
	return err
}

// makeTarget creates the directory target (mode 0755) in its existing
// parent and opens it.
func (a *Agent) makeTarget(op, target string) (int, error) {
	pfd, err := openNoFollow(op, filepath.Dir(target), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	base := filepath.Base(target)
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fileErr(op, target, err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fileErr(op, target, err)
	}
	if err := a.chmodFD(fd, 0o755); err != nil {
		unix.Close(fd)
		return -1, fileErr(op, target, err)
	}
	return fd, nil
}

// chmodFD sets the mode of what the O_PATH descriptor fd names, through
// /proc/self/fd (fchmod refuses O_PATH descriptors; the magic link leads to
// the file itself, not through any name).
func (a *Agent) chmodFD(fd int, mode uint32) error {
	return unix.Fchmodat(unix.AT_FDCWD, filepath.Join(a.cfg.ProcDir, "self/fd", fmt.Sprint(fd)), mode, 0)
}

type fileID struct{ dev, ino uint64 }

// dirTime is a directory the extraction made and the mtime it gets last.
type dirTime struct {
	rel string
	ts  unix.Timespec
}

// extractor is one archive write.
type extractor struct {
	a       *Agent
	ctx     context.Context
	op      string
	target  string
	o       ArchiveWriteOptions
	root    int // -1 while the target is still to be made
	rootDev uint64
	entries []wire.ArchiveEntry
	planned map[string]string // name -> kind the archive puts there (plan)
	// linkSources are the names hard links of this archive point to (plan).
	linkSources map[string]bool
	files       map[string]fileID // hard link sources written
	dirs        []dirTime
	bytes       int64
	written     int              // entries made so far (second pass)
	dirFDs      map[string]dirFD // parent directories open (parent)
	// pending are the files written and waiting for their batch's sync
	// (flush), pendingBytes their data.
	pending      []pendingFile
	pendingBytes int64
	probeErr     *entryRefusal // why probe refused
	// refusedNames are the names of refused entries: nothing is written
	// beneath them.
	refusedNames map[string]bool
	applied      bool   // the second pass ran
	buf          []byte // the copy buffer of every file
}

func (x *extractor) close() {
	for _, p := range x.pending {
		p.tmp.discard()
	}
	x.pending = nil
	x.closeDirs()
	if x.root >= 0 {
		unix.Close(x.root)
	}
}

func (x *extractor) result() wire.ArchiveWritten {
	res := wire.ArchiveWritten{Path: x.target, Entries: x.entries, Bytes: x.bytes}
	for _, e := range x.entries {
		switch e.Action {
		case wire.ActionCreate, wire.ActionReplace:
			if x.applied {
				res.Written++
			}
		case wire.ActionRefused:
			res.Refused++
		}
	}
	if res.Entries == nil {
		res.Entries = []wire.ArchiveEntry{}
	}
	return res
}

// entryRefusal refuses one entry; the extraction goes on.
type entryRefusal struct{ reason, msg string }

func (r *entryRefusal) Error() string { return r.msg }

func refuseEntry(reason, format string, args ...any) *entryRefusal {
	return &entryRefusal{reason: reason, msg: fmt.Sprintf(format, args...)}
}

func isSpecialKind(k string) bool { return k == "char" || k == "block" || k == "fifo" }

// plan checks one entry (the first pass).
func (x *extractor) plan(h wire.ArchiveHeader, _ io.Reader) error {
	e := wire.EntryOf(h, x.target)
	if e.Action == "" {
		if r := x.check(h); r == nil && x.underRefused(h.Name) != "" {
			e.Action, e.Reason, e.Message = wire.ActionRefused, wire.ReasonConflict, fmt.Sprintf("%s, which would hold it, was refused", x.underRefused(h.Name))
		} else if r != nil {
			e.Action, e.Reason, e.Message = wire.ActionRefused, r.reason, r.msg
		} else {
			e.Action = x.probe(h)
			if e.Action == wire.ActionRefused {
				r := x.probeErr
				e.Reason, e.Message = r.reason, r.msg
			}
		}
	}
	switch {
	case e.Action != wire.ActionRefused && h.Name != "":
		x.planned[h.Name] = plannedKind(h.Type)
		if h.Type == "hardlink" {
			src, _, _ := wire.CleanArchiveName(h.Header.Linkname)
			x.linkSources[src] = true
		}
	case e.Action == wire.ActionRefused && h.Name != "" && x.planned[h.Name] == "":
		x.refusedNames[h.Name] = true
	}
	x.entries = append(x.entries, e)
	return nil
}

// underRefused is the refused entry whose name is a parent of name ("" for none).
func (x *extractor) underRefused(name string) string {
	for i := range len(name) {
		if name[i] == '/' && x.refusedNames[name[:i]] {
			return name[:i]
		}
	}
	return ""
}

func plannedKind(t string) string {
	if t == "hardlink" {
		return "file"
	}
	return t
}

// check applies the rules that need only the archive.
func (x *extractor) check(h wire.ArchiveHeader) *entryRefusal {
	hdr := h.Header
	mode := hdr.Mode & 0o7777
	p := wire.ArchivePath(x.target, h.Name)
	switch {
	case x.o.Skip[h.Index]:
		return refuseEntry(wire.ReasonPolicy, "the policy does not allow writing %s", p)
	case h.Type == "other":
		return refuseEntry(wire.ReasonUnsupported, "tar entry type %q is not written", hdr.Typeflag)
	case isSpecialKind(h.Type) && !x.o.Devices:
		return refuseEntry(wire.ReasonSpecial, "a %s is written only where the policy allows devices (files.devices)", h.Type)
	case h.Type != "symlink" && h.Type != "hardlink" && mode&0o7000 != 0 && !x.o.SpecialBits:
		return refuseEntry(wire.ReasonSpecialBits, "mode %#o has setuid, setgid or sticky bits, which the policy does not allow (files.special_bits)", mode)
	case h.Type == "symlink" && !x.o.SymlinksOut && !wire.SymlinkInside(h.Name, hdr.Linkname):
		return refuseEntry(wire.ReasonLinkOut, "symlink to %q leaves the target directory", hdr.Linkname)
	case h.Type == "hardlink":
		src, reason, _ := wire.CleanArchiveName(hdr.Linkname)
		if reason != "" || src == "" || x.planned[src] != "file" {
			return refuseEntry(wire.ReasonLinkOut, "hard link to %q, which is not a regular file this archive writes before it", hdr.Linkname)
		}
	case h.Name == "" && h.Type != "dir":
		return refuseEntry(wire.ReasonConflict, "the target itself is a directory")
	}
	return nil
}

// probe decides what writing h would do to the target as it is (the
// first pass). A refusal is left in x.probeErr.
func (x *extractor) probe(h wire.ArchiveHeader) string {
	if h.Name == "" {
		return wire.ActionExists
	}
	comps := strings.Split(h.Name, "/")
	for i := 1; i < len(comps); i++ {
		dir := strings.Join(comps[:i], "/")
		if k, ok := x.planned[dir]; ok {
			if k != "dir" {
				return x.refuseProbe(wire.ReasonConflict, "%s is a %s this archive writes, not a directory", dir, k)
			}
			continue
		}
		st, err := x.lstat(dir)
		switch {
		case errors.Is(err, unix.ENOENT):
			for j := i; j < len(comps); j++ {
				x.planned[strings.Join(comps[:j], "/")] = "dir" // made on the way
			}
			return wire.ActionCreate
		case err != nil:
			return x.refuseProbe(wire.ReasonConflict, "%s: %v", dir, err)
		case kindOf(st) == "symlink":
			return x.refuseProbe(wire.ReasonSymlink, "%s is a symlink; nothing is written through one", dir)
		case kindOf(st) != "dir":
			return x.refuseProbe(wire.ReasonConflict, "%s is a %s, not a directory", dir, kindOf(st))
		}
		x.planned[dir] = "dir"
	}
	if k, ok := x.planned[h.Name]; ok {
		return x.overPlanned(h, k)
	}
	st, err := x.lstat(h.Name)
	if errors.Is(err, unix.ENOENT) {
		return wire.ActionCreate
	}
	if err != nil {
		return x.refuseProbe(wire.ReasonConflict, "%s: %v", h.Name, err)
	}
	if r := x.over(h.Name, h.Type, st); r != nil {
		x.probeErr = r
		return wire.ActionRefused
	}
	if h.Type == "dir" {
		return wire.ActionExists
	}
	return wire.ActionReplace
}

// lstat stats name beneath the target (ENOENT for a target still to be made).
func (x *extractor) lstat(name string) (*unix.Stat_t, error) {
	if x.root < 0 {
		return nil, unix.ENOENT
	}
	var st unix.Stat_t
	return &st, unix.Fstatat(x.root, name, &st, unix.AT_SYMLINK_NOFOLLOW)
}

func (x *extractor) refuseProbe(reason, format string, args ...any) string {
	x.probeErr = refuseEntry(reason, format, args...)
	return wire.ActionRefused
}

// overPlanned decides an entry over one this archive writes earlier.
func (x *extractor) overPlanned(h wire.ArchiveHeader, k string) string {
	switch {
	case h.Type == "dir" && k == "dir":
		return wire.ActionExists
	case h.Type != "dir" && !isSpecialKind(h.Type) && (k == "file" || k == "symlink"):
		return wire.ActionReplace
	}
	return x.refuseProbe(wire.ReasonConflict, "%s is a %s this archive writes earlier", h.Name, k)
}

// over refuses writing an entry of kind typ where st is, or allows it
// (replacing a regular file or a symlink, keeping a directory).
func (x *extractor) over(name, typ string, st *unix.Stat_t) *entryRefusal {
	have := kindOf(st)
	switch {
	case typ == "dir" && have == "dir":
		return nil
	case typ == "dir" || isSpecialKind(typ) || have != "file" && have != "symlink":
		return refuseEntry(wire.ReasonConflict, "%s is a %s already", name, have)
	case have == "file" && st.Nlink > 1:
		return refuseEntry(wire.ReasonHardlink, "%s has %d hard links, so replacing it would leave its other names behind", name, st.Nlink)
	case have == "file" && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 && !x.o.SpecialBits:
		return refuseEntry(wire.ReasonSpecialBits, "%s is setuid or setgid (mode %#o), and the policy does not allow writing such files (files.special_bits)", name, st.Mode&0o7777)
	}
	return nil
}
