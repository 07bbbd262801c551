package hypervisortest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// RunSnapshots runs the snapshot suite against h.VM, which the calling test
// must own: it takes snapshots of it and reverts it. It checks that a
// revert undoes what happened after the snapshot (a file created is gone, a
// file changed has its old content: in h.Dir, and in h.DiskDir when set),
// that list, delete, a taken name, a missing name, a mode the backend
// cannot take, bad names and an unknown VM behave as the contract says.
// Snapshots it makes are deleted when it ends. It fails unless
// h.Capabilities declares Snapshots and the driver has them. The VM is
// left running.
func RunSnapshots(t *testing.T, h Harness) {
	t.Helper()
	h.validate(t)
	for _, c := range snapshotChecks {
		t.Run(c.name, func(t *testing.T) { c.run(t, h) })
	}
}

var snapshotChecks = []check{
	{"RevertUndoes", checkSnapshotRevert},
	{"ListAndDelete", checkSnapshotListDelete},
	{"Identity", checkSnapshotIdentity},
	{"NameTaken", checkSnapshotExists},
	{"Missing", checkSnapshotMissing},
	{"Mode", checkSnapshotMode},
	{"BadNames", checkSnapshotBadNames},
	{"UnknownVM", checkSnapshotUnknownVM},
}

// snapshotter returns the driver's Snapshotter, applying the skip rule.
func snapshotter(t testing.TB, h Harness) hypervisor.Snapshotter {
	t.Helper()
	requireCapability(t, h, "snapshot", hasSnapshots)
	s, _ := hypervisor.AsSnapshotter(h.Driver)
	return s
}

// snapshotRequest is a request for a fresh name in the mode the backend
// takes (with memory when it can).
func snapshotRequest(t testing.TB, s hypervisor.Snapshotter) hypervisor.SnapshotRequest {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("rand: %v", err)
	}
	return hypervisor.SnapshotRequest{
		Name:        "ht-" + hex.EncodeToString(b[:]),
		Description: "hypervisortest: taken at " + time.Now().UTC().Format(time.RFC3339) + "\nsecond line",
		Memory:      s.SnapshotModes().Memory,
	}
}

// takeSnapshot creates req's snapshot and deletes it when the check ends
// (a snapshot already deleted by the check is fine).
func takeSnapshot(t testing.TB, h Harness, s hypervisor.Snapshotter, req hypervisor.SnapshotRequest) hypervisor.Snapshot {
	t.Helper()
	before := time.Now()
	snap, err := s.SnapshotCreate(h.ctx(t), h.VM, req)
	if err != nil {
		t.Fatalf("SnapshotCreate(%q, %+v) error: %v", h.VM, req, err)
	}
	t.Cleanup(func() {
		ctx, cancel := testload.WithTimeout(context.Background(), h.callTimeout())
		defer cancel()
		if err := s.SnapshotDelete(ctx, h.VM, req.Name); err != nil && !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
			t.Logf("deleting snapshot %s of %s: %v", req.Name, h.VM, err)
		}
	})
	if snap.Name != req.Name || snap.Description != req.Description || snap.Memory != req.Memory {
		t.Errorf("SnapshotCreate(%q, %+v) = %+v; want its name, description and memory", h.VM, req, snap)
	}
	if !snap.CreatedAt.IsZero() && (snap.CreatedAt.Before(before.Add(-time.Minute)) || snap.CreatedAt.After(time.Now().Add(time.Minute))) {
		t.Errorf("SnapshotCreate(%q).CreatedAt = %v; want about now", h.VM, snap.CreatedAt)
	}
	return snap
}

// findSnapshot lists the VM's snapshots and returns the named one.
func findSnapshot(t testing.TB, h Harness, s hypervisor.Snapshotter, name string) (hypervisor.Snapshot, bool) {
	t.Helper()
	list, err := s.SnapshotList(h.ctx(t), h.VM)
	if err != nil {
		t.Fatalf("SnapshotList(%q) error: %v", h.VM, err)
	}
	seen := map[string]bool{}
	var found *hypervisor.Snapshot
	for i, sn := range list {
		if seen[sn.Name] {
			t.Errorf("SnapshotList(%q) lists %q twice", h.VM, sn.Name)
		}
		seen[sn.Name] = true
		if sn.Name == name {
			found = &list[i]
		}
	}
	if found == nil {
		return hypervisor.Snapshot{}, false
	}
	return *found, true
}

