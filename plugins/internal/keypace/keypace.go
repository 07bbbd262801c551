// Package keypace paces key presses sent to QEMU's keyboard, for the
// drivers whose keys end in QMP's send-key (the QEMU driver directly,
// libvirt's virDomainSendKey through libvirt's QEMU driver).
//
// QEMU does not press a send-key's keys at once: qmp_send_key
// (ui/input-legacy.c) queues each key's press and release with a delay
// after each (its hold time, 0 meaning the default of 10 ms,
// kbd_default_delay_ms in ui/input.c), and the queue holds at most 1024
// entries (queue_limit), three per press or release (the event, a sync
// and the delay). Beyond that QEMU drops key events without a word. So a
// driver typing a long text waits while QEMU's queue drains, keeping the
// backlog short, and returns only once the last key has been pressed and
// released: a screenshot taken next sees what the keys did (as far as the
// guest has caught up).
//
// A Pacer is used by one goroutine at a time.
package keypace

import (
	"context"
	"time"
)

// KeyDelay is the delay QEMU puts after each key's press and after its
// release when send-key gives no hold time.
const KeyDelay = 10 * time.Millisecond

// MaxBacklog is how much of QEMU's queue, in time, a Pacer lets build up
// before it waits: 20 keys' worth, 120 entries of the 1024.
const MaxBacklog = 400 * time.Millisecond

// Pacer tracks when QEMU will have pressed every key sent so far.
type Pacer struct {
	// Now and Sleep are the clock; nil means the real one. Tests set them.
	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error

	until time.Time
}

func (p *Pacer) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func (p *Pacer) sleep(ctx context.Context, d time.Duration) error {
	if p.Sleep != nil {
		return p.Sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Duration is how long QEMU takes to press and release a combination of n
// keys: each key's press and its release are followed by KeyDelay.
func Duration(n int) time.Duration { return time.Duration(2*n) * KeyDelay }

// Before waits until a combination of n keys can be queued without the
// backlog passing MaxBacklog, then counts it as queued.
func (p *Pacer) Before(ctx context.Context, n int) error {
	now := p.now()
	if p.until.Before(now) {
		p.until = now // nothing queued (a zero until would overflow Sub)
	}
	if wait := p.until.Sub(now) - MaxBacklog; wait > 0 {
		if err := p.sleep(ctx, wait); err != nil {
			return err
		}
		now = p.now()
	}
	p.until = later(p.until, now).Add(Duration(n))
	return nil
}

// Drain waits until QEMU has pressed and released every key counted.
func (p *Pacer) Drain(ctx context.Context) error {
	now := p.now()
	if p.until.After(now) {
		return p.sleep(ctx, p.until.Sub(now))
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
