// Package storetest is the conformance suite every store.Store passes:
// all-or-none reservations, exact sliding windows, RetryAfter, Refund,
// exactly Max grants under 1,000 concurrent callers, hostile keys, bad input
// that changes nothing, cancelled contexts, and the approval life cycle.
//
// Run calls newStore once per subtest; each call must return an empty store
// that shares nothing with the others. Run closes each store when its
// subtest ends.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/store"
)

// T0 is the virtual clock's origin in the suite.
func T0() time.Time { return time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC) }

// Run runs the suite.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"AllOrNone", testAllOrNone},
		{"SlidingWindow", testSlidingWindow},
		{"RetryAfter", testRetryAfter},
		{"ClockSkew", testClockSkew},
		{"Refund", testRefund},
		{"Duplicate", testDuplicate},
		{"Concurrent", testConcurrent},
		{"HostileKeys", testHostileKeys},
		{"BadInput", testBadInput},
		{"Cancelled", testCancelled},
		{"Approvals", testApprovals},
		{"ApprovalExpiry", testApprovalExpiry},
		{"ApprovalConcurrentConsume", testApprovalConcurrentConsume},
		{"BadApprovals", testBadApprovals},
		{"ApprovalFullArgs", testApprovalFullArgs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { s.Close() })
			tt.fn(t, s)
		})
	}
}

func counter(key string, window time.Duration, max int64) policy.Counter {
	return policy.Counter{Key: key, Name: "n_" + key, Window: window, Max: max, Rule: "/tools/t/limits/0"}
}

func at(d time.Duration) time.Time { return T0().Add(d) }

// reserveN reserves n units of cs with ids prefix-0… at now and fails on any error.
func reserveN(t *testing.T, s store.Store, prefix string, n int, now time.Time, cs ...policy.Counter) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if err := s.ReserveAll(context.Background(), id, now, cs); err != nil {
			t.Fatalf("ReserveAll(%q, %v) = %v; want nil", id, now, err)
		}
	}
}

// wantLimited checks that err is a *LimitedError for key with retry (exact when retry >= 0).
func wantLimited(t *testing.T, what string, err error, key string, retry time.Duration) {
	t.Helper()
	var le *store.LimitedError
	if !errors.As(err, &le) {
		t.Fatalf("%s = %v; want *store.LimitedError", what, err)
	}
	if le.Counter.Key != key {
		t.Errorf("%s: limited counter = %q; want %q", what, le.Counter.Key, key)
	}
	if retry >= 0 && le.RetryAfter != retry {
		t.Errorf("%s: RetryAfter = %v; want %v", what, le.RetryAfter, retry)
	}
	if le.RetryAfter <= 0 {
		t.Errorf("%s: RetryAfter = %v; want > 0", what, le.RetryAfter)
	}
}

// free reports how many more units of c fit at now (probing with fresh
// ids, up to limit, then refunding them all).
func free(t *testing.T, s store.Store, c policy.Counter, now time.Time, limit int) int {
	t.Helper()
	ctx := context.Background()
	var ids []string
	defer func() {
		for _, id := range ids {
			if err := s.Refund(ctx, id, now, []policy.Counter{c}); err != nil {
				t.Errorf("Refund(%q) = %v; want nil", id, err)
			}
		}
	}()
	for i := range limit + 1 {
		id := fmt.Sprintf("probe-%d", i)
		err := s.ReserveAll(ctx, id, now, []policy.Counter{c})
		var le *store.LimitedError
		if errors.As(err, &le) {
			return i
		}
		if err != nil {
			t.Fatalf("ReserveAll(%q) = %v; want nil or *LimitedError", id, err)
		}
		ids = append(ids, id)
	}
	return limit + 1
}

