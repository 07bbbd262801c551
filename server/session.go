package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/guest/helper"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// Sessions and processes (create_session, list_sessions, destroy_session,
// list_processes, kill_process, vm_agent_exec with session) run through
// the vmgate-guest helper (guest/helper), which pushes itself into a guest
// that lacks it.
//
// A session id is minted here (helper.NewSessionID: 128 random bits) and
// stored with the grant that created it and its VM in Config.Sessions (the
// store, when it keeps sessions; otherwise in memory, and a restart forgets
// them). A session of another grant, on another VM, or one that never
// existed all give the same "[INVALID ARGUMENT] unknown session", so ids
// cannot be probed. The store is the source of truth for expiry: every use
// (exec in the session, list_processes of it) touches it, and the reaper
// destroys sessions past their ttl or idle time. The guest gets the ttl
// only, as a backstop the reaper's SessionReap applies.
//
// Guard refusals of kill_process (pid 1, kernel threads, the guest agent,
// vmgate-guest itself, a reused pid) are not policy decisions: they are
// "[INVALID ARGUMENT] refused: <reason>", with the reason in the structured
// result's "refused" field.

// DefaultReapEvery is how often the reaper runs when Config.ReapEvery is 0.
// A negative Config.ReapEvery disables it.
const DefaultReapEvery = 30 * time.Second

// errNoHelper is the message of the session tools on a host without
// vmgate-guest builds.
const errNoHelper = "the vmgate-guest helper is not available on this host (build it with make build)"

// guestTools is the server's session and helper state. The helpers and the
// session store are fixed after New; cancel and done belong to the reaper.
type guestTools struct {
	s        *Server
	sessions store.Sessions
	bins     helper.Binaries
	helpers  map[string]*helper.Helper // backend name -> helper over its driver
	every    time.Duration

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}
}

func newGuestTools(s *Server, cfg Config) *guestTools {
	g := &guestTools{s: s, sessions: cfg.Sessions, bins: cfg.GuestBinaries, every: cfg.ReapEvery, helpers: map[string]*helper.Helper{}}
	if g.sessions == nil {
		if ss, ok := cfg.Store.(store.Sessions); ok {
			g.sessions = ss
		} else {
			s.log.Warn("server: the store keeps no sessions; they are kept in memory and a restart forgets them")
			g.sessions = memory.NewSessions()
		}
	}
	if g.bins == nil {
		g.bins = helper.DefaultBinaries()
	}
	for name, d := range s.backends {
		g.helpers[name] = helper.New(d, g.bins)
	}
	if g.every == 0 {
		g.every = DefaultReapEvery
	}
	if g.every > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		g.cancel, g.done = cancel, make(chan struct{})
		go g.reapLoop(ctx)
	}
	return g
}

// stop ends the reaper and waits for it.
func (g *guestTools) stop() {
	g.stopOnce.Do(func() {
		if g.cancel != nil {
			g.cancel()
			<-g.done
		}
	})
}

// available reports whether the host has a vmgate-guest build at all.
func (g *guestTools) available() bool {
	for _, arch := range []string{"amd64", "arm64"} {
		if _, err := g.bins.Binary(arch); err == nil {
			return true
		}
	}
	return false
}

// helperFor returns c's helper, or a result to return when the host has
// no vmgate-guest build.
func (g *guestTools) helperFor(c *call) (*helper.Helper, *result) {
	if !g.available() {
		r := failure(TagBackend, errNoHelper, true)
		return nil, &r
	}
	h := g.helpers[c.backend]
	if h == nil { // resolveVM found the backend, so this cannot happen
		r := failure(TagBackend, "no helper for backend "+c.backend, true)
		return nil, &r
	}
	return h, nil
}

// unknownSession is the one answer for every session a grant may not use.
func unknownSession() result {
	return failure(TagInvalid, "unknown session", true)
}

