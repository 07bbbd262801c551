package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/catalog"
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

func createSessionTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "create_session", Title: "Create a session",
		Desc: "Create a session in a VM: a work directory whose processes are tracked together and can be limited " +
			"and destroyed as one. Its processes are confined (sandbox): by default an unprivileged user of their own, " +
			"writes only in the session's directories, no network; the policy sets the loosest sandbox a call may ask for. " +
			"The result says what this guest enforces. vmgate installs its vmgate-guest helper in the VM on first use.",
		Fields: []catalog.Field{
			catalog.VMField(true),
			{Name: "ttl_s", Kind: catalog.KindInteger, Desc: "Seconds until the session is destroyed.", Min: 1, Max: 7 * 86400},
			{Name: "idle_s", Kind: catalog.KindInteger, Desc: "Seconds without activity until the session is destroyed; a command of the session still running (wait: false) counts as activity.", Min: 1, Max: 7 * 86400},
			{Name: "limits", Kind: catalog.KindObject, Desc: "Resource limits for the session's processes.", Fields: []catalog.Field{
				{Name: "memory_mb", Kind: catalog.KindInteger, Desc: "Memory cap in MiB.", Min: 1, Max: 1 << 20},
				{Name: "pids", Kind: catalog.KindInteger, Desc: "Cap on the number of processes.", Min: 1, Max: MaxPID},
				{Name: "cpu_percent", Kind: catalog.KindInteger, Desc: "CPU cap in percent of one CPU.", Min: 1, Max: 100000},
			}},
			sandboxField(),
		},
		Output: []map[string]any{sessionShape()},
	}, runCreateSession)
}

func listSessionsTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "list_sessions", Title: "List sessions", ReadOnly: true, Idempotent: true,
		Desc:   "List your sessions, in one VM or in all. vmgate installs its vmgate-guest helper in the VM on first use.",
		Fields: []catalog.Field{catalog.VMField(false)},
		Output: []map[string]any{catalog.OObject(map[string]any{
			"sessions": catalog.OArray(sessionShape()),
			"errors":   catalog.OArray(catalog.OObject(map[string]any{"vm": catalog.OString(), "error": catalog.OString()}, "vm", "error")),
			"lost":     catalog.OArray(catalog.OString()),
		}, "sessions")},
	}, runListSessions)
}

func destroySessionTool() *catalog.Tool {
	return catalog.NewTool(catalog.Tool{
		Name: "destroy_session", Title: "Destroy a session", Destructive: true, Idempotent: true,
		Desc:   "Kill every process of a session and remove its work directory. Destroying a session twice is harmless. vmgate installs its vmgate-guest helper in the VM on first use.",
		Fields: []catalog.Field{catalog.VMField(true), {Name: "session", Kind: catalog.KindString, Desc: "Session id from create_session.", Required: true, MaxLen: 128}},
		Output: []map[string]any{
			catalog.OObject(map[string]any{"session": catalog.OString(), "vm": catalog.OString(), "existed": catalog.OBoolean(), "killed": catalog.ONonNeg(), "took_ms": catalog.ONonNeg(), "files_kept_until": catalog.OTime()}, "session", "vm", "existed", "killed"),
			catalog.OObject(map[string]any{"session": catalog.OString(), "vm": catalog.OString(), "existed": catalog.OBoolean(), "destroyed_at": catalog.OTime()}, "session", "vm", "existed", "destroyed_at"),
		},
	}, runDestroySession)
}

// sessionShape is a session as sessionView shows it (with processes and
// in_guest when list_sessions asked the guest).
func sessionShape() map[string]any {
	return catalog.OObject(map[string]any{
		"session": catalog.OString(), "vm": catalog.OString(), "created": catalog.OTime(), "last_used": catalog.OTime(),
		"workdir": catalog.OString(), "tracking": catalog.OString(),
		"limits": catalog.OObject(map[string]any{"memory_mb": catalog.ONonNeg(), "pids": catalog.ONonNeg(), "cpu_percent": catalog.ONonNeg()}),
		"ttl_s":  catalog.OInteger(), "expires_at": catalog.OTime(), "idle_s": catalog.OInteger(), "idle_expires_at": catalog.OTime(),
		"processes": catalog.ONonNeg(), "in_guest": catalog.OBoolean(),
		"sandbox": sandboxShape(), "enforced": enforcedShape(),
	}, "session", "vm", "created", "last_used", "limits")
}

// sandboxShape is the sandbox a session runs under (wire.Sandbox).
func sandboxShape() map[string]any {
	paths := catalog.OArray(catalog.OString())
	return catalog.OObject(map[string]any{
		"net": catalog.OString(), "user": catalog.OString(),
		"fs":          catalog.OObject(map[string]any{"read": paths, "write": paths}),
		"tcp":         map[string]any{"type": "object"},
		"best_effort": catalog.OArray(catalog.OString()),
	})
}

