package qga

import (
	"slices"
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	p := newPacer()
	for i := range 5 {
		if d := p.next(); d != 0 {
			t.Fatalf("next() #%d within the first %v = %v; want 0 (back to back)", i, backToBack, d)
		}
	}
	p.start = time.Now().Add(-backToBack) // the window has passed
	var got []time.Duration
	for range 30 {
		got = append(got, p.next())
	}
	// From 1 ms, each a quarter longer, capped at 200 ms: 1, 1.25, 1.5625, …
	want := []time.Duration{time.Millisecond}
	for len(want) < len(got) {
		w := want[len(want)-1]
		want = append(want, min(w+w/4, pollCeiling))
	}
	if !slices.Equal(got, want) || got[len(got)-1] != pollCeiling {
		t.Fatalf("next() after the window = %v; want %v, ending at %v", got, want, pollCeiling)
	}
}

// TestSettle: the pause before the first poll is 0.4 of guest-exec's
// round trip, at most settleCeiling, and never runs past the deadline.
func TestSettle(t *testing.T) {
	far, past := time.Now().Add(time.Hour), time.Now().Add(-time.Second)
	for _, c := range []struct {
		spawn    time.Duration
		deadline time.Time
		want     time.Duration
	}{
		{0, time.Time{}, 0},
		{10 * time.Millisecond, time.Time{}, 4 * time.Millisecond},
		{time.Millisecond, time.Time{}, 400 * time.Microsecond},
		{100 * time.Millisecond, time.Time{}, settleCeiling},
		{10 * time.Millisecond, far, 4 * time.Millisecond},
		{10 * time.Millisecond, past, 0},
	} {
		if got := settle(c.spawn, c.deadline); got != c.want {
			t.Errorf("settle(%v, %v) = %v; want %v", c.spawn, c.deadline, got, c.want)
		}
	}
	// A deadline closer than the pause cuts it.
	if got := settle(10*time.Millisecond, time.Now().Add(time.Millisecond)); got > time.Millisecond {
		t.Errorf("settle(10ms, deadline in 1ms) = %v; want at most 1ms", got)
	}
}
