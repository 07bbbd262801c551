//go:build linux

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// Session threads: in the resident helper, each sandboxed session gets
// one confined OS thread (confinement.applySteps: mount and network
// namespaces, the session's paths opened, the Landlock ruleset, the
// mounts, no_new_privs, Landlock enforced, the capabilities a child could
// keep dropped), made once and kept, from which every later run of that
// session is forked. A run then costs a fork and an exec plus what is its
// own: its run cgroup (CLONE_INTO_CGROUP), the uid switch in the child
// (SysProcAttr.Credential), its working directory, its environment. A
// process per command (no resident helper) and a run with rlimits (the
// shim's road) confine a thread, or the shim, per run as before.
//
// # Why a kept thread confines a run as a fresh one would
//
//   - The session's paths are opened once, by the thread, without
//     following a symlink (openRulePath), and the Landlock rules and the
//     mounts are made from those descriptors: they hold the inodes
//     opened then, whatever the names mean later. A session process that
//     swaps one of its paths for a symlink gains nothing through that
//     name: the rule and the writable mount stay on the old inode.
//   - Before each run, the paths are opened again in the guest's view
//     (pathIDs): a symlink refuses the run, naming it, as a fresh thread
//     would (TestHostSwappedPathRefused); a path that names another file
//     or mount than the thread's (replaced, created, removed, mounted
//     over) makes a new thread for the run, so the run's view is the one
//     a fresh thread would have built. Mounts the guest makes or removes
//     elsewhere reach a session's runs with its next thread: a thread
//     serves at most threadMaxAge, and ends after threadIdle unused (a
//     thread's mount namespace also holds every mount it copied alive).
//   - What our code changes on the thread between runs: only its working
//     directory (unshare(CLONE_NEWNS) unshared CLONE_FS, so the cwd, the
//     root and the umask are the thread's own), which enterCwd sets whole
//     before every fork with a private /tmp (without, the thread shares
//     the process's, which it never changes, and the child enters its
//     cwd after the fork). Its nice value, lowered while a thread is made
//     ahead of time, is set back before it forks anything. Ids,
//     capabilities, no_new_privs, Landlock, namespaces, the umask and the
//     signal mask (reset by the fork) are set once and never changed; the
//     rlimits and credentials are the child's own. A run's process can
//     change nothing of its parent thread.
//   - A thread belongs to one session: it is found by the session's id and
//     used only under the same key (the session's marker secret, which
//     every create draws anew, and its confinement), so a session
//     destroyed by a process per command and made again under the same id
//     gets a new thread.
//
// # Concurrency
//
// The cache's mu guards byID and every thread's fields marked so. Each
// thread's OS thread is owned by its goroutine (sessionThread.loop),
// locked and never unlocked: when the goroutine returns, the runtime ends
// the thread. Runs are queued to it on reqs, one at a time; a request is
// the fork of one run (runSetup.start on the thread) and is answered
// before the next is taken. A run holds a reference from its fork until
// its process is waited for (runSetup.close): a thread retired (idle,
// old, replaced, evicted) ends only once no run holds it, since its
// children's parent-death signal fires when it ends. A session's destroy
// ends its thread at once, after the kill and before its files are
// removed (removeSessionLocked), and waits for it to be gone: a run in
// flight then was killed by that destroy; a session run cannot be queued
// then, as its start holds the session lock the destroy holds, and a
// one-shot session is destroyed after its only run. A thread made ahead
// of time (prepare: after a create, for every pooled session) is made at
// nice poolNice, off the caller's path; a run that waits for it raises it
// back.

// Session thread bounds.
const (
	// maxThreads bounds the kept threads: past it the least recently used
	// idle one ends (a run that finds every kept thread busy gets one
	// that ends after it).
	maxThreads = 32
	// threadIdle: a thread unused this long ends.
	threadIdle = 2 * time.Minute
	// threadMaxAge: a thread this old serves no new run (the rest of the
	// guest's mounts it copied are that old at most).
	threadMaxAge = 30 * time.Minute
)

// threadCache is the resident helper's session threads.
type threadCache struct {
	max int              // maxThreads; tests lower it
	now func() time.Time // time.Now; tests set a clock

	mu     sync.Mutex
	byID   map[string]*sessionThread
	closed bool
	stats  wire.ThreadStats // Kept is filled when read
}

// statsLocked is the cache's counts.
func (tc *threadCache) statsLocked() wire.ThreadStats {
	st := tc.stats
	st.Kept = len(tc.byID)
	return st
}

func newThreadCache() *threadCache {
	return &threadCache{max: maxThreads, now: time.Now, byID: map[string]*sessionThread{}}
}