func testAllOrNone(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := counter("a", time.Minute, 1)
	b := counter("b", time.Minute, 5)
	c := counter("c", time.Hour, 3)
	reserveN(t, s, "fill-a", 1, at(0), a)
	err := s.ReserveAll(ctx, "x", at(time.Second), []policy.Counter{b, a, c})
	wantLimited(t, "ReserveAll(b, a full, c)", err, "a", 59*time.Second)
	if got := free(t, s, b, at(time.Second), 5); got != 5 {
		t.Errorf("free units of b after a refused reservation = %d; want 5", got)
	}
	if got := free(t, s, c, at(time.Second), 3); got != 3 {
		t.Errorf("free units of c after a refused reservation = %d; want 3", got)
	}
	// A reservation that fits takes a unit of every counter.
	if err := s.ReserveAll(ctx, "y", at(2*time.Second), []policy.Counter{b, c}); err != nil {
		t.Fatalf("ReserveAll(b, c) = %v; want nil", err)
	}
	if got := free(t, s, b, at(2*time.Second), 5); got != 4 {
		t.Errorf("free units of b = %d; want 4", got)
	}
	if got := free(t, s, c, at(2*time.Second), 3); got != 2 {
		t.Errorf("free units of c = %d; want 2", got)
	}
	// No counters: nothing to reserve, nothing refused.
	if err := s.ReserveAll(ctx, "z", at(0), nil); err != nil {
		t.Errorf("ReserveAll(no counters) = %v; want nil", err)
	}
}

func testSlidingWindow(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := counter("exec|grant=alice", time.Minute, 10)
	for i := range 10 {
		if err := s.ReserveAll(ctx, fmt.Sprintf("call-%d", i), at(time.Duration(i)*time.Second), []policy.Counter{c}); err != nil {
			t.Fatalf("ReserveAll at %ds = %v; want nil", i, err)
		}
	}
	for _, off := range []time.Duration{10 * time.Second, 30 * time.Second, 59 * time.Second, 59*time.Second + 999*time.Millisecond} {
		err := s.ReserveAll(ctx, "late", at(off), []policy.Counter{c})
		wantLimited(t, fmt.Sprintf("ReserveAll at %v", off), err, c.Key, 60*time.Second-off)
	}
	// At 60 s the call of 0 s has left the window: exactly one unit is free.
	if err := s.ReserveAll(ctx, "at60", at(60*time.Second), []policy.Counter{c}); err != nil {
		t.Fatalf("ReserveAll at 60s = %v; want nil", err)
	}
	err := s.ReserveAll(ctx, "at60b", at(60*time.Second), []policy.Counter{c})
	wantLimited(t, "second ReserveAll at 60s", err, c.Key, time.Second)
	// At 70 s the calls of 1..9 s have left; only the one of 60 s remains.
	if got := free(t, s, c, at(70*time.Second), 10); got != 9 {
		t.Errorf("free units at 70s = %d; want 9", got)
	}
	// Much later everything has left.
	if got := free(t, s, c, at(time.Hour), 10); got != 10 {
		t.Errorf("free units after an hour = %d; want 10", got)
	}
}

func testRetryAfter(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := counter("r", 10*time.Second, 2)
	reserveN(t, s, "r0", 1, at(0), c)
	reserveN(t, s, "r3", 1, at(3*time.Second), c)
	tests := []struct {
		now  time.Duration
		want time.Duration
	}{
		{3 * time.Second, 7 * time.Second},
		{5 * time.Second, 5 * time.Second},
		{9*time.Second + 500*time.Millisecond, 500 * time.Millisecond},
		{9*time.Second + 999*time.Millisecond, time.Millisecond},
	}
	for _, tt := range tests {
		err := s.ReserveAll(ctx, "probe", at(tt.now), []policy.Counter{c})
		wantLimited(t, fmt.Sprintf("ReserveAll at %v", tt.now), err, c.Key, tt.want)
	}
	// Max 0 never fits; the caller waits a window.
	zero := counter("zero", 30*time.Second, 0)
	err := s.ReserveAll(ctx, "z", at(0), []policy.Counter{zero})
	wantLimited(t, "ReserveAll(max 0)", err, zero.Key, 30*time.Second)
}

