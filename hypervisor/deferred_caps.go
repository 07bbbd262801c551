package hypervisor

import (
	"context"
	"fmt"
)

// Deferred's optional capabilities: each forwards to the built driver when
// it has the capability, and is ErrNotSupported (ErrNotConfigured before
// Configure) otherwise.

var (
	_ CapabilityReporter = (*Deferred)(nil)
	_ Snapshotter        = (*Deferred)(nil)
	_ SnapshotIDReverter = (*Deferred)(nil)
	_ GuestNetworker     = (*Deferred)(nil)
	_ MetricsReader      = (*Deferred)(nil)
	_ HelperCaller       = (*Deferred)(nil)
)

// Capabilities reports the built driver's capabilities; none before Configure.
func (f *Deferred) Capabilities() Capabilities {
	d, err := f.driver()
	if err != nil {
		return Capabilities{}
	}
	return CapabilitiesOf(d)
}

func (f *Deferred) snapshotter(op string) (Snapshotter, error) {
	d, err := f.driver()
	if err != nil {
		return nil, err
	}
	s, ok := AsSnapshotter(d)
	if !ok {
		return nil, fmt.Errorf("%s: %w: this backend has no snapshots", op, ErrNotSupported)
	}
	return s, nil
}

// SnapshotModes implements Snapshotter (no modes before Configure).
func (f *Deferred) SnapshotModes() SnapshotModes { return f.Capabilities().SnapshotModes }

// SnapshotCreate implements Snapshotter.
func (f *Deferred) SnapshotCreate(ctx context.Context, vm string, req SnapshotRequest) (Snapshot, error) {
	s, err := f.snapshotter("snapshot create")
	if err != nil {
		return Snapshot{}, err
	}
	return s.SnapshotCreate(ctx, vm, req)
}

// SnapshotList implements Snapshotter.
func (f *Deferred) SnapshotList(ctx context.Context, vm string) ([]Snapshot, error) {
	s, err := f.snapshotter("snapshot list")
	if err != nil {
		return nil, err
	}
	return s.SnapshotList(ctx, vm)
}

// SnapshotRevert implements Snapshotter.
func (f *Deferred) SnapshotRevert(ctx context.Context, vm, name string) error {
	s, err := f.snapshotter("snapshot revert")
	if err != nil {
		return err
	}
	return s.SnapshotRevert(ctx, vm, name)
}

// SnapshotRevertID implements SnapshotIDReverter: the built driver's, or
// RevertSnapshotID on it when it lacks the capability.
func (f *Deferred) SnapshotRevertID(ctx context.Context, vm, name, id string) error {
	s, err := f.snapshotter("snapshot revert")
	if err != nil {
		return err
	}
	if r, ok := s.(SnapshotIDReverter); ok {
		return r.SnapshotRevertID(ctx, vm, name, id)
	}
	return RevertSnapshotID(ctx, s, vm, name, id)
}

// SnapshotDelete implements Snapshotter.
func (f *Deferred) SnapshotDelete(ctx context.Context, vm, name string) error {
	s, err := f.snapshotter("snapshot delete")
	if err != nil {
		return err
	}
	return s.SnapshotDelete(ctx, vm, name)
}

// GuestNetwork implements GuestNetworker.
func (f *Deferred) GuestNetwork(ctx context.Context, vm string) ([]NetInterface, error) {
	d, err := f.driver()
	if err != nil {
		return nil, err
	}
	n, ok := AsGuestNetworker(d)
	if !ok {
		return nil, fmt.Errorf("guest network: %w: this backend has no guest network query", ErrNotSupported)
	}
	return n.GuestNetwork(ctx, vm)
}

// VMMetrics implements MetricsReader.
func (f *Deferred) VMMetrics(ctx context.Context, vm string) (VMMetrics, error) {
	d, err := f.driver()
	if err != nil {
		return VMMetrics{}, err
	}
	m, ok := AsMetricsReader(d)
	if !ok {
		return VMMetrics{}, fmt.Errorf("metrics: %w: this backend has no hypervisor metrics", ErrNotSupported)
	}
	return m.VMMetrics(ctx, vm)
}

// HelperCall implements HelperCaller.
func (f *Deferred) HelperCall(ctx context.Context, vm string, call HelperCall) (HelperReply, error) {
	d, err := f.driver()
	if err != nil {
		return HelperReply{}, err
	}
	h, ok := AsHelperCaller(d)
	if !ok {
		return HelperReply{}, fmt.Errorf("helper call: %w: %w: this backend has no resident helper channel", ErrNotSupported, ErrNoHelperChannel)
	}
	return h.HelperCall(ctx, vm, call)
}
