//go:build !linux

package qga

import (
	"context"
	"time"
)

// kernelSleep has no kernel timer to offer here: the caller uses a Go timer.
func kernelSleep(context.Context, time.Duration) (handled bool, err error) { return false, nil }