// enforcedShape is what the guest says holds for a session (wire.Enforced):
// its top level is fixed; the reports inside it (landlock, net, cgroup)
// are the guest's and may grow.
func enforcedShape() map[string]any {
	obj := map[string]any{"type": "object"}
	return catalog.OObject(map[string]any{
		"sandboxed": catalog.OBoolean(), "user": catalog.OString(), "uid": catalog.OInteger(), "gid": catalog.OInteger(),
		"no_new_privs": catalog.OBoolean(), "capabilities": catalog.OString(), "landlock": obj, "net": obj,
		"private_tmp": catalog.OBoolean(), "tmp": catalog.OString(), "cgroup": obj, "membership": catalog.OString(),
		"not_enforced": catalog.OArray(catalog.OString()), "read_only_outside": catalog.OBoolean(), "held_by": obj, "write_blocked": catalog.OArray(obj),
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
	Sandbox *sandboxArg `arg:"sandbox"`
}

// destroySessionArgs are destroy_session's arguments.
type destroySessionArgs struct {
	Session string `arg:"session"`
}

// UndoApplies: a policy's snapshot_before applies to every destroy
// (catalog.Undoable).
func (a *destroySessionArgs) UndoApplies() bool { return true }

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

func runCreateSession(e *catalog.Env, c *catalog.Call, a *createSessionArgs) catalog.Result {
	g := e.Guest
	h, r := g.HelperFor(c)
	if r != nil {
		return *r
	}
	limits := store.SessionLimits{MemoryMB: a.Limits.MemoryMB, Pids: a.Limits.Pids, CPUPercent: a.Limits.CPUPercent}
	ttl, idle := a.TTLS, a.IdleS
	wl := wire.Limits{MemoryMB: limits.MemoryMB, Pids: limits.Pids, CPUPercent: limits.CPUPercent}
	if err := wl.Validate(); err != nil {
		return catalog.Failure(catalog.TagInvalid, "limits: "+err.Error(), true)
	}
	sb, r := wireSandbox(c.Rules.Sandbox)
	if r != nil {
		return *r
	}
	now := e.Now()
	sess := store.Session{
		ID: guestctl.NewSessionID(), Grant: c.Grant.Name, VM: c.VM, Created: now, LastUsed: now,
		TTL: time.Duration(ttl) * time.Second, Idle: time.Duration(idle) * time.Second, Limits: limits,
	}
	// The store first: a session the guest has is always one the server knows.
	if err := g.Sessions.CreateSession(c.Ctx, sess); err != nil {
		return catalog.StoreFailure(err)
	}
	gs, err := h.SessionCreate(c.Ctx, c.Name, guestctl.SessionCreate{ID: sess.ID, TTLS: ttl, Limits: wl, Sandbox: sb})
	if err != nil {
		forgetFailedSession(e, c, h, sess.ID, err)
		return sessionCreateFailure(err)
	}
	sess.Workdir, sess.Tracking = gs.Workdir, string(gs.Tracking)
	out := sessionView(sess)
	addEnforced(out, gs)
	text := fmt.Sprintf("session %s in %s (workdir %s, tracked by %s)\n%s", sess.ID, c.VM, gs.Workdir, gs.Tracking, enforcedText(gs.Enforced))
	return catalog.Success(out, text)
}

// forgetFailedSession undoes what a failed create left: the store's
// record, and whatever part of the session the guest made (unless it
// refused before making anything).
func forgetFailedSession(e *catalog.Env, c *catalog.Call, h *guestctl.Helper, id string, err error) {
	g := e.Guest
	if _, derr := g.Sessions.DeleteSession(context.WithoutCancel(c.Ctx), id, e.Now()); derr != nil {
		e.Log.Error("server: forget a session the guest did not create", "session", id, "err", derr)
	}
	if errors.Is(err, guestctl.ErrRefused) || errors.Is(err, hypervisor.ErrInvalidArgument) {
		return
	}
	if _, derr := h.SessionDestroy(context.WithoutCancel(c.Ctx), c.Name, id); derr != nil {
		e.Log.Warn("server: clean up a failed session", "vm", c.VM, "session", id, "err", derr)
	}
}

// sessionCreateFailure is helperFailure, but a guest whose kernel lacks
// a feature the policy's sandbox requires is a [BACKEND ERROR] (the call
// was fine; the guest cannot confine it) that says who can change that.
func sessionCreateFailure(err error) catalog.Result {
	var he *guestctl.Error
	if errors.As(err, &he) && he.Code == wire.CodeRefused && he.Reason == wire.ReasonSandboxUnavailable {
		r := catalog.Failure(catalog.TagBackend, he.Message+" (best_effort is the grant's policy's to set, in its sandbox block; "+
			"or use a guest whose kernel has the feature)", true)
		r.Detail = err.Error()
		r.Structured = map[string]any{"error": strings.Trim(catalog.TagBackend, "[]"), "message": r.Text, "refused": he.Reason}
		return r
	}
	return catalog.HelperFailure(err)
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

func runListSessions(e *catalog.Env, c *catalog.Call, _ *catalog.NoArgs) catalog.Result {
	// A named VM must exist: sessions are listed from the store, which
	// would answer "none" for any name. Only the backend's "no such VM"
	// refuses; a backend that cannot answer leaves the store's answer.
	if c.VM != "" {
		if _, err := c.Driver.Status(c.Ctx, c.Name); errors.Is(err, hypervisor.ErrUnknownVM) {
			return catalog.DriverFailure(err)
		}
	}
	g := e.Guest
	if !g.Available() {
		return catalog.Failure(catalog.TagBackend, catalog.ErrNoHelper, true)
	}
	list, err := g.Sessions.ListSessions(c.Ctx, c.Grant.Name, c.VM)
	if err != nil {
		return catalog.StoreFailure(err)
	}
	now := e.Now()
	views := []map[string]any{}
	byVM := map[string][]map[string]any{}
	for _, sess := range list {
		if !c.Grant.Sees(sess.VM) || sess.Expired(now) {
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
		h := g.Helpers[backend]
		if h == nil {
			continue
		}
		gl, err := h.SessionList(c.Ctx, name)
		if err != nil {
			errs = append(errs, map[string]string{"vm": vm, "error": catalog.HelperFailure(err).Text})
			details = append(details, vm+": "+err.Error())
			continue
		}
		addGuestViews(vs, gl)
	}
	views, lost := leaveOutLost(views)
	out := map[string]any{"sessions": views}
	if errs != nil {
		out["errors"] = errs
	}
	text := listSessionsText(views, errs)
	if len(lost) > 0 {
		out["lost"] = lost
		text += fmt.Sprintf("\nnot listed: %d session(s) the guest no longer has (lost to a reboot or a snapshot revert): %s", len(lost), strings.Join(lost, ", "))
	}
	r := catalog.Success(out, text)
	r.Detail = strings.Join(details, "; ")
	return r
}

// addGuestViews adds to the views of one VM's sessions what its guest
// says of them (gl): members, enforcement, and the guest's own word on
// where each lives and how its processes are tracked.
func addGuestViews(views []map[string]any, gl []wire.Session) {
	inGuest := make(map[string]wire.Session, len(gl))
	for _, gs := range gl {
		inGuest[gs.ID] = gs
	}
	for _, v := range views {
		gs, ok := inGuest[v["session"].(string)]
		v["processes"] = gs.Processes
		v["in_guest"] = ok
		if ok {
			addEnforced(v, gs)
		}
		if ok && gs.Workdir != "" {
			v["workdir"] = gs.Workdir
		}
		if ok && gs.Tracking != "" {
			v["tracking"] = string(gs.Tracking)
		}
	}
}

// leaveOutLost splits views into the sessions the guest has (or whose
// guest did not answer) and the ids of those its answer lacks: lost to a
// reboot or a revert (the guest keeps its sessions' state where neither
// survives). A session whose create_session has not returned yet may be
// among them; its id is not the agent's yet.
func leaveOutLost(views []map[string]any) (kept []map[string]any, lost []string) {
	kept = views[:0:0]
	for _, v := range views {
		if in, asked := v["in_guest"].(bool); asked && !in {
			lost = append(lost, v["session"].(string))
			continue
		}
		kept = append(kept, v)
	}
	return kept, lost
}

// listSessionsText is list_sessions' text: each session with its members
// and enforcement, then the guests that did not answer.
func listSessionsText(views []map[string]any, errs []map[string]string) string {
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
	return b.String()
}

func runDestroySession(e *catalog.Env, c *catalog.Call, a *destroySessionArgs) catalog.Result {
	g := e.Guest
	h, r := g.HelperFor(c)
	if r != nil {
		return *r
	}
	id := a.Session
	sess, r := g.OwnedSession(c, id)
	if r != nil {
		return *r
	}
	if !sess.Deleted.IsZero() {
		out := map[string]any{"session": id, "vm": c.VM, "existed": false, "destroyed_at": sess.Deleted.UTC()}
		return catalog.Success(out, fmt.Sprintf("session %s was already gone (destroyed at %s)", id, sess.Deleted.UTC().Format(time.RFC3339)))
	}
	dr, err := h.SessionTrash(c.Ctx, c.Name, id, c.Rules.KeepFiles) // tool_trash.go
	if err != nil {
		return catalog.HelperFailure(err)
	}
	if _, err := g.Sessions.DeleteSession(c.Ctx, id, e.Now()); err != nil && !errors.Is(err, store.ErrUnknownSession) {
		r := catalog.Failure(catalog.TagBackend, "the session was destroyed in the guest but the store did not record it; destroy it again", false)
		r.Detail = err.Error()
		return r
	}
	out := map[string]any{"session": id, "vm": c.VM, "existed": dr.Existed, "killed": dr.Killed, "took_ms": dr.TookMS}
	if !dr.Existed {
		return catalog.Success(out, fmt.Sprintf("session %s was already gone in the guest", id))
	}
	if dr.TrashUntilMS > 0 {
		return trashed(out, id, dr)
	}
	return catalog.Success(out, fmt.Sprintf("destroyed session %s: killed %d process(es), removed its files", id, dr.Killed))
}
