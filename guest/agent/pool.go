//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

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
//     after that run (retire), never used again: what the command left
//     in the session's cgroup is killed before the reply, and the destroy
//     (a scan of every process, the removal of the session's files)
//     follows in the background, so that a one-shot run costs what a run
//     in a session does. Without cgroup v2 the processes the command left
//     end with that destroy, within milliseconds of the reply. Its metadata says OneShot:
//     no other command joins it, and the host's lists leave it out.
//   - The pool holds sessions of one sandbox at a time (key, the sandbox
//     normalised, as JSON): a run that asks for another empties it and
//     refills it with the new one. It holds at most size sessions and
//     makes none while the guest has less than poolMinAvailable memory
//     available; a run that finds it empty gets a session made for it, as
//     before the pool.
//   - One goroutine refills it, one session at a time, after a run took
//     one. Ready sessions are destroyed when the helper ends (close); a
//     helper that starts destroys the one-shot sessions a helper before it
//     left (recover), ready or in use: their runs died with it.
//
// Concurrency: mu guards every field below it; wg counts the refill and
// the destroys in flight, and close waits for them. Neither a create nor
// a destroy runs under mu.
type sessionPool struct {
	a    *Agent
	size int

	mu      sync.Mutex
	key     string       // the normalised sandbox the ready sessions have
	spec    wire.Sandbox // the same, as a value
	ready   []meta
	filling bool
	closed  bool
	wg      sync.WaitGroup
}

// Pool bounds.
const (
	// DefaultPoolSize is how many ready sessions the pool keeps.
	DefaultPoolSize = 2
	// poolMinAvailable: below this much available memory (MemAvailable)
	// the pool makes no session.
	poolMinAvailable = 64 << 20
	// oneShotPrefix starts a one-shot session's id, pooled or not.
	oneShotPrefix = "oneshot"
)

func newSessionPool(a *Agent, size int) *sessionPool {
	return &sessionPool{a: a, size: size}
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
	}
	p.refillLocked()
	p.mu.Unlock()
	if ok {
		return m, nil
	}
	return p.a.createSession(req, true)
}

// refillLocked starts the refill unless it runs or is not needed.
func (p *sessionPool) refillLocked() {
	if p.filling || p.closed || len(p.ready) >= p.size {
		return
	}
	p.filling = true
	p.wg.Add(1)
	go p.fill()
}

// fill makes sessions until the pool holds size of the current sandbox,
// the guest runs short of memory, a create fails or the pool closes.
func (p *sessionPool) fill() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		key, spec := p.key, p.spec
		if p.closed || len(p.ready) >= p.size || !memoryForPool() {
			p.filling = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		m, err := p.a.createSession(wire.SessionCreate{ID: oneShotID(), Sandbox: &spec}, true)
		p.mu.Lock()
		switch {
		case err != nil:
			p.filling = false
			p.mu.Unlock()
			p.a.cfg.Logger.Warn("one-shot pool: making a session", "err", err)
			return
		case p.closed || key != p.key:
			p.retireLocked(m.ID)
		default:
			p.ready = append(p.ready, m)
		}
		p.mu.Unlock()
	}
}

// retire destroys a one-shot session after its run, in the background
// while the pool is open.
func (p *sessionPool) retire(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retireLocked(id)
}

func (p *sessionPool) retireLocked(id string) {
	if p.closed {
		p.a.destroyOneShot(id)
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.a.destroyOneShot(id)
	}()
}

// close destroys the ready sessions and waits for the refill and every
// destroy in flight; the pool makes no session after it.
func (p *sessionPool) close() {
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, m := range ready {
		p.a.destroyOneShot(m.ID)
	}
	p.wg.Wait()
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
func (a *Agent) destroyOneShot(id string) {
	ctx := context.Background()
	start := time.Now()
	t, res := a.sessionTree(id)
	err := a.killSession(ctx, t, &res)
	if err == nil {
		var unlock func()
		if unlock, err = a.lock(); err == nil {
			_, err = a.removeSessionLocked(id, t, 0, res, start)
			unlock()
		}
	}
	if err != nil {
		a.cfg.Logger.Error("run: one-shot sandbox: destroy", "session", id, "err", err)
	}
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
// and the function that destroys it: the pool's retire in the resident
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
			if m.Tracking == wire.TrackCgroup {
				killCgroup(a.sessionCgroup(m.ID))
			}
			a.res.pool.retire(m.ID)
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
