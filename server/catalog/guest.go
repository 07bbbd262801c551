package catalog

import (
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy/store"
)

// The vmgate-guest helper as the tools use it: the session and process
// tools (tools/sessions.go, tools/processes.go, and vm_agent_exec with a
// session in tools/exec.go) run through internal/guestctl, which pushes
// vmgate-guest into a guest that lacks it.

// ErrNoHelper is the message of the session tools on a host without
// vmgate-guest builds.
const ErrNoHelper = "the vmgate-guest helper is not available on this host (build it with make build)"

// Guest is vmgate-guest as the tools use it: a helper over each backend's
// driver, and the store of sessions. Its fields are fixed by NewGuest.
type Guest struct {
	// Sessions keeps every session with its grant and VM; the source of
	// truth for who may use a session and when it expires.
	Sessions store.Sessions
	// Helpers are the helpers by backend name.
	Helpers map[string]*guestctl.Helper
	bins    guestctl.Binaries
	now     func() time.Time
	log     *slog.Logger
}

// NewGuest makes the helpers of backends from bins (nil: the host's
// builds, guestctl.DefaultBinaries) over the session store sessions.
func NewGuest(sessions store.Sessions, bins guestctl.Binaries, backends map[string]hypervisor.Driver, now func() time.Time, log *slog.Logger) *Guest {
	if bins == nil {
		bins = guestctl.DefaultBinaries()
	}
	g := &Guest{Sessions: sessions, Helpers: make(map[string]*guestctl.Helper, len(backends)), bins: bins, now: now, log: log}
	for name, d := range backends {
		g.Helpers[name] = guestctl.New(d, bins)
	}
	return g
}

// Available reports whether the host has a vmgate-guest build at all.
func (g *Guest) Available() bool {
	for _, arch := range []string{"amd64", "arm64"} {
		if _, err := g.bins.Binary(arch); err == nil {
			return true
		}
	}
	return false
}

// HelperFor returns c's helper, or a result to return when the host has
// no vmgate-guest build.
func (g *Guest) HelperFor(c *Call) (*guestctl.Helper, *Result) {
	if !g.Available() {
		r := Failure(TagBackend, ErrNoHelper, true)
		return nil, &r
	}
	h := g.Helpers[c.Backend]
	if h == nil { // the gate found the backend, so this cannot happen
		r := Failure(TagBackend, "no helper for backend "+c.Backend, true)
		return nil, &r
	}
	return h, nil
}

// HelperFailure maps a helper error to a tagged result; details go to the
// audit log.
func HelperFailure(err error) Result {
	var he *guestctl.Error
	var re *guestctl.ReplyError
	switch {
	case errors.Is(err, guestctl.ErrNoBinary):
		r := Failure(TagBackend, "no vmgate-guest build for this guest's architecture (build it with make build)", true)
		r.Detail = err.Error()
		return r
	case errors.As(err, &he):
		r := Result{Tag: TagInvalid, Text: GuestCause(CleanReason(he.Message)), Detail: err.Error()}
		switch he.Code {
		case wire.CodeRefused:
			r.Text, r.NoEffect = "refused: "+he.Reason, true
			r.Structured = map[string]any{"error": strings.Trim(TagInvalid, "[]"), "message": r.Text, "refused": he.Reason}
		case wire.CodeNotFound, wire.CodeInvalid:
			r.NoEffect = true
		case wire.CodeExists:
			r.Tag, r.NoEffect = TagBackend, true
		default:
			r.Tag, r.Text = TagBackend, "the guest helper failed: "+r.Text
		}
		return r
	case errors.As(err, &re):
		r := Failure(TagBackend, "vmgate-guest gave a reply that is not its JSON ("+CleanReason(Truncate(re.Error(), 200))+"); retry", false)
		r.Detail = err.Error()
		return r
	}
	return DriverFailure(err)
}

// unknownSession is the one answer for every session a grant may not use.
func unknownSession() Result {
	return Failure(TagInvalid, "unknown session", true)
}

// OwnedSession finds session id for c's grant on c's VM. Another grant's
// session, one on another VM and one that never existed are all unknown;
// live says whether it has not been deleted.
func (g *Guest) OwnedSession(c *Call, id string) (store.Session, *Result) {
	if wire.ValidateSessionID(id) != nil {
		r := unknownSession()
		return store.Session{}, &r
	}
	sess, err := g.Sessions.GetSession(c.Ctx, id)
	switch {
	case errors.Is(err, store.ErrUnknownSession):
		r := unknownSession()
		return store.Session{}, &r
	case err != nil:
		r := StoreFailure(err)
		return store.Session{}, &r
	case sess.Grant != c.Grant.Name || sess.VM != c.VM:
		r := unknownSession()
		return store.Session{}, &r
	}
	return sess, nil
}

// touchEvery is how stale a session's recorded last use may be before a
// call in it writes it again. The write is a commit of the session store
// (bbolt: two fsyncs), which every command in a session paid on top of a
// plain one; idle limits are whole seconds, so a last use kept to the
// second ends an idle session at most a second before its idle_s.
const touchEvery = time.Second

// LiveSession is OwnedSession for a session that must still exist, touched
// as used now (written when its recorded last use is touchEvery old).
func (g *Guest) LiveSession(c *Call, id string) (store.Session, *Result) {
	sess, r := g.OwnedSession(c, id)
	if r != nil {
		return sess, r
	}
	now := g.now()
	if !sess.Deleted.IsZero() || sess.Expired(now) {
		rr := Failure(TagInvalid, "session "+id+" has ended", true)
		return sess, &rr
	}
	if now.Sub(sess.LastUsed) < touchEvery {
		return sess, nil
	}
	if err := g.Sessions.TouchSession(c.Ctx, id, now); err != nil {
		if errors.Is(err, store.ErrUnknownSession) {
			rr := Failure(TagInvalid, "session "+id+" has ended", true)
			return sess, &rr
		}
		rr := StoreFailure(err)
		return sess, &rr
	}
	return sess, nil
}

// StoreFailure is the result of a session store that did not answer.
func StoreFailure(err error) Result {
	r := Failure(TagBackend, "the session store did not answer; try again", true)
	r.Detail = err.Error()
	return r
}
