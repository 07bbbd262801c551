// Package audit is vmgate's tamper-evident audit log: JSON lines, one
// decision record appended (and made durable) before a call is dispatched and
// one outcome record after it, linked by a call id, chained with an HMAC.
//
// # Record and chain
//
// Every line is one JSON object. The log assigns seq (1, 2, 3, … in file
// order) and prev_hash (the hash of the previous record; "" for the first).
// The canonical form of a record, the bytes that are authenticated, is the
// line without its hash field and without the newline:
//
//	body = {"seq":N,"prev_hash":"<hex>", … every other field … }
//	hash = hex(HMAC-SHA256(key, prev_hash ‖ body))
//	line = body with its final '}' replaced by ,"hash":"<hash>"} and then '\n'
//
// So a verifier never re-encodes JSON: it cuts the fixed-size
// `,"hash":"<64 hex>"}` suffix off the line, puts the '}' back and computes
// the HMAC over exactly the bytes in the file. Any changed byte, a removed,
// inserted or reordered line is detected (see Verify). Removing whole records
// from the end of the log cannot be detected by a chain alone: compare the
// last seq with one kept elsewhere when that matters.
//
// The key is 32 random bytes stored hex encoded in a key file created with
// mode 0600 on first use (LoadOrCreateKey); by default it lives next to the
// log as "audit.key" (DefaultKeyFile).
//
// # Durability
//
// One commit at a time writes the file. An Append that finds no commit
// running commits its record itself (no hand-off to another goroutine on the
// call path); one that arrives while a commit runs queues its record for the
// writer goroutine, which takes every queued record, assigns seq and
// prev_hash (so chain order is file order), writes them with one write(2)
// and, with Fsync "always", calls fsync once for the whole batch before
// releasing every waiter (group commit). With Fsync "interval", Append returns after the write and the file
// is fsynced at most Options.Interval later. AppendWritten (the decision of
// a call that reserves nothing and changes nothing) is Append answered after
// the write, never starting an fsync: the record rides the next group
// commit, or the writer fsyncs it Options.Interval later; a crash of the
// process cannot lose it, a power loss within the interval can. AppendLazy (outcome records,
// records of refused calls) never waits and costs no write(2) or fsync of
// its own: the encoded record is held in memory and goes out with the next
// batch, so the next group commit makes it durable; when no commit comes,
// the writer writes and fsyncs it Options.Interval after it was appended.
// So a sequential stream of calls costs one write(2) and one fsync per call
// (Stats counts them), and concurrent calls share both. A crash can lose an
// outcome, never an acknowledged decision (an AppendWritten one: not to a
// crash of the process).
//
// # Advances
//
// The log is also the write-ahead log of the server's counters (rebuilt at
// start by Reservations). A read-only call that reserves a counter does not
// wait for an fsync of its own decision record: the server first makes an
// advance record durable (KindAdvance: the counters, how many calls may use
// it, for how long), and the decision records of the calls that use it name
// it (Advance) and are written with AppendWritten. Once every call that used
// an advance has its decision record in the file, the server appends its end
// record (KindAdvanceEnd). Reservations restores, for an advance without an
// end record, the units no surviving decision record accounts for: so a power
// loss that takes decision records never takes their reservations.
//
// Records are encoded by hand (encode.go), arguments redacted as they are
// written, to the bytes encoding/json wrote before: about 2 µs and 2
// allocations per record instead of 10–15 µs and ~36.
//
// # Failures
//
// An append that cannot be written (disk full, log closed) returns an error
// and the caller denies the call. After a failed write(2) the writer
// truncates the file back to the end of the last complete record and rewinds
// seq and prev_hash, so the chain stays verifiable and later appends work
// again once space is freed. If that truncation fails, or an fsync fails
// (the kernel may have dropped the dirty pages: durability is unknown), the
// log is broken: every later append fails with ErrBroken until it is reopened.
//
// Reopening (Open) verifies the whole chain with the key and refuses a log
// whose chain is broken. A torn last line (a write cut short by a crash: no
// trailing newline, or not a record) is kept for inspection, terminated with
// a newline, reported by (*Log).Torn and logged; the chain continues from the
// last good record. Verify later reports such a line as torn, not as tampering,
// because the record after it continues the chain from the record before it.
package audit

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/vmgate/vmgate/policy"
)

// Kind is a record's kind.
type Kind string

// The record kinds.
const (
	// KindDecision is written before dispatch and carries the decision and
	// the counters reserved (durable before dispatch, or covered by an
	// advance: see "Advances").
	KindDecision Kind = "decision"
	// KindOutcome is written after the call, carries the outcome.
	KindOutcome Kind = "outcome"
	// KindAdvance is a block of reservations made durable ahead of the
	// calls that will use them (see "Advances" in the package doc): its
	// CallID names it, Counters are the counters it covers, Units how many
	// calls may use it and ValidMS how long after its Time they may.
	KindAdvance Kind = "advance"
	// KindAdvanceEnd says that every call that used the advance named by
	// its CallID has its decision record earlier in the log; Units is how
	// many did.
	KindAdvanceEnd Kind = "advance_end"
)

