// Package rules holds what every store implementation shares: input
// validation (done before any side effect) and the approval life cycle, so
// that memory, bbolt and Redis agree on every transition.
package rules

import (
	"fmt"
	"sort"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// Counters validates a reservation: a non-empty id within store.MaxKeyLen,
// and counters with a non-empty key within store.MaxKeyLen, a positive
// window, a non-negative max and no key twice.
func Counters(id string, counters []policy.Counter) error {
	if err := key("reservation id", id); err != nil {
		return err
	}
	for i, c := range counters {
		if err := key(fmt.Sprintf("counter %d key", i), c.Key); err != nil {
			return err
		}
		if c.Window <= 0 {
			return fmt.Errorf("%w: counter %q: window %v is not positive", store.ErrInvalid, c.Name, c.Window)
		}
		if c.Max < 0 {
			return fmt.Errorf("%w: counter %q: max %d is negative", store.ErrInvalid, c.Name, c.Max)
		}
		for _, d := range counters[:i] {
			if d.Key == c.Key {
				return fmt.Errorf("%w: counter key %q appears twice in one reservation", store.ErrInvalid, c.Key)
			}
		}
	}
	return nil
}

func key(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", store.ErrInvalid, what)
	}
	if len(s) > store.MaxKeyLen {
		return fmt.Errorf("%w: %s is %d bytes long; the limit is %d", store.ErrInvalid, what, len(s), store.MaxKeyLen)
	}
	return nil
}

// ID validates an approval id.
func ID(id string) error { return key("approval id", id) }

// NewApproval validates an approval about to be created. An empty State
// means pending; any other state is an error.
func NewApproval(a store.Approval) (store.Approval, error) {
	if err := ID(a.ID); err != nil {
		return a, err
	}
	switch {
	case a.Grant == "":
		return a, fmt.Errorf("%w: approval %q: grant is empty", store.ErrInvalid, a.ID)
	case a.Tool == "":
		return a, fmt.Errorf("%w: approval %q: tool is empty", store.ErrInvalid, a.ID)
	case a.Digest == "":
		return a, fmt.Errorf("%w: approval %q: digest is empty", store.ErrInvalid, a.ID)
	case a.State != "" && a.State != store.ApprovalPending:
		return a, fmt.Errorf("%w: approval %q: a new approval is pending, not %q", store.ErrInvalid, a.ID, a.State)
	case a.Created.IsZero():
		return a, fmt.Errorf("%w: approval %q: created time is zero", store.ErrInvalid, a.ID)
	case !a.Expires.After(a.Created):
		return a, fmt.Errorf("%w: approval %q: expires %v is not after created %v", store.ErrInvalid, a.ID, a.Expires, a.Created)
	case a.TTL <= 0:
		return a, fmt.Errorf("%w: approval %q: ttl %v is not positive", store.ErrInvalid, a.ID, a.TTL)
	case len(a.FullArgs) > store.MaxApprovalArgs:
		return a, fmt.Errorf("%w: approval %q: arguments of %d bytes exceed the limit of %d", store.ErrInvalid, a.ID, len(a.FullArgs), store.MaxApprovalArgs)
	}
	a.State = store.ApprovalPending
	// Strip the monotonic reading and the location so that every store
	// returns what it would return after a round trip through JSON.
	a.Created = a.Created.Round(0).UTC()
	a.Expires = a.Expires.Round(0).UTC()
	return a, nil
}

// AsOf returns a as it stands at now: a pending or granted approval past
// Expires is expired, and an approval that can no longer let a call run
// (denied, consumed, expired) has no full arguments. Nothing else changes.
func AsOf(a store.Approval, now time.Time) store.Approval {
	if (a.State == store.ApprovalPending || a.State == store.ApprovalGranted) && !now.Before(a.Expires) {
		a.State = store.ApprovalExpired
	}
	if a.State != store.ApprovalPending && a.State != store.ApprovalGranted {
		a.FullArgs = ""
	}
	return a
}

// Scrubbed returns a as a store should keep it at now: without its full
// arguments once it ended (see AsOf), its state as it was. changed says
// whether the stored record must be rewritten.
func Scrubbed(a store.Approval, now time.Time) (store.Approval, bool) {
	if a.FullArgs == "" || AsOf(a, now).FullArgs != "" {
		return a, false
	}
	a.FullArgs = ""
	return a, true
}

// Decide applies an operator's decision to a at now. It returns the new
// approval and whether it changed (an expired pending approval changes to
// expired and still returns an error wrapping store.ErrNotPending).
func Decide(a store.Approval, grant bool, by, reason string, now time.Time) (store.Approval, bool, error) {
	if by == "" {
		return a, false, fmt.Errorf("%w: approval %q: the deciding operator is empty", store.ErrInvalid, a.ID)
	}
	cur := AsOf(a, now)
	if cur.State != store.ApprovalPending {
		return cur, cur.State != a.State, fmt.Errorf("approval %q is %s: %w", a.ID, cur.State, store.ErrNotPending)
	}
	now = now.Round(0).UTC()
	a.DecidedBy = by
	a.Reason = reason
	if grant {
		a.State = store.ApprovalGranted
		a.Expires = now.Add(a.TTL)
	} else {
		a.State = store.ApprovalDenied
		a.FullArgs = "" // nothing can run from it any more
	}
	return a, true, nil
}

// Consumable reports whether a is granted, unexpired at now and bound to
// grant, tool and digest.
func Consumable(a store.Approval, grant, tool, digest string, now time.Time) bool {
	return a.State == store.ApprovalGranted && now.Before(a.Expires) &&
		a.Grant == grant && a.Tool == tool && a.Digest == digest
}

// Consume returns a marked consumed, without its full arguments.
func Consume(a store.Approval) store.Approval {
	a.State = store.ApprovalConsumed
	a.FullArgs = ""
	return a
}

// Binding validates the arguments of ConsumeApproval.
func Binding(grant, tool, digest string) error {
	switch {
	case grant == "":
		return fmt.Errorf("%w: grant is empty", store.ErrInvalid)
	case tool == "":
		return fmt.Errorf("%w: tool is empty", store.ErrInvalid)
	case digest == "":
		return fmt.Errorf("%w: digest is empty", store.ErrInvalid)
	}
	return nil
}

// Less orders approvals oldest first, then by id.
func Less(a, b store.Approval) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.ID < b.ID
}

// Sort sorts approvals with Less.
func Sort(as []store.Approval) {
	sort.Slice(as, func(i, j int) bool { return Less(as[i], as[j]) })
}

// Retention is how long an approval is kept after its Expires: long enough
// for an operator to see what happened, short enough that parked calls do
// not pile up. Stores drop stale approvals when a new one is created.
const Retention = 24 * time.Hour

// Stale reports whether a ended more than Retention before now.
func Stale(a store.Approval, now time.Time) bool {
	return now.Sub(a.Expires) > Retention
}
