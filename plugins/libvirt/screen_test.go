package libvirt

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// TestWaitScreenshot: a stream whose call never returns (go-libvirt's lost
// end) is ended by closing its connection once it brings nothing for the
// stall limit, and says so with errStreamStalled, which Screenshot takes
// again; a finished stream gives its bytes; an ended context closes the
// connection and says ErrTimeout.
func TestWaitScreenshot(t *testing.T) {
	t.Run("stalled", func(t *testing.T) {
		img := &boundedBuffer{max: maxScreenBytes}
		img.Write([]byte("P6\n"))
		res := make(chan streamResult, 1)
		closed := make(chan struct{})
		_, _, err := waitScreenshot(context.Background(), res, img, 20*time.Millisecond, func() { close(closed) })
		if !errors.Is(err, errStreamStalled) {
			t.Fatalf("waitScreenshot(stalled stream) = %v; want errStreamStalled", err)
		}
		select {
		case <-closed:
		default:
			t.Fatal("waitScreenshot(stalled stream) returned without closing the connection")
		}
	})
	t.Run("finished", func(t *testing.T) {
		img := &boundedBuffer{max: maxScreenBytes}
		img.Write([]byte("\x89PNG\r\n\x1a\n"))
		res := make(chan streamResult, 1)
		res <- streamResult{}
		mime, got, err := waitScreenshot(context.Background(), res, img, time.Hour, func() { t.Error("disconnect called on a finished stream") })
		if err != nil || mime != "image/png" || len(got) != 8 {
			t.Fatalf("waitScreenshot(finished) = %q, %d bytes, %v; want image/png, 8 bytes, nil", mime, len(got), err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		closed := false
		_, _, err := waitScreenshot(ctx, make(chan streamResult), &boundedBuffer{max: 1}, time.Hour, func() { closed = true })
		if !errors.Is(err, hypervisor.ErrTimeout) || !closed {
			t.Fatalf("waitScreenshot(ended ctx) = %v, closed %v; want ErrTimeout, closed", err, closed)
		}
	})
}