// Counters are the counter reservations a decision record carries, so the
// server can rebuild its sliding-window counters from the log after a crash:
// each was made at the record's time. They are the policy's own counters
// (policy.Counter, the type the store reserves); a record keeps what a
// rebuild needs of each, as {"key":…,"window_ms":…,"max":…}, so Name and
// Rule read back empty and Window in whole milliseconds.
type Counters []policy.Counter

// counterJSON is one counter as a record holds it.
type counterJSON struct {
	Key      string `json:"key"`
	WindowMS int64  `json:"window_ms"`
	Max      int64  `json:"max"`
}

// MarshalJSON writes cs as a record holds them (what Append writes).
func (cs Counters) MarshalJSON() ([]byte, error) {
	if cs == nil {
		return []byte("null"), nil
	}
	out := make([]counterJSON, len(cs))
	for i, c := range cs {
		out[i] = counterJSON{Key: c.Key, WindowMS: c.Window.Milliseconds(), Max: c.Max}
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads the counters of a record.
func (cs *Counters) UnmarshalJSON(b []byte) error {
	var in []counterJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	if in == nil {
		*cs = nil
		return nil
	}
	out := make(Counters, len(in))
	for i, c := range in {
		out[i] = policy.Counter{Key: c.Key, Window: time.Duration(c.WindowMS) * time.Millisecond, Max: c.Max}
	}
	*cs = out
	return nil
}

// Record is one line of the log. Seq, PrevHash and Hash are set by the log
// (Append rejects a record that sets them); the rest by the caller.
type Record struct {
	Seq      uint64 `json:"seq"`
	PrevHash string `json:"prev_hash"`
	// Time is written in UTC with nanoseconds (RFC 3339); Append sets it to
	// the current time when zero.
	Time       time.Time `json:"time"`
	Kind       Kind      `json:"kind"`
	CallID     string    `json:"call_id"`
	Grant      string    `json:"grant,omitempty"`
	Transport  string    `json:"transport,omitempty"`
	Tool       string    `json:"tool,omitempty"`
	VM         string    `json:"vm,omitempty"`
	Decision   string    `json:"decision,omitempty"` // allow, deny, approve, rate_limited, invalid, …
	Rule       string    `json:"rule,omitempty"`     // JSON pointer into the policy document
	Reason     string    `json:"reason,omitempty"`
	ApprovalID string    `json:"approval_id,omitempty"`
	Outcome    string    `json:"outcome,omitempty"` // ok, error, timed_out, …
	DurationMS float64   `json:"duration_ms,omitempty"`
	Shadow     bool      `json:"shadow,omitempty"`
	// Args are the call's arguments. Append redacts them (see Redact): pass
	// the decoded arguments as they came, not an already redacted copy.
	Args map[string]any `json:"args,omitempty"`
	// Counters are the reservations made for this call (decision records).
	Counters Counters `json:"counters,omitempty"`
	// Refunded is set on an outcome record whose call's reservations were
	// refunded (the call failed before any side effect).
	Refunded bool `json:"refunded,omitempty"`
	// Snapshot is the undo snapshot the server took of VM before the call
	// ran (outcome records of a tool with snapshot_before).
	Snapshot string `json:"snapshot,omitempty"`
	// SnapshotID is that snapshot's identity as the backend gave it when
	// it was taken (hypervisor.Snapshot.ID), and SnapshotTaken the
	// backend's time of it: `vmgate undo` reverts only the snapshot that
	// still has this identity.
	SnapshotID    string    `json:"snapshot_id,omitempty"`
	SnapshotTaken time.Time `json:"snapshot_taken,omitzero"`
	// Advance names the advance (a KindAdvance record earlier in the log)
	// that made this decision's reservations durable ahead of it.
	Advance string `json:"advance,omitempty"`
	// Units and ValidMS belong to advance records (KindAdvance,
	// KindAdvanceEnd).
	Units   int64  `json:"units,omitempty"`
	ValidMS int64  `json:"valid_ms,omitempty"`
	Hash    string `json:"hash,omitempty"`
}

// Fsync modes (Options.Fsync).
const (
	FsyncAlways   = "always"   // Append returns after the record is fsynced (shared by concurrent appends)
	FsyncInterval = "interval" // Append returns after write(2); fsync at most Options.Interval later
)

// DefaultInterval is Options.Interval when unset.
const DefaultInterval = 5 * time.Millisecond

// MaxRecordBytes bounds one encoded record. A larger record is refused with
// ErrTooLarge (the caller denies the call: it could not be audited).
const MaxRecordBytes = 1 << 20

// maxLineBytes bounds a line the readers accept: longer lines are malformed.
const maxLineBytes = MaxRecordBytes + 4096

// Sentinel errors.
var (
	ErrClosed   = errors.New("audit log is closed")
	ErrBroken   = errors.New("audit log is broken after a failed write or fsync; reopen it")
	ErrTooLarge = errors.New("audit record too large")
	// ErrInUse: another process (another vmgate serve on the same state
	// directory) holds the log's lock.
	ErrInUse = errors.New("in use by another process")
	// ErrInvalid wraps every rejection of a record handed to Append.
	ErrInvalid = errors.New("invalid audit record")
	// ErrTampered is wrapped by the *ChainError that Verify, Read and Open
	// return when the chain is broken.
	ErrTampered = errors.New("audit chain broken")
	// ErrKeyFile wraps every problem with a key file (mode, size, content).
	ErrKeyFile = errors.New("bad audit key file")
)
