package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/argview"
)

// Operators see what they approve: a parked call's approval holds its
// arguments exactly as the call will run with them (store.Approval.FullArgs,
// the JSON its digest is computed from), and the operator's views (the
// operator socket, `vmgate approvals list|show`, /ui) render every one of
// them with argview: stdin, file content and env values as text or a hex
// dump, with their total length. The audit log keeps recording them
// redacted; the store drops them once the approval can no longer let a
// call run. A retry whose arguments differ in any byte has another digest,
// so it parks anew and the approval of what the operator saw stays unused.
//
// Because approvals now hold up to a message's worth of arguments, a grant
// may have at most maxWaitingApprovals approvals waiting (pending, or
// granted and not yet used) holding at most maxWaitingApprovalBytes of
// arguments; a call beyond that is refused with [RATE LIMITED] until the
// oldest expires or is decided.

// The bounds of one grant's waiting approvals.
const (
	maxWaitingApprovals     = 32
	maxWaitingApprovalBytes = 64 << 20
)

// ApprovalPreviewBytes is how much of each argument a list shows; `vmgate
// approvals show ID` and the page of one approval show all of it.
const ApprovalPreviewBytes = 1024

// ApprovalView is an approval as an operator sees it: its arguments
// rendered (FullArgs itself is left out).
type ApprovalView struct {
	store.Approval
	// Arguments are the call's arguments, each at most the view's limit.
	Arguments []argview.Field `json:"arguments,omitempty"`
	// Redacted: the full arguments are no longer kept (the approval ended,
	// or was parked by an older server); Arguments show the redacted ones.
	Redacted bool `json:"redacted,omitempty"`
}

// View renders a with each argument cut to limit bytes (limit <= 0: all).
func View(a store.Approval, limit int) ApprovalView {
	v := ApprovalView{Approval: a}
	v.FullArgs = ""
	v.Arguments, v.Redacted = argview.Of(a.FullArgs, a.Args, limit)
	return v
}

// Get returns approval id as it stands now, with its full arguments while
// it can still let a call run.
func (a *Approvals) Get(ctx context.Context, id string) (store.Approval, error) {
	list, err := a.List(ctx)
	if err != nil {
		return store.Approval{}, err
	}
	for _, ap := range list {
		if ap.ID == id {
			return ap, nil
		}
	}
	return store.Approval{}, fmt.Errorf("server: approvals: get %s: %w", id, store.ErrUnknownApproval)
}

// waiting sums grant's approvals that hold full arguments in list.
func waiting(list []store.Approval, grant string) (n, bytes int, oldest time.Time) {
	for _, a := range list {
		if a.Grant != grant || a.FullArgs == "" || a.State != store.ApprovalPending && a.State != store.ApprovalGranted {
			continue
		}
		n++
		bytes += len(a.FullArgs)
		if oldest.IsZero() || a.Expires.Before(oldest) {
			oldest = a.Expires
		}
	}
	return n, bytes, oldest
}

// parkNew creates the approval of g's call, which has none yet (list is
// the store's approvals, listErr why there are none), and refuses the call
// with its id.
func (g *gating) parkNew(list []store.Approval, listErr error, digest string, ttl time.Duration) verdict {
	s, rec, now, args := g.s, g.rec, g.start, g.args
	unavailable := func(err error) verdict {
		rec.Reason = "approval store: " + err.Error()
		return s.refuse(g.ctx, g.ID, rec, refusal{decision: decisionError, tag: TagDenied, msg: "the approval store is unavailable, so the call is refused"})
	}
	if listErr != nil {
		return unavailable(listErr)
	}
	full, err := json.Marshal(args) // what argsDigest hashes, byte for byte
	if err != nil {
		return unavailable(err)
	}
	n, size, oldest := waiting(list, rec.Grant)
	if n >= maxWaitingApprovals || size+len(full) > maxWaitingApprovalBytes || len(full) > store.MaxApprovalArgs {
		secs := max(int64(math.Ceil(oldest.Sub(now).Seconds())), 1)
		rec.Reason = fmt.Sprintf("%d approvals of %d bytes already wait for an operator", n, size)
		msg := fmt.Sprintf("%d calls of this grant already wait for an operator's approval (at most %d, with %d MiB of arguments): retry in %d s, when the oldest expires, or once an operator decided them",
			n, maxWaitingApprovals, maxWaitingApprovalBytes>>20, secs)
		return s.refuse(g.ctx, g.ID, rec, rateLimited(msg, secs))
	}
	redacted, _ := json.Marshal(audit.Redact(args))
	a := store.Approval{
		ID: rand.Text(), Grant: rec.Grant, Tool: g.spec.Name, VM: g.call.VM, Digest: digest, Args: string(redacted), FullArgs: string(full),
		State: store.ApprovalPending, Created: now, Expires: now.Add(ttl), TTL: ttl,
	}
	if err := s.store.CreateApproval(g.ctx, a); err != nil {
		return unavailable(err)
	}
	rec.ApprovalID = a.ID
	return g.approvalRequired(rec, a.ID)
}
