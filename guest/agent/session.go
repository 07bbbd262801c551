//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// readMeta reads a session's metadata; notFound when there is none. It
// needs no lock: a metadata file is only ever replaced whole, by a rename
// (writeMetaLocked), or removed, so a read sees one whole version. A caller
// that changes the session after reading holds the lock across both, so
// that no other change comes between (joinSession, destroyLocked,
// SessionRestore); listing and indexing read without it.
func (a *Agent) readMeta(id string) (meta, error) {
	var m meta
	b, err := os.ReadFile(a.metaPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return m, notFoundf("unknown session %s", id)
	}
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("session %s: metadata: %w", id, err)
	}
	if m.ID != id {
		return m, fmt.Errorf("session %s: metadata names %q", id, m.ID)
	}
	return m, nil
}

// writeMetaLocked writes the metadata atomically (temp file, fsync, rename).
func (a *Agent) writeMetaLocked(m meta) error {
	m.Processes, m.Expired = 0, false
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return replaceOwnFile(a.metaPath(m.ID), a.metaPath(m.ID)+".tmp", b, 0o600, true)
}

// replaceOwnFile gives p the content data, mode mode, through tmp (a name
// in p's directory) and a rename, so that a reader sees the old file or
// the new one whole; with sync the data is on disk before the rename. It
// is for the agent's own files, in directories of root's that no session
// can write (metadata, job records, the systemd unit); a session's files
// go through files_atomic.go. tmp is opened O_NOFOLLOW and removed when
// the write fails.
func replaceOwnFile(p, tmp string, data []byte, mode os.FileMode, sync bool) error {
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode) // what the umask took
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// SessionCreate creates a session: its workdir, its tracking (a cgroup v2
// group with the limits, else its uid or its secret marker, with rlimits),
// its metadata and, with a Sandbox, its confinement (see creation). An
// existing id is CodeExists; a sandbox this kernel cannot give is
// CodeRefused naming what is missing. On failure nothing is left behind.
//
// In the resident helper the session's confined thread is then made ahead
// of its first run, at low priority (threadCache.prepare).
func (a *Agent) SessionCreate(ctx context.Context, req wire.SessionCreate) (wire.Session, error) {
	m, err := a.createSession(req, false)
	if err == nil && a.res != nil {
		a.res.threads.prepare(m)
	}
	return m.Session, err
}

// createSession is SessionCreate; oneShot marks the session as the
// resident helper's, for one run (meta.OneShot).
func (a *Agent) createSession(req wire.SessionCreate, oneShot bool) (meta, error) {
	sb, err := a.validateCreate(req)
	if err != nil {
		return meta{}, err
	}
	unlock, err := a.lock()
	if err != nil {
		return meta{}, fmt.Errorf("session create: %w", err)
	}
	defer unlock()
	if _, err := os.Lstat(a.metaPath(req.ID)); err == nil {
		return meta{}, &wire.Error{Code: wire.CodeExists, Message: "session create: session " + req.ID + " exists"}
	}
	now := time.Now().UnixMilli()
	c := &creation{a: a, k: a.probeKernel(), m: meta{Token: randomHex(16), OneShot: oneShot, Session: wire.Session{
		ID: req.ID, Workdir: filepath.Join(a.sessionsDir(), req.ID), Tracking: wire.TrackMarker,
		CreatedMS: now, LastUsedMS: now, TTLS: req.TTLS, IdleS: req.IdleS, Limits: req.Limits, Sandbox: sb,
	}}}
	if err := c.run(); err != nil {
		c.undo()
		return meta{}, fmt.Errorf("session create: %w", err)
	}
	return c.m, nil
}

// validateCreate checks a create request without side effects and returns
// its sandbox normalized (nil when none was asked for).
func (a *Agent) validateCreate(req wire.SessionCreate) (*wire.Sandbox, error) {
	if err := wire.ValidateSessionID(req.ID); err != nil {
		return nil, invalidf("session create: %v", err)
	}
	if req.TTLS < 0 || req.TTLS > maxSessionSeconds || req.IdleS < 0 || req.IdleS > maxSessionSeconds {
		return nil, invalidf("session create: ttl_s %d / idle_s %d out of range 0..%d", req.TTLS, req.IdleS, maxSessionSeconds)
	}
	if err := req.Limits.Validate(); err != nil {
		return nil, invalidf("session create: limits: %v", err)
	}
	if req.Sandbox == nil {
		return nil, nil
	}
	if err := req.Sandbox.Validate(); err != nil {
		return nil, invalidf("session create: %v", err)
	}
	sb := req.Sandbox.Normalized()
	for _, l := range []struct {
		name  string
		paths []string
	}{{"fs.read", sb.FS.Read}, {"fs.write", sb.FS.Write}} {
		for _, p := range l.paths {
			if err := a.checkSandboxPath(p); err != nil {
				return nil, invalidf("session create: sandbox %s: %v", l.name, err)
			}
		}
	}
	return &sb, nil
}

