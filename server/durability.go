package server

import (
	"context"
	"errors"
	"syscall"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/server/catalog"
)

// writtenAppender is an optional capability of an Auditor (*audit.Log has
// it): AppendWritten returns once the record is written to the log file,
// without waiting for an fsync; the record is fsynced with the next group
// commit or within the log's flush interval.
type writtenAppender interface {
	AppendWritten(ctx context.Context, rec audit.Record) (uint64, error)
}

var _ writtenAppender = (*audit.Log)(nil)

// appendDecision records the decision of a call about to be dispatched. It
// waits for exactly one (shared) fsync when the call consumed an approval or
// can change a guest: after a crash or a power loss the log still holds
// every call that may have changed something. A read-only call under a
// plain allow does not wait for an fsync of its own: its record is in the
// file before dispatch (a crash of the process loses nothing) and becomes
// durable with the next group commit, within the log's flush interval; if
// it reserved counters, an advance made durable before it holds its
// reservations (advance.go), so a power loss cannot lose those (counters
// are rebuilt from the log). An Auditor without AppendWritten makes every
// decision durable.
func (s *Server) appendDecision(ctx context.Context, spec *catalog.Tool, rec audit.Record) error {
	w, ok := s.audit.(writtenAppender)
	if !ok || !spec.ReadOnly || rec.ApprovalID != "" || rec.Decision != policy.Allow.String() {
		_, err := s.audit.Append(ctx, rec)
		return err
	}
	if len(rec.Counters) > 0 {
		return s.appendAdvanced(ctx, w, rec)
	}
	_, err := w.AppendWritten(ctx, rec)
	return err
}

// auditRefusal is what the agent reads when its call is refused because the
// audit log did not take the call's decision record: the log's own reason
// in plain words and what to do next. The log's path stays out of it (the
// server's log has the whole error).
func auditRefusal(err error) string {
	const refused = "the audit log is unavailable, so the call is refused"
	var errno syscall.Errno
	hasErrno := errors.As(err, &errno)
	switch {
	case errors.Is(err, audit.ErrClosed):
		return refused + ": the server is shutting down; retry once it is back"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return refused + ": the call was cancelled before its record was written"
	case errors.Is(err, audit.ErrBroken) && hasErrno:
		return refused + ": an earlier write or fsync of the log failed (" + errno.Error() + ") and the log takes nothing until vmgate restarts; ask the operator to fix the disk of vmgate's state directory and restart it"
	case errors.Is(err, audit.ErrBroken):
		return refused + ": an earlier write or fsync of the log failed and the log takes nothing until vmgate restarts; ask the operator to restart it"
	case hasErrno:
		return refused + ": writing it failed (" + errno.Error() + "); ask the operator to fix the disk of vmgate's state directory (space, permissions), then retry"
	}
	return refused + "; ask the operator to check vmgate's audit log (its disk and permissions)"
}
