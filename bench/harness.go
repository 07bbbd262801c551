package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// errNoFigures is returned for a row asked for statistics before it has a
// pair of figures.
var errNoFigures = errors.New("no figures")

// Row is one line of the table: subject A against baseline B, one figure
// of each per round. A[i] and B[i] were measured in the same round, one
// right after the other, so their ratio is a pair.
type Row struct {
	ID   string // "2a"
	What string // what A and B are
	Unit string // of the figures: "µs", "calls/s", …
	A, B []float64
	Note string // extra detail (allocs/op, cores, …)
	Err  error  // the row could not be measured
	Skip string // the row was skipped, and why
}

// Add records one round's pair of figures. Both must be positive and
// finite: a zero or negative time or rate is a measurement error.
func (r *Row) Add(a, b float64) error {
	for _, v := range []float64{a, b} {
		if !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("bench: %s: figure %v is not a positive finite number", r.ID, v)
		}
	}
	r.A = append(r.A, a)
	r.B = append(r.B, b)
	return nil
}

// Stats are the medians of each side, their spread and the ratio of the
// medians with the range of the per-pair ratios.
type Stats struct {
	MedianA, MedianB float64
	// SpreadA and SpreadB are half the range of a side's figures relative
	// to its median (0.05 means ±5 %).
	SpreadA, SpreadB float64
	Ratio            float64 // MedianA / MedianB
	RatioLo, RatioHi float64 // lowest and highest A[i]/B[i]
	Pairs            int
}

// Stats computes the row's statistics.
func (r *Row) Stats() (Stats, error) {
	if len(r.A) == 0 || len(r.A) != len(r.B) {
		return Stats{}, fmt.Errorf("bench: %s: %w (%d A, %d B)", r.ID, errNoFigures, len(r.A), len(r.B))
	}
	s := Stats{Pairs: len(r.A)}
	s.MedianA, s.SpreadA = medianSpread(r.A)
	s.MedianB, s.SpreadB = medianSpread(r.B)
	s.Ratio = s.MedianA / s.MedianB
	s.RatioLo, s.RatioHi = math.Inf(1), math.Inf(-1)
	for i := range r.A {
		q := r.A[i] / r.B[i]
		s.RatioLo, s.RatioHi = min(s.RatioLo, q), max(s.RatioHi, q)
	}
	return s, nil
}

// medianSpread returns the median of v (the mean of the middle two for an
// even count) and half its range relative to the median.
func medianSpread(v []float64) (median, spread float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		median = s[n/2]
	} else {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, (s[n-1] - s[0]) / 2 / median
}

// Rounds runs warmup rounds whose figures are thrown away, then pairs
// rounds that count; round gets its index and whether it counts. It stops
// at the first error or when ctx ends.
func Rounds(ctx context.Context, warmup, pairs int, round func(ctx context.Context, i int, counts bool) error) error {
	for i := range warmup + pairs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := round(ctx, i, i >= warmup); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
	}
	return nil
}

// Interleave fills r with A B A B … rounds of two measurements that each
// return one figure.
func Interleave(ctx context.Context, r *Row, warmup, pairs int, a, b func(ctx context.Context) (float64, error)) error {
	return Rounds(ctx, warmup, pairs, func(ctx context.Context, _ int, counts bool) error {
		fa, err := a(ctx)
		if err != nil {
			return err
		}
		fb, err := b(ctx)
		if err != nil {
			return err
		}
		if !counts {
			return nil
		}
		return r.Add(fa, fb)
	})
}

// formatFigure prints v with three significant digits and its unit.
func formatFigure(v float64, unit string) string {
	var s string
	switch a := math.Abs(v); {
	case a >= 100:
		s = fmt.Sprintf("%.0f", v)
	case a >= 10:
		s = fmt.Sprintf("%.1f", v)
	case a >= 1:
		s = fmt.Sprintf("%.2f", v)
	default:
		s = fmt.Sprintf("%.3g", v)
	}
	return s + " " + unit
}

// formatRatio prints a ratio with up to three significant digits.
func formatRatio(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 0.1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// WriteTable prints the rows as one aligned table. Rows that failed or
// were skipped say so in place of their figures.
func WriteTable(w io.Writer, header string, rows []*Row) error {
	if header != "" {
		if _, err := fmt.Fprintln(w, header); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tA / B (what)\tA median\tB median\tA/B\tA/B per pair\tpairs\tnote")
	for _, r := range rows {
		what := strings.ReplaceAll(r.What, "\t", " ")
		switch {
		case r.Err != nil:
			fmt.Fprintf(tw, "%s\t%s\tFAILED: %v\t\t\t\t\t\n", r.ID, what, r.Err)
			continue
		case r.Skip != "":
			fmt.Fprintf(tw, "%s\t%s\tskipped: %s\t\t\t\t\t\n", r.ID, what, r.Skip)
			continue
		}
		s, err := r.Stats()
		if err != nil {
			fmt.Fprintf(tw, "%s\t%s\tFAILED: %v\t\t\t\t\t\n", r.ID, what, err)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s ±%.0f%%\t%s ±%.0f%%\t%s\t%s–%s\t%d\t%s\n", r.ID, what,
			formatFigure(s.MedianA, r.Unit), 100*s.SpreadA,
			formatFigure(s.MedianB, r.Unit), 100*s.SpreadB,
			formatRatio(s.Ratio), formatRatio(s.RatioLo), formatRatio(s.RatioHi), s.Pairs, r.Note)
	}
	return tw.Flush()
}
