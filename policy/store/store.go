// Package store holds the state the policy needs across calls: sliding-window
// counters and approvals. Three implementations pass one shared test suite:
// memory (tests, `policy test`), bbolt (the embedded default) and Redis
// (replicas). A store that errors or times out makes the caller deny.
package store

import (
	"context"
	"errors"
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
	ID      string        `json:"id"`
	Grant   string        `json:"grant"`
	Tool    string        `json:"tool"`
	VM      string        `json:"vm,omitempty"`
	Digest  string        `json:"digest"`         // SHA-256 of the canonical arguments
	Args    string        `json:"args,omitempty"` // the arguments as the audit log records them (redacted JSON)
	State   ApprovalState `json:"state"`
	Created time.Time     `json:"created"`
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

// MaxKeyLen bounds the length in bytes of counter keys, reservation ids and
// approval ids (bbolt keys are limited to 32 KiB; Redis keys are cheap but
// not free). Any byte sequence within it is a valid key: NUL, unicode, '|'.
const MaxKeyLen = 4096
