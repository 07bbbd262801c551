// Package store holds the state the policy needs across calls: sliding-window
// counters and approvals. Three implementations pass one shared test suite:
// memory (tests, `policy test`), bbolt (the embedded default) and Redis
// (replicas). A store that errors or times out makes the caller deny.
package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vmgate/vmgate/policy"
)

// Counters reserves sliding-window budgets.
type Counters interface {
	// ReserveAll reserves one unit of every counter at time now, atomically:
	// either all are reserved, or none is and the error is a *LimitedError
	// naming the first counter that was full. id names the reservation (the
	// call id) so that Refund can undo exactly it.
	ReserveAll(ctx context.Context, id string, now time.Time, counters []policy.Counter) error
	// Refund releases the reservation id made at now for counters (a call
	// that failed before any side effect). Refunding twice is harmless.
	Refund(ctx context.Context, id string, now time.Time, counters []policy.Counter) error
}

// LimitedError says a counter was full.
type LimitedError struct {
	Counter    policy.Counter
	RetryAfter time.Duration // when the oldest reservation in the window leaves it
}

func (e *LimitedError) Error() string {
	return "store: counter " + e.Counter.Name + " is at its limit"
}

// ErrUnavailable wraps every failure of a store to answer (I/O error,
// timeout, Redis down). The caller denies.
var ErrUnavailable = errors.New("store unavailable")

// Approvals holds parked calls waiting for an operator.
type Approvals interface {
	CreateApproval(ctx context.Context, a Approval) error
	GetApproval(ctx context.Context, id string) (Approval, error)
	ListApprovals(ctx context.Context, now time.Time) ([]Approval, error)
	// DecideApproval grants or denies a pending approval.
	DecideApproval(ctx context.Context, id string, grant bool, by, reason string, now time.Time) (Approval, error)
	// ConsumeApproval finds a granted, unexpired, unconsumed approval bound to
	// grant, tool and digest, marks it consumed and returns it. Single use:
	// of two concurrent consumers exactly one gets it. ok is false when none matches.
	ConsumeApproval(ctx context.Context, grant, tool, digest string, now time.Time) (a Approval, ok bool, err error)
}

// Store is both.
type Store interface {
	Counters
	Approvals
	Close() error
}

// ApprovalState is the life cycle of an approval.
type ApprovalState string

// The approval states.
const (
	ApprovalPending  ApprovalState = "pending"
	ApprovalGranted  ApprovalState = "granted"
	ApprovalDenied   ApprovalState = "denied"
	ApprovalConsumed ApprovalState = "consumed"
	ApprovalExpired  ApprovalState = "expired"
)

// Approval is one parked call.
type Approval struct {
	ID     string `json:"id"`
	Grant  string `json:"grant"`
	Tool   string `json:"tool"`
	VM     string `json:"vm,omitempty"`
	Digest string `json:"digest"`         // SHA-256 of the canonical arguments
	Args   string `json:"args,omitempty"` // the arguments as the audit log records them (redacted JSON)
	// FullArgs are the arguments exactly as the call will run with them
	// (the JSON its digest is computed from: stdin, file content and env
	// values in full), for the operator who decides. A store keeps them
	// only while the approval can still let a call run: a denial, the
	// consuming call and expiry drop them (an ended approval is never
	// returned with them, and is rewritten without them when approvals
	// are next listed or created). At most MaxApprovalArgs bytes.
	FullArgs string        `json:"full_args,omitempty"`
	State    ApprovalState `json:"state"`
	Created  time.Time     `json:"created"`
	// Expires: a pending approval expires then; once granted, the grant is
	// usable until Expires too (reset to decision time + TTL on grant).
	Expires   time.Time     `json:"expires"`
	TTL       time.Duration `json:"ttl"`
	DecidedBy string        `json:"decided_by,omitempty"`
	Reason    string        `json:"reason,omitempty"`
}

// Errors of the approval methods.
var (
	ErrUnknownApproval = errors.New("unknown approval")
	ErrNotPending      = errors.New("approval is not pending")
)

// Errors for bad input. A call that returns one changed nothing.
var (
	// ErrInvalid: an argument was malformed (empty id, non-positive window,
	// negative max, a key too long, the same counter key twice in one call).
	ErrInvalid = errors.New("invalid argument")
	// ErrDuplicate: the reservation id is already reserved in one of the
	// counters, or the approval id already exists.
	ErrDuplicate = errors.New("duplicate id")
)

// MaxApprovalArgs bounds Approval.FullArgs (a call's arguments are bounded
// by the server's message limit, 8 MiB by default, before that).
const MaxApprovalArgs = 16 << 20

// MaxKeyLen bounds the length in bytes of counter keys, reservation ids and
// approval ids (bbolt keys are limited to 32 KiB; Redis keys are cheap but
// not free). Any byte sequence within it is a valid key: NUL, unicode, '|'.
const MaxKeyLen = 4096

