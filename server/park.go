package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
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
				msg := fmt.Sprintf("approval id %s: %s denied this call", a.ID, a.DecidedBy)
				if a.Reason != "" {
					msg += ": " + a.Reason
				}
				r := denied(msg)
				r.extra = map[string]any{"approval_id": a.ID}
				return s.refuse(g.ctx, g.ID, rec, r)
			}
		}
	}
	return g.parkNew(list, listErr, digest, ttl) // approvals_full.go
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
