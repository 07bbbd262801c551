//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

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
		if err := os.RemoveAll(filepath.Join(a.trashDir(), e.Name())); err != nil {
			a.cfg.Logger.Warn("session trash: purge", "entry", e.Name(), "err", err)
			continue
		}
		removed = append(removed, id)
	}
	return removed
}

// SessionRestore moves the files session from left in the trash into the
// workdir of the live session id. A name that exists in the workdir
// refuses the whole restore (CodeExists) before anything moves; trash that
// is gone or expired is CodeNotFound.
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
	m, err := a.readMetaLocked(id)
	if err != nil {
		return wire.RestoreResult{}, fmt.Errorf("session restore: %w", err)
	}
	a.purgeTrash(time.Now())
	src, _, ok := a.trashEntry(from)
	if !ok {
		return wire.RestoreResult{}, notFoundf("session restore: no files of session %s in the trash (never trashed, or kept too long ago)", from)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return wire.RestoreResult{}, fmt.Errorf("session restore: %w", err)
	}
	for _, e := range entries {
		if exists(filepath.Join(m.Workdir, e.Name())) {
			return wire.RestoreResult{}, &wire.Error{Code: wire.CodeExists, Message: fmt.Sprintf("session restore: %s already has %q", m.Workdir, e.Name())}
		}
	}
	res := wire.RestoreResult{ID: id, From: from, Workdir: m.Workdir}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(src, e.Name()), filepath.Join(m.Workdir, e.Name())); err != nil {
			return res, fmt.Errorf("session restore: %w", err)
		}
		res.Entries = append(res.Entries, e.Name())
	}
	if uid := m.uid(); uid >= 0 {
		if err := chownTree(m.Workdir, uid); err != nil {
			return res, fmt.Errorf("session restore: %w", err)
		}
	}
	if err := os.Remove(src); err != nil && !errors.Is(err, os.ErrNotExist) {
		a.cfg.Logger.Warn("session restore: trash entry", "path", src, "err", err)
	}
	return res, nil
}

// chownTree gives everything under root (root included) to uid, never
// following a symlink.
func chownTree(root string, uid int) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}
