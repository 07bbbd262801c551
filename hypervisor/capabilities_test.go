package hypervisor

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/vmgate/vmgate/hypervisor/proto"
)

// bareDriver is a Driver with no optional capability.
type bareDriver struct{ Driver }

// snapDriver is a Snapshotter found by type assertion.
type snapDriver struct {
	Driver
	Snapshotter
}

// fullDriver has every capability by type.
type fullDriver struct {
	Driver
	HelperCaller
	Snapshotter
	GuestNetworker
	MetricsReader
	Creator
}

type modesOnly struct{ Snapshotter }

func (modesOnly) SnapshotModes() SnapshotModes { return SnapshotModes{Memory: true} }

// reporting claims no capability although its type has them all.
type reporting struct{ fullDriver }

func (reporting) Capabilities() Capabilities { return Capabilities{GuestNetwork: true} }

func TestCapabilitiesOf(t *testing.T) {
	tests := []struct {
		name string
		d    Driver
		want Capabilities
	}{
		{"bare", bareDriver{}, Capabilities{}},
		{"snapshots by type, with the driver's modes", snapDriver{Snapshotter: modesOnly{}},
			Capabilities{Snapshots: true, SnapshotModes: SnapshotModes{Memory: true}}},
		{"all by type", fullDriver{Snapshotter: modesOnly{}},
			Capabilities{Snapshots: true, SnapshotModes: SnapshotModes{Memory: true}, GuestNetwork: true, Metrics: true, Create: true, HelperChannel: true}},
		{"a reporter is believed over its type", reporting{fullDriver{Snapshotter: modesOnly{}}}, Capabilities{GuestNetwork: true}},
	}
	for _, tt := range tests {
		if got := CapabilitiesOf(tt.d); got != tt.want {
			t.Errorf("%s: CapabilitiesOf() = %+v; want %+v", tt.name, got, tt.want)
		}
	}
	r := reporting{fullDriver{Snapshotter: modesOnly{}}}
	if _, ok := AsSnapshotter(r); ok {
		t.Errorf("AsSnapshotter(a reporter without snapshots) ok = true; want false")
	}
	if _, ok := AsMetricsReader(r); ok {
		t.Errorf("AsMetricsReader(a reporter without metrics) ok = true; want false")
	}
	if _, ok := AsGuestNetworker(r); !ok {
		t.Errorf("AsGuestNetworker(a reporter with guest network) ok = false; want true")
	}
	if _, ok := AsSnapshotter(bareDriver{}); ok {
		t.Errorf("AsSnapshotter(bare) ok = true; want false")
	}
}

// countingConn is a grpc.ClientConnInterface that answers Configure and
// Capabilities with caps and counts every call by method.
type countingConn struct {
	caps *pb.CapabilitySet
	// capsErr, when set, is the Capabilities RPC's error.
	capsErr error
	mu      sync.Mutex
	calls   map[string]int
}

func (c *countingConn) Invoke(_ context.Context, method string, _, reply any, _ ...grpc.CallOption) error {
	c.mu.Lock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	name := method[strings.LastIndexByte(method, '/')+1:]
	c.calls[name]++
	c.mu.Unlock()
	switch name {
	case "Configure":
		proto.Merge(reply.(proto.Message), &pb.ConfigureResponse{Capabilities: c.caps})
	case "Capabilities":
		if c.capsErr != nil {
			return c.capsErr
		}
		proto.Merge(reply.(proto.Message), c.caps)
	}
	return nil
}

func (c *countingConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no streams")
}

func (c *countingConn) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[name]
}

func TestClientRefusesMissingCapabilitiesWithoutARoundTrip(t *testing.T) {
	ctx := context.Background()
	conn := &countingConn{caps: &pb.CapabilitySet{GuestNetwork: true, SnapshotMemory: true}}
	c := newClient("fake", conn)
	if got := c.Capabilities(); got != (Capabilities{}) {
		t.Errorf("Capabilities() before Configure = %+v; want none", got)
	}
	if err := c.Configure(ctx, nil); err != nil {
		t.Fatalf("Configure() = %v", err)
	}
	// snapshot_memory without snapshots is ignored.
	if got, want := c.Capabilities(), (Capabilities{GuestNetwork: true}); got != want {
		t.Errorf("Capabilities() = %+v; want %+v", got, want)
	}
	calls := []struct {
		method string
		call   func() error
	}{
		{"SnapshotCreate", func() error { _, err := c.SnapshotCreate(ctx, "vm1", SnapshotRequest{Name: "s1"}); return err }},
		{"SnapshotList", func() error { _, err := c.SnapshotList(ctx, "vm1"); return err }},
		{"SnapshotRevert", func() error { return c.SnapshotRevert(ctx, "vm1", "s1") }},
		{"SnapshotDelete", func() error { return c.SnapshotDelete(ctx, "vm1", "s1") }},
		{"VMMetrics", func() error { _, err := c.VMMetrics(ctx, "vm1"); return err }},
	}
	for _, tc := range calls {
		err := tc.call()
		if !errors.Is(err, ErrNotSupported) {
			t.Errorf("%s() = %v; want ErrNotSupported", tc.method, err)
		}
		if err != nil && !strings.Contains(err.Error(), "driver fake") {
			t.Errorf("%s() = %q; want the driver named", tc.method, err)
		}
		if n := conn.count(tc.method); n != 0 {
			t.Errorf("%s() sent %d RPCs; want none (the plugin said it has no such capability)", tc.method, n)
		}
	}
	if _, err := c.GuestNetwork(ctx, "vm1"); err != nil {
		t.Errorf("GuestNetwork() = %v; want the RPC made", err)
	}
	if n := conn.count("GuestNetwork"); n != 1 {
		t.Errorf("GuestNetwork() sent %d RPCs; want 1", n)
	}
	if n := conn.count("Capabilities"); n != 0 {
		t.Errorf("Capabilities RPC sent %d times after Configure; want 0", n)
	}
}

func TestClientAsksCapabilitiesOnceWithoutConfigure(t *testing.T) {
	ctx := context.Background()
	conn := &countingConn{caps: &pb.CapabilitySet{Snapshots: true, SnapshotDiskOnly: true}}
	c := newClient("fake", conn)
	for range 3 {
		if _, err := c.SnapshotList(ctx, "vm1"); err != nil {
			t.Fatalf("SnapshotList() = %v", err)
		}
	}
	if n := conn.count("Capabilities"); n != 1 {
		t.Errorf("Capabilities RPC sent %d times for 3 calls; want 1", n)
	}
	if got := c.SnapshotModes(); got != (SnapshotModes{DiskOnly: true}) {
		t.Errorf("SnapshotModes() = %+v; want disk only", got)
	}

	// A plugin that predates the RPC has no capabilities.
	old := &countingConn{capsErr: status.Error(codes.Unimplemented, "unknown method Capabilities")}
	c = newClient("old", old)
	if _, err := c.SnapshotList(ctx, "vm1"); !errors.Is(err, ErrNotSupported) {
		t.Errorf("SnapshotList() on a plugin without the Capabilities RPC = %v; want ErrNotSupported", err)
	}
	if n := old.count("SnapshotList"); n != 0 {
		t.Errorf("SnapshotList() on an old plugin sent %d RPCs; want 0", n)
	}
}
