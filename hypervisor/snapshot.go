package hypervisor

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Snapshotter is an optional capability: a driver that can take, list,
// revert to and delete snapshots of a VM implements it. Every method is
// bounded by ctx like the Driver's; a snapshot of a large VM takes long, so
// callers give these calls a generous deadline.
//
// Names are checked with ValidateSnapshotName before any side effect; an
// invalid one is ErrInvalidArgument. A name the VM has no snapshot of is
// ErrSnapshotNotFound; creating a name that exists is ErrSnapshotExists
// (a driver never replaces a snapshot).
type Snapshotter interface {
	// SnapshotCreate takes a snapshot of vm. A request for a mode the
	// backend cannot take (SnapshotModes) is ErrSnapshotMemory or
	// ErrSnapshotDiskOnly, refused before any side effect.
	SnapshotCreate(ctx context.Context, vm string, req SnapshotRequest) (Snapshot, error)
	// SnapshotList returns vm's snapshots, oldest first.
	SnapshotList(ctx context.Context, vm string) ([]Snapshot, error)
	// SnapshotRevert returns vm to the named snapshot. With a memory
	// snapshot the VM runs on from the moment the snapshot was taken; with
	// a disk-only one the backend restores the disks (a running guest is
	// restarted from them, or left stopped where the backend does that;
	// the driver's documentation says which).
	SnapshotRevert(ctx context.Context, vm, name string) error
	// SnapshotDelete removes the named snapshot; the VM's current state is
	// unchanged.
	SnapshotDelete(ctx context.Context, vm, name string) error
	// SnapshotModes says which snapshots the backend can take. It is a
	// property of the backend, not of a VM: it does no I/O.
	SnapshotModes() SnapshotModes
}

// SnapshotModes says which kinds of snapshot a backend can take of a
// running VM.
type SnapshotModes struct {
	// Memory: with the VM's memory and device state (SnapshotRequest.Memory
	// true); a revert resumes the VM where it was.
	Memory bool `json:"memory"`
	// DiskOnly: the disks alone (SnapshotRequest.Memory false).
	DiskOnly bool `json:"disk_only"`
}

// SnapshotRequest is what SnapshotCreate takes.
type SnapshotRequest struct {
	// Name: see ValidateSnapshotName.
	Name string `json:"name"`
	// Description is free text kept with the snapshot (see ValidateSnapshotRequest).
	Description string `json:"description,omitempty"`
	// Memory asks for the VM's memory and device state to be included.
	Memory bool `json:"memory"`
}

// Snapshot is one snapshot of a VM.
type Snapshot struct {
	Name string `json:"name"`
	// ID is the snapshot's identity as the backend gives it: it stays the
	// same while the snapshot exists and differs for a snapshot made anew
	// under the same name, so a caller that recorded it can tell "the
	// snapshot I took" from "a snapshot called that" (SnapshotRevertID).
	// QEMU: its id, date, vm-state-size and vm-clock; libvirt: its
	// creation time and state; Proxmox: its snaptime and vmstate;
	// VirtualBox: its UUID. Empty when the backend gives none.
	ID          string `json:"id,omitempty"`
	Description string `json:"description,omitempty"`
	// CreatedAt is when the snapshot was taken (the backend's clock);
	// zero when the backend does not say, and then absent from the JSON
	// (never "0001-01-01T00:00:00Z").
	CreatedAt time.Time `json:"created_at,omitzero"`
	// Memory is true when the snapshot holds the VM's memory and device state.
	Memory bool `json:"memory"`
	// SizeBytes is what the backend reports as the snapshot's size (QEMU:
	// the saved VM state), 0 when it does not say.
	SizeBytes int64 `json:"size_bytes,omitempty"`
	// Parent is the snapshot this one was taken on top of, when the
	// backend keeps a tree; empty otherwise.
	Parent string `json:"parent,omitempty"`
	// Current marks the snapshot the VM was last created from or reverted
	// to, when the backend tracks one.
	Current bool `json:"current,omitempty"`
}

// Limits of snapshot names and descriptions.
const (
	MaxSnapshotName        = 40
	MaxSnapshotDescription = 1024
)

// Snapshot errors. ErrSnapshotMemory and ErrSnapshotDiskOnly wrap
// ErrNotSupported, so a caller that only asks "can this backend do it"
// finds them with errors.Is(err, ErrNotSupported).
var (
	// ErrSnapshotNotFound: the VM has no snapshot of that name.
	ErrSnapshotNotFound = errors.New("snapshot not found")
	// ErrSnapshotExists: the VM already has a snapshot of that name.
	ErrSnapshotExists = errors.New("snapshot already exists")
	// ErrSnapshotMemory: the backend (or the VM in its present state, e.g.
	// stopped) cannot take a snapshot that includes memory.
	ErrSnapshotMemory = fmt.Errorf("snapshot with memory: %w", ErrNotSupported)
	// ErrSnapshotDiskOnly: the backend cannot take a snapshot without the
	// VM's memory.
	ErrSnapshotDiskOnly = fmt.Errorf("snapshot without memory: %w", ErrNotSupported)
	// ErrSnapshotChanged: the named snapshot is not the one the caller
	// recorded (its identity differs: it was deleted and made anew, or
	// replaced); nothing was done.
	ErrSnapshotChanged = errors.New("snapshot changed since it was recorded")
)

