package tools

import (
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/server/catalog"
)

// Calls known not to succeed before they run (catalog.Foreseer): the gate
// refuses them instead of parking them for an operator.

var (
	_ catalog.Foreseer = (*destroySessionArgs)(nil)
	_ catalog.Foreseer = (*snapshotNameArgs)(nil)
	_ catalog.Foreseer = (*execArgs)(nil)
)

// Foresee: a timeout_s over the grant's cap is refused when the command
// would run (runExec), so no operator is asked to approve it.
func (a *execArgs) Foresee(e *catalog.Env, c *catalog.Call) *catalog.Result {
	return checkTimeout(e, c, a)
}

// Foresee: a session that is unknown to the grant, or already destroyed,
// cannot be destroyed.
func (a *destroySessionArgs) Foresee(e *catalog.Env, c *catalog.Call) *catalog.Result {
	sess, r := e.Guest.OwnedSession(c, a.Session)
	switch {
	case r != nil && r.Tag == catalog.TagInvalid:
		return r // unknown session (a store that did not answer: park)
	case r != nil || sess.Deleted.IsZero():
		return nil
	}
	rr := catalog.Failure(catalog.TagInvalid, fmt.Sprintf("session %s was already destroyed at %s: there is nothing to destroy, so no operator was asked (list_sessions shows your sessions)",
		a.Session, sess.Deleted.UTC().Format(time.RFC3339)), true)
	return &rr
}

// Foresee: a snapshot the VM does not have cannot be reverted to or
// deleted, nor can one the grant may not touch.
func (a *snapshotNameArgs) Foresee(e *catalog.Env, c *catalog.Call) *catalog.Result {
	sn, r := snapshotterFor(c)
	if r != nil {
		return r
	}
	snap, err := hypervisor.FindSnapshot(c.Ctx, sn, c.Name, a.Name)
	switch {
	case errors.Is(err, hypervisor.ErrSnapshotNotFound):
		rr := catalog.SnapshotFailure(c, a.Name, err)
		return &rr
	case err != nil:
		return nil
	}
	if r := e.Snapshots.MayTouch(c, snap); r != nil && r.Tag == catalog.TagDenied && r.Detail == "" {
		return r // another grant's snapshot (an owner store that did not answer: park)
	}
	return nil
}
