package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
)

// The session reaper: destroys sessions past their ttl or idle time (the
// store decides) and forgets those the guest's own reap destroyed.

// DefaultReapEvery is how often the reaper runs when Config.ReapEvery is 0.
// A negative Config.ReapEvery disables it.
const DefaultReapEvery = 30 * time.Second

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
			g.s.undo.reap(ctx)
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
		cctx, cancel := context.WithTimeout(ctx, guestctl.CommandTimeout)
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
		cctx, cancel := context.WithTimeout(ctx, guestctl.CommandTimeout)
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
