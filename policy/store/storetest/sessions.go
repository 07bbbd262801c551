package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/store"
)

// SessionStore is what RunSessions tests: a store.Sessions that can be closed.
type SessionStore interface {
	store.Sessions
	Close() error
}

// RunSessions runs the session suite: life cycle, tombstones, grant and VM
// filters, touch that never goes back, duplicates, concurrent creation,
// hostile ids, bad input that changes nothing and cancelled contexts.
// newStore is called once per subtest and must return an empty store.
func RunSessions(t *testing.T, newStore func(t *testing.T) SessionStore) {
	tests := []struct {
		name string
		fn   func(*testing.T, SessionStore)
	}{
		{"LifeCycle", testSessionLifeCycle},
		{"List", testSessionList},
		{"Touch", testSessionTouch},
		{"Duplicate", testSessionDuplicate},
		{"Concurrent", testSessionConcurrent},
		{"HostileIDs", testSessionHostileIDs},
		{"BadInput", testSessionBadInput},
		{"Cancelled", testSessionCancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tt.fn(t, s)
		})
	}
}

func session(id, grant, vm string, created time.Duration) store.Session {
	return store.Session{ID: id, Grant: grant, VM: vm, Created: at(created), TTL: time.Hour, Idle: 7 * 24 * time.Hour,
		Limits: store.SessionLimits{MemoryMB: 256, Pids: 100, CPUPercent: 50}, Workdir: "/var/lib/x/" + id, Tracking: "cgroup"}
}

// sameSession compares sessions field by field (times with Equal).
func sameSession(a, b store.Session) bool {
	return a.ID == b.ID && a.Grant == b.Grant && a.VM == b.VM && a.Created.Equal(b.Created) &&
		a.LastUsed.Equal(b.LastUsed) && a.TTL == b.TTL && a.Idle == b.Idle && a.Limits == b.Limits &&
		a.Workdir == b.Workdir && a.Tracking == b.Tracking && a.Deleted.Equal(b.Deleted)
}

func ids(ss []store.Session) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.ID
	}
	return out
}

func mustCreate(t *testing.T, s store.Sessions, sess store.Session) {
	t.Helper()
	if err := s.CreateSession(context.Background(), sess); err != nil {
		t.Fatalf("CreateSession(%q) = %v; want nil", sess.ID, err)
	}
}

func testSessionLifeCycle(t *testing.T, s SessionStore) {
	ctx := context.Background()
	in := session("s1", "alice", "lab/vm1", 0)
	mustCreate(t, s, in)
	want := in
	want.LastUsed = in.Created
	got, err := s.GetSession(ctx, "s1")
	if err != nil || !sameSession(got, want) {
		t.Fatalf("GetSession(s1) = %+v, %v; want %+v", got, err, want)
	}
	before, err := s.DeleteSession(ctx, "s1", at(time.Minute))
	if err != nil || !sameSession(before, want) {
		t.Fatalf("DeleteSession(s1) = %+v, %v; want the live session %+v", before, err, want)
	}
	got, err = s.GetSession(ctx, "s1")
	if err != nil || !got.Deleted.Equal(at(time.Minute)) {
		t.Fatalf("GetSession(s1) after delete = %+v, %v; want a tombstone deleted at %v", got, err, at(time.Minute))
	}
	again, err := s.DeleteSession(ctx, "s1", at(2*time.Minute))
	if err != nil || !again.Deleted.Equal(at(time.Minute)) {
		t.Fatalf("second DeleteSession(s1) = %+v, %v; want the tombstone unchanged (deleted at %v)", again, err, at(time.Minute))
	}
	if list, err := s.ListSessions(ctx, "", ""); err != nil || len(list) != 0 {
		t.Errorf("ListSessions after delete = %v, %v; want none", ids(list), err)
	}
	if err := s.TouchSession(ctx, "s1", at(3*time.Minute)); !errors.Is(err, store.ErrUnknownSession) {
		t.Errorf("TouchSession(deleted) = %v; want ErrUnknownSession", err)
	}
	for _, id := range []string{"never", "s1x", "S1"} {
		if _, err := s.GetSession(ctx, id); !errors.Is(err, store.ErrUnknownSession) {
			t.Errorf("GetSession(%q) = %v; want ErrUnknownSession", id, err)
		}
		if _, err := s.DeleteSession(ctx, id, at(0)); !errors.Is(err, store.ErrUnknownSession) {
			t.Errorf("DeleteSession(%q) = %v; want ErrUnknownSession", id, err)
		}
		if err := s.TouchSession(ctx, id, at(0)); !errors.Is(err, store.ErrUnknownSession) {
			t.Errorf("TouchSession(%q) = %v; want ErrUnknownSession", id, err)
		}
	}
}

