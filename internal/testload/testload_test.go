package testload

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fixed is a load source that always reports l.
func fixed(l float64) LoadSource { return func() (float64, error) { return l, nil } }

func TestFactor(t *testing.T) {
	tests := []struct {
		name string
		s    Scaler
		want float64
	}{
		{"idle counts as 1", Scaler{Load: fixed(0.2)}, 1},
		{"load per core", Scaler{Load: fixed(3.5)}, 3.5},
		{"capped at MaxFactor", Scaler{Load: fixed(40)}, MaxFactor},
		{"capped at Max", Scaler{Load: fixed(40), Max: 2}, 2},
		{"Max below 1 is 1", Scaler{Load: fixed(40), Max: 0.5}, 1},
		{"unreadable counts as 1", Scaler{Load: func() (float64, error) { return 9, errors.New("no /proc") }}, 1},
		{"NaN counts as 1", Scaler{Load: fixed(math.NaN())}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.Factor(); got != tc.want {
				t.Errorf("Factor() = %v; want %v", got, tc.want)
			}
			if got, want := tc.s.Scale(time.Second), time.Duration(tc.want*float64(time.Second)); got != want {
				t.Errorf("Scale(1s) = %v; want %v", got, want)
			}
		})
	}
}

// TestLoadPerCore reads this machine's load: a number, not negative.
func TestLoadPerCore(t *testing.T) {
	l, err := LoadPerCore()
	if err != nil || l < 0 {
		t.Fatalf("LoadPerCore() = %v, %v; want a load ≥ 0", l, err)
	}
	if f := Factor(); f < 1 || f > MaxFactor {
		t.Errorf("Factor() = %v; want within [1, %d]", f, MaxFactor)
	}
}

// waitEnd waits for ctx to end and returns how long after start it ended;
// a context that has not ended by limit after start fails the test (a
// deadline that was never set, or not capped).
func waitEnd(t *testing.T, ctx context.Context, start time.Time, limit time.Duration) time.Duration {
	t.Helper()
	select {
	case <-ctx.Done():
		return time.Since(start)
	case <-time.After(time.Until(start.Add(limit))):
		t.Fatalf("the context had not ended %v after the start", limit)
		return 0
	}
}

// notCapped is the cap the tests of the scaled deadline set, far above the
// factors they use: a context that ends before base × notCapped ended on
// the factor measured, not on the cap.
const notCapped = 50

// TestWithTimeoutScales: the deadline is base × the factor measured at the
// start (not the cap); the context ends with DeadlineExceeded and a cause
// that names the factor; Deadline reports the cap.
func TestWithTimeoutScales(t *testing.T) {
	base := 40 * time.Millisecond
	s := Scaler{Load: fixed(3), Max: notCapped, Every: 5 * time.Millisecond}
	start := time.Now()
	ctx, cancel := s.WithTimeout(context.Background(), base)
	defer cancel()
	if dl, ok := ctx.Deadline(); !ok || dl.Before(start.Add(notCapped*base)) {
		t.Errorf("Deadline() = %v, %v; want the cap, at least %v after the start", dl, ok, notCapped*base)
	}
	if took := waitEnd(t, ctx, start, 2*notCapped*base); took < 3*base || took >= notCapped*base {
		t.Errorf("WithTimeout(%v) at load 3 ended after %v; want at least %v, before the cap %v", base, took, 3*base, notCapped*base)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Errorf("Err() = %v; want %v", ctx.Err(), context.DeadlineExceeded)
	}
	if c := context.Cause(ctx); !errors.Is(c, context.DeadlineExceeded) || !strings.Contains(c.Error(), "load factor 3.0") {
		t.Errorf("Cause() = %v; want DeadlineExceeded naming load factor 3.0", c)
	}
}

// TestWithTimeoutExtends: a load that rises while the context waits pushes
// its deadline out to base × the new factor.
func TestWithTimeoutExtends(t *testing.T) {
	base := 40 * time.Millisecond
	var calls atomic.Int32
	s := Scaler{Max: notCapped, Every: 5 * time.Millisecond, Load: func() (float64, error) {
		if calls.Add(1) <= 2 {
			return 1, nil // idle at the start
		}
		return 3, nil // then busy
	}}
	start := time.Now()
	ctx, cancel := s.WithTimeout(context.Background(), base)
	defer cancel()
	if took := waitEnd(t, ctx, start, 2*notCapped*base); took < 3*base || took >= notCapped*base {
		t.Errorf("WithTimeout(%v) with the load rising to 3 ended after %v; want at least %v, before the cap %v", base, took, 3*base, notCapped*base)
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Errorf("Err() = %v; want %v", ctx.Err(), context.DeadlineExceeded)
	}
}

// TestWithTimeoutCapped: however high the load, the context ends, after
// base × Max.
func TestWithTimeoutCapped(t *testing.T) {
	base := 20 * time.Millisecond
	s := Scaler{Load: fixed(1e6), Max: 3, Every: 5 * time.Millisecond}
	start := time.Now()
	ctx, cancel := s.WithTimeout(context.Background(), base)
	defer cancel()
	if took := waitEnd(t, ctx, start, notCapped*base); took < 3*base {
		t.Errorf("WithTimeout(%v) capped at 3 ended after %v; want at least %v", base, took, 3*base)
	}
	if dl, _ := ctx.Deadline(); dl.After(start.Add(3*base + time.Second)) {
		t.Errorf("Deadline() = %v; want the cap, %v after the start", dl, 3*base)
	}
}

// TestWithTimeoutCancel: cancel and the parent's end are Canceled, not
// DeadlineExceeded; a parent deadline earlier than the cap is reported.
func TestWithTimeoutCancel(t *testing.T) {
	s := Scaler{Load: fixed(1)}
	ctx, cancel := s.WithTimeout(context.Background(), time.Hour)
	cancel()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("after cancel, Err() = %v; want %v", ctx.Err(), context.Canceled)
	}

	parentDL := time.Now().Add(time.Minute)
	parent, pcancel := context.WithDeadline(context.Background(), parentDL)
	ctx, cancel = s.WithTimeout(parent, time.Hour)
	defer cancel()
	if dl, ok := ctx.Deadline(); !ok || !dl.Equal(parentDL) {
		t.Errorf("Deadline() under a parent ending first = %v, %v; want %v", dl, ok, parentDL)
	}
	pcancel()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("after the parent's cancel, Err() = %v; want %v", ctx.Err(), context.Canceled)
	}
}
