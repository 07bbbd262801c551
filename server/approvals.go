package server

import (
	"context"
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
)

// Approvals is the operator's side of parked calls: what the operator
// socket and `vmgate approvals` use. Every decision is audited.
type Approvals struct {
	s *Server
}

// Approvals returns the operator interface of s.
func (s *Server) Approvals() *Approvals { return &Approvals{s: s} }

// List returns every approval the store knows (pending, granted, …).
func (a *Approvals) List(ctx context.Context) ([]store.Approval, error) {
	list, err := a.s.store.ListApprovals(ctx, a.s.now())
	if err != nil {
		return nil, fmt.Errorf("server: approvals: list: %w", err)
	}
	return list, nil
}

// Grant approves the pending approval id: the identical call, retried by
// the same grant, then goes through once.
func (a *Approvals) Grant(ctx context.Context, id, by, reason string) (store.Approval, error) {
	return a.decide(ctx, id, true, by, reason)
}

// Deny refuses the pending approval id.
func (a *Approvals) Deny(ctx context.Context, id, by, reason string) (store.Approval, error) {
	return a.decide(ctx, id, false, by, reason)
}

func (a *Approvals) decide(ctx context.Context, id string, grant bool, by, reason string) (store.Approval, error) {
	op := "deny"
	if grant {
		op = "grant"
	}
	if id == "" || len(id) > store.MaxKeyLen || strings.ContainsAny(id, "\x00\n") {
		return store.Approval{}, fmt.Errorf("server: approvals: %s: %w: malformed approval id", op, store.ErrInvalid)
	}
	if by == "" {
		by = "operator"
	}
	ap, err := a.s.store.DecideApproval(ctx, id, grant, by, reason, a.s.now())
	if err != nil {
		return store.Approval{}, fmt.Errorf("server: approvals: %s %s: %w", op, id, err)
	}
	a.s.notifyDecided(ap)
	rec := audit.Record{
		Kind: audit.KindDecision, CallID: "approval-" + id, Grant: ap.Grant, Transport: "operator",
		Tool: ap.Tool, VM: ap.VM, Decision: "approval_" + string(ap.State), ApprovalID: id,
		Reason: decisionReason(by, reason),
	}
	if _, err := a.s.audit.Append(ctx, rec); err != nil {
		// The decision stands in the store; the operator must know it is not audited.
		return ap, fmt.Errorf("server: approvals: %s %s: audit: %w", op, id, err)
	}
	return ap, nil
}

// decisionReason is the audit reason of an operator's decision: who, and
// why when they said.
func decisionReason(by, reason string) string {
	if reason = strings.TrimSpace(reason); reason == "" {
		return by + " (no reason given)"
	}
	return by + ": " + reason
}