// Sessions holds the server's sessions: which grant owns each, on which VM,
// and when it expires. The server is the source of truth for expiry (the
// guest helper's own ttl is a backstop). Implementations are safe for
// concurrent use.
//
// A deleted session is kept as a tombstone (Deleted set) for
// SessionRetention, so that its owner destroying it again learns it is
// already gone while any other grant still gets ErrUnknownSession.
type Sessions interface {
	// CreateSession stores s (Deleted must be zero, LastUsed zero means
	// Created). ErrDuplicate when the id exists, tombstones included. It
	// may purge tombstones older than SessionRetention before s.Created.
	CreateSession(ctx context.Context, s Session) error
	// GetSession returns the session, tombstone or not; ErrUnknownSession
	// when there is none.
	GetSession(ctx context.Context, id string) (Session, error)
	// ListSessions returns the live (not deleted) sessions of grant on vm,
	// oldest first; an empty grant or vm matches any.
	ListSessions(ctx context.Context, grant, vm string) ([]Session, error)
	// TouchSession records a use at now (LastUsed never goes back).
	// ErrUnknownSession when the session is missing or deleted.
	TouchSession(ctx context.Context, id string, now time.Time) error
	// DeleteSession marks the session deleted at now and returns it as it
	// was before: a session whose Deleted was already set stays as it was
	// (deleting twice is harmless). ErrUnknownSession when there is none.
	DeleteSession(ctx context.Context, id string, now time.Time) (Session, error)
}

// ErrUnknownSession: no session by that id (or, for Touch, no live one).
var ErrUnknownSession = errors.New("unknown session")

// SessionRetention is how long a deleted session is kept as a tombstone.
const SessionRetention = 24 * time.Hour

// Session is one session as the server stores it.
type Session struct {
	ID       string        `json:"id"`
	Grant    string        `json:"grant"`
	VM       string        `json:"vm"`
	Created  time.Time     `json:"created"`
	LastUsed time.Time     `json:"last_used"`
	TTL      time.Duration `json:"ttl,omitempty"`  // 0: no ttl
	Idle     time.Duration `json:"idle,omitempty"` // 0: no idle limit
	Limits   SessionLimits `json:"limits"`
	// Workdir and Tracking are what the guest reported at creation.
	Workdir  string    `json:"workdir,omitempty"`
	Tracking string    `json:"tracking,omitempty"`
	Deleted  time.Time `json:"deleted,omitzero"`
}

// SessionLimits are a session's resource limits; 0 means none.
type SessionLimits struct {
	MemoryMB   int64 `json:"memory_mb,omitempty"`
	Pids       int64 `json:"pids,omitempty"`
	CPUPercent int64 `json:"cpu_percent,omitempty"`
}

// Expired reports whether s is past its ttl or idle time at now.
func (s Session) Expired(now time.Time) bool {
	if s.TTL > 0 && !now.Before(s.Created.Add(s.TTL)) {
		return true
	}
	return s.Idle > 0 && !now.Before(s.LastUsed.Add(s.Idle))
}

// ValidateSession checks s as CreateSession receives it and returns it
// normalised (LastUsed defaults to Created). An error wraps ErrInvalid.
func ValidateSession(s Session) (Session, error) {
	switch {
	case s.ID == "" || len(s.ID) > MaxKeyLen:
		return s, fmt.Errorf("%w: session id of %d bytes (want 1..%d)", ErrInvalid, len(s.ID), MaxKeyLen)
	case s.Grant == "" || len(s.Grant) > MaxKeyLen:
		return s, fmt.Errorf("%w: session %q: grant of %d bytes (want 1..%d)", ErrInvalid, s.ID, len(s.Grant), MaxKeyLen)
	case s.VM == "" || len(s.VM) > MaxKeyLen:
		return s, fmt.Errorf("%w: session %q: vm of %d bytes (want 1..%d)", ErrInvalid, s.ID, len(s.VM), MaxKeyLen)
	case s.Created.IsZero():
		return s, fmt.Errorf("%w: session %q: no creation time", ErrInvalid, s.ID)
	case s.TTL < 0 || s.Idle < 0:
		return s, fmt.Errorf("%w: session %q: negative ttl %v or idle %v", ErrInvalid, s.ID, s.TTL, s.Idle)
	case s.Limits.MemoryMB < 0 || s.Limits.Pids < 0 || s.Limits.CPUPercent < 0:
		return s, fmt.Errorf("%w: session %q: negative limit %+v", ErrInvalid, s.ID, s.Limits)
	case !s.Deleted.IsZero():
		return s, fmt.Errorf("%w: session %q: created deleted", ErrInvalid, s.ID)
	case !s.LastUsed.IsZero() && s.LastUsed.Before(s.Created):
		return s, fmt.Errorf("%w: session %q: last used before it was created", ErrInvalid, s.ID)
	}
	if s.LastUsed.IsZero() {
		s.LastUsed = s.Created
	}
	return s, nil
}

// ValidateSessionID checks an id given to Get, Touch or Delete.
func ValidateSessionID(id string) error {
	if id == "" || len(id) > MaxKeyLen {
		return fmt.Errorf("%w: session id of %d bytes (want 1..%d)", ErrInvalid, len(id), MaxKeyLen)
	}
	return nil
}

// SortSessions orders sessions oldest first, then by id (ListSessions' order).
func SortSessions(ss []Session) {
	slices.SortFunc(ss, func(a, b Session) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
}
