package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// Sessions: create_session, list_sessions and destroy_session, through
// vmgate-guest (guest.go); the reaper that ends them is in reaper.go.
//
// A session id is minted here (guestctl.NewSessionID: 128 random bits) and
// stored with the grant that created it and its VM in Config.Sessions (the
// store, when it keeps sessions; otherwise in memory, and a restart forgets
// them). A session of another grant, on another VM, or one that never
// existed all give the same "[INVALID ARGUMENT] unknown session", so ids
// cannot be probed. The store is the source of truth for expiry: every use
// (exec in the session, list_processes of it) touches it, and the reaper
// destroys sessions past their ttl or idle time. The guest gets the ttl
// only, as a backstop the reaper's SessionReap applies.

func createSessionTool() *toolSpec {
	return newTool(toolSpec{
		name: "create_session", title: "Create a session",
		desc: "Create a session in a VM: a work directory whose processes are tracked together and can be limited " +
			"and destroyed as one. Its processes are confined (sandbox): by default an unprivileged user of their own, " +
			"writes only in the session's directories, no network; the policy sets the loosest sandbox a call may ask for. " +
			"The result says what this guest enforces. vmgate installs its vmgate-guest helper in the VM on first use.",
		fields: []field{
			vmField(true),
			{name: "ttl_s", kind: kindInteger, desc: "Seconds until the session is destroyed.", min: 1, max: 7 * 86400},
			{name: "idle_s", kind: kindInteger, desc: "Seconds without activity until the session is destroyed.", min: 1, max: 7 * 86400},
			{name: "limits", kind: kindObject, desc: "Resource limits for the session's processes.", fields: []field{
				{name: "memory_mb", kind: kindInteger, desc: "Memory cap in MiB.", min: 1, max: 1 << 20},
				{name: "pids", kind: kindInteger, desc: "Cap on the number of processes.", min: 1, max: MaxPID},
				{name: "cpu_percent", kind: kindInteger, desc: "CPU cap in percent of one CPU.", min: 1, max: 100000},
			}},
			sandboxField(),
		},
		output: []map[string]any{sessionShape()},
	}, (*Server).runCreateSession)
}

func listSessionsTool() *toolSpec {
	return newTool(toolSpec{
		name: "list_sessions", title: "List sessions", readOnly: true, idempotent: true,
		desc:   "List your sessions, in one VM or in all. vmgate installs its vmgate-guest helper in the VM on first use.",
		fields: []field{vmField(false)},
		output: []map[string]any{oObject(map[string]any{
			"sessions": oArray(sessionShape()),
			"errors":   oArray(oObject(map[string]any{"vm": oString, "error": oString}, "vm", "error")),
		}, "sessions")},
	}, (*Server).runListSessions)
}

func destroySessionTool() *toolSpec {
	return newTool(toolSpec{
		name: "destroy_session", title: "Destroy a session", destructive: true, idempotent: true,
		desc:   "Kill every process of a session and remove its work directory. Destroying a session twice is harmless. vmgate installs its vmgate-guest helper in the VM on first use.",
		fields: []field{vmField(true), {name: "session", kind: kindString, desc: "Session id from create_session.", required: true, maxLen: 128}},
		output: []map[string]any{
			oObject(map[string]any{"session": oString, "vm": oString, "existed": oBoolean, "killed": oNonNeg, "took_ms": oNonNeg, "files_kept_until": oTime}, "session", "vm", "existed", "killed"),
			oObject(map[string]any{"session": oString, "vm": oString, "existed": oBoolean, "destroyed_at": oTime}, "session", "vm", "existed", "destroyed_at"),
		},
	}, (*Server).runDestroySession)
}

// sandboxField is create_session's sandbox argument. Only its shape is
// checked here (known fields, modes, absolute clean paths, at most
// wire.MaxSandboxPaths of them); whether it is within the policy's is the
// policy's decision (policy/sandbox.go), and whether a path is a symlink
// the guest's (it refuses one).
func sandboxField() field {
	paths := func(name, desc string) field {
		return field{name: name, kind: kindStringArray, desc: desc, maxLen: wire.MaxSandboxPaths, allowEmpty: true, valid: wire.ValidateSandboxPath}
	}
	return field{name: "sandbox", kind: kindObject,
		desc: "How the session's processes are confined; a field left out gets the loosest value the policy allows. " +
			"Asking for more than the policy allows is denied, naming what was too loose.",
		fields: []field{
			{name: "net", kind: kindString, enum: []string{"none", "loopback", "host"},
				desc: "none: a network namespace with only its own loopback; loopback is enforced as none (a stock kernel cannot share the guest's loopback alone); host: the guest's network."},
			{name: "user", kind: kindString, enum: []string{"session", "root"},
				desc: "session: an unprivileged uid and gid of the session's own, no capabilities; root: root, unconfined by uid."},
			{name: "fs", kind: kindObject, desc: "Extra paths beyond the system directories (read) and the session's own directories (write).",
				fields: []field{
					paths("read", "Absolute paths the session may also read and execute (no symlinks)."),
					paths("write", "Absolute paths the session may also write (no symlinks)."),
				}},
		}}
}

