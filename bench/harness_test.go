package main

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRowAddRejectsBadFigures(t *testing.T) {
	tests := []struct {
		name string
		a, b float64
		ok   bool
	}{
		{"positive", 2, 3, true},
		{"zero A", 0, 3, false},
		{"zero B", 2, 0, false},
		{"negative", -1, 3, false},
		{"NaN", math.NaN(), 3, false},
		{"+Inf", 2, math.Inf(1), false},
		{"-Inf", math.Inf(-1), 3, false},
	}
	for _, tt := range tests {
		r := &Row{ID: "x"}
		err := r.Add(tt.a, tt.b)
		if (err == nil) != tt.ok {
			t.Errorf("%s: Add(%v, %v) = %v; want ok %v", tt.name, tt.a, tt.b, err, tt.ok)
		}
		if want := map[bool]int{true: 1, false: 0}[tt.ok]; len(r.A) != want || len(r.B) != want {
			t.Errorf("%s: after Add(%v, %v) the row holds %d/%d figures; want %d", tt.name, tt.a, tt.b, len(r.A), len(r.B), want)
		}
	}
}

func TestStats(t *testing.T) {
	tests := []struct {
		name            string
		a, b            []float64
		medA, medB      float64
		sprA            float64
		ratio, rlo, rhi float64
	}{
		{"odd", []float64{1, 3, 2}, []float64{2, 2, 2}, 2, 2, 0.5, 1, 0.5, 1.5},
		{"even", []float64{4, 1, 2, 3}, []float64{1, 1, 1, 1}, 2.5, 1, 0.6, 2.5, 1, 4},
		{"one pair", []float64{6}, []float64{3}, 6, 3, 0, 2, 2, 2},
	}
	for _, tt := range tests {
		r := &Row{ID: tt.name}
		for i := range tt.a {
			if err := r.Add(tt.a[i], tt.b[i]); err != nil {
				t.Fatal(err)
			}
		}
		s, err := r.Stats()
		if err != nil {
			t.Fatalf("%s: Stats() = %v", tt.name, err)
		}
		got := []float64{s.MedianA, s.MedianB, s.SpreadA, s.Ratio, s.RatioLo, s.RatioHi}
		want := []float64{tt.medA, tt.medB, tt.sprA, tt.ratio, tt.rlo, tt.rhi}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-12 {
				t.Errorf("%s: Stats() = %+v; want medians %v/%v, spread A %v, ratio %v [%v–%v]", tt.name, s, tt.medA, tt.medB, tt.sprA, tt.ratio, tt.rlo, tt.rhi)
				break
			}
		}
		if s.Pairs != len(tt.a) {
			t.Errorf("%s: Stats().Pairs = %d; want %d", tt.name, s.Pairs, len(tt.a))
		}
	}
}

func TestStatsWithoutPairs(t *testing.T) {
	for _, r := range []*Row{{ID: "empty"}, {ID: "uneven", A: []float64{1, 2}, B: []float64{1}}} {
		if _, err := r.Stats(); !errors.Is(err, errNoFigures) {
			t.Errorf("Stats() of row %s = %v; want errNoFigures", r.ID, err)
		}
	}
}

func TestRoundsCountsAfterWarmup(t *testing.T) {
	var got []bool
	err := Rounds(context.Background(), 2, 3, func(_ context.Context, i int, counts bool) error {
		if i != len(got) {
			t.Errorf("round index %d; want %d", i, len(got))
		}
		got = append(got, counts)
		return nil
	})
	want := []bool{false, false, true, true, true}
	if err != nil || len(got) != len(want) {
		t.Fatalf("Rounds(2, 3) = %v, rounds %v; want nil, %v", err, got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Rounds(2, 3) counts = %v; want %v", got, want)
			break
		}
	}
}

