package hypervisor_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
)

// fullFake has every optional capability, answering fixed values and
// recording what it was asked.
func fullFake(got *[]string) *hypervisortest.Fake {
	created := time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)
	return &hypervisortest.Fake{
		Modes: hypervisor.SnapshotModes{Memory: true},
		SnapshotCreateFunc: func(_ context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
			*got = append(*got, "create "+vm+" "+req.Name+" "+req.Description+" "+map[bool]string{true: "mem", false: "disk"}[req.Memory])
			return hypervisor.Snapshot{Name: req.Name, ID: "fake:" + req.Name + ":1", Description: req.Description, CreatedAt: created, Memory: true, SizeBytes: 4096, Parent: "p", Current: true}, nil
		},
		SnapshotListFunc: func(_ context.Context, vm string) ([]hypervisor.Snapshot, error) {
			*got = append(*got, "list "+vm)
			return []hypervisor.Snapshot{{Name: "a"}, {Name: "b", ID: "fake:b:1", CreatedAt: created, Memory: true}}, nil
		},
		SnapshotRevertFunc: func(_ context.Context, vm, name string) error {
			*got = append(*got, "revert "+vm+" "+name)
			return nil
		},
		SnapshotDeleteFunc: func(_ context.Context, vm, name string) error {
			*got = append(*got, "delete "+vm+" "+name)
			return hypervisor.ErrSnapshotNotFound
		},
		GuestNetworkFunc: func(_ context.Context, vm string) ([]hypervisor.NetInterface, error) {
			*got = append(*got, "network "+vm)
			return []hypervisor.NetInterface{
				{Name: "lo", Addresses: []hypervisor.IPAddress{{Family: "ipv4", Address: "127.0.0.1", Prefix: 8}}},
				{Name: "eth0", MAC: "52:54:00:12:34:56", Addresses: []hypervisor.IPAddress{}, Stats: &hypervisor.NetStats{RxBytes: 1, TxDropped: 8}},
			}, nil
		},
		HelperCallFunc: func(_ context.Context, vm string, c hypervisor.HelperCall) (hypervisor.HelperReply, error) {
			*got = append(*got, fmt.Sprintf("helper %s %q %q %v", vm, c.Args, c.Stdin, c.Timeout))
			if c.Args[0] == "down" {
				return hypervisor.HelperReply{}, fmt.Errorf("fake: %w", hypervisor.ErrHelperUnavailable)
			}
			return hypervisor.HelperReply{Exit: 1, Stdout: []byte("{\"ok\":false}\n")}, nil
		},
		VMMetricsFunc: func(_ context.Context, vm string) (hypervisor.VMMetrics, error) {
			*got = append(*got, "metrics "+vm)
			return hypervisor.VMMetrics{Time: created, Source: "fake", VCPUs: 2, CPUTimeNS: hypervisor.Uint64(0), MemoryBytes: hypervisor.Uint64(1 << 30)}, nil
		},
	}
}