// sessionThread is one session's confined thread.
type sessionThread struct {
	session, key string
	c            confinement
	made         time.Time
	reqs         chan func()
	quit         chan struct{} // closed to end the thread
	done         chan struct{} // closed when the thread has ended
	ready        chan struct{} // closed when confined (or failed: err)

	// Set before ready is closed, read after.
	err  error
	kept kept

	// Guarded by threadCache.mu.
	refs    int // runs forked and not yet waited for
	lastUse time.Time
	retired bool // out of the cache: ends once refs is 0
	stopped bool // quit is closed
	tid     int  // the OS thread, once known
	low     bool // being made at nice poolNice
	nice    int  // the helper's own nice value, given back once made
}

// threadKey is what a session's thread is used under: the session's
// secret and its confinement.
func threadKey(token string, c confinement) string {
	b, _ := json.Marshal(c)
	return token + "\x00" + string(b)
}

// prepare makes session m's thread ahead of its first run, at low
// priority, unless it has one or needs none (no sandbox, or rlimits).
func (tc *threadCache) prepare(m meta) {
	if m.Sandbox == nil {
		return
	}
	c := m.confinement()
	if c.RlimitAS != 0 || c.RlimitNPROC != 0 {
		return
	}
	ids, err := c.pathIDs()
	if err != nil {
		return // the first run says why
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if t := tc.byID[m.ID]; tc.closed || t != nil && !t.retired {
		return
	}
	tc.startLocked(m.ID, threadKey(m.Token, c), c, ids, true)
}

// startLocked starts making a thread for session id and puts it in the
// cache (ending the least recently used idle one past maxThreads; when
// every kept thread is busy it is made outside the cache, retired).
func (tc *threadCache) startLocked(id, key string, c confinement, ids []pathID, low bool) *sessionThread {
	t := &sessionThread{session: id, key: key, c: c, made: tc.now(), lastUse: tc.now(), low: low,
		reqs: make(chan func()), quit: make(chan struct{}), done: make(chan struct{}), ready: make(chan struct{})}
	if old := tc.byID[id]; old != nil {
		tc.retireLocked(old)
	}
	if len(tc.byID) >= tc.max && !tc.evictLocked() {
		t.retired = true
	} else {
		tc.byID[id] = t
	}
	tc.stats.Made++
	go t.loop(tc, ids)
	return t
}

// evictLocked ends the least recently used thread no run holds.
func (tc *threadCache) evictLocked() bool {
	var lru *sessionThread
	for _, t := range tc.byID {
		if t.refs == 0 && (lru == nil || t.lastUse.Before(lru.lastUse)) {
			lru = t
		}
	}
	if lru == nil {
		return false
	}
	tc.retireLocked(lru)
	return true
}

// retireLocked takes t out of the cache; it ends once no run holds it.
func (tc *threadCache) retireLocked(t *sessionThread) {
	if tc.byID[t.session] == t {
		delete(tc.byID, t.session)
	}
	t.retired = true
	if t.refs == 0 {
		t.stopLocked()
	}
}

// stopLocked tells t's goroutine to end.
func (t *sessionThread) stopLocked() {
	if !t.stopped {
		t.stopped = true
		close(t.quit)
	}
}

// loop is the thread: it confines itself, then forks what reqs brings
// until quit.
func (t *sessionThread) loop(tc *threadCache, ids []pathID) {
	runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
	defer close(t.done)
	tc.mu.Lock()
	t.tid = unix.Gettid()
	low := t.low
	if low {
		if prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0); err == nil {
			t.nice = 20 - prio // the system call's value is 20 - nice
			_ = unix.Setpriority(unix.PRIO_PROCESS, 0, poolNice)
		} else {
			low, t.low = false, false
		}
	}
	tc.mu.Unlock()
	start := time.Now()
	t.kept, t.err = t.c.applySteps("capabilities", t.c.dropChildCaps, false)
	took := time.Since(start)
	if low {
		// Back to the helper's own before anything is forked (a child
		// inherits it); root's CAP_SYS_NICE is still in effect.
		tc.mu.Lock()
		t.low = false
		if err := unix.Setpriority(unix.PRIO_PROCESS, 0, t.nice); err != nil && t.err == nil {
			t.err = fmt.Errorf("nice %d: %w", t.nice, err)
		}
		tc.mu.Unlock()
	}
	tc.mu.Lock()
	tc.stats.BuildMS += took.Milliseconds()
	if t.err != nil {
		tc.retireLocked(t) // a failed thread stays in no cache
	}
	tc.mu.Unlock()
	if t.err == nil && !slices.EqualFunc(ids, t.kept.ids, sameFile) {
		ids = nil // changed while it was made: the next run makes another
	}
	t.kept.ids = withMounts(t.kept.ids, ids)
	defer t.kept.close()
	close(t.ready)
	if t.err != nil {
		return
	}
	for {
		select {
		case fn := <-t.reqs:
			fn()
		case <-t.quit:
			return
		}
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// sameFile reports whether a and b name the same file (or both nothing).
func sameFile(a, b pathID) bool {
	return a.missing == b.missing && a.dev == b.dev && a.ino == b.ino
}

// withMounts gives the thread's ids the mounts the caller saw; without
// them (nil: the paths changed meanwhile) it marks every id unknown, so
// that no later check matches.
func withMounts(ids, seen []pathID) []pathID {
	for i := range ids {
		if seen == nil {
			ids[i].mnt = ^uint64(0)
		} else {
			ids[i].mnt = seen[i].mnt
		}
	}
	return ids
}

// matches reports whether the paths name what the thread opened.
func (t *sessionThread) matches(ids []pathID) bool {
	return slices.Equal(ids, t.kept.ids)
}

// get returns session id's thread for a run confined by c (key), with a
// reference the caller gives back (release) once the run's process is
// waited for; a thread is made now when there is none, or none that
// matches what the paths name now.
func (tc *threadCache) get(id, key string, c confinement) (*sessionThread, error) {
	ids, err := c.pathIDs()
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		tc.mu.Lock()
		if tc.closed {
			tc.mu.Unlock()
			return nil, errors.New("the resident helper is stopping")
		}
		t := tc.byID[id]
		fresh := false // made by this call: a failure of it would only repeat
		switch {
		case t == nil || t.key != key || tc.now().Sub(t.made) >= threadMaxAge:
			t, fresh = tc.startLocked(id, key, c, ids, false), true
			tc.stats.OnPath++
		case isClosed(t.ready):
			tc.stats.Ready++
		default:
			tc.stats.Waited++
		}
		t.refs++
		t.lastUse = tc.now()
		t.boostLocked() // a run waits for it now
		tc.mu.Unlock()
		<-t.ready
		if t.err == nil && (t.matches(ids) || attempt > 0) {
			return t, nil // a second try's thread is fresh: what a run of its own would get
		}
		tc.mu.Lock()
		tc.retireLocked(t)
		tc.mu.Unlock()
		tc.release(t)
		if attempt > 0 || fresh && t.err != nil {
			return nil, t.err
		}
	}
}

// boostLocked gives a thread being made ahead of time the helper's own
// priority back: someone waits for it.
func (t *sessionThread) boostLocked() {
	if !t.low {
		return
	}
	if t.tid != 0 {
		_ = unix.Setpriority(unix.PRIO_PROCESS, t.tid, t.nice)
	} // else loop has not lowered it yet, and now will not
	t.low = false
}

// release gives back a run's reference.
func (tc *threadCache) release(t *sessionThread) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	t.refs--
	t.lastUse = tc.now()
	if t.retired && t.refs == 0 {
		t.stopLocked()
	}
}

