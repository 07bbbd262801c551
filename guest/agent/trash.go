//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// The session trash: `session destroy --trash-s N` moves the session's
// workdir to <Root>/trash/<id>.<expiry> (a rename on the same filesystem,
// so nothing is copied) instead of removing it; `session restore --id NEW
// --from OLD` moves its files into the live session NEW's workdir and
// gives them NEW's uid when NEW has one of its own. Expired trash is
// removed by the next destroy, restore or reap. The name carries the
// expiry (Unix seconds), so nothing else has to remember it.

func (a *Agent) trashDir() string { return filepath.Join(a.cfg.Root, "trash") }

// trashWorkdir moves dir (a session's workdir) to the trash for keep.
func (a *Agent) trashWorkdir(id, dir string, keep time.Duration) (until time.Time, err error) {
	if err := os.MkdirAll(a.trashDir(), 0o700); err != nil {
		return time.Time{}, fmt.Errorf("trash: %w", err)
	}
	a.purgeTrash(time.Now())
	until = time.Now().Add(keep).Truncate(time.Second)
	dst := filepath.Join(a.trashDir(), id+"."+strconv.FormatInt(until.Unix(), 10))
	if err := os.Rename(dir, dst); err != nil {
		return time.Time{}, fmt.Errorf("trash: %w", err)
	}
	return until, nil
}

// trashEntry finds session id's trash; ok false when there is none.
func (a *Agent) trashEntry(id string) (path string, until time.Time, ok bool) {
	entries, err := os.ReadDir(a.trashDir())
	if err != nil {
		return "", time.Time{}, false
	}
	for _, e := range entries {
		name, exp, found := strings.Cut(e.Name(), ".")
		if !found || name != id {
			continue
		}
		secs, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			continue
		}
		return filepath.Join(a.trashDir(), e.Name()), time.Unix(secs, 0), true
	}
	return "", time.Time{}, false
}

// purgeTrash removes the trash past its expiry (or not named as the trash
// names it) and returns the session ids it removed.
func (a *Agent) purgeTrash(now time.Time) []string {
	entries, err := os.ReadDir(a.trashDir())
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range entries {
		id, exp, _ := strings.Cut(e.Name(), ".")
		secs, err := strconv.ParseInt(exp, 10, 64)
		if err == nil && now.Before(time.Unix(secs, 0)) {
			continue
		}
		if err := removePath(filepath.Join(a.trashDir(), e.Name())); err != nil {
			a.cfg.Logger.Warn("session trash: purge", "entry", e.Name(), "err", err)
			continue
		}
		removed = append(removed, id)
	}
	return removed
}

// SessionRestore moves the files session from left in the trash into the
// workdir of the live session id (restoration). A name that exists in the
// workdir refuses the whole restore (CodeExists) and leaves everything as
// it was; trash that is gone or expired is CodeNotFound.
func (a *Agent) SessionRestore(ctx context.Context, id, from string) (wire.RestoreResult, error) {
	for _, s := range []string{id, from} {
		if err := wire.ValidateSessionID(s); err != nil {
			return wire.RestoreResult{}, invalidf("session restore: %v", err)
		}
	}
	if id == from {
		return wire.RestoreResult{}, invalidf("session restore: --id and --from are the same session")
	}
	unlock, err := a.lock()
	if err != nil {
		return wire.RestoreResult{}, fmt.Errorf("session restore: %w", err)
	}
	defer unlock()
	m, err := a.readMeta(id)
	if err != nil {
		return wire.RestoreResult{}, fmt.Errorf("session restore: %w", err)
	}
	a.purgeTrash(time.Now())
	src, _, ok := a.trashEntry(from)
	if !ok {
		return wire.RestoreResult{}, notFoundf("session restore: no files of session %s in the trash (never trashed, or kept too long ago)", from)
	}
	r := &restoration{a: a, m: m, src: src, srcFD: -1, wdFD: -1,
		res: wire.RestoreResult{ID: id, From: from, Workdir: m.Workdir, Entries: []string{}}}
	defer r.cleanup()
	if err := r.run(); err != nil {
		var we *wire.Error
		if errors.As(err, &we) {
			return wire.RestoreResult{}, err
		}
		return wire.RestoreResult{}, fmt.Errorf("session restore: %w", err)
	}
	if err := unix.Rmdir(src); err != nil && !errors.Is(err, unix.ENOENT) {
		a.cfg.Logger.Warn("session restore: trash entry", "path", src, "err", err)
	}
	return r.res, nil
}

