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
