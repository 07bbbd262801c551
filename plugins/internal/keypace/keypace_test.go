package keypace

import (
	"context"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when slept on.
type fakeClock struct {
	t     time.Time
	slept []time.Duration
}

func (c *fakeClock) pacer() *Pacer {
	return &Pacer{
		Now: func() time.Time { return c.t },
		Sleep: func(_ context.Context, d time.Duration) error {
			c.slept = append(c.slept, d)
			c.t = c.t.Add(d)
			return nil
		},
	}
}

func TestPacerKeepsTheBacklogShort(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	p := c.pacer()
	ctx := context.Background()
	// 100 shifted characters sent back to back: 40 ms each in QEMU.
	for range 100 {
		if err := p.Before(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if backlog := p.until.Sub(c.t); backlog > MaxBacklog+Duration(2) {
			t.Fatalf("backlog %v; want at most %v", backlog, MaxBacklog+Duration(2))
		}
	}
	if err := p.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if total := c.t.Sub(time.Unix(1000, 0)); total != 100*Duration(2) {
		t.Errorf("typing 100 two-key combinations took %v; want %v (QEMU's own pace, no more)", total, 100*Duration(2))
	}
}

func TestPacerIdleSendsAtOnce(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	p := c.pacer()
	if err := p.Before(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	if len(c.slept) != 0 {
		t.Errorf("the first combination waited %v; want no wait", c.slept)
	}
	c.t = c.t.Add(time.Hour) // long idle: nothing is queued any more
	if err := p.Drain(context.Background()); err != nil || len(c.slept) != 0 {
		t.Errorf("Drain after the queue emptied waited %v (%v); want no wait", c.slept, err)
	}
}

func TestPacerCancelled(t *testing.T) {
	p := &Pacer{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 30 {
		if err := p.Before(ctx, 8); err != nil {
			return // the cancelled context ended the wait
		}
	}
	t.Errorf("30 eight-key combinations with a cancelled context never waited; want ctx.Err()")
}
