package hypervisor

import (
	"context"
	"fmt"
	"time"
)

// Run runs req to completion on vm. It uses the driver's own Runner when it
// has one; otherwise it starts the command and polls ExecStatus adaptively:
// the first poll after about a millisecond, growing by a quarter up to
// 200 ms, so a short command returns in milliseconds, it is seen to exit
// at most about 30% of its run time late, and a long one costs few polls.
//
// Run is the one place that decides whether a driver runs commands itself.
// The layers between the server and a plugin's driver do not decide: the
// plugin host's Supervisor and the plugin client forward a Run as one RPC,
// and the plugin's gRPC server calls Run on the driver it serves (the one a
// Deferred built), so the question is asked once, next to the driver.
//
// Run does not enforce req.Timeout itself: the driver does, because only it
// can kill the command in the guest. ctx bounds the wait.
func Run(ctx context.Context, d Driver, vm string, req ExecRequest) (ExecResult, error) {
	if r, ok := d.(Runner); ok {
		return r.Run(ctx, vm, req)
	}
	h, err := d.ExecStart(ctx, vm, req)
	if err != nil {
		return ExecResult{}, err
	}
	return Wait(ctx, d, vm, h)
}

// Wait polls h until the command has exited or ctx ends.
func Wait(ctx context.Context, d Driver, vm string, h ExecHandle) (ExecResult, error) {
	var b Backoff
	for {
		res, err := d.ExecStatus(ctx, vm, h)
		if err != nil {
			return ExecResult{}, err
		}
		if res.Exited {
			return res, nil
		}
		if err := b.Sleep(ctx, 0); err != nil {
			return res, fmt.Errorf("exec status: %w: %w", ErrTimeout, err)
		}
	}
}

// Backoff yields the adaptive poll intervals: 1 ms, 1.25 ms, 1.56 ms, …
// each a quarter longer than the one before, capped at 200 ms. Doubling
// would see a command exit up to twice its run time after it did (a 17 ms
// command seen at 31 ms); a quarter bounds that at about 30% for a few
// more polls (about 25 to reach the cap, 2 s in). The zero value is ready to
// use; it is not safe for concurrent use.
type Backoff struct {
	next time.Duration
}

// Poll schedule of Backoff (and of guest/qga's Exec, which keeps the same).
const (
	PollFirst   = time.Millisecond
	PollCeiling = 200 * time.Millisecond
)

// Next returns the next interval to wait.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = PollFirst
	}
	d := b.next
	b.next = min(b.next+b.next/4, PollCeiling)
	return d
}

// Sleep waits the next interval, at most ceiling when ceiling is above 0,
// and returns nil; or ctx.Err() as soon as ctx ends.
func (b *Backoff) Sleep(ctx context.Context, ceiling time.Duration) error {
	d := b.Next()
	if ceiling > 0 {
		d = min(d, ceiling)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
