package hypervisor

import (
	"context"
	"fmt"
)

// Deferred's Screener, KeySender, ConsoleReader and ConsoleWriter:
// forwarded to the built driver when it has the capability,
// ErrNotSupported (ErrNotConfigured before Configure) otherwise.

var (
	_ Screener      = (*Deferred)(nil)
	_ KeySender     = (*Deferred)(nil)
	_ ConsoleReader = (*Deferred)(nil)
	_ ConsoleWriter = (*Deferred)(nil)
)

// deferredCap returns the built driver's side of a capability.
func deferredCap[T any](f *Deferred, op, what string, as func(Driver) (T, bool)) (T, error) {
	var zero T
	d, err := f.driver()
	if err != nil {
		return zero, err
	}
	c, ok := as(d)
	if !ok {
		return zero, fmt.Errorf("%s: %w: this backend has no %s", op, ErrNotSupported, what)
	}
	return c, nil
}

// Screenshot implements Screener.
func (f *Deferred) Screenshot(ctx context.Context, vm string, req ScreenshotRequest) (Screenshot, error) {
	s, err := deferredCap(f, "screenshot", "screenshots", AsScreener)
	if err != nil {
		return Screenshot{}, err
	}
	return s.Screenshot(ctx, vm, req)
}

// SendKeys implements KeySender.
func (f *Deferred) SendKeys(ctx context.Context, vm string, req KeysRequest) error {
	k, err := deferredCap(f, "send keys", "keyboard input", AsKeySender)
	if err != nil {
		return err
	}
	return k.SendKeys(ctx, vm, req)
}

// ConsoleRead implements ConsoleReader.
func (f *Deferred) ConsoleRead(ctx context.Context, vm string, req ConsoleReadRequest) (ConsoleChunk, error) {
	r, err := deferredCap(f, "console read", "serial console output", AsConsoleReader)
	if err != nil {
		return ConsoleChunk{}, err
	}
	return r.ConsoleRead(ctx, vm, req)
}

// ConsoleWrite implements ConsoleWriter.
func (f *Deferred) ConsoleWrite(ctx context.Context, vm string, data []byte) error {
	w, err := deferredCap(f, "console write", "serial console input", AsConsoleWriter)
	if err != nil {
		return err
	}
	return w.ConsoleWrite(ctx, vm, data)
}
