package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
)

// SnapshotStore is what RunSnapshots tests: a store.Snapshots that can be
// closed.
type SnapshotStore interface {
	store.Snapshots
	Close() error
}

// RunSnapshots runs the snapshot record suite: put, get, list by VM in
// order, replace, delete, keys no two VM and name pairs share, concurrent
// puts, bad input that changes nothing and cancelled contexts. newStore is
// called once per subtest and must return an empty store.
func RunSnapshots(t *testing.T, newStore func(t *testing.T) SnapshotStore) {
	runSuite(t, newStore, map[string]func(*testing.T, SnapshotStore){
		"LifeCycle": testSnapshotLifeCycle, "Replace": testSnapshotReplace, "HostileKeys": testSnapshotHostileKeys,
		"Concurrent": testSnapshotConcurrent, "BadInput": testSnapshotBadInput, "Cancelled": testSnapshotCancelled,
	})
}

// runSuite runs each test of a suite as a subtest, in name order, on a
// store of its own that is closed when it ends.
func runSuite[S interface{ Close() error }](t *testing.T, newStore func(t *testing.T) S, tests map[string]func(*testing.T, S)) {
	for _, name := range slices.Sorted(maps.Keys(tests)) {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tests[name](t, s)
		})
	}
}

func snapRec(vm, name, grant string, created time.Duration) store.SnapshotRecord {
	return store.SnapshotRecord{VM: vm, Name: name, ID: "qemu:1:" + name, Grant: grant, CallID: "C" + name, Created: at(created), Memory: true, SizeBytes: 1 << 20}
}

func sameSnap(a, b store.SnapshotRecord) bool {
	return a.VM == b.VM && a.Name == b.Name && a.ID == b.ID && a.Grant == b.Grant && a.CallID == b.CallID && a.Undo == b.Undo &&
		a.Created.Equal(b.Created) && a.Expires.Equal(b.Expires) && a.Memory == b.Memory && a.SizeBytes == b.SizeBytes
}

func snapNames(rs []store.SnapshotRecord) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.VM + " " + r.Name
	}
	return out
}

func mustPutSnap(t *testing.T, s store.Snapshots, r store.SnapshotRecord) {
	t.Helper()
	if err := s.PutSnapshot(context.Background(), r); err != nil {
		t.Fatalf("PutSnapshot(%q, %q) = %v; want nil", r.VM, r.Name, err)
	}
}

func testSnapshotLifeCycle(t *testing.T, s SnapshotStore) {
	ctx := context.Background()
	undo := snapRec("lab/vm1", "vmgate-undo-x-c1", "alice", 2*time.Second)
	undo.Undo, undo.Expires = true, at(time.Hour)
	mustPutSnap(t, s, snapRec("lab/vm1", "b", "bob", time.Second))
	mustPutSnap(t, s, undo)
	mustPutSnap(t, s, snapRec("lab/vm2", "a", "alice", 0))
	got, err := s.GetSnapshot(ctx, "lab/vm1", undo.Name)
	if err != nil || !sameSnap(got, undo) {
		t.Errorf("GetSnapshot(lab/vm1, %s) = %+v, %v; want %+v", undo.Name, got, err, undo)
	}
	list, err := s.ListSnapshots(ctx, "lab/vm1")
	if want := []string{"lab/vm1 b", "lab/vm1 " + undo.Name}; err != nil || fmt.Sprint(snapNames(list)) != fmt.Sprint(want) {
		t.Errorf("ListSnapshots(lab/vm1) = %q, %v; want %q (oldest first, that VM only)", snapNames(list), err, want)
	}
	all, err := s.ListSnapshots(ctx, "")
	if want := []string{"lab/vm2 a", "lab/vm1 b", "lab/vm1 " + undo.Name}; err != nil || fmt.Sprint(snapNames(all)) != fmt.Sprint(want) {
		t.Errorf("ListSnapshots(all) = %q, %v; want %q", snapNames(all), err, want)
	}
	if err := s.DeleteSnapshot(ctx, "lab/vm1", "b"); err != nil {
		t.Fatalf("DeleteSnapshot(lab/vm1, b) = %v", err)
	}
	if _, err := s.GetSnapshot(ctx, "lab/vm1", "b"); !errors.Is(err, store.ErrUnknownSnapshot) {
		t.Errorf("GetSnapshot(deleted) = %v; want ErrUnknownSnapshot", err)
	}
	if err := s.DeleteSnapshot(ctx, "lab/vm1", "b"); !errors.Is(err, store.ErrUnknownSnapshot) {
		t.Errorf("DeleteSnapshot twice = %v; want ErrUnknownSnapshot", err)
	}
	if list, err := s.ListSnapshots(ctx, "lab/vm1"); err != nil || len(list) != 1 {
		t.Errorf("ListSnapshots(lab/vm1) after the delete = %q, %v; want the undo snapshot alone", snapNames(list), err)
	}
	if list, err := s.ListSnapshots(ctx, "lab/none"); err != nil || list == nil || len(list) != 0 {
		t.Errorf("ListSnapshots(a VM without records) = %#v, %v; want an empty list", list, err)
	}
}

