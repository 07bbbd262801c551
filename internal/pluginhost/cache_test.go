package pluginhost

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/testload"
)

// launchCounting runs the counting driver as a plugin with the given state
// TTL.
func launchCounting(t *testing.T, ttl time.Duration) *Supervisor {
	t.Helper()
	h, _ := newTestHost(t, Options{StateTTL: ttl})
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := h.Launch(ctx, Spec{Driver: "counting"})
	if err != nil {
		t.Fatalf("Launch(counting) = %v", err)
	}
	return d.(*Supervisor)
}

func status(t *testing.T, s *Supervisor) string {
	t.Helper()
	st, err := s.Status(context.Background(), "vm1")
	if err != nil {
		t.Fatalf("Status(vm1) = %v", err)
	}
	return st.Detail
}

func listInfo(t *testing.T, s *Supervisor) string {
	t.Helper()
	vms, err := s.ListVMs(context.Background())
	if err != nil || len(vms) != 1 {
		t.Fatalf("ListVMs() = %+v, %v", vms, err)
	}
	return vms[0].Info
}

// TestStateCache: within the TTL, Status and ListVMs are answered without
// reaching the plugin; a call that can change a guest, a plugin restart and
// errors are never served from it.
func TestStateCache(t *testing.T) {
	s := launchCounting(t, time.Hour)
	ctx := context.Background()
	first, list := status(t, s), listInfo(t, s)
	if again := status(t, s); again != first {
		t.Errorf("Status within the TTL = %q, then %q; want the cached answer", first, again)
	}
	if again := listInfo(t, s); again != list {
		t.Errorf("ListVMs within the TTL = %q, then %q; want the cached answer", list, again)
	}
	// A read does not invalidate; a change does.
	if _, err := s.FileRead(ctx, "vm1", "/x", 10); err != nil {
		t.Fatal(err)
	}
	if again := status(t, s); again != first {
		t.Errorf("Status after FileRead = %q; want the cached %q", again, first)
	}
	for _, change := range []struct {
		name string
		do   func() error
	}{
		{"Power", func() error { return s.Power(ctx, "vm1", hypervisor.PowerReset) }},
		{"FileWrite", func() error { return s.FileWrite(ctx, "vm1", "/x", []byte("x"), 0o644) }},
		{"SnapshotCreate", func() error {
			_, err := s.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1"})
			return err
		}},
		{"SnapshotRevert", func() error { return s.SnapshotRevert(ctx, "vm1", "s1") }},
		{"SnapshotRevertID", func() error { return s.SnapshotRevertID(ctx, "vm1", "s1", "fake:s1") }},
		{"SnapshotDelete", func() error { return s.SnapshotDelete(ctx, "vm1", "s1") }},
		{"CreateVM", func() error {
			_, err := s.CreateVM(ctx, hypervisor.CreateRequest{Name: "c1", Mark: "Lcachetest01"})
			return err
		}},
		{"DeleteVM", func() error { return s.DeleteVM(ctx, hypervisor.DeleteRequest{Name: "c1", Mark: "Lcachetest01"}) }},
	} {
		before, beforeList := status(t, s), listInfo(t, s)
		if err := change.do(); err != nil {
			t.Fatalf("%s = %v", change.name, err)
		}
		if after := status(t, s); after == before {
			t.Errorf("Status after %s = %q; want a fresh answer", change.name, after)
		}
		if after := listInfo(t, s); after == beforeList {
			t.Errorf("ListVMs after %s = %q; want a fresh answer", change.name, after)
		}
	}
	// Errors are not kept: each one reaches the plugin. Between two fresh
	// answers n1 and n2: two errors, a Power and the Status itself.
	num := func(detail string) int {
		n, _ := strconv.Atoi(detail[strings.IndexByte(detail, ':')+1:])
		return n
	}
	if err := s.Power(ctx, "vm1", hypervisor.PowerReset); err != nil {
		t.Fatal(err)
	}
	n1 := num(status(t, s))
	for range 2 {
		if _, err := s.Status(ctx, "nope"); !errors.Is(err, hypervisor.ErrUnknownVM) {
			t.Fatalf("Status(nope) = %v; want ErrUnknownVM", err)
		}
	}
	if err := s.Power(ctx, "vm1", hypervisor.PowerReset); err != nil {
		t.Fatal(err)
	}
	if n2 := num(status(t, s)); n2 != n1+4 {
		t.Errorf("calls reaching the plugin: %d then %d; want %d (errors are not cached)", n1, n2, n1+4)
	}
	// A restarted plugin answers afresh.
	oldPID := s.PID()
	if err := syscall.Kill(oldPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var after string
	deadline := time.Now().Add(testload.Scale(30 * time.Second))
	for time.Now().Before(deadline) {
		st, err := s.Status(ctx, "vm1")
		if err == nil && !strings.HasPrefix(st.Detail, strconv.Itoa(oldPID)+":") {
			after = st.Detail
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if after == "" || strings.HasPrefix(after, strconv.Itoa(oldPID)+":") {
		t.Errorf("Status after the plugin restarted = %q; want an answer of the new process (old pid %d)", after, oldPID)
	}
}

// TestStateCacheExpires: past the TTL the plugin is asked again; with a
// negative TTL always.
func TestStateCacheExpires(t *testing.T) {
	s := launchCounting(t, 20*time.Millisecond)
	first := status(t, s)
	deadline := time.Now().Add(10 * time.Second)
	for status(t, s) == first && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if status(t, s) == first {
		t.Errorf("Status still %q 10s later with a 20ms TTL; want it to expire", first)
	}
	off := launchCounting(t, -1)
	if a, b := status(t, off), status(t, off); a == b {
		t.Errorf("Status with the cache off = %q twice; want each call to reach the plugin", a)
	}
}

// TestStateCacheRefusesAnswersFetchedAcrossAChange: an answer that was in
// flight when a change ran is not stored, whether the change emptied the
// cache or forgot one VM.
func TestStateCacheRefusesAnswersFetchedAcrossAChange(t *testing.T) {
	c := newStateCache(time.Hour)
	inst := &instance{}
	k := statusKey("vm1")
	for _, change := range []struct {
		name string
		do   func()
	}{{"invalidate", c.invalidate}, {"invalidateVM of another VM", func() { c.invalidateVM("vm2") }}} {
		_, ok, gen := c.lookup(inst, k)
		if ok {
			t.Fatal("lookup in an empty cache hit")
		}
		change.do() // a Power or an exec ran while the answer was fetched
		c.store(inst, k, gen, "stale", time.Now())
		if v, ok, _ := c.lookup(inst, k); ok {
			t.Errorf("lookup after a store across %s = %v; want a miss", change.name, v)
		}
	}
	_, _, gen := c.lookup(inst, k)
	c.store(inst, k, gen, "fresh", time.Now())
	if v, ok, _ := c.lookup(inst, k); !ok || v != "fresh" {
		t.Errorf("lookup = %v, %v; want the fresh answer", v, ok)
	}
	if v, ok, _ := c.lookup(&instance{}, k); ok {
		t.Errorf("lookup for another plugin process = %v; want a miss", v)
	}
}

// TestStateCacheInvalidateVM: a call in one guest forgets that VM's status
// and the list, and keeps the other VMs' statuses.
func TestStateCacheInvalidateVM(t *testing.T) {
	c := newStateCache(time.Hour)
	inst := &instance{}
	put := func(k cacheKey) {
		_, _, gen := c.lookup(inst, k)
		c.store(inst, k, gen, "v", time.Now())
	}
	for _, k := range []cacheKey{listKey, statusKey("vm1"), statusKey("vm2")} {
		put(k)
	}
	c.invalidateVM("vm1")
	for _, tt := range []struct {
		k    cacheKey
		kept bool
	}{{listKey, false}, {statusKey("vm1"), false}, {statusKey("vm2"), true}} {
		if _, ok, _ := c.lookup(inst, tt.k); ok != tt.kept {
			t.Errorf("lookup(%+v) after invalidateVM(vm1) hit = %v; want %v", tt.k, ok, tt.kept)
		}
	}
}

// TestStateCacheBounded: a cache full of expired answers sweeps them out
// and keeps the fresh ones; one full of fresh answers (more VMs polled
// within a TTL than it holds) starts over; it never holds more than
// maxStateEntries.
func TestStateCacheBounded(t *testing.T) {
	c := newStateCache(time.Minute)
	inst := &instance{}
	put := func(vm string, at time.Time) {
		_, _, gen := c.lookup(inst, statusKey(vm))
		c.store(inst, statusKey(vm), gen, vm, at)
	}
	old := time.Now().Add(-time.Hour)
	for i := range maxStateEntries - 10 {
		put("old"+strconv.Itoa(i), old)
	}
	for i := range 10 {
		put("fresh"+strconv.Itoa(i), time.Now())
	}
	put("one-more", time.Now())
	if n := c.len(); n != 11 {
		t.Errorf("cache of %d expired and 10 fresh answers after one more = %d entries; want the 11 fresh ones", maxStateEntries-10, n)
	}
	if _, ok, _ := c.lookup(inst, statusKey("fresh3")); !ok {
		t.Error("a fresh answer was swept out with the expired ones")
	}
	for i := range 2*maxStateEntries + 1 {
		put("vm"+strconv.Itoa(i), time.Now())
		if n := c.len(); n > maxStateEntries {
			t.Fatalf("cache holds %d entries after %d fresh answers; want at most %d", n, i+1, maxStateEntries)
		}
	}
}
