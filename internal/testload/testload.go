// Package testload scales the failure deadlines of tests with the load of
// the machine they run on.
//
// Tests wait for conditions (a VM booted, an agent answering, a power
// transition); their deadlines only bound how long a run that is really
// stuck takes to fail. A deadline set for an idle machine fails a correct
// run on a busy one: a TCG guest whose QEMU gets a tenth of a core boots
// ten times slower. So a test's deadline here is a base duration (what an
// idle machine needs, with a margin) times a load factor:
//
//	factor = clamp(load per core, 1, MaxFactor)
//
// where the load per core is the 1-minute load average over the number of
// CPUs (/proc/loadavg). The factor is measured when the wait starts and
// again every SampleEvery while it lasts, and the highest one seen sets the
// deadline: start + base × factor. A wait that began on an idle machine
// that then became busy is extended, never beyond base × MaxFactor, so a
// VM that is really stuck still fails in bounded time.
//
// Product timeouts (what a user of vmgate gets) do not use this package:
// it is for tests and their helpers.
//
// Concurrency: a Scaler and the package's functions are safe for
// concurrent use; each context from WithTimeout has one goroutine that
// watches the load until the context ends.
package testload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxFactor caps the load factor: no deadline grows beyond MaxFactor times
// its base. Measured on 2026-12-03 at load 10–17 on two cores: lab VMs
// booted in 14–29 s (6–8 s idle) and internal/guestctl's tests took
// 1,140 s (569 s on CI), so 2–4× in all; and a wait for a VM that will
// never answer (its libvirtd gone) took base × factor to fail: 8× a
// 5-minute power wait was 40 minutes, 4× is 20.
const MaxFactor = 4

// SampleEvery is how often a waiting context measures the load again.
const SampleEvery = 5 * time.Second

// LoadSource returns the load per core.
type LoadSource func() (float64, error)

// Scaler turns base durations into deadlines scaled by a LoadSource.
type Scaler struct {
	// Load is the load source; nil means LoadPerCore.
	Load LoadSource
	// Max caps the factor; 0 means MaxFactor.
	Max float64
	// Every is the sampling period of WithTimeout; 0 means SampleEvery.
	Every time.Duration
}

// LoadPerCore reads the 1-minute load average from /proc/loadavg and
// divides it by the number of CPUs this process may use.
func LoadPerCore() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, fmt.Errorf("testload: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("testload: /proc/loadavg is empty")
	}
	l, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("testload: /proc/loadavg: %w", err)
	}
	return l / float64(runtime.NumCPU()), nil
}

// Factor is the load factor now: the load per core, at least 1 and at
// most the cap. A load that cannot be read counts as 1 (no scaling).
func (s Scaler) Factor() float64 {
	load := s.Load
	if load == nil {
		load = LoadPerCore
	}
	l, err := load()
	if err != nil || l != l { // NaN too
		l = 1
	}
	return min(max(l, 1), s.max())
}

func (s Scaler) max() float64 {
	if s.Max <= 0 {
		return MaxFactor
	}
	return max(s.Max, 1)
}

// Scale returns base times the load factor now.
func (s Scaler) Scale(base time.Duration) time.Duration {
	return scale(base, s.Factor())
}

func scale(base time.Duration, f float64) time.Duration {
	return time.Duration(float64(base) * f)
}

// WithTimeout returns a context that ends base × the highest load factor
// seen since the call (measured at once and every Every while it waits),
// and never later than base × the cap. When it ends that way its Err is
// context.DeadlineExceeded and context.Cause says by how much the
// deadline was scaled. Its Deadline reports the cap, the latest it can
// end, so that helpers which add a default timeout to a context without
// one leave it alone. Call cancel to release it.
func (s Scaler) WithTimeout(parent context.Context, base time.Duration) (context.Context, context.CancelFunc) {
	start := time.Now()
	hard := start.Add(scale(base, s.max()))
	inner, cancelCause := context.WithCancelCause(parent)
	c := &loadCtx{Context: inner, hard: hard}
	every := s.Every
	if every <= 0 {
		every = SampleEvery
	}
	peak := s.Factor()
	go func() {
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			f := s.Factor()
			peak = max(peak, f)
			deadline := start.Add(scale(base, peak))
			now := time.Now()
			if !now.Before(deadline) {
				c.expire(cancelCause, fmt.Errorf("testload: deadline of %v × load factor %.1f (at most %v × %g) passed: %w",
					base, peak, base, s.max(), context.DeadlineExceeded))
				return
			}
			t.Reset(min(deadline.Sub(now), every))
			select {
			case <-inner.Done():
				return
			case <-t.C:
			}
		}
	}()
	return c, func() { cancelCause(context.Canceled) }
}

// loadCtx is the context of WithTimeout.
type loadCtx struct {
	context.Context
	hard time.Time

	mu      sync.Mutex
	expired bool
}

func (c *loadCtx) expire(cancel context.CancelCauseFunc, cause error) {
	c.mu.Lock()
	if c.Context.Err() == nil {
		c.expired = true
	}
	c.mu.Unlock()
	cancel(cause)
}

// Deadline reports the latest the context can end.
func (c *loadCtx) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.hard) {
		return d, true
	}
	return c.hard, true
}

// Err is context.DeadlineExceeded once the scaled deadline passed.
func (c *loadCtx) Err() error {
	err := c.Context.Err()
	if err == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expired && errors.Is(err, context.Canceled) {
		return context.DeadlineExceeded
	}
	return err
}

// std is the Scaler of the package's functions: the machine's load, the
// documented cap.
var std = Scaler{}

// Factor is the machine's load factor now (see Scaler.Factor).
func Factor() float64 { return std.Factor() }

// Scale returns base times the machine's load factor now.
func Scale(base time.Duration) time.Duration { return std.Scale(base) }

// WithTimeout is Scaler.WithTimeout on the machine's load.
func WithTimeout(parent context.Context, base time.Duration) (context.Context, context.CancelFunc) {
	return std.WithTimeout(parent, base)
}