// restoration is one restore, as named steps under the lock with one
// cleanup. Nothing in it follows a name a session controls:
//
//   - the trash entry (root's alone: the trash is 0700 and the old
//     session's processes were killed before its workdir went there) and
//     the live workdir (below root's directories) are opened once, without
//     following symlinks, and used by descriptor from then on;
//   - the files get the live session's uid and gid while still in the
//     trash, where no session can reach them, by a descriptor walk
//     (chownTree): a device node, or a file with other hard links that the
//     old session did not own, keeps its owner;
//   - the live session's processes are frozen (freezeSession) while each
//     top-level entry moves into the workdir with renameat2(RENAME_NOREPLACE)
//     between the two descriptors; a name there already undoes the moves
//     made and refuses the restore. They are thawed in cleanup, whatever
//     happened.
type restoration struct {
	a           *Agent
	m           meta
	src         string
	srcFD, wdFD int
	names       []string
	thaw        func()
	res         wire.RestoreResult
}

func (r *restoration) run() error {
	return runSteps([]step{
		{"trash", r.openTrash},
		{"workdir", r.openWorkdir},
		{"owner", r.chown},
		{"freeze", r.freeze},
		{"move", r.move},
	})
}

func (r *restoration) cleanup() {
	if r.thaw != nil {
		r.thaw()
	}
	for _, fd := range []int{r.srcFD, r.wdFD} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

func (r *restoration) openTrash() (err error) {
	if r.srcFD, err = openNoFollowRaw(r.src, unix.O_RDONLY|unix.O_DIRECTORY, 0); err != nil {
		return fmt.Errorf("%s: %w", r.src, err)
	}
	r.names, err = readNames(r.srcFD)
	slices.Sort(r.names)
	return err
}

func (r *restoration) openWorkdir() (err error) {
	if r.wdFD, err = openNoFollowRaw(r.m.Workdir, unix.O_PATH|unix.O_DIRECTORY, 0); err != nil {
		return fmt.Errorf("%s: %w", r.m.Workdir, err)
	}
	return nil
}

// chown gives the trashed files the live session's uid and gid (when it
// has its own).
func (r *restoration) chown() error {
	uid := r.m.uid()
	if uid < 0 {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(r.srcFD, &st); err != nil {
		return err
	}
	kept, err := chownTree(r.srcFD, uid, r.m.Enforced.GID, r.a.ownUID(int(st.Uid)))
	r.res.KeptOwner = kept
	if kept > 0 {
		r.a.cfg.Logger.Warn("session restore: entries kept their owner (device nodes, or files with other hard links)", "count", kept)
	}
	return err
}

// ownUID returns uid when it is one of the session uids (a file a session
// uid owns is that session's, whatever other names it has), else -1.
func (a *Agent) ownUID(uid int) int {
	if uid >= a.cfg.UIDBase && uid < a.cfg.UIDBase+a.cfg.UIDCount {
		return uid
	}
	return -1
}

func (r *restoration) freeze() (err error) {
	r.thaw, err = r.a.freezeSession(r.m)
	return err
}

// move renames every entry into the workdir, never over a name there; on
// any failure it moves back what it moved.
func (r *restoration) move() error {
	for i, name := range r.names {
		err := unix.Renameat2(r.srcFD, name, r.wdFD, name, unix.RENAME_NOREPLACE)
		if err == nil {
			continue
		}
		for _, back := range r.names[:i] {
			if berr := unix.Renameat2(r.wdFD, back, r.srcFD, back, unix.RENAME_NOREPLACE); berr != nil {
				r.a.cfg.Logger.Error("session restore: moving back", "entry", back, "err", berr)
			}
		}
		if errors.Is(err, unix.EEXIST) {
			return &wire.Error{Code: wire.CodeExists, Message: fmt.Sprintf("session restore: %s already has %q", r.m.Workdir, name)}
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	r.res.Entries = append(r.res.Entries, r.names...)
	return nil
}

// chownTree gives every entry below the directory top (not top itself) to
// uid and gid, by descriptor (dirWalk; a symlink itself is chowned, never
// followed). A device node keeps its owner, and so does a file with other
// hard links unless ownUID (when not -1) already owns it: giving it away
// would give its other names too. It returns how many kept their owner.
func chownTree(top, uid, gid, ownUID int) (kept int, err error) {
	w := dirWalk{enter: func(_ int, _ string, fd int, st *unix.Stat_t) error {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR, unix.S_IFBLK:
			kept++
			return nil
		case unix.S_IFDIR, unix.S_IFLNK:
		default:
			if st.Nlink > 1 && (ownUID < 0 || int(st.Uid) != ownUID) {
				kept++
				return nil
			}
		}
		return unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	}}
	return kept, w.walk(top)
}