// testClockSkew: a caller whose clock lags still never makes more than Max
// in any window-long interval.
func testClockSkew(t *testing.T, s store.Store) {
	c := counter("skew", 10*time.Second, 2)
	reserveN(t, s, "ahead", 2, at(10*time.Second), c)
	err := s.ReserveAll(context.Background(), "behind", at(5*time.Second), []policy.Counter{c})
	wantLimited(t, "ReserveAll with a lagging clock", err, c.Key, 15*time.Second)
	if got := free(t, s, c, at(20*time.Second), 2); got != 2 {
		t.Errorf("free units at 20s = %d; want 2", got)
	}
}

func testRefund(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := counter("k", time.Minute, 2)
	d := counter("d", time.Minute, 5)
	now := at(time.Second)
	for _, id := range []string{"a", "b"} {
		if err := s.ReserveAll(ctx, id, now, []policy.Counter{c, d}); err != nil {
			t.Fatalf("ReserveAll(%q) = %v; want nil", id, err)
		}
	}
	wantLimited(t, "ReserveAll when full", s.ReserveAll(ctx, "c", now, []policy.Counter{c}), c.Key, time.Minute)
	for i := range 2 {
		if err := s.Refund(ctx, "a", now, []policy.Counter{c, d}); err != nil {
			t.Fatalf("Refund(a) #%d = %v; want nil", i+1, err)
		}
	}
	if err := s.Refund(ctx, "never-reserved", now, []policy.Counter{c, counter("unused", time.Minute, 1)}); err != nil {
		t.Fatalf("Refund(unknown id) = %v; want nil", err)
	}
	// Exactly one unit came back: b still holds the other.
	if got := free(t, s, c, now, 2); got != 1 {
		t.Errorf("free units of k after refunding a twice = %d; want 1", got)
	}
	if got := free(t, s, d, now, 5); got != 4 {
		t.Errorf("free units of d after refunding a twice = %d; want 4", got)
	}
	// The refunded id may be reserved again.
	if err := s.ReserveAll(ctx, "a", now, []policy.Counter{c}); err != nil {
		t.Errorf("ReserveAll(a) after its refund = %v; want nil", err)
	}
}

func testDuplicate(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := counter("dup", time.Minute, 10)
	e := counter("other", time.Minute, 10)
	reserveN(t, s, "id", 1, at(0), c)
	// The same id again (alone or with another counter) is refused and changes nothing.
	for _, cs := range [][]policy.Counter{{c}, {e, c}} {
		err := s.ReserveAll(ctx, "id-0", at(time.Second), cs)
		if !errors.Is(err, store.ErrDuplicate) {
			t.Errorf("ReserveAll(id-0 again, %d counters) = %v; want ErrDuplicate", len(cs), err)
		}
	}
	if got := free(t, s, c, at(time.Second), 10); got != 9 {
		t.Errorf("free units of dup = %d; want 9", got)
	}
	if got := free(t, s, e, at(time.Second), 10); got != 10 {
		t.Errorf("free units of other = %d; want 10", got)
	}
}

func testConcurrent(t *testing.T, s store.Store) {
	const callers = 1000
	c := counter("hot", time.Minute, 10)
	e := counter("wide", time.Minute, callers)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted int
		other   []error
	)
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			now := at(time.Duration(i) * time.Millisecond)
			err := s.ReserveAll(context.Background(), fmt.Sprintf("g%d", i), now, []policy.Counter{e, c})
			var le *store.LimitedError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				granted++
			case errors.As(err, &le):
			default:
				other = append(other, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("%d callers got errors other than *LimitedError, first: %v", len(other), other[0])
	}
	if granted != 10 {
		t.Errorf("%d concurrent ReserveAll against max 10 granted %d; want 10", callers, granted)
	}
	// All or none: the wide counter holds exactly the 10 granted.
	if got := free(t, s, e, at(2*time.Second), callers); got != callers-10 {
		t.Errorf("free units of the wide counter = %d; want %d", got, callers-10)
	}
}

