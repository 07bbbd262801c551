// Package audittest holds what tests of the audit log's users share: a
// Recorder that keeps the records in memory.
package audittest

import (
	"context"
	"sync"
	"time"

	"github.com/vmgate/vmgate/policy/audit"
)

// Recorder is an audit log (the gate's server.Auditor) keeping its records
// in memory. AppendErr and Now are set before it is used; it is safe for
// concurrent use.
type Recorder struct {
	// AppendErr, when set, is asked before every durable Append; an error
	// fails the append (a full disk).
	AppendErr func(audit.Record) error
	// Now, when set, stamps records without a time (as the log does).
	Now func() time.Time

	mu   sync.Mutex // guards recs
	recs []audit.Record
}

// Append records rec as durable.
func (r *Recorder) Append(ctx context.Context, rec audit.Record) (uint64, error) {
	if r.AppendErr != nil {
		if err := r.AppendErr(rec); err != nil {
			return 0, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, r.stamp(rec))
	return uint64(len(r.recs)), nil
}

// AppendLazy records rec.
func (r *Recorder) AppendLazy(ctx context.Context, rec audit.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, r.stamp(rec))
	return nil
}

func (r *Recorder) stamp(rec audit.Record) audit.Record {
	if rec.Time.IsZero() && r.Now != nil {
		rec.Time = r.Now()
	}
	return rec
}

// Each calls fn with every record, its arguments redacted as the log
// writes them (the gate's Config.AuditRecords).
func (r *Recorder) Each(fn func(audit.Record) error) error {
	for _, rec := range r.Records() {
		rec.Args = audit.Redact(rec.Args)
		if err := fn(rec); err != nil {
			return err
		}
	}
	return nil
}

// Records returns a copy of the records so far, in order.
func (r *Recorder) Records() []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record(nil), r.recs...)
}
