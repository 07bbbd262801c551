package qga

import (
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
	for range 10 {
		got = append(got, p.next())
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 200, 200}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("next() after the window = %v; want %v ms", got, want)
		}
	}
}
