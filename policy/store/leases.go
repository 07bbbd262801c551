package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/policy"
)

// Leases holds the VMs vmgate created (vm_create): one lease per VM, which
// holds the quotas that applied to its creation until the VM is deleted.
// The server is the only writer; several replicas share one store (Redis),
// so every change is atomic and a change to a lease is a compare-and-swap
// on its revision. Implementations are safe for concurrent use.
//
// A lease's life: AcquireLease stores it creating, held by the call that
// creates the VM until Until; UpdateLease makes it live once the VM answers
// (Expires set), or deleting when vm_delete or the reaper takes it (held
// until Until, so that another replica may take it over once the holder is
// gone); ReleaseLease removes it once the VM is gone, giving its quota
// units back. A creating or deleting lease whose Until has passed belongs
// to nobody: the reaper of any replica takes it and deletes the VM.
type Leases interface {
	// AcquireLease stores l and holds l.Quotas (Weight units of each)
	// atomically: either every quota has room and l is stored, or nothing
	// changes and the error is a *QuotaError naming the first quota that
	// had none. ErrDuplicate when a lease with l's id or l's name exists.
	AcquireLease(ctx context.Context, l Lease) error
	// GetLease returns the lease id; ErrUnknownLease when there is none.
	GetLease(ctx context.Context, id string) (Lease, error)
	// ListLeases returns every lease, oldest first.
	ListLeases(ctx context.Context) ([]Lease, error)
	// UpdateLease replaces the stored lease l.ID, which must still be at
	// revision l.Rev, with l at revision l.Rev+1, and returns it. Only
	// State, Expires, Until, Holder and an empty VM may change (ErrInvalid
	// otherwise).
	// ErrStaleLease when the stored revision differs, ErrUnknownLease when
	// the lease is gone.
	UpdateLease(ctx context.Context, l Lease) (Lease, error)
	// ReleaseLease removes the lease id and gives its quota units back.
	// ErrUnknownLease when there is none (releasing twice is harmless to
	// the quotas).
	ReleaseLease(ctx context.Context, id string) error
}

// Errors of the lease methods.
var (
	ErrUnknownLease = errors.New("unknown lease")
	ErrStaleLease   = errors.New("lease changed since it was read")
)

// LeaseState is where a lease is in its life.
type LeaseState string

// The lease states.
const (
	LeaseCreating LeaseState = "creating"
	LeaseLive     LeaseState = "live"
	LeaseDeleting LeaseState = "deleting"
)

// MaxLeaseQuotas bounds the quotas one lease holds.
const MaxLeaseQuotas = 64

// Lease is one VM vmgate created.
type Lease struct {
	// ID is minted by the server (random, unguessable); the driver marks
	// the VM with it, so that only this lease's VM is ever deleted.
	ID string `json:"id"`
	// Name is the VM id the server asked the backend for ("lab/small-x7"):
	// one lease per name. VM is the id the VM is known by once the backend
	// made it: the same on most backends; Proxmox numbers its VMs, so there
	// the name is the VM's name property and VM is "<backend>/<vmid>".
	// Empty until known.
	Name     string `json:"name"`
	VM       string `json:"vm,omitempty"`
	Grant    string `json:"grant"`
	Template string `json:"template"`
	CallID   string `json:"call_id,omitempty"` // the vm_create call
	MemoryMB int64  `json:"memory_mb,omitempty"`
	CPUs     int64  `json:"cpus,omitempty"`
	// TTL is the lease's length once the VM is live.
	TTL    time.Duration  `json:"ttl"`
	Quotas []policy.Quota `json:"quotas,omitempty"`
	State  LeaseState     `json:"state"`
	// Created is when the lease was acquired.
	Created time.Time `json:"created"`
	// Expires is when a live VM is deleted; zero until it is live.
	Expires time.Time `json:"expires,omitzero"`
	// Until is when a creating or deleting lease's holder loses it.
	Until  time.Time `json:"until,omitzero"`
	Holder string    `json:"holder,omitempty"`
	Rev    int64     `json:"rev"`
}

