package hypervisortest

import (
	"context"
	"fmt"

	"github.com/vmgate/vmgate/hypervisor"
)

// Fake is a hypervisor.Driver made of function fields, for unit tests of
// code that uses a driver. Each method calls its field; a method whose field
// is nil fails with an error wrapping hypervisor.ErrNotSupported, so a test
// that forgot to set a field fails closed instead of seeing zero values.
//
// Fake adds no locking: it is as safe for concurrent use as its functions are.
// It deliberately does not implement hypervisor.Runner, so hypervisor.Run
// drives it through ExecStart and ExecStatus.
type Fake struct {
	ListVMsFunc    func(ctx context.Context) ([]hypervisor.VM, error)
	StatusFunc     func(ctx context.Context, vm string) (hypervisor.Status, error)
	AgentInfoFunc  func(ctx context.Context, vm string) (hypervisor.AgentInfo, error)
	ExecStartFunc  func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error)
	ExecStatusFunc func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error)
	FileReadFunc   func(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error)
	FileWriteFunc  func(ctx context.Context, vm, path string, data []byte, mode uint32) error
	PowerFunc      func(ctx context.Context, vm string, action hypervisor.PowerAction) error

	// The optional capabilities (fake_caps.go): Fake reports a capability
	// when one of its functions is set.
	SnapshotCreateFunc func(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error)
	SnapshotListFunc   func(ctx context.Context, vm string) ([]hypervisor.Snapshot, error)
	SnapshotRevertFunc func(ctx context.Context, vm, name string) error
	SnapshotDeleteFunc func(ctx context.Context, vm, name string) error
	// Modes is what SnapshotModes reports.
	Modes            hypervisor.SnapshotModes
	GuestNetworkFunc func(ctx context.Context, vm string) ([]hypervisor.NetInterface, error)
	VMMetricsFunc    func(ctx context.Context, vm string) (hypervisor.VMMetrics, error)
	// CreateVMFunc and DeleteVMFunc make Fake a hypervisor.Creator
	// (fake_create.go).
	CreateVMFunc func(ctx context.Context, req hypervisor.CreateRequest) (hypervisor.CreatedVM, error)
	DeleteVMFunc func(ctx context.Context, req hypervisor.DeleteRequest) error
	// HelperCallFunc makes Fake a hypervisor.HelperCaller.
	HelperCallFunc func(ctx context.Context, vm string, call hypervisor.HelperCall) (hypervisor.HelperReply, error)
	// The screen, keyboard and console capabilities (fake_screen.go).
	ScreenshotFunc   func(ctx context.Context, vm string, req hypervisor.ScreenshotRequest) (hypervisor.Screenshot, error)
	SendKeysFunc     func(ctx context.Context, vm string, req hypervisor.KeysRequest) error
	ConsoleReadFunc  func(ctx context.Context, vm string, req hypervisor.ConsoleReadRequest) (hypervisor.ConsoleChunk, error)
	ConsoleWriteFunc func(ctx context.Context, vm string, data []byte) error
}

var _ hypervisor.Driver = (*Fake)(nil)

func unset(method string) error {
	return fmt.Errorf("hypervisortest: fake: %s: no %sFunc set: %w", method, method, hypervisor.ErrNotSupported)
}

// ListVMs calls ListVMsFunc.
func (f *Fake) ListVMs(ctx context.Context) ([]hypervisor.VM, error) {
	if f.ListVMsFunc == nil {
		return nil, unset("ListVMs")
	}
	return f.ListVMsFunc(ctx)
}

// Status calls StatusFunc.
func (f *Fake) Status(ctx context.Context, vm string) (hypervisor.Status, error) {
	if f.StatusFunc == nil {
		return hypervisor.Status{}, unset("Status")
	}
	return f.StatusFunc(ctx, vm)
}

// AgentInfo calls AgentInfoFunc.
func (f *Fake) AgentInfo(ctx context.Context, vm string) (hypervisor.AgentInfo, error) {
	if f.AgentInfoFunc == nil {
		return hypervisor.AgentInfo{}, unset("AgentInfo")
	}
	return f.AgentInfoFunc(ctx, vm)
}

// ExecStart calls ExecStartFunc.
func (f *Fake) ExecStart(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
	if f.ExecStartFunc == nil {
		return hypervisor.ExecHandle{}, unset("ExecStart")
	}
	return f.ExecStartFunc(ctx, vm, req)
}

// ExecStatus calls ExecStatusFunc.
func (f *Fake) ExecStatus(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
	if f.ExecStatusFunc == nil {
		return hypervisor.ExecResult{}, unset("ExecStatus")
	}
	return f.ExecStatusFunc(ctx, vm, h)
}

// FileRead calls FileReadFunc.
func (f *Fake) FileRead(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
	if f.FileReadFunc == nil {
		return hypervisor.FileContent{}, unset("FileRead")
	}
	return f.FileReadFunc(ctx, vm, path, maxBytes)
}

// FileWrite calls FileWriteFunc.
func (f *Fake) FileWrite(ctx context.Context, vm, path string, data []byte, mode uint32) error {
	if f.FileWriteFunc == nil {
		return unset("FileWrite")
	}
	return f.FileWriteFunc(ctx, vm, path, data, mode)
}

// Power calls PowerFunc.
func (f *Fake) Power(ctx context.Context, vm string, action hypervisor.PowerAction) error {
	if f.PowerFunc == nil {
		return unset("Power")
	}
	return f.PowerFunc(ctx, vm, action)
}