// ownedSession finds session id for c's grant on c's VM. Another grant's
// session, one on another VM and one that never existed are all unknown;
// live says whether it has not been deleted.
func (g *guestTools) ownedSession(c *call, id string) (store.Session, *result) {
	if wire.ValidateSessionID(id) != nil {
		r := unknownSession()
		return store.Session{}, &r
	}
	sess, err := g.sessions.GetSession(c.ctx, id)
	switch {
	case errors.Is(err, store.ErrUnknownSession):
		r := unknownSession()
		return store.Session{}, &r
	case err != nil:
		r := storeFailure(err)
		return store.Session{}, &r
	case sess.Grant != c.grant.Name || sess.VM != c.vm:
		r := unknownSession()
		return store.Session{}, &r
	}
	return sess, nil
}

// liveSession is ownedSession for a session that must still exist, touched
// as used now.
func (g *guestTools) liveSession(c *call, id string) (store.Session, *result) {
	sess, r := g.ownedSession(c, id)
	if r != nil {
		return sess, r
	}
	now := g.s.now()
	if !sess.Deleted.IsZero() || sess.Expired(now) {
		rr := failure(TagInvalid, "session "+id+" has ended", true)
		return sess, &rr
	}
	if err := g.sessions.TouchSession(c.ctx, id, now); err != nil {
		if errors.Is(err, store.ErrUnknownSession) {
			rr := failure(TagInvalid, "session "+id+" has ended", true)
			return sess, &rr
		}
		rr := storeFailure(err)
		return sess, &rr
	}
	return sess, nil
}

func storeFailure(err error) result {
	r := failure(TagBackend, "the session store did not answer; try again", true)
	r.detail = err.Error()
	return r
}

// helperFailure maps a helper error to a tagged result; details go to the
// audit log.
func helperFailure(err error) result {
	var he *helper.Error
	var re *helper.ReplyError
	switch {
	case errors.Is(err, helper.ErrNoBinary):
		r := failure(TagBackend, "no vmgate-guest build for this guest's architecture (build it with make build)", true)
		r.detail = err.Error()
		return r
	case errors.As(err, &he):
		r := result{tag: TagInvalid, text: he.Message, detail: err.Error()}
		switch he.Code {
		case wire.CodeRefused:
			r.text, r.noEffect = "refused: "+he.Reason, true
			r.structured = map[string]any{"error": strings.Trim(TagInvalid, "[]"), "message": r.text, "refused": he.Reason}
		case wire.CodeNotFound, wire.CodeInvalid:
			r.noEffect = true
		case wire.CodeExists:
			r.tag, r.noEffect = TagBackend, true
		default:
			r.tag, r.text = TagBackend, "the guest helper failed: "+truncate(he.Message, 300)
		}
		return r
	case errors.As(err, &re):
		r := failure(TagBackend, "vmgate-guest gave a reply that is not its JSON (details in the audit log)", false)
		r.detail = err.Error()
		return r
	}
	return driverFailure(err)
}

// sessionView is a session as the tools show it.
func sessionView(sess store.Session) map[string]any {
	out := map[string]any{
		"session": sess.ID, "vm": sess.VM, "created": sess.Created.UTC(), "last_used": sess.LastUsed.UTC(),
		"workdir": sess.Workdir, "tracking": sess.Tracking,
		"limits": map[string]any{"memory_mb": sess.Limits.MemoryMB, "pids": sess.Limits.Pids, "cpu_percent": sess.Limits.CPUPercent},
	}
	if sess.TTL > 0 {
		out["ttl_s"] = int64(sess.TTL / time.Second)
		out["expires_at"] = sess.Created.Add(sess.TTL).UTC()
	}
	if sess.Idle > 0 {
		out["idle_s"] = int64(sess.Idle / time.Second)
		out["idle_expires_at"] = sess.LastUsed.Add(sess.Idle).UTC()
	}
	return out
}

