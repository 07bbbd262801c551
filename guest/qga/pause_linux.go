//go:build linux

package qga

import (
	"context"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// clockMonotonic is CLOCK_MONOTONIC (linux/time.h), the clock time.Since
// reads.
const clockMonotonic = 1

// itimerspec is struct itimerspec (linux/time_types.h): a one-shot timer
// sets Value and leaves Interval zero.
type itimerspec struct {
	Interval syscall.Timespec
	Value    syscall.Timespec
}

// newTimerfd is timerfd_create(2) and timerfd_settime(2) of a one-shot
// non-blocking timer that expires after d; a variable so that tests can
// make it fail.
var newTimerfd = func(d time.Duration) (int, error) {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return -1, errno
	}
	spec := itimerspec{Value: syscall.NsecToTimespec(d.Nanoseconds())}
	if _, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); errno != 0 {
		syscall.Close(int(fd))
		return -1, errno
	}
	return int(fd), nil
}

// kernelSleep waits d on a timerfd read through the netpoller, or until ctx
// ends (ctx.Err()). handled is false when no timerfd could be had: the
// caller then waits on a Go timer. A read that fails for another reason
// than ctx waits out the rest on a Go timer itself (the read returns only
// once the timer expired, or with an error: never early).
func kernelSleep(ctx context.Context, d time.Duration) (handled bool, err error) {
	start := time.Now()
	fd, err := newTimerfd(d)
	if err != nil {
		return false, nil
	}
	// A non-blocking descriptor: os.NewFile registers it with the poller,
	// so the read parks the goroutine, not a thread.
	f := os.NewFile(uintptr(fd), "timerfd")
	defer f.Close()
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var expirations [8]byte
	if _, rerr := f.Read(expirations[:]); rerr != nil {
		if err := ctx.Err(); err != nil {
			return true, err
		}
		return true, timerSleep(ctx, d-time.Since(start))
	}
	return true, nil
}
