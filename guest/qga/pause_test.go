package qga

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"
)

// TestSleep checks that sleep waits at least what it is asked, on the
// kernel timer and on the Go timer it falls back to.
func TestSleep(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		if fallback {
			withTimerfd(t, func(time.Duration) (int, error) { return -1, syscall.EMFILE })
		}
		for _, d := range []time.Duration{-time.Millisecond, 0, time.Microsecond, 300 * time.Microsecond, 3400 * time.Microsecond} {
			start := time.Now()
			err := sleep(context.Background(), d)
			if took := time.Since(start); err != nil || took < d {
				t.Errorf("sleep(%v) (fallback %v) = %v after %v; want nil after at least %v", d, fallback, err, took, d)
			}
		}
	}
}

// TestSleepEndsWithContext checks that an ended context ends a long sleep,
// while it waits on either timer, and that a passed deadline is ErrTimeout.
func TestSleepEndsWithContext(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		// Cancel once the sleep has its timer (or failed to get one).
		withTimerfd(t, func(d time.Duration) (int, error) {
			defer cancel()
			if fallback {
				return -1, syscall.EMFILE
			}
			return realTimerfd(d)
		})
		if err := sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
			t.Errorf("sleep(1h) cancelled (fallback %v) = %v; want context.Canceled", fallback, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := sleep(ctx, time.Hour); !errors.Is(err, ErrTimeout) {
		t.Errorf("sleep(1h) past a 1 ms deadline = %v; want ErrTimeout", err)
	}
	if err := sleep(ctx, 0); !errors.Is(err, ErrTimeout) {
		t.Errorf("sleep(0) past the deadline = %v; want ErrTimeout", err)
	}
}

// realTimerfd is newTimerfd as shipped.
var realTimerfd = newTimerfd

// withTimerfd makes sleep get its kernel timers from f for the rest of t.
func withTimerfd(t *testing.T, f func(time.Duration) (int, error)) {
	t.Helper()
	newTimerfd = f
	t.Cleanup(func() { newTimerfd = realTimerfd })
}

// BenchmarkSleepOvershoot sleeps for a settling pause's typical 3.4 ms, the
// process otherwise idle, on the kernel timer and on a Go timer, and
// reports how much longer than asked each slept (overshoot-µs/op).
func BenchmarkSleepOvershoot(b *testing.B) {
	const d = 3400 * time.Microsecond
	for _, bc := range []struct {
		name  string
		sleep func(context.Context, time.Duration) error
	}{
		{"timerfd", sleep},
		{"go-timer", timerSleep},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var over time.Duration
			for b.Loop() {
				start := time.Now()
				if err := bc.sleep(context.Background(), d); err != nil {
					b.Fatal(err)
				}
				over += time.Since(start) - d
			}
			b.ReportMetric(float64(over.Microseconds())/float64(b.N), "overshoot-µs/op")
		})
	}
}
