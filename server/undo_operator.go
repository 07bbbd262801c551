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
	"github.com/vmgate/vmgate/server/catalog"
)

// `vmgate undo CALL_ID`: the operator reverts a VM to the undo snapshot a
// call recorded, behind an approval like any gated call. The audit log is
// the source of truth: the call's decision record says what the call was
// (tool, grant, VM, time, its arguments as the log keeps them: redacted)
// and its outcome record which snapshot was taken first, with its identity
// as the backend gave it. Undo looks at that VM only (never the name on
// another VM), and only when the snapshot there still has that identity:
// one deleted and made anew under the name (by anyone, on the backend
// directly) is refused, and nothing is reverted. The first undo of a call
// parks an approval (grant "operator", tool "undo") whose arguments are
// everything above, so the operator sees what is reverted and to what;
// `vmgate approvals grant ID` decides it, and the same undo run again
// consumes it, checks the identity once more and reverts, bound to it.
// Everything is audited.

// Undo approvals are bound to this grant and tool name.
const (
	undoGrant = "operator"
	undoTool  = "undo"
)

// callIDRE is a call id as the gate mints them (rand.Text: base32).
var callIDRE = regexp.MustCompile(`^[A-Za-z2-7]{12,26}$`)

// UndoResult is what an undo did: Reverted, or parked for approval.
type UndoResult struct {
	Call     string    `json:"call"`
	VM       string    `json:"vm"`
	Snapshot string    `json:"snapshot"`
	Expires  time.Time `json:"expires"`
	// SnapshotID and Taken are the snapshot's identity and time as the
	// call's outcome record has them.
	SnapshotID string    `json:"snapshot_id,omitempty"`
	Taken      time.Time `json:"snapshot_taken,omitzero"`
	// Tool, Grant and CallTime are the call the undo undoes.
	Tool       string    `json:"tool,omitempty"`
	Grant      string    `json:"grant,omitempty"`
	CallTime   time.Time `json:"call_time,omitzero"`
	ApprovalID string    `json:"approval_id,omitempty"`
	Reverted   bool      `json:"reverted"`
}

// ErrNoUndo: the call has no undo snapshot (it took none, it expired, or
// the audit log has no record of it).
var ErrNoUndo = errors.New("no undo snapshot")

// undoCall is a call with an undo snapshot, as its audit records say.
type undoCall struct {
	undoEntry
	Call, Tool, Grant string
	Time              time.Time
	Args              map[string]any
}

// findUndo reads the audit log for call callID: its decision record and
// the outcome record naming its undo snapshot.
func (s *Server) findUndo(callID string) (undoCall, error) {
	if s.auditRecords == nil {
		return undoCall{}, fmt.Errorf("server: undo %s: %w: this server was started without access to its audit log", callID, ErrNoUndo)
	}
	u := undoCall{Call: callID}
	var decided, outcome bool
	err := s.auditRecords(func(r audit.Record) error {
		if r.CallID != callID {
			return nil
		}
		switch r.Kind {
		case audit.KindDecision:
			decided = true
			u.Tool, u.Grant, u.Time, u.Args = r.Tool, r.Grant, r.Time, r.Args
		case audit.KindOutcome:
			if r.Snapshot != "" {
				outcome = true
				u.VM, u.Name, u.ID, u.Taken = r.VM, r.Snapshot, r.SnapshotID, r.SnapshotTaken
			}
		}
		return nil
	})
	switch {
	case err != nil:
		return u, fmt.Errorf("server: undo %s: reading the audit log: %w", callID, err)
	case !decided || !outcome:
		return u, fmt.Errorf("server: undo %s: %w: the audit log has no outcome record of this call naming an undo snapshot (the call took none, or it is still running)", callID, ErrNoUndo)
	case u.ID == "":
		return u, fmt.Errorf("server: undo %s: %w: its outcome record holds no identity of snapshot %s (recorded by an older vmgate), so it cannot be verified", callID, ErrNoUndo, u.Name)
	}
	exp, ok := UndoExpiry(u.Name, u.Time)
	if !ok {
		return u, fmt.Errorf("server: undo %s: %w: %q is not the name of an undo snapshot the server takes", callID, ErrNoUndo, u.Name)
	}
	u.Expires = exp
	return u, nil
}

// UndoExpiry returns when the undo snapshot name, taken for a call made at
// callTime, expires, as `vmgate undo` reads it; false for a name that is
// not one the server could have given that call (never trusted as its own).
func UndoExpiry(name string, callTime time.Time) (time.Time, bool) {
	exp, _, ok := parseUndoName(name)
	if !ok || !undoExpiryOK(exp, callTime) {
		return time.Time{}, false
	}
	return exp, true
}

// approvalArgs are what the operator approves: the snapshot and when it
// was taken, and the call it undoes ("call.*") with each of its arguments
// as the audit log has them ("call.args.<name>", redacted), one by one so
// that each shows as text. The approval's digest covers them all.
func (u undoCall) approvalArgs() map[string]any {
	m := map[string]any{
		"vm": u.VM, "snapshot": u.Name, "snapshot_id": u.ID,
		"snapshot_taken": u.Taken.UTC().Format(time.RFC3339Nano), "snapshot_expires": u.Expires.UTC().Format(time.RFC3339),
		"call": u.Call, "call.tool": u.Tool, "call.grant": u.Grant, "call.time": u.Time.UTC().Format(time.RFC3339Nano),
	}
	for k, v := range u.Args {
		m["call.args."+k] = v
	}
	return m
}