// sessionShape is a session as sessionView shows it (with processes and
// in_guest when list_sessions asked the guest).
func sessionShape() map[string]any {
	return oObject(map[string]any{
		"session": oString, "vm": oString, "created": oTime, "last_used": oTime,
		"workdir": oString, "tracking": oString,
		"limits": oObject(map[string]any{"memory_mb": oNonNeg, "pids": oNonNeg, "cpu_percent": oNonNeg}),
		"ttl_s":  oInteger, "expires_at": oTime, "idle_s": oInteger, "idle_expires_at": oTime,
		"processes": oNonNeg, "in_guest": oBoolean,
		"sandbox": sandboxShape(), "enforced": enforcedShape(),
	}, "session", "vm", "created", "last_used", "limits")
}

// sandboxShape is the sandbox a session runs under (wire.Sandbox).
func sandboxShape() map[string]any {
	paths := oArray(oString)
	return oObject(map[string]any{
		"net": oString, "user": oString,
		"fs":          oObject(map[string]any{"read": paths, "write": paths}),
		"tcp":         map[string]any{"type": "object"},
		"best_effort": oArray(oString),
	})
}

// enforcedShape is what the guest says holds for a session (wire.Enforced):
// its top level is fixed; the reports inside it (landlock, net, cgroup)
// are the guest's and may grow.
func enforcedShape() map[string]any {
	obj := map[string]any{"type": "object"}
	return oObject(map[string]any{
		"sandboxed": oBoolean, "user": oString, "uid": oInteger, "gid": oInteger,
		"no_new_privs": oBoolean, "capabilities": oString, "landlock": obj, "net": obj,
		"private_tmp": oBoolean, "tmp": oString, "cgroup": obj, "membership": oString,
		"not_enforced": oArray(oString), "read_only_outside": oBoolean, "held_by": obj, "write_blocked": oArray(obj),
	}, "sandboxed")
}

// createSessionArgs are create_session's arguments; 0 is "not given".
type createSessionArgs struct {
	TTLS   int64 `arg:"ttl_s"`
	IdleS  int64 `arg:"idle_s"`
	Limits struct {
		MemoryMB   int64 `arg:"memory_mb"`
		Pids       int64 `arg:"pids"`
		CPUPercent int64 `arg:"cpu_percent"`
	} `arg:"limits"`
	// Sandbox is what the call asked for; the handler runs the policy's
	// answer to it (call.sandbox), never this.
	Sandbox *struct {
		Net  *string `arg:"net"`
		User *string `arg:"user"`
		FS   *struct {
			Read  []string `arg:"read"`
			Write []string `arg:"write"`
		} `arg:"fs"`
	} `arg:"sandbox"`
}

