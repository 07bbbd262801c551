//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agent/wire"
)

// The one-shot pool: the resident helper keeps a few sandboxed sessions
// ready for one-shot runs (`run`/`job start` with a sandbox and no
// session), so that such a run costs what a run in a session does rather
// than a session create and a destroy on top.
//
//   - A pooled session is made by the same create as any session
//     (createSession: plan, uid, workdir, tmp, cgroup, network namespace,
//     metadata), for the normalised sandbox the run asked for; its run is
//     confined as every run of a session is (joinMeta, startConfined), so
//     the command cannot tell it from a fresh one: its workdir and /tmp are
//     empty, its uid has no process, nothing ever ran in it.
//   - Each is handed to one run (take pops it under mu) and destroyed
//     after that run (runEnded), never used again: what the command left
//     in the session's cgroup is killed before the reply, and the destroy
//     (a scan of every process, the removal of the session's files)
//     follows in the background, so that a one-shot run costs what a run
//     in a session does. Without cgroup v2 the processes the command left
//     end with that destroy, shortly after the reply. Its metadata says
//     OneShot: no other command joins it, and the host's lists leave it
//     out.
//   - The pool holds sessions of one sandbox at a time (key, the sandbox
//     normalised, as JSON): a run that asks for another empties it and
//     refills it with the new one. It holds at most size sessions and
//     makes none while the guest has less than poolMinAvailable memory
//     available; a run that finds it empty gets a session made for it, as
//     before the pool.
//   - The pool's background work (making sessions, destroying used
//     ones) runs after the run it follows, one job at a time, on one
//     thread of its own with a lower priority (poolNice), so that it
//     takes the guest's CPU from no command: on a one-CPU guest a create
//     running beside a run slowed the run by half. A run takes a session
//     without waiting for that work; one that finds the pool empty gets a
//     session made for it, as before the pool. Ready sessions are
//     destroyed when the helper ends (close); a helper that starts
//     destroys the one-shot sessions a helper before it left (recover),
//     ready or in use: their runs died with it.
//
// Concurrency: mu guards every field below it (cond waits on it). Jobs
// run on the worker goroutine, never under mu; close waits for the
// worker, which drains the jobs queued before it.
type sessionPool struct {
	a    *Agent
	size int
	done chan struct{} // closed when the worker has ended

	mu      sync.Mutex
	cond    *sync.Cond
	key     string       // the normalised sandbox the ready sessions have
	spec    wire.Sandbox // the same, as a value
	ready   []meta
	jobs    []func()
	filling bool // a fill job is queued or running
	closed  bool
	stats   wire.PoolStats // the counts; Size, Ready and Pending are filled when read
	pending int            // destroy jobs queued
}

// Pool bounds.
const (
	// DefaultPoolSize is how many ready sessions the pool keeps
	// (`serve --oneshot-pool`); maxPoolSize bounds the setting.
	DefaultPoolSize = 2
	maxPoolSize     = 16
	// poolMinAvailable: below this much available memory (MemAvailable)
	// the pool makes no session.
	poolMinAvailable = 64 << 20
	// oneShotPrefix starts a one-shot session's id, pooled or not.
	oneShotPrefix = "oneshot"
	// poolNice is the worker thread's nice value.
	poolNice = 10
	// maxPendingJobs bounds the worker's queue of destroys.
	maxPendingJobs = 8
)