func TestCapabilitiesCrossTheBoundary(t *testing.T) {
	ctx := context.Background()
	var got []string
	f := fullFake(&got)
	ref := fullFake(new([]string)) // for the expected values
	drv := connect(t, "fake", f)
	if err := drv.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatalf("Configure() = %v", err)
	}
	want := hypervisor.Capabilities{Snapshots: true, SnapshotModes: hypervisor.SnapshotModes{Memory: true}, GuestNetwork: true, Metrics: true, HelperChannel: true}
	if k := hypervisor.CapabilitiesOf(drv); k != want {
		t.Fatalf("CapabilitiesOf(plugin client) = %+v; want %+v", k, want)
	}
	sn, _ := hypervisor.AsSnapshotter(drv)
	snap, err := sn.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Description: "d ✓", Memory: true})
	wantSnap, _ := ref.SnapshotCreateFunc(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Description: "d ✓", Memory: true})
	if err != nil || !snap.CreatedAt.Equal(wantSnap.CreatedAt) {
		t.Errorf("SnapshotCreate() = %+v, %v; want %+v", snap, err, wantSnap)
	}
	snap.CreatedAt, wantSnap.CreatedAt = time.Time{}, time.Time{}
	if snap != wantSnap {
		t.Errorf("SnapshotCreate() = %+v; want %+v", snap, wantSnap)
	}
	list, err := sn.SnapshotList(ctx, "vm1")
	if err != nil || len(list) != 2 || list[0].Name != "a" || !list[0].CreatedAt.IsZero() || !list[1].Memory || list[1].CreatedAt.IsZero() ||
		list[0].ID != "" || list[1].ID != "fake:b:1" {
		t.Errorf("SnapshotList() = %+v, %v; want a (no time, no id), b (memory, with time and id)", list, err)
	}
	if err := sn.SnapshotRevert(ctx, "vm1", "s1"); err != nil {
		t.Errorf("SnapshotRevert() = %v", err)
	}
	if err := sn.SnapshotDelete(ctx, "vm1", "gone"); !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		t.Errorf("SnapshotDelete() = %v; want ErrSnapshotNotFound", err)
	}
	nw, _ := hypervisor.AsGuestNetworker(drv)
	ifs, err := nw.GuestNetwork(ctx, "vm1")
	wantIfs, _ := ref.GuestNetworkFunc(ctx, "vm1")
	if err != nil || !reflect.DeepEqual(ifs, wantIfs) {
		t.Errorf("GuestNetwork() = %+v, %v; want %+v", ifs, err, wantIfs)
	}
	mr, _ := hypervisor.AsMetricsReader(drv)
	m, err := mr.VMMetrics(ctx, "vm1")
	wantM, _ := ref.VMMetricsFunc(ctx, "vm1")
	if err != nil || !reflect.DeepEqual(m.MemoryBytes, wantM.MemoryBytes) || m.CPUTimeNS == nil || *m.CPUTimeNS != 0 ||
		m.BalloonBytes != nil || m.VCPUs != 2 || m.Source != "fake" || !m.Time.Equal(wantM.Time) {
		t.Errorf("VMMetrics() = %+v, %v; want %+v (a reported zero stays a zero, an unreported field nil)", m, err, wantM)
	}
	hc, _ := hypervisor.AsHelperCaller(drv)
	rep, err := hc.HelperCall(ctx, "vm1", hypervisor.HelperCall{Args: []string{"ps", "--session", "x"}, Stdin: []byte("in"), Timeout: time.Minute})
	if err != nil || rep.Exit != 1 || string(rep.Stdout) != "{\"ok\":false}\n" {
		t.Errorf("HelperCall() = %+v, %v; want exit 1 and the reply", rep, err)
	}
	if _, err := hc.HelperCall(ctx, "vm1", hypervisor.HelperCall{Args: []string{"down"}}); !errors.Is(err, hypervisor.ErrHelperUnavailable) {
		t.Errorf("HelperCall(down) = %v; want ErrHelperUnavailable across the boundary", err)
	}
	wantCalls := []string{"create vm1 s1 d ✓ mem", "list vm1", "revert vm1 s1", "delete vm1 gone", "network vm1", "metrics vm1",
		`helper vm1 ["ps" "--session" "x"] "in" 1m0s`, `helper vm1 ["down"] "" 0s`}
	if !reflect.DeepEqual(got, wantCalls) {
		t.Errorf("the plugin's driver saw %q; want %q", got, wantCalls)
	}
}

