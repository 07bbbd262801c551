package server

import (
	"context"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
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
// waits for exactly one (shared) fsync when the call reserved a counter,
// consumed an approval or can change a guest: after a crash or a power loss
// the log still holds every reservation (counters are rebuilt from it) and
// every call that may have changed something. A read-only call that
// reserved nothing, under a plain allow, does not wait for an fsync: its
// record is in the file before dispatch (a crash of the process loses
// nothing) and becomes durable with the next group commit, within the log's
// flush interval (only a power loss in between can lose it). An Auditor
// without AppendWritten makes every decision durable.
func (s *Server) appendDecision(ctx context.Context, spec *toolSpec, rec audit.Record) error {
	if w, ok := s.audit.(writtenAppender); ok && spec.readOnly && len(rec.Counters) == 0 &&
		rec.ApprovalID == "" && rec.Decision == policy.Allow.String() {
		_, err := w.AppendWritten(ctx, rec)
		return err
	}
	_, err := s.audit.Append(ctx, rec)
	return err
}
