//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// DestroyTimeout bounds destroy's kill loop.
const DestroyTimeout = 10 * time.Second

// maxSessionSeconds caps ttl and idle (ten years).
const maxSessionSeconds = 10 * 365 * 24 * 3600

// lock takes the exclusive flock on <Root>/lock that serialises session
// changes between concurrent vmgate-guest processes. unlock releases it.
func (a *Agent) lock() (unlock func(), err error) {
	if err := os.MkdirAll(a.cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(a.cfg.Root, "lock"), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock: %w", err)
	}
	return func() { f.Close() }, nil
}

func (a *Agent) metaPath(id string) string { return filepath.Join(a.metaDir(), id+".json") }

// readMetaLocked reads a session's metadata; notFound when there is none.
func (a *Agent) readMetaLocked(id string) (wire.Session, error) {
	var s wire.Session
	b, err := os.ReadFile(a.metaPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return s, notFoundf("unknown session %s", id)
	}
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("session %s: metadata: %w", id, err)
	}
	if s.ID != id {
		return s, fmt.Errorf("session %s: metadata names %q", id, s.ID)
	}
	return s, nil
}

// writeMetaLocked writes the metadata atomically (temp file, fsync, rename).
func (a *Agent) writeMetaLocked(s wire.Session) error {
	s.Processes, s.Expired = 0, false
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := a.metaPath(s.ID) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, a.metaPath(s.ID))
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// SessionCreate creates a session: its workdir, its tracking (a cgroup v2
// group with the limits, else the environment marker with rlimits) and its
// metadata. An existing id is CodeExists. On failure nothing is left behind.
func (a *Agent) SessionCreate(ctx context.Context, req wire.SessionCreate) (wire.Session, error) {
	if err := wire.ValidateSessionID(req.ID); err != nil {
		return wire.Session{}, invalidf("session create: %v", err)
	}
	if req.TTLS < 0 || req.TTLS > maxSessionSeconds || req.IdleS < 0 || req.IdleS > maxSessionSeconds {
		return wire.Session{}, invalidf("session create: ttl_s %d / idle_s %d out of range 0..%d", req.TTLS, req.IdleS, maxSessionSeconds)
	}
	if err := req.Limits.Validate(); err != nil {
		return wire.Session{}, invalidf("session create: limits: %v", err)
	}
	unlock, err := a.lock()
	if err != nil {
		return wire.Session{}, fmt.Errorf("session create: %w", err)
	}
	defer unlock()
	if _, err := os.Lstat(a.metaPath(req.ID)); err == nil {
		return wire.Session{}, &wire.Error{Code: wire.CodeExists, Message: "session create: session " + req.ID + " exists"}
	}
	for _, d := range []string{a.sessionsDir(), a.metaDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return wire.Session{}, fmt.Errorf("session create: %w", err)
		}
	}
	now := time.Now().UnixMilli()
	s := wire.Session{
		ID: req.ID, Workdir: filepath.Join(a.sessionsDir(), req.ID), Tracking: wire.TrackMarker,
		CreatedMS: now, LastUsedMS: now, TTLS: req.TTLS, IdleS: req.IdleS, Limits: req.Limits,
	}
	if err := os.Mkdir(s.Workdir, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return wire.Session{}, &wire.Error{Code: wire.CodeExists, Message: "session create: workdir of " + req.ID + " exists (destroy it first)"}
		}
		return wire.Session{}, fmt.Errorf("session create: %w", err)
	}
	if a.cgroupUsable() {
		if err := a.createSessionCgroup(req.ID, req.Limits); err != nil {
			_ = os.Remove(s.Workdir)
			return wire.Session{}, fmt.Errorf("session create: %w", err)
		}
		s.Tracking = wire.TrackCgroup
	} else if req.Limits.CPUPercent > 0 {
		_ = os.Remove(s.Workdir)
		return wire.Session{}, refused(wire.ReasonNoCgroupLimit, "session create: cpu_percent needs cgroup v2, which this guest does not have")
	}
	if err := a.writeMetaLocked(s); err != nil {
		_ = removeCgroupTree(a.sessionCgroup(req.ID))
		_ = os.Remove(s.Workdir)
		return wire.Session{}, fmt.Errorf("session create: metadata: %w", err)
	}
	return s, nil
}