// checkSandboxPath refuses an extra path that does not exist, that goes
// through a symlink (the rule would land on the target, which the policy
// did not name), or that lies inside vmgate-guest's state. It opens the
// path as every run does (openRulePath); runs check again, as a session
// may swap a path for a symlink later.
func (a *Agent) checkSandboxPath(p string) error {
	fd, _, err := openRulePath(p)
	if err != nil {
		var we *wire.Error
		if errors.As(err, &we) {
			return errors.New(we.Message)
		}
		return err
	}
	unix.Close(fd)
	if p == a.cfg.Root || strings.HasPrefix(p, a.cfg.Root+"/") {
		return fmt.Errorf("%s is inside vmgate-guest's state (%s)", p, a.cfg.Root)
	}
	return nil
}

// SessionList lists the sessions with their member counts, sorted by id.
func (a *Agent) SessionList(ctx context.Context) ([]wire.Session, error) {
	metas, err := a.readAllMeta()
	if err != nil {
		return nil, fmt.Errorf("session list: %w", err)
	}
	members := a.allMembers()
	now := time.Now().UnixMilli()
	out := make([]wire.Session, 0, len(metas))
	for _, m := range metas {
		if m.OneShot { // a one-shot run's own (pool.go), nobody's session
			continue
		}
		m.Processes = members[m.ID]
		m.Expired = m.ExpiredAt(now)
		out = append(out, m.Session)
	}
	return out, nil
}

// readAllMeta reads every session's metadata, sorted by id. A file that
// cannot be read is logged and left out (a torn read is impossible: writes
// are renames).
func (a *Agent) readAllMeta() ([]meta, error) {
	ents, err := os.ReadDir(a.metaDir()) // sorted by name, so by id
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []meta
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || wire.ValidateSessionID(id) != nil {
			continue
		}
		m, err := a.readMeta(id)
		if err != nil {
			a.cfg.Logger.Warn("session metadata: skipping", "id", id, "err", err)
			continue
		}
		out = append(out, m)
	}
	return out, nil
}

// allMembers counts live processes per session id (see membership.go).
func (a *Agent) allMembers() map[string]int {
	out := map[string]int{}
	pids, _ := a.proc.pids()
	ms := a.memberScan()
	var buf []byte
	for _, pid := range pids {
		d, err := a.proc.openPID(pid)
		if err != nil {
			continue
		}
		b, err := d.read("stat", buf)
		buf = b[:0]
		if st, perr := parseStat(b); err == nil && perr == nil && st.State != "Z" && st.State != "X" {
			if m := ms.of(d, &buf, st.KernelThread()); m.session != "" {
				out[m.session]++
			}
		}
		d.close()
	}
	return out
}

// SessionDestroy kills every process of the session (its cgroup, and every
// process carrying its marker, in rounds until none is left: a fork can
// race a round), removes its cgroup, its workdir (symlinks inside are
// unlinked, never followed) and its metadata. Destroying an unknown or
// already destroyed session succeeds with Existed false.
func (a *Agent) SessionDestroy(ctx context.Context, id string) (wire.DestroyResult, error) {
	return a.SessionTrash(ctx, id, 0)
}

// SessionTrash is SessionDestroy that, with trash > 0, moves the session's
// workdir to the trash for that long instead of removing it (trash.go).
func (a *Agent) SessionTrash(ctx context.Context, id string, trash time.Duration) (wire.DestroyResult, error) {
	if err := wire.ValidateSessionID(id); err != nil {
		return wire.DestroyResult{}, invalidf("session destroy: %v", err)
	}
	if trash < 0 || trash > wire.MaxTrashS*time.Second {
		return wire.DestroyResult{}, invalidf("session destroy: trash %v: want 0..%ds", trash, wire.MaxTrashS)
	}
	unlock, err := a.lock()
	if err != nil {
		return wire.DestroyResult{}, fmt.Errorf("session destroy: %w", err)
	}
	defer unlock()
	return a.destroyLocked(ctx, id, trash)
}

// destroyLocked destroys session id; with trash > 0 its workdir goes to
// the trash (trash.go) for that long instead of being removed.
func (a *Agent) destroyLocked(ctx context.Context, id string, trash time.Duration) (wire.DestroyResult, error) {
	start := time.Now()
	t, res := a.sessionTree(id)
	// Before the kill, so that each job ends saying why (a job whose
	// processes the kill ended first would read as killed by a signal).
	a.endSessionJobs(ctx, id)
	if err := a.killSession(ctx, t, &res); err != nil {
		return res, err
	}
	return a.removeSessionLocked(id, t, trash, res, start)
}