// Due reports whether the lease needs the reaper at now: a live VM past
// its Expires, or a creating or deleting lease whose holder let Until pass.
func (l Lease) Due(now time.Time) bool {
	if l.State == LeaseLive {
		return !now.Before(l.Expires)
	}
	return !now.Before(l.Until)
}

// QuotaError says a quota had no room for a lease.
type QuotaError struct {
	Quota policy.Quota
	// Used is how many units leases held when the lease was refused.
	Used int64
	// Holders are the leases holding the quota (best effort: read after the
	// refusal, for the message).
	Holders []Lease
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("store: quota %s is full (%d of %d held, %d more asked)", e.Quota.Name, e.Used, e.Quota.Max, e.Quota.Weight)
}

// ValidateLease checks l as AcquireLease receives it and returns it
// normalised (state creating, revision 1, times in UTC without a
// monotonic reading). An error wraps ErrInvalid.
func ValidateLease(l Lease) (Lease, error) {
	for _, f := range []struct{ name, v string }{{"id", l.ID}, {"name", l.Name}, {"grant", l.Grant}, {"template", l.Template}} {
		if f.v == "" || len(f.v) > MaxKeyLen {
			return l, fmt.Errorf("%w: lease %q: %s of %d bytes (want 1..%d)", ErrInvalid, l.ID, f.name, len(f.v), MaxKeyLen)
		}
	}
	switch {
	case len(l.CallID) > MaxKeyLen || len(l.Holder) > MaxKeyLen || len(l.VM) > MaxKeyLen:
		return l, fmt.Errorf("%w: lease %q: vm, call id or holder over %d bytes", ErrInvalid, l.ID, MaxKeyLen)
	case l.MemoryMB < 0 || l.CPUs < 0:
		return l, fmt.Errorf("%w: lease %q: negative memory %d or cpus %d", ErrInvalid, l.ID, l.MemoryMB, l.CPUs)
	case l.TTL <= 0:
		return l, fmt.Errorf("%w: lease %q: ttl %v is not positive", ErrInvalid, l.ID, l.TTL)
	case l.State != "" && l.State != LeaseCreating:
		return l, fmt.Errorf("%w: lease %q: a new lease is creating, not %q", ErrInvalid, l.ID, l.State)
	case l.Created.IsZero() || l.Until.IsZero():
		return l, fmt.Errorf("%w: lease %q: no creation time or no holding time", ErrInvalid, l.ID)
	case !l.Until.After(l.Created):
		return l, fmt.Errorf("%w: lease %q: held until %v, not after its creation %v", ErrInvalid, l.ID, l.Until, l.Created)
	case !l.Expires.IsZero():
		return l, fmt.Errorf("%w: lease %q: a creating lease has no expiry yet", ErrInvalid, l.ID)
	case len(l.Quotas) > MaxLeaseQuotas:
		return l, fmt.Errorf("%w: lease %q: %d quotas (at most %d)", ErrInvalid, l.ID, len(l.Quotas), MaxLeaseQuotas)
	}
	for i, q := range l.Quotas {
		switch {
		case q.Key == "" || len(q.Key) > MaxKeyLen:
			return l, fmt.Errorf("%w: lease %q: quota %d key of %d bytes (want 1..%d)", ErrInvalid, l.ID, i, len(q.Key), MaxKeyLen)
		case q.Max < 0 || q.Weight < 0:
			return l, fmt.Errorf("%w: lease %q: quota %q: negative max %d or weight %d", ErrInvalid, l.ID, q.Key, q.Max, q.Weight)
		case slices.ContainsFunc(l.Quotas[:i], func(o policy.Quota) bool { return o.Key == q.Key }):
			return l, fmt.Errorf("%w: lease %q: quota key %q appears twice", ErrInvalid, l.ID, q.Key)
		}
	}
	l.State, l.Rev = LeaseCreating, 1
	l.Created, l.Until = l.Created.Round(0).UTC(), l.Until.Round(0).UTC()
	l.Quotas = slices.Clip(slices.Clone(l.Quotas)) // the caller's slice stays the caller's
	if len(l.Quotas) == 0 {
		l.Quotas = nil
	}
	return l, nil
}

