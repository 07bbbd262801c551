package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"
)

// ctxMonitor is a qmp.Monitor over a connected monitor whose every command
// is bounded by ctx, so go-qemu's typed raw commands honour the caller's
// deadline. Connecting and disconnecting stay with the caller (withQMP).
type ctxMonitor struct {
	ctx context.Context
	m   monitor
}

var _ qmp.Monitor = ctxMonitor{}

func (c ctxMonitor) Connect() error    { return nil }
func (c ctxMonitor) Disconnect() error { return nil }
func (c ctxMonitor) Run(command []byte) ([]byte, error) {
	return c.m.RunContext(c.ctx, command)
}
func (c ctxMonitor) Events(context.Context) (<-chan qmp.Event, error) {
	return nil, errors.New("qemu: events are not used over a per-operation connection")
}

// qmpSession is one QMP connection held for a few commands.
type qmpSession struct {
	ctx context.Context
	m   monitor
	// Raw is go-qemu's typed command set over the connection.
	Raw *raw.Monitor
}

// Run runs command with args (nil: none) and unmarshals its "return" into
// out (nil: discarded).
func (s qmpSession) Run(command string, args, out any) error {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp: %s: %w", command, err)
	}
	reply, err := s.m.RunContext(s.ctx, b)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(reply, &r); err != nil {
		return fmt.Errorf("qmp: %s: reply: %w", command, err)
	}
	if err := json.Unmarshal(r.Return, out); err != nil {
		return fmt.Errorf("qmp: %s: reply %.200s: %w", command, r.Return, err)
	}
	return nil
}

// withQMP connects to vm's QMP socket, runs f and disconnects, holding the
// VM's QMP lock throughout (QEMU serves one QMP client at a time). A socket
// nobody listens on is ErrVMNotRunning.
func (vm *vmState) withQMP(ctx context.Context, f func(s qmpSession) error) error {
	vm.qmpMu.Lock()
	defer vm.qmpMu.Unlock()
	if err := vm.mon.ConnectContext(ctx); err != nil {
		return err
	}
	defer vm.mon.Disconnect()
	return f(qmpSession{ctx: ctx, m: vm.mon, Raw: raw.NewMonitor(ctxMonitor{ctx: ctx, m: vm.mon})})
}
