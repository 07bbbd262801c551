package guestctl

import "testing"

func TestStatStartTicks(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"7 (a b) c)) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 1 2", 99, true},
		{"7 (x) S 1 7", 0, false},
		{"no parenthesis", 0, false},
		{"7 (x) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -5 1 2", 0, false},
	} {
		got, ok := statStartTicks([]byte(tt.in))
		if got != tt.want || ok != tt.ok {
			t.Errorf("statStartTicks(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
