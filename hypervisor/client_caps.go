package hypervisor

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// The host side of the optional capabilities. The client implements every
// capability interface, because it cannot know the plugin's driver when
// it is built; Capabilities says which the driver behind it has, and a
// call to one it lacks fails with ErrNotSupported without reaching the
// plugin.

var (
	_ CapabilityReporter = (*client)(nil)
	_ Snapshotter        = (*client)(nil)
	_ SnapshotIDReverter = (*client)(nil)
	_ GuestNetworker     = (*client)(nil)
	_ MetricsReader      = (*client)(nil)
	_ HelperCaller       = (*client)(nil)
)

func (c *client) setCaps(k Capabilities) { c.caps.Store(&k) }

// Capabilities reports the plugin driver's capabilities as its Configure
// reply gave them; before Configure (the plugin host always sends it) none.
func (c *client) Capabilities() Capabilities {
	if k := c.caps.Load(); k != nil {
		return *k
	}
	return Capabilities{}
}

// capabilities returns the plugin's capabilities, asking it once when
// Configure has not told them. A plugin that does not know the RPC has none.
func (c *client) capabilities(ctx context.Context) (Capabilities, error) {
	if k := c.caps.Load(); k != nil {
		return *k, nil
	}
	resp, err := c.rpc.Capabilities(ctx, &pb.CapabilitiesRequest{})
	if status.Code(err) == codes.Unimplemented {
		c.setCaps(Capabilities{})
		return Capabilities{}, nil
	}
	if err != nil {
		return Capabilities{}, c.fromStatus(ctx, "capabilities", err)
	}
	k := capabilitiesFromPB(resp)
	c.setCaps(k)
	return k, nil
}

// need fails with ErrNotSupported, before any RPC, when the plugin's driver
// lacks the capability has picks out.
func (c *client) need(ctx context.Context, op, what string, has func(Capabilities) bool) error {
	k, err := c.capabilities(ctx)
	if err != nil {
		return err
	}
	if !has(k) {
		return fmt.Errorf("driver %s: %s: %w: this backend has no %s", c.name, op, ErrNotSupported, what)
	}
	return nil
}

func hasSnapshots(k Capabilities) bool { return k.Snapshots }
func hasNetwork(k Capabilities) bool   { return k.GuestNetwork }
func hasMetrics(k Capabilities) bool   { return k.Metrics }
func hasHelper(k Capabilities) bool    { return k.HelperChannel }

// SnapshotModes implements Snapshotter from the plugin's capabilities.
func (c *client) SnapshotModes() SnapshotModes { return c.Capabilities().SnapshotModes }

func (c *client) SnapshotCreate(ctx context.Context, vm string, req SnapshotRequest) (Snapshot, error) {
	if err := c.need(ctx, "snapshot create", "snapshots", hasSnapshots); err != nil {
		return Snapshot{}, err
	}
	resp, err := c.rpc.SnapshotCreate(ctx, &pb.SnapshotCreateRequest{
		Vm: vm, Name: req.Name, Description: req.Description, Memory: req.Memory,
	})
	if err != nil {
		return Snapshot{}, c.fromStatus(ctx, "snapshot create", err)
	}
	return snapshotFromPB(resp), nil
}

func (c *client) SnapshotList(ctx context.Context, vm string) ([]Snapshot, error) {
	if err := c.need(ctx, "snapshot list", "snapshots", hasSnapshots); err != nil {
		return nil, err
	}
	resp, err := c.rpc.SnapshotList(ctx, &pb.VMRequest{Vm: vm})
	if err != nil {
		return nil, c.fromStatus(ctx, "snapshot list", err)
	}
	out := make([]Snapshot, len(resp.GetSnapshots()))
	for i, s := range resp.GetSnapshots() {
		out[i] = snapshotFromPB(s)
	}
	return out, nil
}

func (c *client) SnapshotRevert(ctx context.Context, vm, name string) error {
	if err := c.need(ctx, "snapshot revert", "snapshots", hasSnapshots); err != nil {
		return err
	}
	if _, err := c.rpc.SnapshotRevert(ctx, &pb.SnapshotNameRequest{Vm: vm, Name: name}); err != nil {
		return c.fromStatus(ctx, "snapshot revert", err)
	}
	return nil
}

// SnapshotRevertID implements SnapshotIDReverter: the plugin checks the
// identity next to its driver (RevertSnapshotID there). A plugin built
// before expect_id existed ignores it; RevertSnapshotID checked on this
// side first.
func (c *client) SnapshotRevertID(ctx context.Context, vm, name, id string) error {
	if err := c.need(ctx, "snapshot revert", "snapshots", hasSnapshots); err != nil {
		return err
	}
	if _, err := c.rpc.SnapshotRevert(ctx, &pb.SnapshotNameRequest{Vm: vm, Name: name, ExpectId: id}); err != nil {
		return c.fromStatus(ctx, "snapshot revert", err)
	}
	return nil
}

func (c *client) SnapshotDelete(ctx context.Context, vm, name string) error {
	if err := c.need(ctx, "snapshot delete", "snapshots", hasSnapshots); err != nil {
		return err
	}
	if _, err := c.rpc.SnapshotDelete(ctx, &pb.SnapshotNameRequest{Vm: vm, Name: name}); err != nil {
		return c.fromStatus(ctx, "snapshot delete", err)
	}
	return nil
}

func (c *client) GuestNetwork(ctx context.Context, vm string) ([]NetInterface, error) {
	if err := c.need(ctx, "guest network", "guest network query", hasNetwork); err != nil {
		return nil, err
	}
	resp, err := c.rpc.GuestNetwork(ctx, &pb.VMRequest{Vm: vm})
	if err != nil {
		return nil, c.fromStatus(ctx, "guest network", err)
	}
	return netInterfacesFromPB(resp.GetInterfaces()), nil
}

func (c *client) VMMetrics(ctx context.Context, vm string) (VMMetrics, error) {
	if err := c.need(ctx, "metrics", "hypervisor metrics", hasMetrics); err != nil {
		return VMMetrics{}, err
	}
	resp, err := c.rpc.VMMetrics(ctx, &pb.VMRequest{Vm: vm})
	if err != nil {
		return VMMetrics{}, c.fromStatus(ctx, "metrics", err)
	}
	return metricsFromPB(resp), nil
}

func (c *client) HelperCall(ctx context.Context, vm string, call HelperCall) (HelperReply, error) {
	if err := c.need(ctx, "helper call", "resident helper channel", hasHelper); err != nil {
		return HelperReply{}, fmt.Errorf("%w (%w)", err, ErrNoHelperChannel)
	}
	resp, err := c.rpc.HelperCall(ctx, &pb.HelperCallRequest{Vm: vm, Args: call.Args, Stdin: call.Stdin, TimeoutNs: int64(call.Timeout)})
	if err != nil {
		return HelperReply{}, c.fromStatus(ctx, "helper call", err)
	}
	return HelperReply{Exit: int(resp.GetExit()), Stdout: resp.GetStdout()}, nil
}