// SessionList lists the sessions with their member counts, sorted by id.
func (a *Agent) SessionList(ctx context.Context) ([]wire.Session, error) {
	ents, err := os.ReadDir(a.metaDir())
	if errors.Is(err, os.ErrNotExist) {
		return []wire.Session{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("session list: %w", err)
	}
	members := a.allMembers()
	now := time.Now().UnixMilli()
	out := []wire.Session{}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || wire.ValidateSessionID(id) != nil {
			continue
		}
		s, err := a.readMetaLocked(id) // a torn read is impossible: writes are renames
		if err != nil {
			a.cfg.Logger.Warn("session list: skipping", "id", id, "err", err)
			continue
		}
		s.Processes = members[id]
		s.Expired = s.ExpiredAt(now)
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// allMembers counts live processes per session id (cgroup or marker).
func (a *Agent) allMembers() map[string]int {
	out := map[string]int{}
	pids, _ := a.proc.pids()
	for _, pid := range pids {
		if id := a.proc.sessionOf(pid); id != "" {
			out[id]++
		}
	}
	return out
}

// SessionDestroy kills every process of the session (its cgroup, and every
// process carrying its marker, in rounds until none is left: a fork can
// race a round), removes its cgroup, its workdir (symlinks inside are
// unlinked, never followed) and its metadata. Destroying an unknown or
// already destroyed session succeeds with Existed false.
func (a *Agent) SessionDestroy(ctx context.Context, id string) (wire.DestroyResult, error) {
	if err := wire.ValidateSessionID(id); err != nil {
		return wire.DestroyResult{}, invalidf("session destroy: %v", err)
	}
	unlock, err := a.lock()
	if err != nil {
		return wire.DestroyResult{}, fmt.Errorf("session destroy: %w", err)
	}
	defer unlock()
	return a.destroyLocked(ctx, id)
}

func (a *Agent) destroyLocked(ctx context.Context, id string) (wire.DestroyResult, error) {
	start := time.Now()
	res := wire.DestroyResult{ID: id}
	_, err := a.readMetaLocked(id)
	var we *wire.Error
	switch {
	case err == nil:
		res.Existed = true
	case errors.As(err, &we) && we.Code == wire.CodeNotFound:
	default:
		// Unreadable metadata: still destroy everything the id names.
		a.cfg.Logger.Warn("session destroy: metadata", "id", id, "err", err)
		res.Existed = true
	}
	cg := ""
	if a.cfg.CgroupRoot != "" {
		cg = a.sessionCgroup(id)
		if _, err := os.Stat(cg); err != nil {
			cg = ""
		} else {
			res.Existed = true
		}
	}
	killed, rounds, err := a.killUntilGone(ctx, tree{cgroup: cg, markerKey: SessionEnv, markerVal: id}, 0, DestroyTimeout)
	res.Killed, res.Rounds = killed, rounds
	if err != nil {
		return res, fmt.Errorf("session destroy: %w", err)
	}
	if cg != "" {
		// The kernel may report a killed group busy for a moment.
		var err error
		for i := 0; i < 50; i++ {
			if err = removeCgroupTree(cg); !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			return res, fmt.Errorf("session destroy: cgroup: %w", err)
		}
	}
	wd := filepath.Join(a.sessionsDir(), id)
	if _, err := os.Lstat(wd); err == nil {
		res.Existed = true
	}
	// os.RemoveAll walks with openat/unlinkat and O_NOFOLLOW: a symlink is
	// unlinked, never followed (TestDestroyDoesNotFollowSymlinks checks it).
	if err := os.RemoveAll(wd); err != nil {
		return res, fmt.Errorf("session destroy: workdir: %w", err)
	}
	if err := os.Remove(a.metaPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return res, fmt.Errorf("session destroy: metadata: %w", err)
	}
	res.TookMS = time.Since(start).Milliseconds()
	return res, nil
}

// SessionReap destroys every session past its ttl or idle time.
func (a *Agent) SessionReap(ctx context.Context) (wire.ReapResult, error) {
	unlock, err := a.lock()
	if err != nil {
		return wire.ReapResult{}, fmt.Errorf("session reap: %w", err)
	}
	defer unlock()
	res := wire.ReapResult{Destroyed: []wire.DestroyResult{}}
	ents, err := os.ReadDir(a.metaDir())
	if errors.Is(err, os.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("session reap: %w", err)
	}
	now := time.Now().UnixMilli()
	var errs []error
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || wire.ValidateSessionID(id) != nil {
			continue
		}
		s, err := a.readMetaLocked(id)
		if err != nil || !s.ExpiredAt(now) {
			continue
		}
		d, err := a.destroyLocked(ctx, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		res.Destroyed = append(res.Destroyed, d)
	}
	if len(errs) > 0 {
		return res, fmt.Errorf("session reap: %w", errors.Join(errs...))
	}
	return res, nil
}

// touchLocked records a use of the session (for the idle limit).
func (a *Agent) touchLocked(s wire.Session) error {
	s.LastUsedMS = time.Now().UnixMilli()
	return a.writeMetaLocked(s)
}
