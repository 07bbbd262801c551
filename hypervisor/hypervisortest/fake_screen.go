package hypervisortest

import (
	"context"

	"github.com/vmgate/vmgate/hypervisor"
)

var (
	_ hypervisor.Screener      = (*Fake)(nil)
	_ hypervisor.KeySender     = (*Fake)(nil)
	_ hypervisor.ConsoleReader = (*Fake)(nil)
	_ hypervisor.ConsoleWriter = (*Fake)(nil)
)

// Screenshot calls ScreenshotFunc.
func (f *Fake) Screenshot(ctx context.Context, vm string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error) {
	if f.ScreenshotFunc == nil {
		return hypervisor.Screenshot{}, unset("Screenshot")
	}
	return f.ScreenshotFunc(ctx, vm, req)
}

// SendKeys calls SendKeysFunc.
func (f *Fake) SendKeys(ctx context.Context, vm string, req hypervisor.KeysRequest) error {
	if f.SendKeysFunc == nil {
		return unset("SendKeys")
	}
	return f.SendKeysFunc(ctx, vm, req)
}

// ConsoleRead calls ConsoleReadFunc.
func (f *Fake) ConsoleRead(ctx context.Context, vm string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error) {
	if f.ConsoleReadFunc == nil {
		return hypervisor.ConsoleChunk{}, unset("ConsoleRead")
	}
	return f.ConsoleReadFunc(ctx, vm, req)
}

// ConsoleWrite calls ConsoleWriteFunc.
func (f *Fake) ConsoleWrite(ctx context.Context, vm string, data []byte) error {
	if f.ConsoleWriteFunc == nil {
		return unset("ConsoleWrite")
	}
	return f.ConsoleWriteFunc(ctx, vm, data)
}