func TestRoundsStops(t *testing.T) {
	boom := errors.New("boom")
	n := 0
	err := Rounds(context.Background(), 1, 5, func(context.Context, int, bool) error {
		n++
		if n == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || n != 3 {
		t.Errorf("Rounds with a failing third round = %v after %d rounds; want boom after 3", err, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n = 0
	err = Rounds(ctx, 1, 5, func(context.Context, int, bool) error { n++; return nil })
	if !errors.Is(err, context.Canceled) || n != 0 {
		t.Errorf("Rounds on a cancelled context = %v after %d rounds; want Canceled after 0", err, n)
	}
}

func TestInterleaveAlternates(t *testing.T) {
	var order strings.Builder
	fig := 0.0
	side := func(name string) func(context.Context) (float64, error) {
		return func(context.Context) (float64, error) {
			order.WriteString(name)
			fig++
			return fig, nil
		}
	}
	r := &Row{ID: "x"}
	if err := Interleave(context.Background(), r, 1, 5, side("A"), side("B")); err != nil {
		t.Fatal(err)
	}
	if got, want := order.String(), strings.Repeat("AB", 6); got != want {
		t.Errorf("Interleave order = %s; want %s", got, want)
	}
	// The warm-up pair (1, 2) is dropped; A got the odd figures.
	if len(r.A) != 5 || r.A[0] != 3 || r.B[0] != 4 || r.A[4] != 11 || r.B[4] != 12 {
		t.Errorf("Interleave figures A %v B %v; want 3,5,…,11 and 4,6,…,12", r.A, r.B)
	}
	bad := func(context.Context) (float64, error) { return 0, nil }
	r2 := &Row{ID: "y"}
	if err := Interleave(context.Background(), r2, 1, 5, side("A"), bad); err == nil {
		t.Errorf("Interleave with a zero figure = nil; want an error")
	}
}

func TestWriteTable(t *testing.T) {
	good := &Row{ID: "1", What: "good row", Unit: "µs", Note: "a note"}
	for _, p := range [][2]float64{{10, 5}, {12, 6}, {11, 5}} {
		if err := good.Add(p[0], p[1]); err != nil {
			t.Fatal(err)
		}
	}
	rows := []*Row{good, {ID: "2", What: "broken row", Err: errors.New("it broke")}, {ID: "3", What: "absent row", Skip: "no qemu"}, {ID: "4", What: "empty row"}}
	var b strings.Builder
	if err := WriteTable(&b, "header line", rows); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 2+len(rows) || lines[0] != "header line" {
		t.Fatalf("WriteTable wrote %d lines:\n%s\nwant the header, the column names and %d rows", len(lines), b.String(), len(rows))
	}
	for i, want := range [][]string{
		{"good row", "11.0 µs ±9%", "5.00 µs ±10%", "2.20", "2.00–2.20", "a note"},
		{"broken row", "FAILED: it broke"},
		{"absent row", "skipped: no qemu"},
		{"empty row", "FAILED:", "no figures"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[2+i], w) {
				t.Errorf("table line %q; want it to contain %q", lines[2+i], w)
			}
		}
	}
}

// TestInterleavedRotates checks that interleaved runs one of each
// measurement in turn, starting each turn one further, and returns each
// one's median.
func TestInterleavedRotates(t *testing.T) {
	var order []int
	ms := [][]time.Duration{
		{1 * time.Millisecond, 9 * time.Millisecond, 2 * time.Millisecond},
		{5 * time.Millisecond, 4 * time.Millisecond, 6 * time.Millisecond},
	}
	calls := make([]int, len(ms))
	f := func(i int) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			order = append(order, i)
			d := ms[i][calls[i]]
			calls[i]++
			return d, nil
		}
	}
	got, err := interleaved(3, f(0), f(1))
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 1, 0, 0, 1}; !slices.Equal(order, want) {
		t.Errorf("interleaved order = %v; want %v", order, want)
	}
	if want := []float64{2, 5}; !slices.Equal(got, want) {
		t.Errorf("interleaved(3, …) = %v; want medians %v", got, want)
	}
	boom := errors.New("boom")
	n := 0
	_, err = interleaved(5, func() (time.Duration, error) { n++; return time.Millisecond, nil },
		func() (time.Duration, error) { return 0, boom })
	if !errors.Is(err, boom) || n != 1 {
		t.Errorf("interleaved with a failing measurement = %v after %d calls of the other; want boom after 1", err, n)
	}
}