// checkUndoSnapshot verifies that u's VM still has u's snapshot, the same
// one (ErrSnapshotChanged, ErrSnapshotNotFound otherwise).
func (s *Server) checkUndoSnapshot(ctx context.Context, u undoCall) (hypervisor.Snapshotter, string, error) {
	backend, name, _ := strings.Cut(u.VM, "/")
	sn, ok := hypervisor.AsSnapshotter(s.backends[backend])
	if !ok {
		return nil, "", fmt.Errorf("server: undo %s: backend %q of %s is gone or cannot take snapshots", u.Call, backend, u.VM)
	}
	cur, err := hypervisor.FindSnapshot(ctx, sn, name, u.Name)
	if errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		return nil, "", fmt.Errorf("server: undo %s: %w: %s has no snapshot %s any more (deleted, or its retention is over); nothing reverted", u.Call, ErrNoUndo, u.VM, u.Name)
	}
	if err != nil {
		return nil, "", fmt.Errorf("server: undo %s: listing the snapshots of %s: %w", u.Call, u.VM, err)
	}
	if err := hypervisor.CheckSnapshotID(cur, u.ID); err != nil {
		return nil, "", fmt.Errorf("server: undo %s: snapshot %s of %s was replaced since the call (taken at %s as %s; now %s, taken at %s): nothing reverted: %w",
			u.Call, u.Name, u.VM, u.Taken.UTC().Format(time.RFC3339), u.ID, orNone(cur.ID), cur.CreatedAt.UTC().Format(time.RFC3339), hypervisor.ErrSnapshotChanged)
	}
	return sn, name, nil
}

func orNone(s string) string {
	if s == "" {
		return "no identity"
	}
	return s
}

// Undo reverts the VM of call callID to its undo snapshot when an
// operator approved that; otherwise it parks (or finds) the approval and
// returns its id.
func (s *Server) Undo(ctx context.Context, callID, by string) (UndoResult, error) {
	if !callIDRE.MatchString(callID) {
		return UndoResult{}, fmt.Errorf("server: undo: %w: %q is not a call id", store.ErrInvalid, catalog.Truncate(callID, 40))
	}
	u, err := s.findUndo(callID)
	if err != nil {
		return UndoResult{}, err
	}
	res := UndoResult{Call: callID, VM: u.VM, Snapshot: u.Name, Expires: u.Expires, SnapshotID: u.ID, Taken: u.Taken,
		Tool: u.Tool, Grant: u.Grant, CallTime: u.Time}
	now := s.now()
	if !now.Before(u.Expires) {
		return res, fmt.Errorf("server: undo %s: %w: its retention ended at %s", callID, ErrNoUndo, u.Expires.UTC().Format(time.RFC3339))
	}
	if _, _, err := s.checkUndoSnapshot(ctx, u); err != nil {
		return res, err
	}
	args := u.approvalArgs()
	digest := argsDigest(undoTool, args)
	a, ok, err := s.store.ConsumeApproval(ctx, undoGrant, undoTool, digest, now)
	if err != nil {
		return res, fmt.Errorf("server: undo %s: approval store: %w", callID, err)
	}
	if !ok {
		id, err := s.parkUndo(ctx, u.undoEntry, args, digest, now)
		res.ApprovalID = id
		return res, err
	}
	res.ApprovalID = a.ID
	if err := s.revertUndo(ctx, u, a.ID, by, now); err != nil {
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

// revertUndo checks u's snapshot once more, reverts u's VM to it bound
// to its identity, and audits it (a decision and an outcome record).
func (s *Server) revertUndo(ctx context.Context, u undoCall, approvalID, by string, now time.Time) error {
	rec := audit.Record{Kind: audit.KindDecision, CallID: "undo-" + u.Call, Grant: undoGrant, Transport: "operator", Tool: undoTool, VM: u.VM,
		Decision: "allow", ApprovalID: approvalID, Reason: by + ": revert to " + u.Name, Snapshot: u.Name, SnapshotID: u.ID, SnapshotTaken: u.Taken}
	if _, err := s.audit.Append(ctx, rec); err != nil {
		return fmt.Errorf("server: undo %s: audit: %w", u.Call, err)
	}
	rctx, cancel := context.WithTimeout(ctx, s.env.Timeouts.Snapshot)
	defer cancel()
	sn, name, err := s.checkUndoSnapshot(rctx, u)
	if err == nil {
		if r, ok := sn.(hypervisor.SnapshotIDReverter); ok {
			err = r.SnapshotRevertID(rctx, name, u.Name, u.ID)
		} else {
			err = hypervisor.RevertSnapshotID(rctx, sn, name, u.Name, u.ID)
		}
	}
	outcome, detail := "ok", ""
	if err != nil {
		outcome, detail = "error", err.Error()
	}
	s.outcome(audit.Record{CallID: rec.CallID, Grant: undoGrant, Transport: "operator", Tool: undoTool, VM: u.VM, Snapshot: u.Name, SnapshotID: u.ID, SnapshotTaken: u.Taken}, outcome, detail, now, false)
	if err != nil {
		return fmt.Errorf("server: undo %s: revert %s to %s: %w", u.Call, u.VM, u.Name, err)
	}
	s.log.Info("server: undo: reverted", "call", u.Call, "vm", u.VM, "snapshot", u.Name, "id", u.ID, "operator", by)
	return nil
}