func testHostileKeys(t *testing.T, s store.Store) {
	keys := []string{
		"nul\x00inside",
		"nul\x00inside\x00",
		"\x00",
		strings.Repeat("k", store.MaxKeyLen),
		strings.Repeat("é", store.MaxKeyLen/2),
		"日本語|grant=ユーザー",
		"a|grant=b",
		"a|grant=b ",
		"{tag}:*?[]",
		"\xff\xfe invalid utf-8",
		"..\\../..",
		"%s%n",
	}
	var cs []policy.Counter
	for _, k := range keys {
		cs = append(cs, counter(k, time.Minute, 2))
	}
	ids := []string{"id\x00nul", strings.Repeat("i", store.MaxKeyLen), "ид-🙂"}
	// Two reservations with hostile ids fill every key to 2 of 2 ...
	for _, id := range ids[:2] {
		if err := s.ReserveAll(context.Background(), id, at(0), cs); err != nil {
			t.Fatalf("ReserveAll(hostile id of %d bytes, hostile keys) = %v; want nil", len(id), err)
		}
	}
	// ... and each key is its own budget, full now.
	for _, c := range cs {
		err := s.ReserveAll(context.Background(), ids[2], at(time.Second), []policy.Counter{c})
		wantLimited(t, fmt.Sprintf("ReserveAll(key %.40q)", c.Key), err, c.Key, 59*time.Second)
	}
	if got := free(t, s, counter("nul", time.Minute, 2), at(time.Second), 2); got != 2 {
		t.Errorf("free units of key %q = %d; want 2 (a prefix of a NUL key is another key)", "nul", got)
	}
	if err := s.Refund(context.Background(), ids[0], at(0), cs); err != nil {
		t.Fatalf("Refund(hostile id) = %v; want nil", err)
	}
	for _, c := range cs {
		if got := free(t, s, c, at(time.Second), 2); got != 1 {
			t.Errorf("free units of key %.40q after a refund = %d; want 1", c.Key, got)
		}
	}
}

func testBadInput(t *testing.T, s store.Store) {
	ctx := context.Background()
	good := counter("good", time.Minute, 3)
	long := strings.Repeat("x", store.MaxKeyLen+1)
	tests := []struct {
		name string
		id   string
		cs   []policy.Counter
	}{
		{"empty id", "", []policy.Counter{good}},
		{"id too long", long, []policy.Counter{good}},
		{"empty key", "id", []policy.Counter{good, counter("", time.Minute, 1)}},
		{"key too long", "id", []policy.Counter{good, counter(long, time.Minute, 1)}},
		{"zero window", "id", []policy.Counter{good, counter("w", 0, 1)}},
		{"negative window", "id", []policy.Counter{good, counter("w", -time.Second, 1)}},
		{"negative max", "id", []policy.Counter{good, counter("m", time.Minute, -1)}},
		{"key twice", "id", []policy.Counter{good, counter("other", time.Minute, 9), good}},
	}
	for _, tt := range tests {
		for _, op := range []string{"ReserveAll", "Refund"} {
			var err error
			if op == "ReserveAll" {
				err = s.ReserveAll(ctx, tt.id, at(0), tt.cs)
			} else {
				err = s.Refund(ctx, tt.id, at(0), tt.cs)
			}
			if !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s(%s) = %v; want ErrInvalid", op, tt.name, err)
			}
		}
	}
	if got := free(t, s, good, at(time.Second), 3); got != 3 {
		t.Errorf("free units after bad input = %d; want 3 (bad input changed something)", got)
	}
}