// waitRunning waits until the VM runs and its agent answers, starting it
// when a revert left it stopped (which the contract allows for a disk-only
// snapshot).
func waitRunning(t testing.TB, h Harness) {
	t.Helper()
	started := false
	waitFor(t, h, "the VM running with its agent answering after the revert", func(ctx context.Context) (bool, string) {
		st, err := h.Driver.Status(ctx, h.VM)
		if err != nil {
			return false, fmt.Sprintf("Status error %v", err)
		}
		if st.State == hypervisor.StateStopped && !started {
			started = true
			if err := h.Driver.Power(ctx, h.VM, hypervisor.PowerStart); err != nil {
				return false, fmt.Sprintf("Power(start) error %v", err)
			}
		}
		return st.State == hypervisor.StateRunning && st.AgentConnected, fmt.Sprintf("state %q, agent connected %v", st.State, st.AgentConnected)
	})
}

// exists reports whether path exists in the guest (asked through exec).
func exists(t testing.TB, h Harness, path string) bool {
	t.Helper()
	req := hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `if [ -e "$1" ]; then echo yes; else echo no; fi`, "sh", path}}
	res := run(t, h, req)
	wantExit0(t, req, res)
	return strings.TrimSpace(string(res.Stdout)) == "yes"
}

// snapshotDirs are the directories the revert check writes in.
func snapshotDirs(h Harness) []string {
	dirs := []string{h.dir()}
	if h.DiskDir != "" {
		dirs = append(dirs, strings.TrimSuffix(h.DiskDir, "/"))
	}
	return dirs
}

func checkSnapshotRevert(t testing.TB, h Harness) {
	s := snapshotter(t, h)
	ctx := h.ctx(t)
	type files struct{ kept, added string }
	var paths []files
	for _, dir := range snapshotDirs(h) {
		f := files{kept: dir + "/hypervisortest-snap-kept-" + randHex(t), added: dir + "/hypervisortest-snap-added-" + randHex(t)}
		paths = append(paths, f)
		t.Cleanup(func() {
			cctx, cancel := testload.WithTimeout(context.Background(), h.callTimeout())
			defer cancel()
			_, _ = hypervisor.Run(cctx, h.Driver, h.VM, hypervisor.ExecRequest{Argv: []string{"rm", "-f", "--", f.kept, f.added}})
		})
		if err := h.Driver.FileWrite(ctx, h.VM, f.kept, []byte("before the snapshot\n"), 0); err != nil {
			t.Fatalf("FileWrite(%q) error: %v", f.kept, err)
		}
	}
	sync := hypervisor.ExecRequest{Argv: []string{"sync"}}
	wantExit0(t, sync, run(t, h, sync))
	req := snapshotRequest(t, s)
	takeSnapshot(t, h, s, req)

	for _, f := range paths {
		if err := h.Driver.FileWrite(ctx, h.VM, f.kept, []byte("changed after the snapshot\n"), 0); err != nil {
			t.Fatalf("FileWrite(%q) error: %v", f.kept, err)
		}
		if err := h.Driver.FileWrite(ctx, h.VM, f.added, []byte("made after the snapshot\n"), 0); err != nil {
			t.Fatalf("FileWrite(%q) error: %v", f.added, err)
		}
	}
	wantExit0(t, sync, run(t, h, sync))
	if !exists(t, h, paths[0].added) {
		t.Fatalf("%s does not exist right after FileWrite made it", paths[0].added)
	}

	if err := s.SnapshotRevert(h.ctx(t), h.VM, req.Name); err != nil {
		t.Fatalf("SnapshotRevert(%q, %q) error: %v", h.VM, req.Name, err)
	}
	waitRunning(t, h)
	for _, f := range paths {
		if exists(t, h, f.added) {
			t.Errorf("after SnapshotRevert(%q, %q), %s (made after the snapshot) still exists; want it gone", h.VM, req.Name, f.added)
		}
		got, err := h.Driver.FileRead(h.ctx(t), h.VM, f.kept, 1000)
		if err != nil || !bytes.Equal(got.Data, []byte("before the snapshot\n")) {
			t.Errorf("after SnapshotRevert(%q, %q), %s = %q, %v; want its content at the snapshot", h.VM, req.Name, f.kept, got.Data, err)
		}
	}
	// The snapshot outlives the revert: a second revert works too.
	if _, ok := findSnapshot(t, h, s, req.Name); !ok {
		t.Errorf("SnapshotList(%q) after reverting to %q does not list it", h.VM, req.Name)
	}
}

