package hypervisor

import (
	"context"
	"fmt"
	"time"
)

// Run runs req to completion on vm. It uses the driver's own Runner when it
// has one; otherwise it starts the command and polls ExecStatus adaptively:
// the first poll after about a millisecond, doubling up to 200 ms, so a
// short command returns in milliseconds and a long one costs few polls.
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
		t := time.NewTimer(b.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return res, fmt.Errorf("exec status: %w: %w", ErrTimeout, ctx.Err())
		case <-t.C:
		}
	}
}

// Backoff yields the adaptive poll intervals: 1 ms, 2 ms, 4 ms, … capped at
// 200 ms. The zero value is ready to use; it is not safe for concurrent use.
type Backoff struct {
	next time.Duration
}

// Next returns the next interval to wait.
func (b *Backoff) Next() time.Duration {
	const first, ceiling = time.Millisecond, 200 * time.Millisecond
	if b.next == 0 {
		b.next = first
	}
	d := b.next
	b.next *= 2
	if b.next > ceiling {
		b.next = ceiling
	}
	return d
}
