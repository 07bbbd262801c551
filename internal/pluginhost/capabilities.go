package pluginhost

import (
	"context"
	"fmt"

	"github.com/vmgate/vmgate/hypervisor"
)

// The Supervisor's optional capabilities: it forwards each to the running
// plugin (starting one when none runs), whose client answers
// ErrNotSupported without a round trip when the plugin's driver lacks the
// capability. A snapshot's create, revert and delete can change the VM's
// state (a revert powers it to the snapshot's), so they empty the state
// cache as Power does (cache.go).

var (
	_ hypervisor.CapabilityReporter = (*Supervisor)(nil)
	_ hypervisor.Snapshotter        = (*Supervisor)(nil)
	_ hypervisor.SnapshotIDReverter = (*Supervisor)(nil)
	_ hypervisor.GuestNetworker     = (*Supervisor)(nil)
	_ hypervisor.MetricsReader      = (*Supervisor)(nil)
	_ hypervisor.HelperCaller       = (*Supervisor)(nil)
)

// Capabilities reports the plugin driver's capabilities: the running
// plugin's, else those of the last one that ran (a restart does not change
// the driver), else none.
func (s *Supervisor) Capabilities() hypervisor.Capabilities {
	s.mu.Lock()
	inst := s.cur
	s.mu.Unlock()
	if inst != nil {
		k := hypervisor.CapabilitiesOf(inst.drv)
		s.caps.Store(&k)
		return k
	}
	if k := s.caps.Load(); k != nil {
		return *k
	}
	return hypervisor.Capabilities{}
}

// SnapshotModes implements hypervisor.Snapshotter.
func (s *Supervisor) SnapshotModes() hypervisor.SnapshotModes { return s.Capabilities().SnapshotModes }

// capability returns the plugin's side of a capability; the plugin client
// implements them all.
func capability[T any](op string, d hypervisor.Driver) (T, error) {
	c, ok := d.(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("%s: %w: plugin client %T", op, hypervisor.ErrNotSupported, d)
	}
	return c, nil
}

// SnapshotCreate implements hypervisor.Snapshotter.
func (s *Supervisor) SnapshotCreate(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
	return changing(s, ctx, func(d remote) (hypervisor.Snapshot, error) {
		sn, err := capability[hypervisor.Snapshotter]("snapshot create", d)
		if err != nil {
			return hypervisor.Snapshot{}, err
		}
		return sn.SnapshotCreate(ctx, vm, req)
	})
}

// SnapshotList implements hypervisor.Snapshotter.
func (s *Supervisor) SnapshotList(ctx context.Context, vm string) ([]hypervisor.Snapshot, error) {
	return call(s, ctx, func(d remote) ([]hypervisor.Snapshot, error) {
		sn, err := capability[hypervisor.Snapshotter]("snapshot list", d)
		if err != nil {
			return nil, err
		}
		return sn.SnapshotList(ctx, vm)
	})
}

// SnapshotRevert implements hypervisor.Snapshotter.
func (s *Supervisor) SnapshotRevert(ctx context.Context, vm, name string) error {
	_, err := changing(s, ctx, func(d remote) (struct{}, error) {
		sn, err := capability[hypervisor.Snapshotter]("snapshot revert", d)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, sn.SnapshotRevert(ctx, vm, name)
	})
	return err
}

// SnapshotRevertID implements hypervisor.SnapshotIDReverter: the plugin
// checks the identity next to its driver.
func (s *Supervisor) SnapshotRevertID(ctx context.Context, vm, name, id string) error {
	_, err := changing(s, ctx, func(d remote) (struct{}, error) {
		sn, err := capability[hypervisor.SnapshotIDReverter]("snapshot revert", d)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, sn.SnapshotRevertID(ctx, vm, name, id)
	})
	return err
}

// SnapshotDelete implements hypervisor.Snapshotter.
func (s *Supervisor) SnapshotDelete(ctx context.Context, vm, name string) error {
	_, err := changing(s, ctx, func(d remote) (struct{}, error) {
		sn, err := capability[hypervisor.Snapshotter]("snapshot delete", d)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, sn.SnapshotDelete(ctx, vm, name)
	})
	return err
}

// GuestNetwork implements hypervisor.GuestNetworker.
func (s *Supervisor) GuestNetwork(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) {
	return call(s, ctx, func(d remote) ([]hypervisor.NetInterface, error) {
		n, err := capability[hypervisor.GuestNetworker]("guest network", d)
		if err != nil {
			return nil, err
		}
		return n.GuestNetwork(ctx, vm)
	})
}

// VMMetrics implements hypervisor.MetricsReader.
func (s *Supervisor) VMMetrics(ctx context.Context, vm string) (hypervisor.VMMetrics, error) {
	return call(s, ctx, func(d remote) (hypervisor.VMMetrics, error) {
		m, err := capability[hypervisor.MetricsReader]("metrics", d)
		if err != nil {
			return hypervisor.VMMetrics{}, err
		}
		return m.VMMetrics(ctx, vm)
	})
}

// HelperCall implements hypervisor.HelperCaller. A helper command can
// change the VM's state as an exec can (a run of poweroff), so it empties
// the state cache as ExecStart does.
func (s *Supervisor) HelperCall(ctx context.Context, vm string, hc hypervisor.HelperCall) (hypervisor.HelperReply, error) {
	return changing(s, ctx, func(d remote) (hypervisor.HelperReply, error) {
		h, err := capability[hypervisor.HelperCaller]("helper call", d)
		if err != nil {
			return hypervisor.HelperReply{}, err
		}
		return h.HelperCall(ctx, vm, hc)
	})
}