func randHex(t testing.TB) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("rand: %v", err)
	}
	return hex.EncodeToString(b[:])
}

func checkSnapshotListDelete(t testing.TB, h Harness) {
	s := snapshotter(t, h)
	req := snapshotRequest(t, s)
	snap := takeSnapshot(t, h, s, req)
	listed, ok := findSnapshot(t, h, s, req.Name)
	if !ok {
		t.Fatalf("SnapshotList(%q) does not list %q just created", h.VM, req.Name)
	}
	if listed.Description != req.Description || listed.Memory != req.Memory || !listed.CreatedAt.Equal(snap.CreatedAt) {
		t.Errorf("SnapshotList(%q) has %+v; SnapshotCreate returned %+v", h.VM, listed, snap)
	}
	if err := s.SnapshotDelete(h.ctx(t), h.VM, req.Name); err != nil {
		t.Fatalf("SnapshotDelete(%q, %q) error: %v", h.VM, req.Name, err)
	}
	if _, ok := findSnapshot(t, h, s, req.Name); ok {
		t.Errorf("SnapshotList(%q) still lists %q after SnapshotDelete", h.VM, req.Name)
	}
	if err := s.SnapshotDelete(h.ctx(t), h.VM, req.Name); !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		t.Errorf("SnapshotDelete(%q, %q) a second time: error %v; want %v", h.VM, req.Name, err, hypervisor.ErrSnapshotNotFound)
	}
	// The VM is untouched by a delete.
	st, err := h.Driver.Status(h.ctx(t), h.VM)
	if err != nil || st.State != hypervisor.StateRunning {
		t.Errorf("Status(%q) after SnapshotDelete = %+v, %v; want running", h.VM, st, err)
	}
}

