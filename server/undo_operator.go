package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
)

// `vmgate undo CALL_ID`: the operator reverts a VM to the undo snapshot a
// call recorded, behind an approval like any gated call. The first undo
// of a call parks an approval (grant "operator", tool "undo", the VM and
// snapshot as its arguments) that `vmgate approvals grant ID` decides; the
// same undo run again then consumes it and reverts. Everything is audited.

// OpUndo is the operator socket's undo operation (ID: the call id).
const OpUndo = "undo"

// Undo approvals are bound to this grant and tool name.
const (
	undoGrant = "operator"
	undoTool  = "undo"
)

// undoTimeout bounds an undo over the operator socket (a revert loads a
// VM's memory).
var undoTimeout = 10 * time.Minute

// callIDRE is a call id as the gate mints them (rand.Text: base32).
var callIDRE = regexp.MustCompile(`^[A-Za-z2-7]{12,26}$`)

// UndoResult is what an undo did: Reverted, or parked for approval.
type UndoResult struct {
	Call       string    `json:"call"`
	VM         string    `json:"vm"`
	Snapshot   string    `json:"snapshot"`
	Expires    time.Time `json:"expires"`
	ApprovalID string    `json:"approval_id,omitempty"`
	Reverted   bool      `json:"reverted"`
}

// ErrNoUndo: the call has no undo snapshot (it took none, or it expired).
var ErrNoUndo = errors.New("no undo snapshot")

// Undo reverts the VM of call callID to its undo snapshot when an
// operator approved that; otherwise it parks (or finds) the approval and
// returns its id.
func (s *Server) Undo(ctx context.Context, callID, by string) (UndoResult, error) {
	if !callIDRE.MatchString(callID) {
		return UndoResult{}, fmt.Errorf("server: undo: %w: %q is not a call id", store.ErrInvalid, truncate(callID, 40))
	}
	e, ok := s.undo.find(callID)
	if !ok {
		_ = s.undo.sweep(ctx) // taken before a restart, not yet swept
		if e, ok = s.undo.find(callID); !ok {
			return UndoResult{}, fmt.Errorf("server: undo %s: %w (the call took none, or its retention is over)", callID, ErrNoUndo)
		}
	}
	res := UndoResult{Call: callID, VM: e.VM, Snapshot: e.Name, Expires: e.Expires}
	args := map[string]any{"call": callID, "vm": e.VM, "snapshot": e.Name}
	digest := argsDigest(undoTool, args)
	now := s.now()
	a, ok, err := s.store.ConsumeApproval(ctx, undoGrant, undoTool, digest, now)
	if err != nil {
		return res, fmt.Errorf("server: undo %s: approval store: %w", callID, err)
	}
	if !ok {
		id, err := s.parkUndo(ctx, e, args, digest, now)
		res.ApprovalID = id
		return res, err
	}
	res.ApprovalID = a.ID
	if err := s.revertUndo(ctx, e, callID, a.ID, by, now); err != nil {
		return res, err
	}
	res.Reverted = true
	return res, nil
}

// parkUndo returns the pending approval of an undo, creating it.
func (s *Server) parkUndo(ctx context.Context, e undoEntry, args map[string]any, digest string, now time.Time) (string, error) {
	list, err := s.store.ListApprovals(ctx, now)
	if err != nil {
		return "", fmt.Errorf("server: undo: approval store: %w", err)
	}
	for _, a := range list {
		if a.Grant == undoGrant && a.Tool == undoTool && a.Digest == digest && a.State == store.ApprovalPending && now.Before(a.Expires) {
			return a.ID, nil
		}
	}
	full, _ := json.Marshal(args)
	a := store.Approval{
		ID: rand.Text(), Grant: undoGrant, Tool: undoTool, VM: e.VM, Digest: digest, Args: string(full), FullArgs: string(full),
		State: store.ApprovalPending, Created: now, Expires: now.Add(DefaultApprovalTTL), TTL: DefaultApprovalTTL,
	}
	if err := s.store.CreateApproval(ctx, a); err != nil {
		return "", fmt.Errorf("server: undo: approval store: %w", err)
	}
	return a.ID, nil
}

// revertUndo reverts e's VM and audits it (a decision and an outcome record).
func (s *Server) revertUndo(ctx context.Context, e undoEntry, callID, approvalID, by string, now time.Time) error {
	rec := audit.Record{Kind: audit.KindDecision, CallID: "undo-" + callID, Grant: undoGrant, Transport: "operator", Tool: undoTool, VM: e.VM,
		Decision: "allow", ApprovalID: approvalID, Reason: by + ": revert to " + e.Name, Snapshot: e.Name}
	if _, err := s.audit.Append(ctx, rec); err != nil {
		return fmt.Errorf("server: undo %s: audit: %w", callID, err)
	}
	backend, name, _ := strings.Cut(e.VM, "/")
	sn, ok := hypervisor.AsSnapshotter(s.backends[backend])
	var err error
	if !ok {
		err = fmt.Errorf("backend %q cannot take snapshots", backend)
	} else {
		rctx, cancel := context.WithTimeout(ctx, snapshotDeadline)
		err = sn.SnapshotRevert(rctx, name, e.Name)
		cancel()
	}
	outcome, detail := "ok", ""
	if err != nil {
		outcome, detail = "error", err.Error()
	}
	s.outcome(audit.Record{CallID: rec.CallID, Grant: undoGrant, Transport: "operator", Tool: undoTool, VM: e.VM, Snapshot: e.Name}, outcome, detail, now, false)
	if err != nil {
		return fmt.Errorf("server: undo %s: revert %s to %s: %w", callID, e.VM, e.Name, err)
	}
	s.log.Info("server: undo: reverted", "call", callID, "vm", e.VM, "snapshot", e.Name, "operator", by)
	return nil
}
