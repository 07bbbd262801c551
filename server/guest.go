package server

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agent/wire"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// The vmgate-guest helper as the server uses it: the session and process
// tools (tool_sessions.go, tool_processes.go, and vm_agent_exec with a
// session in tool_exec.go) run through internal/guestctl, which pushes
// vmgate-guest into a guest that lacks it.

// errNoHelper is the message of the session tools on a host without
// vmgate-guest builds.
const errNoHelper = "the vmgate-guest helper is not available on this host (build it with make build)"

// guestTools is the server's session and helper state. The helpers and the
// session store are fixed after New; cancel and done belong to the reaper.
type guestTools struct {
	s        *Server
	sessions store.Sessions
	bins     guestctl.Binaries
	helpers  map[string]*guestctl.Helper // backend name -> helper over its driver
	every    time.Duration               // the reaper's period (reaper.go)

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}
}

func newGuestTools(s *Server, cfg Config) *guestTools {
	g := &guestTools{s: s, sessions: cfg.Sessions, bins: cfg.GuestBinaries, every: cfg.ReapEvery, helpers: map[string]*guestctl.Helper{}}
	if g.sessions == nil {
		if ss, ok := cfg.Store.(store.Sessions); ok {
			g.sessions = ss
		} else {
			s.log.Warn("server: the store keeps no sessions; they are kept in memory and a restart forgets them")
			g.sessions = memory.NewSessions()
		}
	}
	if g.bins == nil {
		g.bins = guestctl.DefaultBinaries()
	}
	for name, d := range s.backends {
		g.helpers[name] = guestctl.New(d, g.bins)
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
func (g *guestTools) helperFor(c *call) (*guestctl.Helper, *result) {
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

// helperFailure maps a helper error to a tagged result; details go to the
// audit log.
func helperFailure(err error) result {
	var he *guestctl.Error
	var re *guestctl.ReplyError
	switch {
	case errors.Is(err, guestctl.ErrNoBinary):
		r := failure(TagBackend, "no vmgate-guest build for this guest's architecture (build it with make build)", true)
		r.detail = err.Error()
		return r
	case errors.As(err, &he):
		r := result{tag: TagInvalid, text: guestCause(cleanReason(he.Message)), detail: err.Error()}
		switch he.Code {
		case wire.CodeRefused:
			r.text, r.noEffect = "refused: "+he.Reason, true
			r.structured = map[string]any{"error": strings.Trim(TagInvalid, "[]"), "message": r.text, "refused": he.Reason}
		case wire.CodeNotFound, wire.CodeInvalid:
			r.noEffect = true
		case wire.CodeExists:
			r.tag, r.noEffect = TagBackend, true
		default:
			r.tag, r.text = TagBackend, "the guest helper failed: "+r.text
		}
		return r
	case errors.As(err, &re):
		r := failure(TagBackend, "vmgate-guest gave a reply that is not its JSON ("+cleanReason(truncate(re.Error(), 200))+"); retry", false)
		r.detail = err.Error()
		return r
	}
	return driverFailure(err)
}