func testCancelled(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := counter("cancel", time.Minute, 1)
	a := newApproval("ap-cancel", at(0))
	calls := map[string]func() error{
		"ReserveAll": func() error { return s.ReserveAll(ctx, "id", at(0), []policy.Counter{c}) },
		"Refund":     func() error { return s.Refund(ctx, "id", at(0), []policy.Counter{c}) },
		"CreateApproval": func() error {
			return s.CreateApproval(ctx, a)
		},
		"GetApproval": func() error { _, err := s.GetApproval(ctx, a.ID); return err },
		"ListApprovals": func() error {
			_, err := s.ListApprovals(ctx, at(0))
			return err
		},
		"DecideApproval": func() error {
			_, err := s.DecideApproval(ctx, a.ID, true, "op", "", at(0))
			return err
		},
		"ConsumeApproval": func() error {
			_, _, err := s.ConsumeApproval(ctx, a.Grant, a.Tool, a.Digest, at(0))
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, context.Canceled) || !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s(cancelled context) = %v; want an error wrapping context.Canceled and ErrUnavailable", name, err)
		}
	}
	if got := free(t, s, c, at(0), 1); got != 1 {
		t.Errorf("free units after a cancelled ReserveAll = %d; want 1", got)
	}
	if _, err := s.GetApproval(context.Background(), a.ID); !errors.Is(err, store.ErrUnknownApproval) {
		t.Errorf("GetApproval after a cancelled CreateApproval = %v; want ErrUnknownApproval", err)
	}
}

func newApproval(id string, created time.Time) store.Approval {
	return store.Approval{
		ID:      id,
		Grant:   "alice",
		Tool:    "destroy_session",
		VM:      "lab/vm1",
		Digest:  "sha256:" + strings.Repeat("ab", 32),
		Args:    `{"vm":"lab/vm1","session":"s1"}`,
		Created: created,
		Expires: created.Add(10 * time.Minute),
		TTL:     15 * time.Minute,
	}
}

func sameApproval(t *testing.T, what string, got, want store.Approval) {
	t.Helper()
	if got.ID != want.ID || got.Grant != want.Grant || got.Tool != want.Tool || got.VM != want.VM ||
		got.Digest != want.Digest || got.Args != want.Args || got.State != want.State ||
		!got.Created.Equal(want.Created) || !got.Expires.Equal(want.Expires) || got.TTL != want.TTL ||
		got.DecidedBy != want.DecidedBy || got.Reason != want.Reason {
		t.Errorf("%s = %+v; want %+v", what, got, want)
	}
}

