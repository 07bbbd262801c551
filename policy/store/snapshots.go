package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Snapshots holds who made each snapshot vmgate took: one record per VM
// and snapshot name, written by the server when snapshot_create or an
// undo snapshot succeeds and removed when the server deletes the snapshot.
// A record names the snapshot's identity as the backend gave it
// (hypervisor.Snapshot.ID): a snapshot that now has another identity
// under the name (made anew outside vmgate) is not the record's, and the
// server treats it as made outside vmgate. Several replicas share the
// records through the store (Redis). Implementations are safe for
// concurrent use.
type Snapshots interface {
	// PutSnapshot stores r, replacing the record of the same VM and name
	// (a stale one: the snapshot it named is gone).
	PutSnapshot(ctx context.Context, r SnapshotRecord) error
	// GetSnapshot returns the record of vm's snapshot name;
	// ErrUnknownSnapshot when there is none.
	GetSnapshot(ctx context.Context, vm, name string) (SnapshotRecord, error)
	// ListSnapshots returns the records of vm (every VM's when vm is
	// empty), oldest first.
	ListSnapshots(ctx context.Context, vm string) ([]SnapshotRecord, error)
	// DeleteSnapshot removes the record of vm's snapshot name;
	// ErrUnknownSnapshot when there is none (deleting twice is harmless).
	DeleteSnapshot(ctx context.Context, vm, name string) error
}

// ErrUnknownSnapshot: no record of that VM's snapshot.
var ErrUnknownSnapshot = errors.New("unknown snapshot record")

// SnapshotRecord says who made one snapshot.
type SnapshotRecord struct {
	VM   string `json:"vm"`   // "<backend>/<name>"
	Name string `json:"name"` // the snapshot's name
	// ID is the snapshot's identity as the backend gave it when it was
	// taken (hypervisor.Snapshot.ID).
	ID    string `json:"id"`
	Grant string `json:"grant"` // the owner
	// CallID is the call that took it (snapshot_create, or the call an
	// undo snapshot was taken before).
	CallID string `json:"call_id,omitempty"`
	// Undo marks an undo snapshot (snapshot_before), which the server
	// deletes at Expires and may prune to stay within the owner's bounds.
	Undo      bool      `json:"undo,omitempty"`
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires,omitzero"`
	Memory    bool      `json:"memory,omitempty"`
	SizeBytes int64     `json:"size_bytes,omitempty"`
}

// SnapshotKey is the unambiguous key of vm's snapshot name: the VM id's
// length, a colon, the VM id, then the name (no two pairs share one,
// whatever bytes they hold).
func SnapshotKey(vm, name string) string {
	return strconv.Itoa(len(vm)) + ":" + vm + name
}

// ValidateSnapshotRecord checks r as PutSnapshot receives it and returns
// it normalised (times in UTC without a monotonic reading). An error wraps
// ErrInvalid.
func ValidateSnapshotRecord(r SnapshotRecord) (SnapshotRecord, error) {
	for _, f := range []struct{ name, v string }{{"vm", r.VM}, {"name", r.Name}, {"id", r.ID}, {"grant", r.Grant}} {
		if f.v == "" || len(f.v) > MaxKeyLen {
			return r, fmt.Errorf("%w: snapshot record %q of %q: %s of %d bytes (want 1..%d)", ErrInvalid, r.Name, r.VM, f.name, len(f.v), MaxKeyLen)
		}
	}
	switch {
	case len(r.CallID) > MaxKeyLen:
		return r, fmt.Errorf("%w: snapshot record %q of %q: call id over %d bytes", ErrInvalid, r.Name, r.VM, MaxKeyLen)
	case r.Created.IsZero():
		return r, fmt.Errorf("%w: snapshot record %q of %q: no creation time", ErrInvalid, r.Name, r.VM)
	case r.SizeBytes < 0:
		return r, fmt.Errorf("%w: snapshot record %q of %q: negative size %d", ErrInvalid, r.Name, r.VM, r.SizeBytes)
	case r.Undo && r.Expires.IsZero():
		return r, fmt.Errorf("%w: snapshot record %q of %q: an undo snapshot needs an expiry", ErrInvalid, r.Name, r.VM)
	}
	r.Created = r.Created.Round(0).UTC()
	if !r.Expires.IsZero() {
		r.Expires = r.Expires.Round(0).UTC()
	}
	return r, nil
}

// ValidateSnapshotRef checks the vm and name given to Get and Delete.
func ValidateSnapshotRef(vm, name string) error {
	if vm == "" || len(vm) > MaxKeyLen || name == "" || len(name) > MaxKeyLen {
		return fmt.Errorf("%w: snapshot %q of %q: want a vm and a name of 1..%d bytes", ErrInvalid, name, vm, MaxKeyLen)
	}
	return nil
}

// SortSnapshotRecords orders records oldest first, then by VM and name
// (ListSnapshots' order).
func SortSnapshotRecords(rs []SnapshotRecord) {
	slices.SortFunc(rs, func(a, b SnapshotRecord) int {
		return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.VM, b.VM), strings.Compare(a.Name, b.Name))
	})
}
