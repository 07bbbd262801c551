package qga

import (
	"context"
)

// The Client's commands: the Agent methods over the Client itself.

func (c *Client) agent() Agent { return Agent{Caller: c} }

// Ping: see Agent.Ping.
func (c *Client) Ping(ctx context.Context) error { return c.agent().Ping(ctx) }

// Info: see Agent.Info.
func (c *Client) Info(ctx context.Context) (Info, error) { return c.agent().Info(ctx) }

// OSInfo: see Agent.OSInfo.
func (c *Client) OSInfo(ctx context.Context) (OSInfo, error) { return c.agent().OSInfo(ctx) }

// NetworkInterfaces: see Agent.NetworkInterfaces.
func (c *Client) NetworkInterfaces(ctx context.Context) ([]NetworkInterface, error) {
	return c.agent().NetworkInterfaces(ctx)
}

// Shutdown: see Agent.Shutdown.
func (c *Client) Shutdown(ctx context.Context, mode string) error {
	return c.agent().Shutdown(ctx, mode)
}

// Exec: see Agent.Exec.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (ExecStatus, error) {
	return c.agent().Exec(ctx, req)
}

// ExecStart: see Agent.ExecStart.
func (c *Client) ExecStart(ctx context.Context, req ExecRequest) (int64, error) {
	return c.agent().ExecStart(ctx, req)
}

// ExecStatus: see Agent.ExecStatus.
func (c *Client) ExecStatus(ctx context.Context, pid int64, maxOutputBytes int64) (ExecStatus, error) {
	return c.agent().ExecStatus(ctx, pid, maxOutputBytes)
}

// Kill: see Agent.Kill.
func (c *Client) Kill(ctx context.Context, pid int64) error { return c.agent().Kill(ctx, pid) }

// KillTree: see Agent.KillTree.
func (c *Client) KillTree(ctx context.Context, pid int64) error { return c.agent().KillTree(ctx, pid) }

// FileRead: see Agent.FileRead.
func (c *Client) FileRead(ctx context.Context, path string, maxBytes int64) ([]byte, bool, error) {
	return c.agent().FileRead(ctx, path, maxBytes)
}

// FileWrite: see Agent.FileWrite.
func (c *Client) FileWrite(ctx context.Context, path string, data []byte, mode uint32) error {
	return c.agent().FileWrite(ctx, path, data, mode)
}