func testSnapshotReplace(t *testing.T, s SnapshotStore) {
	ctx := context.Background()
	mustPutSnap(t, s, snapRec("lab/vm1", "s1", "alice", 0))
	again := snapRec("lab/vm1", "s1", "bob", time.Minute)
	again.ID = "qemu:2:s1"
	mustPutSnap(t, s, again)
	got, err := s.GetSnapshot(ctx, "lab/vm1", "s1")
	if err != nil || !sameSnap(got, again) {
		t.Errorf("GetSnapshot after a second put = %+v, %v; want the second record %+v", got, err, again)
	}
	if list, _ := s.ListSnapshots(ctx, ""); len(list) != 1 {
		t.Errorf("ListSnapshots = %q; want one record per VM and name", snapNames(list))
	}
}

// testSnapshotHostileKeys: VM ids and names that could run into each
// other in a naive key stay apart.
func testSnapshotHostileKeys(t *testing.T, s SnapshotStore) {
	ctx := context.Background()
	pairs := [][2]string{{"a", "bc"}, {"ab", "c"}, {"a\x00b", "c"}, {"a", "b\x00c"}, {"1:a", "b"}, {"lab/vm1", "ключ"}, {"x|y", "*"}}
	for i, p := range pairs {
		r := snapRec(p[0], p[1], "g", time.Duration(i)*time.Second)
		r.ID = fmt.Sprint("id-", i)
		mustPutSnap(t, s, r)
	}
	for i, p := range pairs {
		got, err := s.GetSnapshot(ctx, p[0], p[1])
		if err != nil || got.ID != fmt.Sprint("id-", i) || got.VM != p[0] || got.Name != p[1] {
			t.Errorf("GetSnapshot(%q, %q) = %+v, %v; want record id-%d", p[0], p[1], got, err, i)
		}
	}
	if list, _ := s.ListSnapshots(ctx, "a"); len(list) != 2 || list[0].Name != "bc" || list[1].Name != "b\x00c" {
		t.Errorf("ListSnapshots(a) = %q; want a's two records", snapNames(list))
	}
}

func testSnapshotConcurrent(t *testing.T, s SnapshotStore) {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.PutSnapshot(ctx, snapRec("lab/vm1", fmt.Sprint("s", i), "g", time.Duration(i)*time.Millisecond))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent PutSnapshot = %v", err)
		}
	}
	if list, err := s.ListSnapshots(ctx, "lab/vm1"); err != nil || len(list) != 32 {
		t.Errorf("ListSnapshots after 32 concurrent puts = %d records, %v; want 32", len(list), err)
	}
}

func testSnapshotBadInput(t *testing.T, s SnapshotStore) {
	ctx := context.Background()
	long := strings.Repeat("x", store.MaxKeyLen+1)
	bad := []func(r *store.SnapshotRecord){
		func(r *store.SnapshotRecord) { r.VM = "" },
		func(r *store.SnapshotRecord) { r.Name = "" },
		func(r *store.SnapshotRecord) { r.ID = "" },
		func(r *store.SnapshotRecord) { r.Grant = "" },
		func(r *store.SnapshotRecord) { r.Name = long },
		func(r *store.SnapshotRecord) { r.CallID = long },
		func(r *store.SnapshotRecord) { r.Created = time.Time{} },
		func(r *store.SnapshotRecord) { r.SizeBytes = -1 },
		func(r *store.SnapshotRecord) { r.Undo = true },
	}
	for i, f := range bad {
		r := snapRec("lab/vm1", fmt.Sprint("bad", i), "g", 0)
		f(&r)
		if err := s.PutSnapshot(ctx, r); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("PutSnapshot(bad %d: %+v) = %v; want ErrInvalid", i, r, err)
		}
	}
	for _, ref := range [][2]string{{"", "s"}, {"lab/vm1", ""}, {long, "s"}} {
		if _, err := s.GetSnapshot(ctx, ref[0], ref[1]); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("GetSnapshot(%.10q, %q) = %v; want ErrInvalid", ref[0], ref[1], err)
		}
		if err := s.DeleteSnapshot(ctx, ref[0], ref[1]); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("DeleteSnapshot(%.10q, %q) = %v; want ErrInvalid", ref[0], ref[1], err)
		}
	}
	if list, err := s.ListSnapshots(ctx, ""); err != nil || len(list) != 0 {
		t.Errorf("ListSnapshots after bad input = %q, %v; want none stored", snapNames(list), err)
	}
}

func testSnapshotCancelled(t *testing.T, s SnapshotStore) {
	mustPutSnap(t, s, snapRec("lab/vm1", "live", "alice", 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.PutSnapshot(ctx, snapRec("lab/vm1", "new", "alice", 0)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("PutSnapshot(cancelled) = %v; want ErrUnavailable", err)
	}
	if _, err := s.GetSnapshot(ctx, "lab/vm1", "live"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("GetSnapshot(cancelled) = %v; want ErrUnavailable", err)
	}
	if _, err := s.ListSnapshots(ctx, ""); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ListSnapshots(cancelled) = %v; want ErrUnavailable", err)
	}
	if err := s.DeleteSnapshot(ctx, "lab/vm1", "live"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("DeleteSnapshot(cancelled) = %v; want ErrUnavailable", err)
	}
	bg := context.Background()
	if _, err := s.GetSnapshot(bg, "lab/vm1", "new"); !errors.Is(err, store.ErrUnknownSnapshot) {
		t.Errorf("GetSnapshot(new) = %v; want ErrUnknownSnapshot (the cancelled put changed nothing)", err)
	}
	if _, err := s.GetSnapshot(bg, "lab/vm1", "live"); err != nil {
		t.Errorf("GetSnapshot(live) = %v; want it kept", err)
	}
}
