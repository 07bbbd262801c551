package hypervisor

import (
	"context"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// The host side of Screener, KeySender, ConsoleReader and ConsoleWriter
// (see client_caps.go): a call the plugin's driver has no capability for
// fails with ErrNotSupported before any RPC, and a request that fails its
// Validate never leaves the host.

var (
	_ Screener      = (*client)(nil)
	_ KeySender     = (*client)(nil)
	_ ConsoleReader = (*client)(nil)
	_ ConsoleWriter = (*client)(nil)
)

func hasScreenshot(k Capabilities) bool   { return k.Screenshot }
func hasSendKeys(k Capabilities) bool     { return k.SendKeys }
func hasConsoleRead(k Capabilities) bool  { return k.ConsoleRead }
func hasConsoleWrite(k Capabilities) bool { return k.ConsoleWrite }

func (c *client) Screenshot(ctx context.Context, vm string, req ScreenshotRequest) (Screenshot, error) {
	if err := req.Validate(); err != nil {
		return Screenshot{}, err
	}
	if err := c.need(ctx, "screenshot", "screenshots", hasScreenshot); err != nil {
		return Screenshot{}, err
	}
	resp, err := c.rpc.Screenshot(ctx, &pb.ScreenshotRequest{Vm: vm, MaxWidth: int64(req.MaxWidth)})
	if err != nil {
		return Screenshot{}, c.fromStatus(ctx, "screenshot", err)
	}
	return Screenshot{
		PNG: resp.GetPng(), Width: int(resp.GetWidth()), Height: int(resp.GetHeight()),
		SourceWidth: int(resp.GetSourceWidth()), SourceHeight: int(resp.GetSourceHeight()),
	}, nil
}

func (c *client) SendKeys(ctx context.Context, vm string, req KeysRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if err := c.need(ctx, "send keys", "keyboard input", hasSendKeys); err != nil {
		return err
	}
	if _, err := c.rpc.SendKeys(ctx, keysRequestToPB(vm, req)); err != nil {
		return c.fromStatus(ctx, "send keys", err)
	}
	return nil
}

func (c *client) ConsoleRead(ctx context.Context, vm string, req ConsoleReadRequest) (ConsoleChunk, error) {
	if err := req.Validate(); err != nil {
		return ConsoleChunk{}, err
	}
	if err := c.need(ctx, "console read", "serial console output", hasConsoleRead); err != nil {
		return ConsoleChunk{}, err
	}
	resp, err := c.rpc.ConsoleRead(ctx, &pb.ConsoleReadRequest{
		Vm: vm, Since: req.Since, TailBytes: int64(req.TailBytes), MaxBytes: int64(req.MaxBytes),
	})
	if err != nil {
		return ConsoleChunk{}, c.fromStatus(ctx, "console read", err)
	}
	return ConsoleChunk{
		Data: resp.GetData(), Start: resp.GetStart(), Cursor: resp.GetCursor(), Dropped: resp.GetDropped(),
		More: resp.GetMore(), Reset: resp.GetReset_(),
	}, nil
}

func (c *client) ConsoleWrite(ctx context.Context, vm string, data []byte) error {
	if err := ValidateConsoleWrite(data); err != nil {
		return err
	}
	if err := c.need(ctx, "console write", "serial console input", hasConsoleWrite); err != nil {
		return err
	}
	if _, err := c.rpc.ConsoleWrite(ctx, &pb.ConsoleWriteRequest{Vm: vm, Data: data}); err != nil {
		return c.fromStatus(ctx, "console write", err)
	}
	return nil
}