// CheckLeaseUpdate checks that next may replace old (UpdateLease): the same
// lease at old's revision, changed only in State, Expires, Until, Holder
// and VM (from empty to the VM's id, once), with a state a lease can be in (live with an expiry; creating
// or deleting with a holding time). It returns next normalised at the next
// revision. An error wraps ErrStaleLease or ErrInvalid.
func CheckLeaseUpdate(old, next Lease) (Lease, error) {
	if next.Rev != old.Rev {
		return next, fmt.Errorf("%w: lease %q is at revision %d, not %d", ErrStaleLease, old.ID, old.Rev, next.Rev)
	}
	vmOK := next.VM == old.VM || (old.VM == "" && len(next.VM) <= MaxKeyLen)
	same := vmOK && old.ID == next.ID && old.Name == next.Name && old.Grant == next.Grant && old.Template == next.Template &&
		old.CallID == next.CallID && old.MemoryMB == next.MemoryMB && old.CPUs == next.CPUs && old.TTL == next.TTL &&
		old.Created.Equal(next.Created) && slices.Equal(old.Quotas, next.Quotas)
	if !same {
		return next, fmt.Errorf("%w: lease %q: only state, expires, until, holder and an unset vm may change", ErrInvalid, old.ID)
	}
	switch next.State {
	case LeaseLive:
		if next.Expires.IsZero() {
			return next, fmt.Errorf("%w: lease %q: a live lease needs an expiry", ErrInvalid, old.ID)
		}
	case LeaseCreating, LeaseDeleting:
		if next.Until.IsZero() {
			return next, fmt.Errorf("%w: lease %q: a %s lease needs a holding time", ErrInvalid, old.ID, next.State)
		}
	default:
		return next, fmt.Errorf("%w: lease %q: unknown state %q", ErrInvalid, old.ID, next.State)
	}
	if len(next.Holder) > MaxKeyLen {
		return next, fmt.Errorf("%w: lease %q: holder over %d bytes", ErrInvalid, old.ID, MaxKeyLen)
	}
	next.Quotas = old.Quotas
	next.Expires, next.Until = next.Expires.Round(0).UTC(), next.Until.Round(0).UTC()
	next.Rev = old.Rev + 1
	return next, nil
}

// ValidateLeaseID checks an id given to Get, Release.
func ValidateLeaseID(id string) error {
	if id == "" || len(id) > MaxKeyLen {
		return fmt.Errorf("%w: lease id of %d bytes (want 1..%d)", ErrInvalid, len(id), MaxKeyLen)
	}
	return nil
}

// SortLeases orders leases oldest first, then by id (ListLeases' order).
func SortLeases(ls []Lease) {
	slices.SortFunc(ls, func(a, b Lease) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID))
	})
}

// QuotaRoom checks whether l fits next to the leases held: it returns nil,
// ErrDuplicate when one of them has l's id or name, or the *QuotaError of
// the first of l's quotas without room (Holders filled in). Stores that
// see every lease in one transaction (memory, bbolt) decide with it.
func QuotaRoom(held []Lease, l Lease) error {
	for _, h := range held {
		if h.ID == l.ID {
			return fmt.Errorf("%w: lease %q", ErrDuplicate, l.ID)
		}
		if h.Name == l.Name {
			return fmt.Errorf("%w: VM %q already has lease %q", ErrDuplicate, l.Name, h.ID)
		}
	}
	for _, q := range l.Quotas {
		used, holders := QuotaUse(held, q.Key)
		if used+q.Weight > q.Max {
			return &QuotaError{Quota: q, Used: used, Holders: holders}
		}
	}
	return nil
}

// QuotaUse sums the units the leases in held hold of quota key, and
// returns those leases.
func QuotaUse(held []Lease, key string) (used int64, holders []Lease) {
	for _, h := range held {
		for _, hq := range h.Quotas {
			if hq.Key == key {
				used += hq.Weight
				holders = append(holders, h)
			}
		}
	}
	return used, holders
}