// sessionTree is what a destroy of session id kills: its cgroup, its uid
// and its marker. With unreadable metadata the uid and the marker's
// secret are unknown: only the cgroup (and the files the id names) can
// still be found. The metadata is written by rename: a read without the
// lock sees it whole.
func (a *Agent) sessionTree(id string) (tree, wire.DestroyResult) {
	res := wire.DestroyResult{ID: id}
	t := tree{}
	m, err := a.readMeta(id)
	var we *wire.Error
	switch {
	case err == nil:
		res.Existed = true
		t.markerKey, t.markerVal, t.uid = SessionEnv, m.marker(), m.uid()
		if t.uid > 0 {
			// A session uid's processes run as it from the exec on and
			// cannot change it (no capabilities, no_new_privs), and the
			// lock a start holds until then keeps a destroy out: the uid
			// finds every process the marker would, without reading every
			// process's environment.
			t.markerKey, t.markerVal = "", ""
		}
	case errors.As(err, &we) && we.Code == wire.CodeNotFound:
	default:
		a.cfg.Logger.Warn("session destroy: metadata", "id", id, "err", err)
		res.Existed = true
	}
	if a.cfg.CgroupRoot != "" {
		if cg := a.sessionCgroup(id); exists(cg) {
			t.cgroup, res.Existed = cg, true
		}
	}
	return t, res
}

// killSession kills every process of t, in rounds until none is left.
func (a *Agent) killSession(ctx context.Context, t tree, res *wire.DestroyResult) error {
	killed, rounds, err := a.killUntilGone(ctx, t, 0, DestroyTimeout)
	res.Killed, res.Rounds = killed, rounds
	if err != nil {
		return fmt.Errorf("session destroy: %w", err)
	}
	return nil
}

// removeSessionLocked removes what session id leaves once its processes
// (t) are gone, after its confined thread (thread.go) has ended.
func (a *Agent) removeSessionLocked(id string, t tree, trash time.Duration, res wire.DestroyResult, start time.Time) (wire.DestroyResult, error) {
	if a.res != nil {
		a.res.threads.end(id)
	}
	if err := a.removeSessionFiles(id, t.cgroup, trash, &res); err != nil {
		return res, fmt.Errorf("session destroy: %w", err)
	}
	res.TookMS = time.Since(start).Milliseconds()
	return res, nil
}

// removeSessionFiles removes what a session leaves once its processes are
// gone: its cgroup, network namespace, temporary directory, workdir and
// metadata, each only if there.
func (a *Agent) removeSessionFiles(id, cg string, trash time.Duration, res *wire.DestroyResult) error {
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
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	if err := removeNetNS(filepath.Join(a.netnsDir(), id)); err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	for _, dir := range []string{filepath.Join(a.tmpDir(), id), filepath.Join(a.sessionsDir(), id)} {
		if exists(dir) {
			res.Existed = true
			if trash > 0 && dir == filepath.Join(a.sessionsDir(), id) {
				until, err := a.trashWorkdir(id, dir, trash)
				if err != nil {
					return err
				}
				res.TrashUntilMS = until.UnixMilli()
				continue
			}
		}
		// By descriptor, with a bounded number of them open however deep the
		// tree (removeTree): a symlink is unlinked, never followed
		// (TestDestroyDoesNotFollowSymlinks checks it). The session's
		// processes are gone: nothing adds to the tree meanwhile.
		if err := removePath(dir); err != nil {
			return err
		}
	}
	if err := os.Remove(a.metaPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("metadata: %w", err)
	}
	return nil
}

// exists reports whether p names anything (a symlink counts).
func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// SessionReap destroys every session past its ttl or idle time.
func (a *Agent) SessionReap(ctx context.Context) (wire.ReapResult, error) {
	unlock, err := a.lock()
	if err != nil {
		return wire.ReapResult{}, fmt.Errorf("session reap: %w", err)
	}
	defer unlock()
	res := wire.ReapResult{Destroyed: []wire.DestroyResult{}}
	a.purgeTrash(time.Now())
	metas, err := a.readAllMeta()
	if err != nil {
		return res, fmt.Errorf("session reap: %w", err)
	}
	now := time.Now().UnixMilli()
	var errs []error
	for _, m := range metas {
		if !m.ExpiredAt(now) {
			continue
		}
		d, err := a.destroyLocked(ctx, m.ID, 0)
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
func (a *Agent) touchLocked(m meta) error {
	m.LastUsedMS = time.Now().UnixMilli()
	return a.writeMetaLocked(m)
}
