package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/catalog"
)

// Parking: a call the policy wants an operator to approve, which has no
// granted approval yet, is refused with the id of a pending approval (a
// new one, or the one an identical call already waits on); the operator
// grants it (approvals.go) and the identical retry goes through once.

// DefaultApprovalTTL is how long an approval lives when the policy says nothing.
const DefaultApprovalTTL = 15 * time.Minute

// park creates (or finds) a pending approval for g's call (digest: its
// argsDigest) and refuses the call.
func (g *gating) park(digest string) verdict {
	s, d, rec, now := g.s, g.decision, g.rec, g.start
	tool := g.spec.Name
	ttl := DefaultApprovalTTL
	if d.Approval != nil && d.Approval.TTL > 0 {
		ttl = d.Approval.TTL
	}
	if d.Approval != nil && d.Approval.Channel != "" && d.Approval.Channel != "operator" {
		rec.Reason = "approval channel " + d.Approval.Channel + " is not available"
		return s.refuse(g.ctx, g.ID, rec, denied("this call needs an approval through a channel this server does not offer"))
	}
	// An identical call already waiting reuses its approval; one an operator
	// denied is refused with the operator's reason until that approval expires.
	list, listErr := s.store.ListApprovals(g.ctx, now)
	if listErr == nil {
		for _, a := range list {
			if a.Grant != rec.Grant || a.Tool != tool || a.Digest != digest || !now.Before(a.Expires) {
				continue
			}
			switch a.State {
			case store.ApprovalPending:
				rec.ApprovalID = a.ID
				return g.approvalRequired(rec, a.ID)
			case store.ApprovalDenied:
				rec.ApprovalID, rec.Reason = a.ID, "approval denied by "+a.DecidedBy
				return s.refuse(g.ctx, g.ID, rec, deniedBefore(a, now))
			}
		}
	}
	return g.parkNew(list, listErr, digest, ttl) // approvals_full.go
}

// deniedBefore is the refusal of the identical retry of a call an
// operator denied (approval a) at now: who denied it and why, until when
// the denial holds, and that the call then asks an operator again.
func deniedBefore(a store.Approval, now time.Time) refusal {
	why := "no reason given"
	if a.Reason != "" {
		why = a.Reason
	}
	secs := max(int64(math.Ceil(a.Expires.Sub(now).Seconds())), 1)
	msg := fmt.Sprintf("approval id %s: %s denied this call (%s); the identical call is refused until %s (in %d s), "+
		"then it asks an operator again (a call with other arguments asks now)", a.ID, a.DecidedBy, why, a.Expires.UTC().Format(time.RFC3339), secs)
	r := denied(msg)
	r.extra = map[string]any{"approval_id": a.ID, "retry_after_s": secs}
	return r
}

// foreseeTimeout bounds what a Foreseer may ask (a backend's snapshot
// list) before its call is parked; past it, the call is parked.
const foreseeTimeout = 10 * time.Second

// foresee refuses g's call, which would be parked for an operator, when its
// arguments know it cannot succeed (catalog.Foreseer): a session already
// destroyed, a snapshot that is not there.
func (g *gating) foresee() (verdict, bool) {
	fs, ok := g.call.Args.(catalog.Foreseer)
	if !ok {
		return verdict{}, false
	}
	ctx, cancel := context.WithTimeout(g.ctx, foreseeTimeout)
	defer cancel()
	c := g.call.Call
	c.Ctx = ctx
	r := fs.Foresee(g.s.env, &c)
	if r == nil {
		return verdict{}, false
	}
	g.rec.Reason = "cannot succeed, not parked: " + r.Text
	return g.refuse(refusal{decision: decisionInvalid, tag: r.Tag, msg: r.Text, detail: r.Detail})
}

// approvalRequired refuses g's call (recorded as rec) until an operator
// grants approval approvalID.
func (g *gating) approvalRequired(rec audit.Record, approvalID string) verdict {
	g.notifyParked(approvalID)
	msg := fmt.Sprintf("approval id %s: an operator must approve this call (vmgate approvals grant %s); then retry the identical call", approvalID, approvalID)
	return g.s.refuse(g.ctx, g.ID, rec, refusal{decision: policy.Approve.String(), tag: TagApproval, msg: msg, extra: map[string]any{"approval_id": approvalID}})
}

// argsDigest is the SHA-256 of the canonical form of a call: the tool name
// and its validated arguments as JSON with sorted keys.
func argsDigest(tool string, args map[string]any) string {
	b, err := json.Marshal(struct {
		Tool string         `json:"tool"`
		Args map[string]any `json:"args"`
	}{tool, args})
	if err != nil {
		// Validated arguments always marshal; an impossible failure must
		// not collapse distinct calls into one digest.
		b = []byte(rand.Text())
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