func testSessionList(t *testing.T, s SessionStore) {
	ctx := context.Background()
	mustCreate(t, s, session("c", "alice", "lab/vm1", 3*time.Second))
	mustCreate(t, s, session("a", "alice", "lab/vm2", 1*time.Second))
	mustCreate(t, s, session("b", "bob", "lab/vm1", 2*time.Second))
	mustCreate(t, s, session("d", "alice", "lab/vm1", 3*time.Second))
	mustCreate(t, s, session("e", "alice", "lab/vm1", 4*time.Second))
	if _, err := s.DeleteSession(ctx, "e", at(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		grant, vm string
		want      string
	}{
		{"", "", "a b c d"},
		{"alice", "", "a c d"},
		{"alice", "lab/vm1", "c d"},
		{"", "lab/vm1", "b c d"},
		{"bob", "lab/vm2", ""},
		{"carol", "", ""},
		{"ALICE", "", ""},
	}
	for _, tt := range tests {
		list, err := s.ListSessions(ctx, tt.grant, tt.vm)
		if got := strings.Join(ids(list), " "); err != nil || got != tt.want {
			t.Errorf("ListSessions(%q, %q) = %q, %v; want %q", tt.grant, tt.vm, got, err, tt.want)
		}
	}
}

func testSessionTouch(t *testing.T, s SessionStore) {
	ctx := context.Background()
	mustCreate(t, s, session("t", "alice", "lab/vm1", 0))
	steps := []struct {
		now  time.Duration
		want time.Duration
	}{
		{10 * time.Second, 10 * time.Second},
		{5 * time.Second, 10 * time.Second}, // never goes back
		{time.Minute, time.Minute},
	}
	for _, st := range steps {
		if err := s.TouchSession(ctx, "t", at(st.now)); err != nil {
			t.Fatalf("TouchSession(t, %v) = %v", st.now, err)
		}
		got, err := s.GetSession(ctx, "t")
		if err != nil || !got.LastUsed.Equal(at(st.want)) {
			t.Errorf("after TouchSession(t, +%v): LastUsed = %v, %v; want %v", st.now, got.LastUsed, err, at(st.want))
		}
	}
	got, _ := s.GetSession(ctx, "t")
	for _, tt := range []struct {
		now  time.Duration
		want bool
	}{{time.Minute, false}, {59 * time.Minute, false}, {time.Hour, true}} {
		if e := got.Expired(at(tt.now)); e != tt.want {
			t.Errorf("Expired(+%v) = %v; want %v (ttl 1h)", tt.now, e, tt.want)
		}
	}
}

func testSessionDuplicate(t *testing.T, s SessionStore) {
	ctx := context.Background()
	mustCreate(t, s, session("dup", "alice", "lab/vm1", 0))
	other := session("dup", "mallory", "lab/vm9", time.Second)
	if err := s.CreateSession(ctx, other); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("CreateSession(dup again) = %v; want ErrDuplicate", err)
	}
	if _, err := s.DeleteSession(ctx, "dup", at(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSession(ctx, other); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("CreateSession(dup after delete) = %v; want ErrDuplicate (tombstones keep their id)", err)
	}
	got, err := s.GetSession(ctx, "dup")
	if err != nil || got.Grant != "alice" {
		t.Errorf("GetSession(dup) = %+v, %v; want alice's tombstone", got, err)
	}
}

func testSessionConcurrent(t *testing.T, s SessionStore) {
	ctx := context.Background()
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = s.CreateSession(ctx, session("race", fmt.Sprintf("g%d", i), "lab/vm1", 0))
		})
	}
	wg.Wait()
	created := 0
	for i, err := range errs {
		switch {
		case err == nil:
			created++
		case !errors.Is(err, store.ErrDuplicate):
			t.Errorf("CreateSession #%d = %v; want nil or ErrDuplicate", i, err)
		}
	}
	if created != 1 {
		t.Errorf("%d concurrent CreateSession of one id succeeded; want exactly 1", created)
	}
	mustCreate(t, s, session("touched", "alice", "lab/vm1", 0))
	for i := range n {
		wg.Go(func() {
			if err := s.TouchSession(ctx, "touched", at(time.Duration(i+1)*time.Second)); err != nil {
				t.Errorf("TouchSession #%d = %v", i, err)
			}
		})
	}
	wg.Wait()
	if got, err := s.GetSession(ctx, "touched"); err != nil || !got.LastUsed.Equal(at(n*time.Second)) {
		t.Errorf("after %d concurrent touches LastUsed = %v, %v; want the latest %v", n, got.LastUsed, err, at(n*time.Second))
	}
}

