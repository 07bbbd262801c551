package qga

import (
	"context"
	"errors"
	"time"
)

// The pauses between a command's polls are a few milliseconds each, and
// Go's timers are not precise at that scale in an idle process: with every
// thread parked, a timer is fired by the netpoller, whose epoll_wait counts
// in whole milliseconds, so a 3.4 ms timer fires at 4 ms or later and a
// 1.25 ms one at 2 ms. In the QEMU driver's plugin, idle between calls,
// the settling pause slept 4.39 ms where 3.66 ms was asked (medians of 400
// execs; in a busier process, about 3.5 where 3.1 was asked). sleep therefore waits on
// a kernel timer the netpoller watches (a timerfd on Linux, see
// pause_linux.go): it wakes the poller when it expires, to the
// microsecond, and the context still ends the wait at once. Where that
// timer cannot be had (another OS, no descriptor left), a Go timer does.

// sleep waits d (none when d <= 0) or until ctx ends; a passed deadline is
// ErrTimeout.
func sleep(ctx context.Context, d time.Duration) error {
	err := ctx.Err()
	if err == nil && d > 0 {
		var handled bool
		if handled, err = kernelSleep(ctx, d); !handled {
			err = timerSleep(ctx, d)
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ErrTimeout
	}
	return err
}

// timerSleep waits d on a Go timer, or until ctx ends (ctx.Err()).
func timerSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