func (s *Server) runCreateSession(c *call) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	var limits store.SessionLimits
	if m, ok := c.args["limits"].(map[string]any); ok {
		limits.MemoryMB, _ = m["memory_mb"].(int64)
		limits.Pids, _ = m["pids"].(int64)
		limits.CPUPercent, _ = m["cpu_percent"].(int64)
	}
	ttl, _ := c.args["ttl_s"].(int64)
	idle, _ := c.args["idle_s"].(int64)
	wl := wire.Limits{MemoryMB: limits.MemoryMB, Pids: limits.Pids, CPUPercent: limits.CPUPercent}
	if err := wl.Validate(); err != nil {
		return failure(TagInvalid, "limits: "+err.Error(), true)
	}
	sess := store.Session{
		ID: helper.NewSessionID(), Grant: c.grant.Name, VM: c.vm, Created: s.now(),
		TTL: time.Duration(ttl) * time.Second, Idle: time.Duration(idle) * time.Second, Limits: limits,
	}
	// The store first: a session the guest has is always one the server knows.
	if err := g.sessions.CreateSession(c.ctx, sess); err != nil {
		return storeFailure(err)
	}
	gs, err := h.SessionCreate(c.ctx, c.name, helper.SessionCreate{ID: sess.ID, TTLS: ttl, Limits: wl})
	if err != nil {
		if _, derr := g.sessions.DeleteSession(context.WithoutCancel(c.ctx), sess.ID, s.now()); derr != nil {
			s.log.Error("server: forget a session the guest did not create", "session", sess.ID, "err", derr)
		}
		if !errors.Is(err, helper.ErrRefused) && !errors.Is(err, hypervisor.ErrInvalidArgument) {
			// The guest may have made part of it: clean up what is there.
			if _, derr := h.SessionDestroy(context.WithoutCancel(c.ctx), c.name, sess.ID); derr != nil {
				s.log.Warn("server: clean up a failed session", "vm", c.vm, "session", sess.ID, "err", derr)
			}
		}
		return helperFailure(err)
	}
	sess.Workdir, sess.Tracking = gs.Workdir, string(gs.Tracking)
	out := sessionView(sess)
	text := fmt.Sprintf("session %s in %s (workdir %s, tracked by %s)", sess.ID, c.vm, gs.Workdir, gs.Tracking)
	return success(out, text)
}

func (s *Server) runListSessions(c *call) result {
	// A named VM must exist: sessions are listed from the store, which
	// would answer "none" for any name. Only the backend's "no such VM"
	// refuses; a backend that cannot answer leaves the store's answer.
	if c.vm != "" {
		if _, err := c.driver.Status(c.ctx, c.name); errors.Is(err, hypervisor.ErrUnknownVM) {
			return driverFailure(err)
		}
	}
	g := s.guest
	if !g.available() {
		return failure(TagBackend, errNoHelper, true)
	}
	list, err := g.sessions.ListSessions(c.ctx, c.grant.Name, c.vm)
	if err != nil {
		return storeFailure(err)
	}
	now := s.now()
	views := []map[string]any{}
	byVM := map[string][]map[string]any{}
	for _, sess := range list {
		if !c.grant.vmVisible(sess.VM) || sess.Expired(now) {
			continue
		}
		v := sessionView(sess)
		views = append(views, v)
		byVM[sess.VM] = append(byVM[sess.VM], v)
	}
	// Member counts come from the guests; a guest that does not answer is
	// reported, not fatal (the store already answered who owns what).
	var errs []map[string]string
	var details []string
	for vm, vs := range byVM {
		backend, name, _ := strings.Cut(vm, "/")
		h := g.helpers[backend]
		if h == nil {
			continue
		}
		gl, err := h.SessionList(c.ctx, name)
		if err != nil {
			errs = append(errs, map[string]string{"vm": vm, "error": helperFailure(err).text})
			details = append(details, vm+": "+err.Error())
			continue
		}
		counts := make(map[string]int, len(gl))
		for _, gs := range gl {
			counts[gs.ID] = gs.Processes
		}
		for _, v := range vs {
			n, ok := counts[v["session"].(string)]
			v["processes"] = n
			v["in_guest"] = ok
		}
	}
	out := map[string]any{"sessions": views}
	if errs != nil {
		out["errors"] = errs
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d session(s)", len(views))
	for _, v := range views {
		fmt.Fprintf(&b, "\n%s %s", v["session"], v["vm"])
		if n, ok := v["processes"]; ok {
			fmt.Fprintf(&b, " %d process(es)", n)
		}
	}
	for _, e := range errs {
		fmt.Fprintf(&b, "\n%s: %s", e["vm"], e["error"])
	}
	r := success(out, b.String())
	r.detail = strings.Join(details, "; ")
	return r
}

func (s *Server) runDestroySession(c *call) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	id := c.args["session"].(string)
	sess, r := g.ownedSession(c, id)
	if r != nil {
		return *r
	}
	if !sess.Deleted.IsZero() {
		out := map[string]any{"session": id, "vm": c.vm, "existed": false, "destroyed_at": sess.Deleted.UTC()}
		return success(out, fmt.Sprintf("session %s was already gone (destroyed at %s)", id, sess.Deleted.UTC().Format(time.RFC3339)))
	}
	dr, err := h.SessionDestroy(c.ctx, c.name, id)
	if err != nil {
		return helperFailure(err)
	}
	if _, err := g.sessions.DeleteSession(c.ctx, id, s.now()); err != nil && !errors.Is(err, store.ErrUnknownSession) {
		r := failure(TagBackend, "the session was destroyed in the guest but the store did not record it; destroy it again", false)
		r.detail = err.Error()
		return r
	}
	out := map[string]any{"session": id, "vm": c.vm, "existed": dr.Existed, "killed": dr.Killed, "took_ms": dr.TookMS}
	if !dr.Existed {
		return success(out, fmt.Sprintf("session %s was already gone in the guest", id))
	}
	return success(out, fmt.Sprintf("destroyed session %s: killed %d process(es), removed its files", id, dr.Killed))
}

