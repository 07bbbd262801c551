package catalog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/guestctl"
)

// The session reaper's pass: destroys sessions past their ttl or idle time
// (the store decides) and forgets those the guest's own reap destroyed. The
// gate runs it (server/reaper.go).

// ReapReport says what one reaper pass did.
type ReapReport struct {
	Destroyed []string // expired in the store, destroyed in the guest and forgotten
	Reaped    []string // destroyed by the guest's own reap and forgotten
	Errors    []error
}

// Reap destroys the sessions the store says have expired and forgets them,
// then runs the guest's own reap on every VM that still has live sessions
// and forgets what it destroyed.
func (g *Guest) Reap(ctx context.Context) ReapReport {
	var rep ReapReport
	now := g.now()
	list, err := g.Sessions.ListSessions(ctx, "", "")
	if err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("server: reap: %w", err))
		g.log.Warn("server: reap: list sessions", "err", err)
		return rep
	}
	live := map[string]map[string]bool{} // vm -> live session ids
	for _, sess := range list {
		backend, name, _ := strings.Cut(sess.VM, "/")
		h := g.Helpers[backend]
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
			g.log.Warn("server: reap: destroy", "vm", sess.VM, "session", sess.ID, "err", err)
			continue
		}
		g.forget(ctx, sess.ID, now, &rep)
		rep.Destroyed = append(rep.Destroyed, sess.ID)
		g.log.Info("server: reaped an expired session", "vm", sess.VM, "session", sess.ID)
	}
	for vm, ids := range live {
		backend, name, _ := strings.Cut(vm, "/")
		cctx, cancel := context.WithTimeout(ctx, guestctl.CommandTimeout)
		res, err := g.Helpers[backend].SessionReap(cctx, name)
		cancel()
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Errorf("server: reap %s: %w", vm, err))
			g.log.Warn("server: reap: guest reap", "vm", vm, "err", err)
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

func (g *Guest) forget(ctx context.Context, id string, now time.Time, rep *ReapReport) {
	if _, err := g.Sessions.DeleteSession(ctx, id, now); err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("server: reap: forget %s: %w", id, err))
		g.log.Warn("server: reap: forget", "session", id, "err", err)
	}
}