func newSessionPool(a *Agent, size int) *sessionPool {
	p := &sessionPool{a: a, size: size, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	go p.worker()
	return p
}

// worker runs the pool's jobs in order on a thread of its own at nice
// poolNice (per thread on Linux), until the pool is closed and no job is
// left. The thread is never given back to the runtime, which would hand
// its lower priority to any goroutine: it ends with this one. (The
// runtime makes new threads from a template thread, never by cloning a
// locked one, so none inherits the value.)
func (p *sessionPool) worker() {
	defer close(p.done)
	runtime.LockOSThread()
	if err := unix.Setpriority(unix.PRIO_PROCESS, 0, poolNice); err != nil {
		p.a.cfg.Logger.Warn("one-shot pool: lowering the worker's priority", "err", err)
	}
	for {
		p.mu.Lock()
		for len(p.jobs) == 0 && !p.closed {
			p.cond.Wait()
		}
		if len(p.jobs) == 0 {
			p.mu.Unlock()
			return
		}
		job := p.jobs[0]
		p.jobs = p.jobs[1:]
		p.mu.Unlock()
		job()
	}
}

// queueLocked adds a job for the worker.
func (p *sessionPool) queueLocked(job func()) {
	p.jobs = append(p.jobs, job)
	p.cond.Signal()
}

// queueDestroyLocked queues the destroy of used session id. Destroys wait
// behind a fill (refillLocked puts it first): a run that follows finds
// a ready session sooner, and the destroys run when the pool is full.
func (p *sessionPool) queueDestroyLocked(id string) {
	p.pending++
	p.queueLocked(func() {
		start := time.Now()
		p.a.destroyOneShot(id)
		p.mu.Lock()
		p.pending--
		p.stats.Destroyed++
		p.stats.DestroyMS += time.Since(start).Milliseconds()
		p.mu.Unlock()
	})
}

// statsLocked is the pool's counts and state.
func (p *sessionPool) statsLocked() wire.PoolStats {
	st := p.stats
	st.Size, st.Ready, st.Pending = p.size, len(p.ready), p.pending
	return st
}

func oneShotID() string { return oneShotPrefix + randomHex(12) }

// take returns a session for one run confined by sb: a ready one when the
// pool has one of sb, else one made now. sb is checked as a create checks
// it (paths included) either way, and a different sb empties the pool.
func (p *sessionPool) take(sb *wire.Sandbox) (meta, error) {
	req := wire.SessionCreate{ID: oneShotID(), Sandbox: sb}
	norm, err := p.a.validateCreate(req)
	if err != nil {
		return meta{}, err
	}
	b, err := json.Marshal(norm)
	if err != nil {
		return meta{}, err
	}
	key := string(b)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return p.a.createSession(req, true)
	}
	if key != p.key {
		old := p.ready
		p.key, p.spec, p.ready = key, *norm, nil
		for _, m := range old {
			p.retireLocked(m.ID)
		}
	}
	var m meta
	ok := len(p.ready) > 0
	if ok {
		m, p.ready = p.ready[0], p.ready[1:]
		p.stats.Hits++
	} else {
		p.stats.Misses++
	}
	p.mu.Unlock()
	if ok {
		return m, nil
	}
	return p.a.createSession(req, true)
}

// refillLocked queues the refill unless it is queued or not needed.
func (p *sessionPool) refillLocked() {
	if p.filling || p.closed || len(p.ready) >= p.size {
		return
	}
	p.filling = true
	p.jobs = append([]func(){p.fillOne}, p.jobs...) // before the destroys
	p.cond.Signal()
}