func testApprovals(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := newApproval("ap-1", at(0))
	b := newApproval("ap-2", at(time.Second))
	b.Digest = "sha256:other"
	for _, x := range []store.Approval{b, a} {
		if err := s.CreateApproval(ctx, x); err != nil {
			t.Fatalf("CreateApproval(%s) = %v; want nil", x.ID, err)
		}
	}
	if err := s.CreateApproval(ctx, a); !errors.Is(err, store.ErrDuplicate) {
		t.Errorf("CreateApproval(%s again) = %v; want ErrDuplicate", a.ID, err)
	}
	wantA := a
	wantA.State = store.ApprovalPending
	got, err := s.GetApproval(ctx, a.ID)
	if err != nil {
		t.Fatalf("GetApproval(%s) = %v; want nil", a.ID, err)
	}
	sameApproval(t, "GetApproval(ap-1)", got, wantA)
	if _, err := s.GetApproval(ctx, "nope"); !errors.Is(err, store.ErrUnknownApproval) {
		t.Errorf("GetApproval(nope) = %v; want ErrUnknownApproval", err)
	}
	list, err := s.ListApprovals(ctx, at(2*time.Second))
	if err != nil || len(list) != 2 || list[0].ID != "ap-1" || list[1].ID != "ap-2" {
		t.Fatalf("ListApprovals = %+v, %v; want ap-1, ap-2", list, err)
	}
	// Not granted yet: nothing to consume.
	if _, ok, err := s.ConsumeApproval(ctx, a.Grant, a.Tool, a.Digest, at(3*time.Second)); ok || err != nil {
		t.Errorf("ConsumeApproval(pending) = %v, %v; want false, nil", ok, err)
	}
	// Grant: usable until decision time + TTL.
	granted, err := s.DecideApproval(ctx, a.ID, true, "operator", "looks fine", at(5*time.Second))
	if err != nil {
		t.Fatalf("DecideApproval(grant) = %v; want nil", err)
	}
	wantA.State, wantA.DecidedBy, wantA.Reason, wantA.Expires = store.ApprovalGranted, "operator", "looks fine", at(5*time.Second+a.TTL)
	sameApproval(t, "DecideApproval(grant)", granted, wantA)
	if _, err := s.DecideApproval(ctx, a.ID, false, "operator", "", at(6*time.Second)); !errors.Is(err, store.ErrNotPending) {
		t.Errorf("DecideApproval(already granted) = %v; want ErrNotPending", err)
	}
	if _, err := s.DecideApproval(ctx, "nope", true, "operator", "", at(6*time.Second)); !errors.Is(err, store.ErrUnknownApproval) {
		t.Errorf("DecideApproval(nope) = %v; want ErrUnknownApproval", err)
	}
	// The binding: another grant, tool or digest does not match.
	for _, w := range [][3]string{{"bob", a.Tool, a.Digest}, {a.Grant, "vm_power", a.Digest}, {a.Grant, a.Tool, b.Digest}} {
		if _, ok, err := s.ConsumeApproval(ctx, w[0], w[1], w[2], at(7*time.Second)); ok || err != nil {
			t.Errorf("ConsumeApproval(%q, %q, %q) = %v, %v; want false, nil", w[0], w[1], w[2], ok, err)
		}
	}
	c, ok, err := s.ConsumeApproval(ctx, a.Grant, a.Tool, a.Digest, at(8*time.Second))
	if !ok || err != nil {
		t.Fatalf("ConsumeApproval = %v, %v; want true, nil", ok, err)
	}
	wantA.State = store.ApprovalConsumed
	sameApproval(t, "ConsumeApproval", c, wantA)
	if _, ok, err := s.ConsumeApproval(ctx, a.Grant, a.Tool, a.Digest, at(9*time.Second)); ok || err != nil {
		t.Errorf("second ConsumeApproval = %v, %v; want false, nil (single use)", ok, err)
	}
	got, err = s.GetApproval(ctx, a.ID)
	if err != nil {
		t.Fatalf("GetApproval(consumed) = %v", err)
	}
	sameApproval(t, "GetApproval(consumed)", got, wantA)
	// Deny.
	denied, err := s.DecideApproval(ctx, b.ID, false, "operator", "no", at(10*time.Second))
	if err != nil || denied.State != store.ApprovalDenied || denied.Reason != "no" {
		t.Fatalf("DecideApproval(deny) = %+v, %v; want denied with reason", denied, err)
	}
	if _, ok, err := s.ConsumeApproval(ctx, b.Grant, b.Tool, b.Digest, at(11*time.Second)); ok || err != nil {
		t.Errorf("ConsumeApproval(denied) = %v, %v; want false, nil", ok, err)
	}
	list, err = s.ListApprovals(ctx, at(12*time.Second))
	if err != nil || len(list) != 2 || list[0].State != store.ApprovalConsumed || list[1].State != store.ApprovalDenied {
		t.Errorf("ListApprovals = %+v, %v; want consumed, denied", list, err)
	}
}

func testApprovalExpiry(t *testing.T, s store.Store) {
	ctx := context.Background()
	a := newApproval("pending-late", at(0))
	b := newApproval("granted-late", at(0))
	b.Digest = "sha256:b"
	for _, x := range []store.Approval{a, b} {
		if err := s.CreateApproval(ctx, x); err != nil {
			t.Fatalf("CreateApproval(%s) = %v", x.ID, err)
		}
	}
	// A pending approval past Expires is not grantable.
	got, err := s.DecideApproval(ctx, a.ID, true, "operator", "", a.Expires)
	if !errors.Is(err, store.ErrNotPending) || got.State != store.ApprovalExpired {
		t.Errorf("DecideApproval(past Expires) = %v, %v; want expired, ErrNotPending", got.State, err)
	}
	// A granted approval past its TTL is not consumable.
	if _, err := s.DecideApproval(ctx, b.ID, true, "operator", "", at(time.Minute)); err != nil {
		t.Fatalf("DecideApproval(b) = %v", err)
	}
	end := at(time.Minute + b.TTL)
	if _, ok, err := s.ConsumeApproval(ctx, b.Grant, b.Tool, b.Digest, end); ok || err != nil {
		t.Errorf("ConsumeApproval(at the end of its TTL) = %v, %v; want false, nil", ok, err)
	}
	list, err := s.ListApprovals(ctx, end)
	if err != nil || len(list) != 2 {
		t.Fatalf("ListApprovals = %+v, %v; want 2", list, err)
	}
	for _, x := range list {
		if x.State != store.ApprovalExpired {
			t.Errorf("ListApprovals: %s is %s; want expired", x.ID, x.State)
		}
	}
	// Just before the end it was still usable.
	if _, ok, err := s.ConsumeApproval(ctx, b.Grant, b.Tool, b.Digest, end.Add(-time.Millisecond)); !ok || err != nil {
		t.Errorf("ConsumeApproval(1ms before the end) = %v, %v; want true, nil", ok, err)
	}
}