// end ends session id's thread, if any, and waits until it is gone; a
// session's destroy calls it before it removes the session's files.
func (tc *threadCache) end(id string) {
	tc.mu.Lock()
	t := tc.byID[id]
	if t == nil {
		tc.mu.Unlock()
		return
	}
	tc.retireLocked(t)
	t.stopLocked() // its runs' processes, if any, are killed already
	t.boostLocked()
	tc.mu.Unlock()
	<-t.done
}

// expire retires the threads unused for threadIdle, or older than
// threadMaxAge, that no run holds.
func (tc *threadCache) expire(now time.Time) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	for _, t := range tc.byID {
		if t.refs == 0 && (now.Sub(t.lastUse) >= threadIdle || now.Sub(t.made) >= threadMaxAge) {
			tc.retireLocked(t)
		}
	}
}

// close ends every thread and waits for them; runs make no thread after.
func (tc *threadCache) close() {
	tc.mu.Lock()
	tc.closed = true
	var all []*sessionThread
	for _, t := range tc.byID {
		all = append(all, t)
	}
	for _, t := range all {
		tc.retireLocked(t)
		t.stopLocked() // the helper's jobs are ended already
	}
	tc.mu.Unlock()
	for _, t := range all {
		<-t.done
	}
}

// start forks r's process from the thread: it enters the run's working
// directory (with a private /tmp) and starts the plain road there.
func (t *sessionThread) start(r *runSetup, stdin []byte, stdout, stderr io.Writer) (*exec.Cmd, error) {
	type started struct {
		cmd *exec.Cmd
		err error
	}
	c := t.c
	if c.PrivateTmp {
		c.cwd, r.cwd = r.cwd, "" // entered by the thread, in its view
	}
	r.onThread = true
	done := make(chan started, 1)
	fn := func() {
		if err := c.enterCwd(t.kept.attached); err != nil {
			done <- started{err: fmt.Errorf("run: sandbox: %w", err)}
			return
		}
		cmd, err := r.start(stdin, stdout, stderr)
		done <- started{cmd, err}
	}
	select {
	case t.reqs <- fn:
	case <-t.done:
		return nil, errors.New("run: sandbox: the session's thread ended (its session was destroyed)")
	}
	s := <-done
	return s.cmd, s.err
}