// checkSnapshotIdentity: a snapshot has an identity (Snapshot.ID) that the
// listing repeats and that a snapshot made anew under the same name does
// not share; RevertSnapshotID refuses the old identity without reverting
// and reverts to the new one.
func checkSnapshotIdentity(t testing.TB, h Harness) {
	s := snapshotter(t, h)
	req := snapshotRequest(t, s)
	first := takeSnapshot(t, h, s, req)
	if first.ID == "" {
		t.Fatalf("SnapshotCreate(%q, %q).ID is empty; want the backend's identity of the snapshot", h.VM, req.Name)
	}
	if listed, ok := findSnapshot(t, h, s, req.Name); !ok || listed.ID != first.ID {
		t.Fatalf("SnapshotList(%q) has %+v; want %q with ID %q", h.VM, listed, req.Name, first.ID)
	}
	if err := s.SnapshotDelete(h.ctx(t), h.VM, req.Name); err != nil {
		t.Fatalf("SnapshotDelete(%q, %q) error: %v", h.VM, req.Name, err)
	}
	// Backends whose identity is a time in seconds (libvirt, Proxmox) tell
	// two snapshots apart once the second has turned.
	if !first.CreatedAt.IsZero() {
		turned := first.CreatedAt.Truncate(time.Second).Add(time.Second)
		waitFor(t, h, "the clock past the second of the first snapshot", func(context.Context) (bool, string) {
			return time.Now().After(turned), "now " + time.Now().UTC().Format(time.RFC3339Nano)
		})
	}
	second := takeSnapshot(t, h, s, req)
	if second.ID == "" || second.ID == first.ID {
		t.Fatalf("SnapshotCreate(%q, %q) anew: ID %q; want one that differs from the first's %q", h.VM, req.Name, second.ID, first.ID)
	}
	added := h.dir() + "/hypervisortest-snap-id-" + randHex(t)
	t.Cleanup(func() {
		cctx, cancel := testload.WithTimeout(context.Background(), h.callTimeout())
		defer cancel()
		_, _ = hypervisor.Run(cctx, h.Driver, h.VM, hypervisor.ExecRequest{Argv: []string{"rm", "-f", "--", added}})
	})
	if err := h.Driver.FileWrite(h.ctx(t), h.VM, added, []byte("made after the second snapshot\n"), 0); err != nil {
		t.Fatalf("FileWrite(%q) error: %v", added, err)
	}
	if err := hypervisor.RevertSnapshotID(h.ctx(t), s, h.VM, req.Name, first.ID); !errors.Is(err, hypervisor.ErrSnapshotChanged) {
		t.Errorf("RevertSnapshotID(%q, %q, the first snapshot's ID) = %v; want %v", h.VM, req.Name, err, hypervisor.ErrSnapshotChanged)
	}
	// A driver that checks the identity itself refuses too, without the
	// caller's check in front of it.
	if r, ok := s.(hypervisor.SnapshotIDReverter); ok {
		if err := r.SnapshotRevertID(h.ctx(t), h.VM, req.Name, first.ID); !errors.Is(err, hypervisor.ErrSnapshotChanged) {
			t.Errorf("SnapshotRevertID(%q, %q, the first snapshot's ID) = %v; want %v", h.VM, req.Name, err, hypervisor.ErrSnapshotChanged)
		}
	}
	if !exists(t, h, added) {
		t.Fatalf("%s is gone after a refused RevertSnapshotID; want nothing reverted", added)
	}
	if err := hypervisor.RevertSnapshotID(h.ctx(t), s, h.VM, req.Name, second.ID); err != nil {
		t.Fatalf("RevertSnapshotID(%q, %q, its own ID) = %v; want it reverted", h.VM, req.Name, err)
	}
	waitRunning(t, h)
	if exists(t, h, added) {
		t.Errorf("after RevertSnapshotID(%q, %q), %s (made after the snapshot) still exists; want it gone", h.VM, req.Name, added)
	}
}

func checkSnapshotExists(t testing.TB, h Harness) {
	s := snapshotter(t, h)
	req := snapshotRequest(t, s)
	first := takeSnapshot(t, h, s, req)
	again := req
	again.Description = "a second snapshot of the same name"
	_, err := s.SnapshotCreate(h.ctx(t), h.VM, again)
	if !errors.Is(err, hypervisor.ErrSnapshotExists) {
		t.Errorf("SnapshotCreate(%q, %q) when it exists: error %v; want %v", h.VM, req.Name, err, hypervisor.ErrSnapshotExists)
	}
	// The first one is unchanged.
	if got, ok := findSnapshot(t, h, s, req.Name); !ok || got.Description != req.Description || !got.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("SnapshotList(%q) has %+v after a refused second create; want the first one unchanged (%+v)", h.VM, got, first)
	}
}

func checkSnapshotMissing(t testing.TB, h Harness) {
	s := snapshotter(t, h)
	name := "ht-missing-" + randHex(t)
	if err := s.SnapshotRevert(h.ctx(t), h.VM, name); !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		t.Errorf("SnapshotRevert(%q, %q) error %v; want %v", h.VM, name, err, hypervisor.ErrSnapshotNotFound)
	}
	if err := s.SnapshotDelete(h.ctx(t), h.VM, name); !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		t.Errorf("SnapshotDelete(%q, %q) error %v; want %v", h.VM, name, err, hypervisor.ErrSnapshotNotFound)
	}
	// A refused revert leaves the VM running, its agent answering.
	st, err := h.Driver.Status(h.ctx(t), h.VM)
	if err != nil || st.State != hypervisor.StateRunning || !st.AgentConnected {
		t.Errorf("Status(%q) after reverting to a missing snapshot = %+v, %v; want running, agent connected", h.VM, st, err)
	}
}