// TestSnapshotRevertIDCrossesTheBoundary: a revert bound to an identity
// reverts only the snapshot that still has it, and the plugin checks it
// too (a client that skips the host's check still gets ErrSnapshotChanged).
func TestSnapshotRevertIDCrossesTheBoundary(t *testing.T) {
	ctx := context.Background()
	var got []string
	drv := connect(t, "fake", fullFake(&got))
	if err := drv.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatalf("Configure() = %v", err)
	}
	sn, _ := hypervisor.AsSnapshotter(drv)
	tests := []struct {
		name, snap, id string
		want           error
		reverts        bool
	}{
		{"same identity", "b", "fake:b:1", nil, true},
		{"made anew", "b", "fake:b:0", hypervisor.ErrSnapshotChanged, false},
		{"no identity from the backend", "a", "fake:a:1", hypervisor.ErrSnapshotChanged, false},
		{"gone", "c", "fake:c:1", hypervisor.ErrSnapshotNotFound, false},
		{"nothing to check against", "b", "", hypervisor.ErrInvalidArgument, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got = nil
			err := hypervisor.RevertSnapshotID(ctx, sn, "vm1", tt.snap, tt.id)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("RevertSnapshotID(%q, %q) = %v; want %v", tt.snap, tt.id, err, tt.want)
			}
			if reverted := slices.Contains(got, "revert vm1 "+tt.snap); reverted != tt.reverts {
				t.Errorf("RevertSnapshotID(%q, %q): the driver saw %q; want a revert: %v", tt.snap, tt.id, got, tt.reverts)
			}
			got = nil
			if tt.id == "" {
				return
			}
			err = drv.(hypervisor.SnapshotIDReverter).SnapshotRevertID(ctx, "vm1", tt.snap, tt.id)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("client SnapshotRevertID(%q, %q), checked by the plugin alone = %v; want %v", tt.snap, tt.id, err, tt.want)
			}
			if reverted := slices.Contains(got, "revert vm1 "+tt.snap); reverted != tt.reverts {
				t.Errorf("client SnapshotRevertID(%q, %q): the driver saw %q; want a revert: %v", tt.snap, tt.id, got, tt.reverts)
			}
		})
	}
}

func TestPluginWithoutCapabilitiesAnswersNotSupported(t *testing.T) {
	ctx := context.Background()
	drv := connect(t, "plain", &hypervisortest.Fake{})
	if err := drv.(hypervisor.Configurer).Configure(ctx, nil); err != nil {
		t.Fatalf("Configure() = %v", err)
	}
	if k := hypervisor.CapabilitiesOf(drv); k != (hypervisor.Capabilities{}) {
		t.Errorf("CapabilitiesOf(plugin without capabilities) = %+v; want none", k)
	}
	if _, ok := hypervisor.AsSnapshotter(drv); ok {
		t.Errorf("AsSnapshotter(plugin without snapshots) ok = true; want false")
	}
	// Called anyway (the client's type has the method): a clean ErrNotSupported.
	_, err := drv.(hypervisor.Snapshotter).SnapshotList(ctx, "vm1")
	if !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("SnapshotList() = %v; want ErrNotSupported", err)
	}
}

func TestDeferredCapabilities(t *testing.T) {
	ctx := context.Background()
	var got []string
	f := fullFake(&got)
	d := hypervisor.NewDeferred(func(context.Context, []byte) (hypervisor.Driver, error) { return f, nil })
	if k := hypervisor.CapabilitiesOf(d); k != (hypervisor.Capabilities{}) {
		t.Errorf("CapabilitiesOf(Deferred before Configure) = %+v; want none", k)
	}
	if _, err := d.SnapshotList(ctx, "vm1"); !errors.Is(err, hypervisor.ErrNotConfigured) {
		t.Errorf("SnapshotList() before Configure = %v; want ErrNotConfigured", err)
	}
	// Through the plugin boundary: Configure's reply carries the built driver's capabilities.
	drv := connect(t, "deferred", d)
	if err := drv.(hypervisor.Configurer).Configure(ctx, []byte(`{}`)); err != nil {
		t.Fatalf("Configure() = %v", err)
	}
	if k := hypervisor.CapabilitiesOf(drv); !k.Snapshots || !k.GuestNetwork || !k.Metrics || !k.SnapshotModes.Memory || k.SnapshotModes.DiskOnly {
		t.Errorf("CapabilitiesOf(plugin serving a Deferred) = %+v; want the built driver's", k)
	}
	if err := drv.(hypervisor.Snapshotter).SnapshotRevert(ctx, "vm1", "s1"); err != nil {
		t.Errorf("SnapshotRevert() through Deferred = %v", err)
	}

	plain := hypervisor.NewDeferred(func(context.Context, []byte) (hypervisor.Driver, error) { return &hypervisortest.Fake{}, nil })
	if err := plain.Configure(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.VMMetrics(ctx, "vm1"); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("VMMetrics() through a Deferred driver without metrics = %v; want ErrNotSupported", err)
	}
	if _, err := plain.GuestNetwork(ctx, "vm1"); !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("GuestNetwork() through a Deferred driver without it = %v; want ErrNotSupported", err)
	}
}