// destroySessionArgs are destroy_session's arguments.
type destroySessionArgs struct {
	Session string `arg:"session"`
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

// sessionView is a session as the tools show it.
func sessionView(sess store.Session) map[string]any {
	lastUsed := sess.LastUsed
	if lastUsed.IsZero() { // the store's "never used": created
		lastUsed = sess.Created
	}
	out := map[string]any{
		"session": sess.ID, "vm": sess.VM, "created": sess.Created.UTC(), "last_used": lastUsed.UTC(),
		"limits": map[string]any{"memory_mb": sess.Limits.MemoryMB, "pids": sess.Limits.Pids, "cpu_percent": sess.Limits.CPUPercent},
	}
	if sess.Workdir != "" {
		out["workdir"] = sess.Workdir
	}
	if sess.Tracking != "" {
		out["tracking"] = sess.Tracking
	}
	if sess.TTL > 0 {
		out["ttl_s"] = int64(sess.TTL / time.Second)
		out["expires_at"] = sess.Created.Add(sess.TTL).UTC()
	}
	if sess.Idle > 0 {
		out["idle_s"] = int64(sess.Idle / time.Second)
		out["idle_expires_at"] = lastUsed.Add(sess.Idle).UTC()
	}
	return out
}

func (s *Server) runCreateSession(c *call, a *createSessionArgs) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	limits := store.SessionLimits{MemoryMB: a.Limits.MemoryMB, Pids: a.Limits.Pids, CPUPercent: a.Limits.CPUPercent}
	ttl, idle := a.TTLS, a.IdleS
	wl := wire.Limits{MemoryMB: limits.MemoryMB, Pids: limits.Pids, CPUPercent: limits.CPUPercent}
	if err := wl.Validate(); err != nil {
		return failure(TagInvalid, "limits: "+err.Error(), true)
	}
	sb, r := wireSandbox(c.sandbox)
	if r != nil {
		return *r
	}
	now := s.now()
	sess := store.Session{
		ID: guestctl.NewSessionID(), Grant: c.grant.Name, VM: c.vm, Created: now, LastUsed: now,
		TTL: time.Duration(ttl) * time.Second, Idle: time.Duration(idle) * time.Second, Limits: limits,
	}
	// The store first: a session the guest has is always one the server knows.
	if err := g.sessions.CreateSession(c.ctx, sess); err != nil {
		return storeFailure(err)
	}
	gs, err := h.SessionCreate(c.ctx, c.name, guestctl.SessionCreate{ID: sess.ID, TTLS: ttl, Limits: wl, Sandbox: sb})
	if err != nil {
		s.forgetFailedSession(c, h, sess.ID, err)
		return sessionCreateFailure(err)
	}
	sess.Workdir, sess.Tracking = gs.Workdir, string(gs.Tracking)
	out := sessionView(sess)
	addEnforced(out, gs)
	text := fmt.Sprintf("session %s in %s (workdir %s, tracked by %s)\n%s", sess.ID, c.vm, gs.Workdir, gs.Tracking, enforcedText(gs.Enforced))
	return success(out, text)
}

// forgetFailedSession undoes what a failed create left: the store's
// record, and whatever part of the session the guest made (unless it
// refused before making anything).
func (s *Server) forgetFailedSession(c *call, h *guestctl.Helper, id string, err error) {
	g := s.guest
	if _, derr := g.sessions.DeleteSession(context.WithoutCancel(c.ctx), id, s.now()); derr != nil {
		s.log.Error("server: forget a session the guest did not create", "session", id, "err", derr)
	}
	if errors.Is(err, guestctl.ErrRefused) || errors.Is(err, hypervisor.ErrInvalidArgument) {
		return
	}
	if _, derr := h.SessionDestroy(context.WithoutCancel(c.ctx), c.name, id); derr != nil {
		s.log.Warn("server: clean up a failed session", "vm", c.vm, "session", id, "err", derr)
	}
}

// wireSandbox is the policy's sandbox for the call as vmgate-guest takes
// it. Every create_session has one (the policy's default at least): a
// call without one is refused, never run unconfined.
func wireSandbox(sb *policy.Sandbox) (*wire.Sandbox, *result) {
	if sb == nil {
		r := failure(TagDenied, "the policy gave no sandbox for this session, so it is not created", true)
		return nil, &r
	}
	ws := wire.Sandbox{
		Net: wire.NetMode(sb.Net), User: wire.UserMode(sb.User),
		FS: wire.FSAccess{Read: slices.Clone(sb.Read), Write: slices.Clone(sb.Write)},
	}
	if sb.TCP != nil {
		ws.TCP = &wire.TCPPorts{Bind: slices.Clone(sb.TCP.Bind), Connect: slices.Clone(sb.TCP.Connect)}
	}
	for _, f := range sb.BestEffort {
		ws.BestEffort = append(ws.BestEffort, wire.Feature(f))
	}
	if err := ws.Validate(); err != nil {
		r := failure(TagDenied, "the policy's sandbox cannot be sent to the guest: "+err.Error(), true)
		return nil, &r
	}
	return &ws, nil
}

// sessionCreateFailure is helperFailure, but a guest whose kernel lacks
// a feature the policy's sandbox requires is a [BACKEND ERROR] (the call
// was fine; the guest cannot confine it) that says who can change that.
func sessionCreateFailure(err error) result {
	var he *guestctl.Error
	if errors.As(err, &he) && he.Code == wire.CodeRefused && he.Reason == wire.ReasonSandboxUnavailable {
		r := failure(TagBackend, he.Message+" (best_effort is the grant's policy's to set, in its sandbox block; "+
			"or use a guest whose kernel has the feature)", true)
		r.detail = err.Error()
		r.structured = map[string]any{"error": strings.Trim(TagBackend, "[]"), "message": r.text, "refused": he.Reason}
		return r
	}
	return helperFailure(err)
}

