package catalog

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
)

// The session reaper's pass: destroys sessions past their ttl or idle time
// (the store decides) and forgets those the guest's own reap destroyed. The
// gate runs it (server/reaper.go).

// ReapReport says what one reaper pass did.
type ReapReport struct {
	Destroyed []string // expired in the store, destroyed in the guest and forgotten
	Reaped    []string // destroyed by the guest's own reap and forgotten
	// Busy are sessions past their idle time (not their ttl) kept because
	// a command of theirs still runs (a wait: false job): a running job is
	// activity, so their last use is now.
	Busy   []string
	Errors []error
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
	running := runningJobs{}
	for _, sess := range list {
		backend, name, _ := strings.Cut(sess.VM, "/")
		h := g.Helpers[backend]
		if sess.Expired(now) && h != nil && !pastTTL(sess, now) {
			if g.keepBusy(ctx, h, name, sess, now, running, &rep) {
				continue
			}
		}
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

// pastTTL reports whether sess is past its ttl (not only its idle time).
func pastTTL(sess store.Session, now time.Time) bool {
	return sess.TTL > 0 && !now.Before(sess.Created.Add(sess.TTL))
}

// runningJobs caches, for one reaper pass, the sessions of each VM with a
// running job (nil: the VM has no resident helper, so no jobs).
type runningJobs map[string]vmJobs

// vmJobs is one VM's entry in runningJobs: the sessions with a running
// job, or failed when its jobs could not be listed in this pass (its other
// sessions are then kept without asking it again).
type vmJobs struct {
	busy   map[string]bool
	failed bool
}

// keepBusy reports whether sess, past its idle time only, is to be kept
// this pass: it has a running job (its last use is then set to now and it
// goes into rep.Busy), or its VM's jobs could not be listed (the error
// goes into rep.Errors, and the next pass asks again: destroying it could
// kill a job that runs). A VM without a resident helper has no jobs.
func (g *Guest) keepBusy(ctx context.Context, h *guestctl.Helper, name string, sess store.Session, now time.Time, running runningJobs, rep *ReapReport) bool {
	vj, listed := running[sess.VM]
	if vj.failed {
		return true // its VM did not answer this pass (the error is in rep once)
	}
	busy := vj.busy
	if !listed {
		cctx, cancel := context.WithTimeout(ctx, guestctl.CommandTimeout)
		jobs, err := h.Jobs(cctx, name)
		cancel()
		switch {
		case errors.Is(err, guestctl.ErrNotResident), errors.Is(err, hypervisor.ErrUnknownVM):
		case err != nil:
			rep.Errors = append(rep.Errors, fmt.Errorf("server: reap %s: list its jobs: %w", sess.VM, err))
			g.log.Warn("server: reap: a session past its idle time is kept until its VM's jobs can be listed", "vm", sess.VM, "session", sess.ID, "err", err)
			running[sess.VM] = vmJobs{failed: true}
			return true
		default:
			busy = map[string]bool{}
			for _, j := range jobs {
				if j.State == wire.JobRunning && j.Session != "" {
					busy[j.Session] = true
				}
			}
		}
		running[sess.VM] = vmJobs{busy: busy}
	}
	if !busy[sess.ID] {
		return false
	}
	if err := g.Sessions.TouchSession(ctx, sess.ID, now); err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("server: reap: touch busy session %s: %w", sess.ID, err))
	}
	rep.Busy = append(rep.Busy, sess.ID)
	g.log.Info("server: a session past its idle time runs a job; kept", "vm", sess.VM, "session", sess.ID)
	return true
}

func (g *Guest) forget(ctx context.Context, id string, now time.Time, rep *ReapReport) {
	if _, err := g.Sessions.DeleteSession(ctx, id, now); err != nil {
		rep.Errors = append(rep.Errors, fmt.Errorf("server: reap: forget %s: %w", id, err))
		g.log.Warn("server: reap: forget", "session", id, "err", err)
	}
}