// fillOne makes one session of the current sandbox and queues itself
// again until the pool holds size, the guest runs short of memory, a
// create fails or the pool closes.
func (p *sessionPool) fillOne() {
	p.mu.Lock()
	key, spec := p.key, p.spec
	if p.closed || len(p.ready) >= p.size || !memoryForPool() {
		p.filling = false
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	start := time.Now()
	m, err := p.a.createSession(wire.SessionCreate{ID: oneShotID(), Sandbox: &spec}, true)
	took := time.Since(start)
	if err == nil && p.a.res != nil {
		p.a.res.threads.prepare(m) // its confined thread, made behind this job
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err != nil:
		p.filling = false
		p.a.cfg.Logger.Warn("one-shot pool: making a session", "err", err)
		return
	case p.closed || key != p.key:
		p.retireLocked(m.ID)
	default:
		p.ready = append(p.ready, m)
		p.stats.Made++
		p.stats.MakeMS += took.Milliseconds()
	}
	p.filling = false
	p.refillLocked()
}

// runEnded is called after a run that took a session: it destroys that
// session and refills the pool, both in the background.
// With maxPendingJobs queued already, the run destroys its session
// itself: the sessions waiting for their destroy are bounded.
func (p *sessionPool) runEnded(id string) {
	p.mu.Lock()
	now := p.closed || p.pending >= maxPendingJobs
	if !now {
		p.queueDestroyLocked(id)
	}
	p.refillLocked()
	p.mu.Unlock()
	if now {
		p.a.destroyOneShot(id)
	}
}

func (p *sessionPool) retireLocked(id string) {
	if p.closed {
		p.a.destroyOneShot(id)
		return
	}
	p.queueDestroyLocked(id)
}

// close waits for the jobs queued so far and destroys the ready
// sessions; the pool makes no session after it.
func (p *sessionPool) close() {
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.cond.Broadcast()
	p.mu.Unlock()
	<-p.done
	for _, m := range ready {
		p.a.destroyOneShot(m.ID)
	}
}

// recover destroys the one-shot sessions a helper before this one left.
// Only the resident helper makes them, and only one helper runs (its
// serve lock): none of them is this helper's.
func (p *sessionPool) recover() {
	metas, err := p.a.readAllMeta()
	if err != nil {
		p.a.cfg.Logger.Warn("one-shot pool: listing sessions", "err", err)
		return
	}
	for _, m := range metas {
		if m.OneShot {
			p.a.destroyOneShot(m.ID)
		}
	}
}

// destroyOneShot destroys one-shot session id: its processes are killed
// without the lock (nothing else joins a one-shot session, and its run
// has ended), which is then taken only to remove its files.
//
// A session tracked by its cgroup whose cgroup holds no process (its
// cgroup.events, which counts the groups below) has none left: its run's
// process was started in its run cgroup (CLONE_INTO_CGROUP), every
// descendant stays in the session's subtree (moving out takes writing a
// cgroup.procs of root's, which its uid cannot, and no capability), its
// uid is its own, and no process enters it from outside but the helper's
// next fork, which a one-shot session never gets. Its destroy then skips
// the kill's scan of every process (tens of milliseconds on an emulated
// guest, the most of a destroy).
func (a *Agent) destroyOneShot(id string) {
	ctx := context.Background()
	start := time.Now()
	t, res := a.sessionTree(id)
	var err error
	if t.cgroup == "" || cgroupPopulated(t.cgroup) {
		err = a.killSession(ctx, t, &res)
		a.stepTook("destroy kill", time.Since(start))
	}
	if err == nil {
		var unlock func()
		if unlock, err = a.lock(); err == nil {
			t0 := time.Now()
			_, err = a.removeSessionLocked(id, t, 0, res, start)
			a.stepTook("destroy remove", time.Since(t0))
			unlock()
		}
	}
	if err != nil {
		a.cfg.Logger.Error("run: one-shot sandbox: destroy", "session", id, "err", err)
	}
}

// cgroupPopulated reports whether a process is in cgroup dir or below
// (cgroup.events); an unreadable file says yes.
func cgroupPopulated(dir string) bool {
	b, err := os.ReadFile(dir + "/cgroup.events")
	return err != nil || bytes.Contains(b, []byte("populated 1"))
}

// memoryForPool reports whether the guest has poolMinAvailable memory
// available (MemAvailable of /proc/meminfo); an unreadable figure says no.
func memoryForPool() bool {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("MemAvailable:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return false
		}
		kb, err := strconv.ParseUint(string(f[0]), 10, 64)
		return err == nil && kb<<10 >= poolMinAvailable
	}
	return false
}

// oneShotSession makes or takes the session of a one-shot sandbox and
// returns req in it, the session (which the run joins without the lock)
// and the function that destroys it: the pool's runEnded in the resident
// helper, a destroy in this call in a process per command.
func (a *Agent) oneShotSession(ctx context.Context, req wire.RunRequest) (wire.RunRequest, *meta, func(), error) {
	var m meta
	var err error
	var end func()
	if a.res != nil && a.res.pool != nil {
		m, err = a.res.pool.take(req.Sandbox)
		end = func() {
			// What the command left in its cgroup is killed before the
			// reply (one write to cgroup.kill); the destroy, with its
			// scan of every process, follows in the background.
			if cg := a.sessionCgroup(m.ID); m.Tracking == wire.TrackCgroup && cgroupPopulated(cg) {
				killCgroup(cg)
			}
			a.res.pool.runEnded(m.ID)
		}
	} else {
		m, err = a.createSession(wire.SessionCreate{ID: oneShotID(), Sandbox: req.Sandbox}, false)
		end = func() {
			if _, derr := a.SessionDestroy(context.WithoutCancel(ctx), m.ID); derr != nil {
				a.cfg.Logger.Error("run: one-shot sandbox: destroy", "session", m.ID, "err", derr)
			}
		}
	}
	if err != nil {
		return req, nil, nil, fmt.Errorf("run: one-shot sandbox: %w", err)
	}
	req.Sandbox, req.Session = nil, m.ID
	return req, &m, end, nil
}