func testSessionHostileIDs(t *testing.T, s SessionStore) {
	ctx := context.Background()
	hostile := []string{"../../etc", "a/b", "x\x00y", "*", "s:", "ünï", " ", strings.Repeat("z", store.MaxKeyLen)}
	for i, id := range hostile {
		mustCreate(t, s, session(id, "alice", "lab/vm1", time.Duration(i)*time.Second))
	}
	for _, id := range hostile {
		got, err := s.GetSession(ctx, id)
		if err != nil || got.ID != id {
			t.Errorf("GetSession(%.20q) = %.20q, %v; want itself", id, got.ID, err)
		}
	}
	list, err := s.ListSessions(ctx, "alice", "")
	if err != nil || len(list) != len(hostile) {
		t.Errorf("ListSessions = %d sessions, %v; want %d", len(list), err, len(hostile))
	}
	// A prefix of a stored id is not that id.
	if _, err := s.GetSession(ctx, "../"); !errors.Is(err, store.ErrUnknownSession) {
		t.Errorf("GetSession(\"../\") = %v; want ErrUnknownSession", err)
	}
}

func testSessionBadInput(t *testing.T, s SessionStore) {
	ctx := context.Background()
	good := session("good", "alice", "lab/vm1", 0)
	mustCreate(t, s, good)
	bad := []struct {
		name string
		edit func(*store.Session)
	}{
		{"empty id", func(x *store.Session) { x.ID = "" }},
		{"long id", func(x *store.Session) { x.ID = strings.Repeat("a", store.MaxKeyLen+1) }},
		{"empty grant", func(x *store.Session) { x.Grant = "" }},
		{"empty vm", func(x *store.Session) { x.VM = "" }},
		{"no created", func(x *store.Session) { x.Created = time.Time{} }},
		{"negative ttl", func(x *store.Session) { x.TTL = -time.Second }},
		{"negative idle", func(x *store.Session) { x.Idle = -time.Second }},
		{"negative limit", func(x *store.Session) { x.Limits.Pids = -1 }},
		{"already deleted", func(x *store.Session) { x.Deleted = x.Created }},
		{"used before created", func(x *store.Session) { x.LastUsed = x.Created.Add(-time.Second) }},
	}
	for _, tt := range bad {
		x := session("bad", "alice", "lab/vm1", 0)
		tt.edit(&x)
		if err := s.CreateSession(ctx, x); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CreateSession(%s) = %v; want ErrInvalid", tt.name, err)
		}
	}
	for _, id := range []string{"", strings.Repeat("a", store.MaxKeyLen+1)} {
		if _, err := s.GetSession(ctx, id); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("GetSession(%d bytes) = %v; want ErrInvalid", len(id), err)
		}
		if err := s.TouchSession(ctx, id, at(time.Second)); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("TouchSession(%d bytes) = %v; want ErrInvalid", len(id), err)
		}
		if _, err := s.DeleteSession(ctx, id, at(time.Second)); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("DeleteSession(%d bytes) = %v; want ErrInvalid", len(id), err)
		}
	}
	if _, err := s.DeleteSession(ctx, "good", time.Time{}); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("DeleteSession(good, zero time) = %v; want ErrInvalid", err)
	}
	list, err := s.ListSessions(ctx, "", "")
	if err != nil || strings.Join(ids(list), " ") != "good" {
		t.Errorf("ListSessions after bad input = %v, %v; want only good", ids(list), err)
	}
	if got, err := s.GetSession(ctx, "good"); err != nil || !got.Deleted.IsZero() {
		t.Errorf("GetSession(good) = %+v, %v; want it live and unchanged", got, err)
	}
}

func testSessionCancelled(t *testing.T, s SessionStore) {
	mustCreate(t, s, session("live", "alice", "lab/vm1", 0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.CreateSession(ctx, session("new", "alice", "lab/vm1", 0)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("CreateSession(cancelled) = %v; want ErrUnavailable", err)
	}
	if _, err := s.GetSession(ctx, "live"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("GetSession(cancelled) = %v; want ErrUnavailable", err)
	}
	if _, err := s.ListSessions(ctx, "", ""); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ListSessions(cancelled) = %v; want ErrUnavailable", err)
	}
	if err := s.TouchSession(ctx, "live", at(time.Hour)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("TouchSession(cancelled) = %v; want ErrUnavailable", err)
	}
	if _, err := s.DeleteSession(ctx, "live", at(time.Hour)); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("DeleteSession(cancelled) = %v; want ErrUnavailable", err)
	}
	bg := context.Background()
	if _, err := s.GetSession(bg, "new"); !errors.Is(err, store.ErrUnknownSession) {
		t.Errorf("GetSession(new) = %v; want ErrUnknownSession (cancelled create changed nothing)", err)
	}
	if got, err := s.GetSession(bg, "live"); err != nil || !got.Deleted.IsZero() || !got.LastUsed.Equal(got.Created) {
		t.Errorf("GetSession(live) = %+v, %v; want untouched and live", got, err)
	}
}