func (g *guestTools) reapLoop(ctx context.Context) {
	defer close(g.done)
	t := time.NewTicker(g.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.reap(ctx)
		}
	}
}

// reapReport says what one reaper pass did.
type reapReport struct {
	Destroyed []string // expired in the store, destroyed in the guest and forgotten
	Reaped    []string // destroyed by the guest's own reap and forgotten
	Errors    []error
}

// reap destroys the sessions the store says have expired and forgets them,
// then runs the guest's own reap on every VM that still has live sessions
// and forgets what it destroyed.
func (g *guestTools) reap(ctx context.Context) reapReport {
	var rep reapReport
	now := g.s.now()
	list, err := g.sessions.ListSessions(ctx, "", "")
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("server: reap: %w", err))
		g.s.log.Warn("server: reap: list sessions", "err", err)
		return rep
	}
	live := map[string]map[string]bool{} // vm -> live session ids
	for _, sess := range list {
		backend, name, _ := strings.Cut(sess.VM, "/")
		h := g.helpers[backend]
		if !sess.Expired(now) {
			if h != nil {
				if live[sess.VM] == nil {
					live[sess.VM] = map[string]bool{}
				}
				live[sess.VM][sess.ID] = true
			}
			continue
		}
		if h == nil {
			// The backend is gone from the config: nothing to destroy with.
			g.forget(ctx, sess.ID, now, &rep)
			rep.Destroyed = append(rep.Destroyed, sess.ID)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, helper.CommandTimeout)
		_, err := h.SessionDestroy(cctx, name, sess.ID)
		cancel()
		if err != nil && !errors.Is(err, hypervisor.ErrUnknownVM) {
			rep.Errors = append(rep.Errors, fmt.Errorf("server: reap %s %s: %w", sess.VM, sess.ID, err))
			g.s.log.Warn("server: reap: destroy", "vm", sess.VM, "session", sess.ID, "err", err)
			continue
		}
		g.forget(ctx, sess.ID, now, &rep)
		rep.Destroyed = append(rep.Destroyed, sess.ID)
		g.s.log.Info("server: reaped an expired session", "vm", sess.VM, "session", sess.ID)
	}
	for vm, ids := range live {
		backend, name, _ := strings.Cut(vm, "/")
		cctx, cancel := context.WithTimeout(ctx, helper.CommandTimeout)
		res, err := g.helpers[backend].SessionReap(cctx, name)
		cancel()
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Errorf("server: reap %s: %w", vm, err))
			g.s.log.Warn("server: reap: guest reap", "vm", vm, "err", err)
			continue
		}
		for _, d := range res.Destroyed {
			if ids[d.ID] {
				g.forget(ctx, d.ID, now, &rep)
				rep.Reaped = append(rep.Reaped, d.ID)
			}
		}
	}
	return rep
}

func (g *guestTools) forget(ctx context.Context, id string, now time.Time, rep *reapReport) {
	if _, err := g.sessions.DeleteSession(ctx, id, now); err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("server: reap: forget %s: %w", id, err))
		g.s.log.Warn("server: reap: forget", "session", id, "err", err)
	}
}