func testApprovalConcurrentConsume(t *testing.T, s store.Store) {
	ctx := context.Background()
	const consumers = 8
	for round := range 5 {
		a := newApproval(fmt.Sprintf("race-%d", round), at(0))
		if err := s.CreateApproval(ctx, a); err != nil {
			t.Fatalf("CreateApproval = %v", err)
		}
		if _, err := s.DecideApproval(ctx, a.ID, true, "operator", "", at(time.Second)); err != nil {
			t.Fatalf("DecideApproval = %v", err)
		}
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			wins int
			errs []error
		)
		for range consumers {
			wg.Go(func() {
				_, ok, err := s.ConsumeApproval(ctx, a.Grant, a.Tool, a.Digest, at(2*time.Second))
				mu.Lock()
				defer mu.Unlock()
				if ok {
					wins++
				}
				if err != nil {
					errs = append(errs, err)
				}
			})
		}
		wg.Wait()
		if wins != 1 || len(errs) > 0 {
			t.Fatalf("round %d: %d concurrent ConsumeApproval: %d won, errors %v; want exactly 1 win, no errors", round, consumers, wins, errs)
		}
	}
}

func testBadApprovals(t *testing.T, s store.Store) {
	ctx := context.Background()
	good := newApproval("good", at(0))
	mod := func(f func(*store.Approval)) store.Approval { a := good; f(&a); return a }
	tests := []struct {
		name string
		a    store.Approval
	}{
		{"empty id", mod(func(a *store.Approval) { a.ID = "" })},
		{"id too long", mod(func(a *store.Approval) { a.ID = strings.Repeat("i", store.MaxKeyLen+1) })},
		{"empty grant", mod(func(a *store.Approval) { a.Grant = "" })},
		{"empty tool", mod(func(a *store.Approval) { a.Tool = "" })},
		{"empty digest", mod(func(a *store.Approval) { a.Digest = "" })},
		{"granted already", mod(func(a *store.Approval) { a.State = store.ApprovalGranted })},
		{"zero created", mod(func(a *store.Approval) { a.Created = time.Time{} })},
		{"expires before created", mod(func(a *store.Approval) { a.Expires = a.Created.Add(-time.Second) })},
		{"zero ttl", mod(func(a *store.Approval) { a.TTL = 0 })},
		{"arguments too large", mod(func(a *store.Approval) { a.FullArgs = strings.Repeat("x", store.MaxApprovalArgs+1) })},
	}
	for _, tt := range tests {
		if err := s.CreateApproval(ctx, tt.a); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CreateApproval(%s) = %v; want ErrInvalid", tt.name, err)
		}
	}
	if list, err := s.ListApprovals(ctx, at(0)); err != nil || len(list) != 0 {
		t.Errorf("ListApprovals after bad input = %+v, %v; want none", list, err)
	}
	if err := s.CreateApproval(ctx, good); err != nil {
		t.Fatalf("CreateApproval(good) = %v", err)
	}
	if _, err := s.DecideApproval(ctx, good.ID, true, "", "", at(time.Second)); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("DecideApproval(no operator) = %v; want ErrInvalid", err)
	}
	if _, err := s.GetApproval(ctx, ""); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("GetApproval(empty id) = %v; want ErrInvalid", err)
	}
	for _, w := range [][3]string{{"", "t", "d"}, {"g", "", "d"}, {"g", "t", ""}} {
		if _, _, err := s.ConsumeApproval(ctx, w[0], w[1], w[2], at(time.Second)); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ConsumeApproval(%q, %q, %q) = %v; want ErrInvalid", w[0], w[1], w[2], err)
		}
	}
	got, err := s.GetApproval(ctx, good.ID)
	if err != nil || got.State != store.ApprovalPending {
		t.Errorf("GetApproval(good) after bad decisions = %+v, %v; want pending", got, err)
	}
}