// SnapshotIDReverter is an optional capability of a Snapshotter:
// SnapshotRevertID reverts vm to the named snapshot only while its identity
// (Snapshot.ID) is still id, checked as close to the revert as the backend
// allows (under the driver's lock for the VM's snapshots, or by reverting
// to the backend's own id of the snapshot). A snapshot whose identity
// differs is ErrSnapshotChanged and a missing one ErrSnapshotNotFound,
// both before any side effect. Callers use RevertSnapshotID, which also
// covers drivers without the capability.
type SnapshotIDReverter interface {
	SnapshotRevertID(ctx context.Context, vm, name, id string) error
}

// FindSnapshot lists vm's snapshots and returns the named one;
// ErrSnapshotNotFound when there is none.
func FindSnapshot(ctx context.Context, s Snapshotter, vm, name string) (Snapshot, error) {
	list, err := s.SnapshotList(ctx, vm)
	if err != nil {
		return Snapshot{}, err
	}
	for _, sn := range list {
		if sn.Name == name {
			return sn, nil
		}
	}
	return Snapshot{}, fmt.Errorf("%w: %q", ErrSnapshotNotFound, name)
}

// CheckSnapshotID refuses sn unless its identity is id (an empty id, or a
// snapshot without one, never matches: nothing can be verified).
func CheckSnapshotID(sn Snapshot, id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: no identity to check snapshot %q against", ErrInvalidArgument, sn.Name)
	case sn.ID == "":
		return fmt.Errorf("%w: snapshot %q: the backend gives it no identity, so it cannot be verified", ErrSnapshotChanged, sn.Name)
	case sn.ID != id:
		return fmt.Errorf("%w: snapshot %q is now %s, not %s", ErrSnapshotChanged, sn.Name, sn.ID, id)
	}
	return nil
}

// RevertSnapshotID reverts vm to the named snapshot only when its identity
// is id: it lists the snapshots and checks first (ErrSnapshotNotFound,
// ErrSnapshotChanged, nothing reverted), then reverts through the driver's
// SnapshotIDReverter, which checks again where the revert happens, or,
// without one, through SnapshotRevert.
func RevertSnapshotID(ctx context.Context, s Snapshotter, vm, name, id string) error {
	sn, err := FindSnapshot(ctx, s, vm, name)
	if err != nil {
		return err
	}
	if err := CheckSnapshotID(sn, id); err != nil {
		return err
	}
	if r, ok := s.(SnapshotIDReverter); ok {
		return r.SnapshotRevertID(ctx, vm, name, id)
	}
	return s.SnapshotRevert(ctx, vm, name)
}

// snapshotName is the one name rule every backend can take: Proxmox VE's
// (pve-snapshot-name: a letter, then letters, digits, '_' or '-'; at most
// 40), which is the narrowest. Starting with a letter also keeps QEMU from
// taking a name for a snapshot id ("1").
var snapshotName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{1,39}$`)

// reservedSnapshotNames are refused by Proxmox VE ("current", "pending")
// and are refused everywhere, case-insensitively, so that a name means the
// same on every backend.
var reservedSnapshotNames = []string{"current", "pending"}

// ValidateSnapshotName checks name against the rule every backend takes:
// 2 to 40 characters, a letter first, then letters, digits, '_' or '-'; not
// "current" or "pending" in any case. The error wraps ErrInvalidArgument.
func ValidateSnapshotName(name string) error {
	if !snapshotName.MatchString(name) {
		return fmt.Errorf("%w: snapshot name %q: want 2-%d of [A-Za-z0-9_-], starting with a letter",
			ErrInvalidArgument, truncateForError(name), MaxSnapshotName)
	}
	for _, r := range reservedSnapshotNames {
		if strings.EqualFold(name, r) {
			return fmt.Errorf("%w: snapshot name %q is reserved", ErrInvalidArgument, name)
		}
	}
	return nil
}

// ValidateSnapshotRequest checks req's name and its description: valid
// UTF-8 of at most MaxSnapshotDescription bytes, with no control characters
// but newline and tab. The error wraps ErrInvalidArgument.
func ValidateSnapshotRequest(req SnapshotRequest) error {
	if err := ValidateSnapshotName(req.Name); err != nil {
		return err
	}
	if len(req.Description) > MaxSnapshotDescription {
		return fmt.Errorf("%w: snapshot description is %d bytes; at most %d", ErrInvalidArgument, len(req.Description), MaxSnapshotDescription)
	}
	if !utf8.ValidString(req.Description) {
		return fmt.Errorf("%w: snapshot description is not valid UTF-8", ErrInvalidArgument)
	}
	for _, r := range req.Description {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return fmt.Errorf("%w: snapshot description contains control character %U", ErrInvalidArgument, r)
		}
	}
	return nil
}

// CheckSnapshotMode refuses req when modes cannot take it, with
// ErrSnapshotMemory or ErrSnapshotDiskOnly.
func CheckSnapshotMode(modes SnapshotModes, req SnapshotRequest) error {
	switch {
	case req.Memory && !modes.Memory:
		return ErrSnapshotMemory
	case !req.Memory && !modes.DiskOnly:
		return ErrSnapshotDiskOnly
	}
	return nil
}

// truncateForError keeps error messages short when the input is huge.
func truncateForError(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	for i := max; i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i] + "…"
		}
	}
	return ""
}