func checkSnapshotMode(t testing.TB, h Harness) {
	s := snapshotter(t, h)
	modes := s.SnapshotModes()
	if !modes.Memory && !modes.DiskOnly {
		t.Fatalf("SnapshotModes() = %+v; a driver with snapshots takes at least one kind", modes)
	}
	for _, tc := range []struct {
		memory bool
		can    bool
		want   error
	}{{true, modes.Memory, hypervisor.ErrSnapshotMemory}, {false, modes.DiskOnly, hypervisor.ErrSnapshotDiskOnly}} {
		if tc.can {
			continue
		}
		req := snapshotRequest(t, s)
		req.Memory = tc.memory
		_, err := s.SnapshotCreate(h.ctx(t), h.VM, req)
		if !errors.Is(err, tc.want) || !errors.Is(err, hypervisor.ErrNotSupported) {
			t.Errorf("SnapshotCreate(%q, memory %v) on a backend with modes %+v: error %v; want %v (and %v)",
				h.VM, tc.memory, modes, err, tc.want, hypervisor.ErrNotSupported)
		}
		if _, ok := findSnapshot(t, h, s, req.Name); ok {
			t.Errorf("SnapshotList(%q) lists %q, whose creation was refused", h.VM, req.Name)
		}
	}
}

func checkSnapshotBadNames(t testing.TB, h Harness) {
	s := snapshotter(t, h)
	before, err := s.SnapshotList(h.ctx(t), h.VM)
	if err != nil {
		t.Fatalf("SnapshotList(%q) error: %v", h.VM, err)
	}
	for _, name := range []string{"", "1", "a b", "../x", "x;rm -rf /", "current", strings.Repeat("a", 41), "a\x00b"} {
		req := hypervisor.SnapshotRequest{Name: name, Memory: s.SnapshotModes().Memory}
		if _, err := s.SnapshotCreate(h.ctx(t), h.VM, req); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("SnapshotCreate(%q, name %q) error %v; want %v", h.VM, name, err, hypervisor.ErrInvalidArgument)
		}
		if err := s.SnapshotRevert(h.ctx(t), h.VM, name); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("SnapshotRevert(%q, %q) error %v; want %v", h.VM, name, err, hypervisor.ErrInvalidArgument)
		}
		if err := s.SnapshotDelete(h.ctx(t), h.VM, name); !errors.Is(err, hypervisor.ErrInvalidArgument) {
			t.Errorf("SnapshotDelete(%q, %q) error %v; want %v", h.VM, name, err, hypervisor.ErrInvalidArgument)
		}
	}
	bad := snapshotRequest(t, s)
	bad.Description = "escape \x1b[2J"
	if _, err := s.SnapshotCreate(h.ctx(t), h.VM, bad); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("SnapshotCreate(%q) with a control character in the description: error %v; want %v", h.VM, err, hypervisor.ErrInvalidArgument)
	}
	after, err := s.SnapshotList(h.ctx(t), h.VM)
	if err != nil {
		t.Fatalf("SnapshotList(%q) error: %v", h.VM, err)
	}
	if len(after) != len(before) {
		t.Errorf("SnapshotList(%q) had %d snapshots, now %d after refused requests; want no change", h.VM, len(before), len(after))
	}
}

func checkSnapshotUnknownVM(t testing.TB, h Harness) {
	s := snapshotter(t, h)
	ctx := h.ctx(t)
	vm := h.unknownVM()
	calls := []struct {
		name string
		call func() error
	}{
		{"SnapshotCreate", func() error {
			_, err := s.SnapshotCreate(ctx, vm, hypervisor.SnapshotRequest{Name: "ht-unknown", Memory: s.SnapshotModes().Memory})
			return err
		}},
		{"SnapshotList", func() error { _, err := s.SnapshotList(ctx, vm); return err }},
		{"SnapshotRevert", func() error { return s.SnapshotRevert(ctx, vm, "ht-unknown") }},
		{"SnapshotDelete", func() error { return s.SnapshotDelete(ctx, vm, "ht-unknown") }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Errorf("%s(%q) error %v; want %v", c.name, vm, err, hypervisor.ErrUnknownVM)
		}
	}
}