// testApprovalFullArgs: the full arguments are there for the operator while
// the approval can still let a call run, and gone, at rest too, once it
// cannot (denied, consumed, expired).
func testApprovalFullArgs(t *testing.T, s store.Store) {
	ctx := context.Background()
	full := `{"command":["sh"],"stdin":"echo innocent\nrm -rf /tmp/important\n","vm":"lab/vm1"}`
	mk := func(id, digest string) store.Approval {
		a := newApproval(id, at(0))
		a.Digest, a.FullArgs = digest, full
		if err := s.CreateApproval(ctx, a); err != nil {
			t.Fatalf("CreateApproval(%s) = %v", id, err)
		}
		return a
	}
	args := func(id string, now time.Time) (listed, stored string) {
		t.Helper()
		list, err := s.ListApprovals(ctx, now)
		if err != nil {
			t.Fatalf("ListApprovals = %v", err)
		}
		for _, a := range list {
			if a.ID == id {
				listed = a.FullArgs
			}
		}
		got, err := s.GetApproval(ctx, id)
		if err != nil {
			t.Fatalf("GetApproval(%s) = %v", id, err)
		}
		return listed, got.FullArgs
	}
	pending := mk("full-pending", "sha256:p")
	granted := mk("full-granted", "sha256:g")
	denied := mk("full-denied", "sha256:d")
	if l, st := args(pending.ID, at(time.Second)); l != full || st != full {
		t.Errorf("pending approval: listed %q, stored %q; want the full arguments", l, st)
	}
	if _, err := s.DecideApproval(ctx, granted.ID, true, "op", "", at(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if l, _ := args(granted.ID, at(3*time.Second)); l != full {
		t.Errorf("granted, unused approval: listed %q; want the full arguments", l)
	}
	d, err := s.DecideApproval(ctx, denied.ID, false, "op", "", at(2*time.Second))
	if err != nil || d.FullArgs != "" {
		t.Errorf("DecideApproval(deny) = %q, %v; want no full arguments", d.FullArgs, err)
	}
	c, ok, err := s.ConsumeApproval(ctx, granted.Grant, granted.Tool, granted.Digest, at(4*time.Second))
	if !ok || err != nil || c.FullArgs != "" {
		t.Errorf("ConsumeApproval = %q, %v, %v; want consumed without full arguments", c.FullArgs, ok, err)
	}
	for _, id := range []string{granted.ID, denied.ID} {
		if l, st := args(id, at(5*time.Second)); l != "" || st != "" {
			t.Errorf("%s: listed %q, stored %q; want none", id, l, st)
		}
	}
	// Expired: not listed with them, and rewritten without them once listed.
	late := pending.Expires.Add(time.Second)
	if l, st := args(pending.ID, late); l != "" || st != "" {
		t.Errorf("expired approval: listed %q, stored %q after a list; want none", l, st)
	}
	// Creating an approval scrubs the ended ones too.
	other := mk("full-other", "sha256:o")
	if _, st := args(other.ID, at(time.Second)); st != full {
		t.Errorf("a new approval: stored %q; want the full arguments", st)
	}
	n := newApproval("full-new", other.Expires.Add(time.Minute))
	if err := s.CreateApproval(ctx, n); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetApproval(ctx, other.ID); err != nil || got.FullArgs != "" {
		t.Errorf("an expired approval after another was created: stored %q, %v; want none", got.FullArgs, err)
	}
}
