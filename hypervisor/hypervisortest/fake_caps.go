package hypervisortest

import (
	"context"

	"github.com/vmgate/vmgate/hypervisor"
)

var (
	_ hypervisor.CapabilityReporter = (*Fake)(nil)
	_ hypervisor.Snapshotter        = (*Fake)(nil)
	_ hypervisor.GuestNetworker     = (*Fake)(nil)
	_ hypervisor.MetricsReader      = (*Fake)(nil)
	_ hypervisor.HelperCaller       = (*Fake)(nil)
)

// Capabilities reports the capabilities whose functions are set: snapshots
// when any Snapshot*Func is (with Modes), and so on.
func (f *Fake) Capabilities() hypervisor.Capabilities {
	var k hypervisor.Capabilities
	if f.SnapshotCreateFunc != nil || f.SnapshotListFunc != nil || f.SnapshotRevertFunc != nil || f.SnapshotDeleteFunc != nil {
		k.Snapshots, k.SnapshotModes = true, f.Modes
	}
	k.GuestNetwork = f.GuestNetworkFunc != nil
	k.Metrics = f.VMMetricsFunc != nil
	k.Create = f.CreateVMFunc != nil || f.DeleteVMFunc != nil
	k.HelperChannel = f.HelperCallFunc != nil
	k.Screenshot, k.SendKeys = f.ScreenshotFunc != nil, f.SendKeysFunc != nil
	k.ConsoleRead, k.ConsoleWrite = f.ConsoleReadFunc != nil, f.ConsoleWriteFunc != nil
	return k
}

// SnapshotModes returns Modes.
func (f *Fake) SnapshotModes() hypervisor.SnapshotModes { return f.Modes }

// SnapshotCreate calls SnapshotCreateFunc.
func (f *Fake) SnapshotCreate(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
	if f.SnapshotCreateFunc == nil {
		return hypervisor.Snapshot{}, unset("SnapshotCreate")
	}
	return f.SnapshotCreateFunc(ctx, vm, req)
}

// SnapshotList calls SnapshotListFunc.
func (f *Fake) SnapshotList(ctx context.Context, vm string) ([]hypervisor.Snapshot, error) {
	if f.SnapshotListFunc == nil {
		return nil, unset("SnapshotList")
	}
	return f.SnapshotListFunc(ctx, vm)
}

// SnapshotRevert calls SnapshotRevertFunc.
func (f *Fake) SnapshotRevert(ctx context.Context, vm, name string) error {
	if f.SnapshotRevertFunc == nil {
		return unset("SnapshotRevert")
	}
	return f.SnapshotRevertFunc(ctx, vm, name)
}

// SnapshotDelete calls SnapshotDeleteFunc.
func (f *Fake) SnapshotDelete(ctx context.Context, vm, name string) error {
	if f.SnapshotDeleteFunc == nil {
		return unset("SnapshotDelete")
	}
	return f.SnapshotDeleteFunc(ctx, vm, name)
}

// GuestNetwork calls GuestNetworkFunc.
func (f *Fake) GuestNetwork(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) {
	if f.GuestNetworkFunc == nil {
		return nil, unset("GuestNetwork")
	}
	return f.GuestNetworkFunc(ctx, vm)
}

// VMMetrics calls VMMetricsFunc.
func (f *Fake) VMMetrics(ctx context.Context, vm string) (hypervisor.VMMetrics, error) {
	if f.VMMetricsFunc == nil {
		return hypervisor.VMMetrics{}, unset("VMMetrics")
	}
	return f.VMMetricsFunc(ctx, vm)
}

// HelperCall calls HelperCallFunc.
func (f *Fake) HelperCall(ctx context.Context, vm string, call hypervisor.HelperCall) (hypervisor.HelperReply, error) {
	if f.HelperCallFunc == nil {
		return hypervisor.HelperReply{}, unset("HelperCall")
	}
	return f.HelperCallFunc(ctx, vm, call)
}
