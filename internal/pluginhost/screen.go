package pluginhost

import (
	"context"

	"github.com/vmgate/vmgate/hypervisor"
)

// The Supervisor's Screener, KeySender, ConsoleReader and ConsoleWriter:
// forwarded to the running plugin like the other capabilities
// (capabilities.go). Keys and console input can change the VM's state (a
// ctrl-alt-delete, a "poweroff" typed at a shell), so they empty the
// state cache as Power does (cache.go).

var (
	_ hypervisor.Screener      = (*Supervisor)(nil)
	_ hypervisor.KeySender     = (*Supervisor)(nil)
	_ hypervisor.ConsoleReader = (*Supervisor)(nil)
	_ hypervisor.ConsoleWriter = (*Supervisor)(nil)
)

// Screenshot implements hypervisor.Screener.
func (s *Supervisor) Screenshot(ctx context.Context, vm string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
	return call(s, ctx, func(d remote) (hypervisor.Screenshot, error) {
		sc, err := capability[hypervisor.Screener]("screenshot", d)
		if err != nil {
			return hypervisor.Screenshot{}, err
		}
		return sc.Screenshot(ctx, vm, req)
	})
}

// SendKeys implements hypervisor.KeySender.
func (s *Supervisor) SendKeys(ctx context.Context, vm string, req hypervisor.KeysRequest) error {
	_, err := changing(s, ctx, func(d remote) (struct{}, error) {
		k, err := capability[hypervisor.KeySender]("send keys", d)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, k.SendKeys(ctx, vm, req)
	})
	return err
}

// ConsoleRead implements hypervisor.ConsoleReader.
func (s *Supervisor) ConsoleRead(ctx context.Context, vm string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
	return call(s, ctx, func(d remote) (hypervisor.ConsoleChunk, error) {
		r, err := capability[hypervisor.ConsoleReader]("console read", d)
		if err != nil {
			return hypervisor.ConsoleChunk{}, err
		}
		return r.ConsoleRead(ctx, vm, req)
	})
}

// ConsoleWrite implements hypervisor.ConsoleWriter.
func (s *Supervisor) ConsoleWrite(ctx context.Context, vm string, data []byte) error {
	_, err := changing(s, ctx, func(d remote) (struct{}, error) {
		w, err := capability[hypervisor.ConsoleWriter]("console write", d)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, w.ConsoleWrite(ctx, vm, data)
	})
	return err
}