// addEnforced adds to a session's view what it asked the guest for and
// what the guest enforces.
func addEnforced(v map[string]any, gs wire.Session) {
	if gs.Sandbox != nil {
		v["sandbox"] = *gs.Sandbox
	}
	v["enforced"] = gs.Enforced
}

// enforcedText is what holds for a session, in one short paragraph.
func enforcedText(e wire.Enforced) string {
	if !e.Sandboxed {
		return "not confined: its processes run as root (tracked and limited only)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "confined: user %s (uid %d, gid %d)", e.User, e.UID, e.GID)
	if e.NoNewPrivs {
		b.WriteString(", no_new_privs")
	}
	fmt.Fprintf(&b, ", capabilities %s", e.Capabilities)
	switch {
	case e.Landlock.FS:
		fmt.Fprintf(&b, "; Landlock ABI %d: %s", e.Landlock.ABI, strings.Join(e.Landlock.Rights, ", "))
		fmt.Fprintf(&b, "; writes only in %s", strings.Join(e.Landlock.Write, ", "))
		if e.Landlock.TCP {
			b.WriteString("; TCP ports limited")
		}
	default:
		b.WriteString("; no Landlock")
	}
	if e.ReadOnlyOutside {
		b.WriteString("; everything else mounted read-only")
	}
	fmt.Fprintf(&b, "; net %s", e.Net.Mode)
	if e.Net.Namespace {
		b.WriteString(" (own network namespace)")
	}
	if e.PrivateTmp {
		b.WriteString("; private /tmp")
	}
	if e.Cgroup.Path != "" {
		fmt.Fprintf(&b, "; cgroup %s (%s)", e.Cgroup.Path, strings.Join(e.Cgroup.Controllers, ", "))
	}
	fmt.Fprintf(&b, "; membership by %s", e.Membership)
	if len(e.NotEnforced) > 0 {
		b.WriteString("\nnot enforced on this guest: " + strings.Join(e.NotEnforced, "; "))
	}
	return b.String()
}

func (s *Server) runListSessions(c *call, _ *noArgs) result {
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
		inGuest := make(map[string]wire.Session, len(gl))
		for _, gs := range gl {
			inGuest[gs.ID] = gs
		}
		for _, v := range vs {
			gs, ok := inGuest[v["session"].(string)]
			v["processes"] = gs.Processes
			v["in_guest"] = ok
			if ok {
				addEnforced(v, gs)
			}
			// The guest's own word on where the session lives and how its
			// processes are tracked.
			if ok && gs.Workdir != "" {
				v["workdir"] = gs.Workdir
			}
			if ok && gs.Tracking != "" {
				v["tracking"] = string(gs.Tracking)
			}
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
		if e, ok := v["enforced"].(wire.Enforced); ok {
			fmt.Fprintf(&b, "\n  %s", strings.ReplaceAll(enforcedText(e), "\n", "\n  "))
		}
	}
	for _, e := range errs {
		fmt.Fprintf(&b, "\n%s: %s", e["vm"], e["error"])
	}
	r := success(out, b.String())
	r.detail = strings.Join(details, "; ")
	return r
}

func (s *Server) runDestroySession(c *call, a *destroySessionArgs) result {
	g := s.guest
	h, r := g.helperFor(c)
	if r != nil {
		return *r
	}
	id := a.Session
	sess, r := g.ownedSession(c, id)
	if r != nil {
		return *r
	}
	if !sess.Deleted.IsZero() {
		out := map[string]any{"session": id, "vm": c.vm, "existed": false, "destroyed_at": sess.Deleted.UTC()}
		return success(out, fmt.Sprintf("session %s was already gone (destroyed at %s)", id, sess.Deleted.UTC().Format(time.RFC3339)))
	}
	dr, err := h.SessionTrash(c.ctx, c.name, id, c.keepFiles) // tool_trash.go
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
	if dr.TrashUntilMS > 0 {
		return trashed(out, id, dr)
	}
	return success(out, fmt.Sprintf("destroyed session %s: killed %d process(es), removed its files", id, dr.Killed))
}
