package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/server/mcptest"
)

// snapFake is a fake backend with snapshots kept in a map by VM and
// name; every snapshot call is counted in calls. A snapshot it takes gets
// an identity of its own ("fake:<n>") and, with memory, memSize bytes.
type snapFake struct {
	mu       sync.Mutex
	snaps    map[string]hypervisor.Snapshot // by vm + "/" + name
	reqs     []hypervisor.SnapshotRequest
	reverted []string // "vm name id" of each revert
	deleted  []string // "vm name" of each delete
	seq      int
	calls    atomic.Int64
	// err, when set, is what every snapshot call returns.
	err error
	// noMemory refuses snapshots with memory (a stopped VM).
	noMemory bool
	// memSize is the size of a snapshot with memory.
	memSize int64
}

func newSnapFake() *snapFake { return &snapFake{snaps: map[string]hypervisor.Snapshot{}} }

// put adds sn to vm as if made on the backend directly.
func (sf *snapFake) put(vm string, sn hypervisor.Snapshot) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.snaps[vm+"/"+sn.Name] = sn
}

// get returns vm's snapshot name.
func (sf *snapFake) get(vm, name string) (hypervisor.Snapshot, bool) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sn, ok := sf.snaps[vm+"/"+name]
	return sn, ok
}

func (sf *snapFake) create(vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.reqs = append(sf.reqs, req)
	if sf.err != nil {
		return hypervisor.Snapshot{}, sf.err
	}
	if sf.noMemory && req.Memory {
		return hypervisor.Snapshot{}, fmt.Errorf("fake: stopped: %w", hypervisor.ErrSnapshotMemory)
	}
	if _, ok := sf.snaps[vm+"/"+req.Name]; ok {
		return hypervisor.Snapshot{}, fmt.Errorf("fake: %w", hypervisor.ErrSnapshotExists)
	}
	sf.seq++
	sn := hypervisor.Snapshot{Name: req.Name, ID: fmt.Sprint("fake:", sf.seq), Description: req.Description, Memory: req.Memory,
		CreatedAt: time.Unix(1700000000+int64(sf.seq), 0).UTC()}
	if req.Memory {
		sn.SizeBytes = sf.memSize
	}
	sf.snaps[vm+"/"+req.Name] = sn
	return sn, nil
}

func (sf *snapFake) list(vm string) ([]hypervisor.Snapshot, error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	var out []hypervisor.Snapshot
	for k, sn := range sf.snaps {
		if strings.HasPrefix(k, vm+"/") {
			out = append(out, sn)
		}
	}
	slices.SortFunc(out, func(a, b hypervisor.Snapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, sf.err
}

func (sf *snapFake) byName(vm, name string, del bool) error {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.err != nil {
		return sf.err
	}
	sn, ok := sf.snaps[vm+"/"+name]
	if !ok {
		return fmt.Errorf("fake: %q: %w", name, hypervisor.ErrSnapshotNotFound)
	}
	if del {
		delete(sf.snaps, vm+"/"+name)
		sf.deleted = append(sf.deleted, vm+" "+name)
	} else {
		sf.reverted = append(sf.reverted, vm+" "+name+" "+sn.ID)
	}
	return nil
}

func (sf *snapFake) driver(modes hypervisor.SnapshotModes) *hypervisortest.Fake {
	f := hypervisortest.Counting(&sf.calls)
	f.Modes = modes
	f.SnapshotCreateFunc = func(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
		sf.calls.Add(1)
		return sf.create(vm, req)
	}
	f.SnapshotListFunc = func(ctx context.Context, vm string) ([]hypervisor.Snapshot, error) {
		sf.calls.Add(1)
		return sf.list(vm)
	}
	f.SnapshotRevertFunc = func(ctx context.Context, vm, name string) error { sf.calls.Add(1); return sf.byName(vm, name, false) }
	f.SnapshotDeleteFunc = func(ctx context.Context, vm, name string) error { sf.calls.Add(1); return sf.byName(vm, name, true) }
	return f
}

func newSnapFixture(t *testing.T, modes hypervisor.SnapshotModes, pol string) (*fixture, *snapFake) {
	t.Helper()
	sf := newSnapFake()
	f := newFixture(t, fixtureOpts{driver: sf.driver(modes), policy: pol})
	t.Cleanup(func() { f.s.Close() })
	return f, sf
}

var bothModes = hypervisor.SnapshotModes{Memory: true, DiskOnly: true}

// TestSnapshotTools: create, list, revert and delete reach the driver with
// the arguments given, and answer what happened.
func TestSnapshotTools(t *testing.T) {
	f, sf := newSnapFixture(t, bothModes, "")
	steps := []struct {
		tool, args string
		want       string // in the text
	}{
		{"snapshot_create", `{"vm":"lab/vm1","name":"before-upgrade","description":"line one\nline two","memory":false}`, `snapshot "before-upgrade" taken (disks only)`},
		{"snapshot_create", `{"vm":"lab/vm1","name":"b2"}`, `snapshot "b2" taken (with memory)`},
		{"snapshot_list", `{"vm":"lab/vm1"}`, "2 snapshot(s)"},
		{"snapshot_revert", `{"vm":"lab/vm1","name":"before-upgrade"}`, `reverted to snapshot "before-upgrade"`},
		{"snapshot_delete", `{"vm":"lab/vm1","name":"b2"}`, `snapshot "b2" deleted`},
		{"snapshot_list", `{"vm":"lab/vm1"}`, "1 snapshot(s)"},
	}
	for _, st := range steps {
		r := f.call(t, st.tool, st.args)
		if r.Result == nil || r.Result.IsError || !strings.Contains(r.Text(), st.want) {
			t.Fatalf("%s(%s) = %q; want success containing %q", st.tool, st.args, r.Text(), st.want)
		}
	}
	if len(sf.reqs) != 2 || sf.reqs[0].Memory || sf.reqs[0].Description != "line one\nline two" || !sf.reqs[1].Memory {
		t.Errorf("SnapshotCreate requests = %+v; want disk-only with the description, then memory by default", sf.reqs)
	}
	r := f.call(t, "snapshot_list", `{"vm":"lab/vm1"}`)
	list, _ := r.Result.StructuredContent["snapshots"].([]any)
	if len(list) != 1 || list[0].(map[string]any)["name"] != "before-upgrade" {
		t.Errorf("snapshot_list structured = %v; want before-upgrade only", r.Result.StructuredContent)
	}
}

// TestSnapshotDefaultMemory: without memory, a backend that can only take
// disk snapshots gets a disk-only request.
func TestSnapshotDefaultMemory(t *testing.T) {
	f, sf := newSnapFixture(t, hypervisor.SnapshotModes{DiskOnly: true}, "")
	if r := f.call(t, "snapshot_create", `{"vm":"lab/vm1","name":"s1"}`); r.Result == nil || r.Result.IsError {
		t.Fatalf("snapshot_create = %q; want success", r.Text())
	}
	if len(sf.reqs) != 1 || sf.reqs[0].Memory {
		t.Errorf("SnapshotCreate requests = %+v; want one disk-only", sf.reqs)
	}
}

// TestSnapshotErrors: the sentinels become errors that say what to do.
func TestSnapshotErrors(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		tool      string
		args      string
		tag, want string
	}{
		{"not found", nil, "snapshot_revert", `{"vm":"lab/vm1","name":"nope"}`, TagInvalid, `lab/vm1 has no snapshot "nope" (snapshot_list shows its snapshots)`},
		{"delete not found", nil, "snapshot_delete", `{"vm":"lab/vm1","name":"nope"}`, TagInvalid, "snapshot_list"},
		{"exists", nil, "snapshot_create", `{"vm":"lab/vm1","name":"taken"}`, TagInvalid, `already has a snapshot "taken"`},
		{"memory", hypervisor.ErrSnapshotMemory, "snapshot_create", `{"vm":"lab/vm1","name":"m1","memory":true}`, TagInvalid, `backend "lab" cannot take a snapshot with memory`},
		{"disk only", hypervisor.ErrSnapshotDiskOnly, "snapshot_create", `{"vm":"lab/vm1","name":"m1","memory":false}`, TagInvalid, "retry with memory true"},
		{"backend reason", fmt.Errorf("qmp: %w: snapshot-save: Device 'ide0' is writable but does not support snapshots", hypervisor.ErrBackend), "snapshot_create", `{"vm":"lab/vm1","name":"m1"}`, TagBackend, "does not support snapshots"},
		{"timeout", fmt.Errorf("qmp: %w", hypervisor.ErrTimeout), "snapshot_revert", `{"vm":"lab/vm1","name":"taken"}`, TagTimedOut, "in time"},
		{"unknown vm", fmt.Errorf("fake: %w", hypervisor.ErrUnknownVM), "snapshot_list", `{"vm":"lab/vm1"}`, TagUnknownVM, `no VM "lab/vm1" (list_vms shows the VMs you can use)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, sf := newSnapFixture(t, bothModes, "")
			sf.put("vm1", hypervisor.Snapshot{Name: "taken"})
			sf.err = tt.err
			r := f.call(t, tt.tool, tt.args)
			if !mcptest.HasTag(r, tt.tag) || !strings.Contains(r.Text(), tt.want) {
				t.Errorf("%s(%s) = %q; want %s containing %q", tt.tool, tt.args, r.Text(), tt.tag, tt.want)
			}
		})
	}
}

// TestSnapshotNoCapability: a backend without snapshots is named, and the
// call is refunded (nothing happened).
func TestSnapshotNoCapability(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	t.Cleanup(func() { f.s.Close() })
	for _, tool := range []string{"snapshot_create", "snapshot_revert", "snapshot_delete", "snapshot_list"} {
		args := `{"vm":"lab/vm1","name":"s1"}`
		if tool == "snapshot_list" {
			args = `{"vm":"lab/vm1"}`
		}
		r := f.call(t, tool, args)
		if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), `backend "lab" cannot take snapshots`) {
			t.Errorf("%s on a backend without snapshots = %q; want %s naming the backend", tool, r.Text(), TagBackend)
		}
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("driver calls = %d; want 0", n)
	}
}

// TestSnapshotBadArguments: names every backend cannot take, huge or
// hostile descriptions, unknown fields and another grant's VM are refused
// by the gate before the policy (no approval parked) and before the driver.
func TestSnapshotBadArguments(t *testing.T) {
	gated := `{"version":"1","default":"allow","tools":{"snapshot_revert":{"action":"approve"},"snapshot_delete":{"action":"approve"}}}`
	tests := []struct {
		name, tool, args, tag, want string
	}{
		{"empty name", "snapshot_create", `{"vm":"lab/vm1","name":""}`, TagInvalid, "snapshot name"},
		{"path name", "snapshot_create", `{"vm":"lab/vm1","name":"../../etc/passwd"}`, TagInvalid, "snapshot name"},
		{"slash name", "snapshot_revert", `{"vm":"lab/vm1","name":"a/b"}`, TagInvalid, "snapshot name"},
		{"dot name", "snapshot_delete", `{"vm":"lab/vm1","name":".."}`, TagInvalid, "snapshot name"},
		{"digit first", "snapshot_revert", `{"vm":"lab/vm1","name":"1"}`, TagInvalid, "starting with a letter"},
		{"reserved", "snapshot_create", `{"vm":"lab/vm1","name":"Current"}`, TagInvalid, "reserved"},
		{"space", "snapshot_delete", `{"vm":"lab/vm1","name":"a b"}`, TagInvalid, "snapshot name"},
		{"glob", "snapshot_delete", `{"vm":"lab/vm1","name":"a*"}`, TagInvalid, "snapshot name"},
		{"too long", "snapshot_create", `{"vm":"lab/vm1","name":"a` + strings.Repeat("b", 40) + `"}`, TagInvalid, "snapshot name"},
		{"over max length", "snapshot_create", `{"vm":"lab/vm1","name":"` + strings.Repeat("a", 65) + `"}`, TagInvalid, "longer than 64 bytes"},
		{"huge description", "snapshot_create", `{"vm":"lab/vm1","name":"s1","description":"` + strings.Repeat("x", 1025) + `"}`, TagInvalid, "description is 1025 bytes"},
		{"escape in description", "snapshot_create", `{"vm":"lab/vm1","name":"s1","description":"a\u001b[2Jb"}`, TagInvalid, "control character"},
		{"nul in name", "snapshot_create", `{"vm":"lab/vm1","name":"a\u0000b"}`, TagInvalid, "NUL"},
		{"memory string", "snapshot_create", `{"vm":"lab/vm1","name":"s1","memory":"yes"}`, TagInvalid, "want a boolean"},
		{"unknown field", "snapshot_revert", `{"vm":"lab/vm1","name":"s1","force":true}`, TagInvalid, "force: unknown argument"},
		{"list with name", "snapshot_list", `{"vm":"lab/vm1","name":"s1"}`, TagInvalid, "unknown argument"},
		{"no name", "snapshot_revert", `{"vm":"lab/vm1"}`, TagInvalid, "name: required"},
		{"other grant's vm", "snapshot_revert", `{"vm":"other/vm1","name":"s1"}`, TagUnknownVM, "list_vms"},
		{"sample zero", "vm_metrics", `{"vm":"lab/vm1","sample_ms":0}`, TagInvalid, "sample_ms"},
		{"sample huge", "vm_metrics", `{"vm":"lab/vm1","sample_ms":60000}`, TagInvalid, "sample_ms"},
		{"network extra", "vm_network", `{"vm":"lab/vm1","iface":"eth0"}`, TagInvalid, "unknown argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sf := newSnapFake()
			f := newFixture(t, fixtureOpts{driver: sf.driver(bothModes), policy: gated, vms: []string{"lab/*"}})
			t.Cleanup(func() { f.s.Close() })
			r := f.call(t, tt.tool, tt.args)
			if !mcptest.HasTag(r, tt.tag) || !strings.Contains(r.Text(), tt.want) {
				t.Errorf("%s(%.80s) = %q; want %s containing %q", tt.tool, tt.args, r.Text(), tt.tag, tt.want)
			}
			if n := sf.calls.Load(); n != 0 {
				t.Errorf("driver calls = %d; want 0", n)
			}
			if list, _ := f.store.ListApprovals(context.Background(), time.Unix(0, f.now.Load())); len(list) != 0 {
				t.Errorf("approvals = %+v; want none parked for a bad call", list)
			}
		})
	}
}

// TestVMNetwork: the guest's answer is cleaned before it is shown.
func TestVMNetwork(t *testing.T) {
	var calls atomic.Int64
	drv := hypervisortest.Counting(&calls)
	drv.GuestNetworkFunc = func(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) {
		return []hypervisor.NetInterface{
			{Name: "lo", Addresses: []hypervisor.IPAddress{{Family: "ipv4", Address: "127.0.0.1", Prefix: 8}}},
			{Name: "eth0\x1b[31m", MAC: "52:54:00:AB:CD:EF", Addresses: []hypervisor.IPAddress{{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}, {Family: "ipv4", Address: "not-an-ip", Prefix: 24}, {Family: "ipv6", Address: "fe80::1%eth0", Prefix: 64}}},
		}, nil
	}
	f := newFixture(t, fixtureOpts{driver: drv})
	t.Cleanup(func() { f.s.Close() })
	r := f.call(t, "vm_network", `{"vm":"lab/vm1"}`)
	if r.Result == nil || r.Result.IsError {
		t.Fatalf("vm_network = %q; want success", r.Text())
	}
	for _, want := range []string{"2 interface(s)", "lo 127.0.0.1/8", "eth0[31m 52:54:00:ab:cd:ef 10.0.2.15/24 fe80::1/64"} {
		if !strings.Contains(r.Text(), want) {
			t.Errorf("vm_network text = %q; want it to contain %q", r.Text(), want)
		}
	}
	if strings.ContainsAny(r.Text(), "\x1b") || strings.Contains(r.Text(), "not-an-ip") {
		t.Errorf("vm_network text = %q; want control characters and bad addresses dropped", r.Text())
	}

	f2 := newFixture(t, fixtureOpts{})
	t.Cleanup(func() { f2.s.Close() })
	if r := f2.call(t, "vm_network", `{"vm":"lab/vm1"}`); !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), `backend "lab" cannot read`) {
		t.Errorf("vm_network without the capability = %q; want %s naming the backend", r.Text(), TagBackend)
	}
}

// TestVMMetrics: the guest's figures come from vmgate-guest metrics, the
// hypervisor's from the driver; either alone is enough, neither an error.
func TestVMMetrics(t *testing.T) {
	host := hypervisor.VMMetrics{Source: "qmp", VCPUs: 2, CPUTimeNS: hypervisor.Uint64(3e9), MemoryBytes: hypervisor.Uint64(1 << 30)}
	tests := []struct {
		name      string
		host      bool
		bins      fakeBins
		wantKeys  []string
		wantText  []string
		wantError string
	}{
		{"both", true, haveBins(), []string{"guest", "hypervisor"}, []string{"CPU 37.5% of 2 over 250 ms", "memory 128 MiB of 512 MiB", "hypervisor (qmp): 2 vCPU, CPU time 3.0 s, memory 1024 MiB"}, ""},
		{"guest only", false, haveBins(), []string{"guest", "hypervisor_error"}, []string{"CPU 37.5%"}, ""},
		{"host only", true, noBins(), []string{"hypervisor", "guest_error"}, []string{"hypervisor (qmp)"}, ""},
		{"neither", false, noBins(), nil, nil, "no figures: guest: the vmgate-guest helper is not available on this host (build it with make build); hypervisor: backend \"lab\" reports no hypervisor figures"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newFakeGuest()
			drv := g.driver()
			if tt.host {
				drv.VMMetricsFunc = func(ctx context.Context, vm string) (hypervisor.VMMetrics, error) { return host, nil }
			}
			f := newFixture(t, fixtureOpts{driver: drv, bins: tt.bins})
			t.Cleanup(func() { f.s.Close() })
			r := f.call(t, "vm_metrics", `{"vm":"lab/vm1","sample_ms":250}`)
			if tt.wantError != "" {
				if !mcptest.HasTag(r, TagBackend) || !strings.Contains(r.Text(), tt.wantError) {
					t.Errorf("vm_metrics = %q; want %s containing %q", r.Text(), TagBackend, tt.wantError)
				}
				return
			}
			if r.Result == nil || r.Result.IsError {
				t.Fatalf("vm_metrics = %q; want success", r.Text())
			}
			for _, k := range tt.wantKeys {
				if _, ok := r.Result.StructuredContent[k]; !ok {
					t.Errorf("vm_metrics structured = %v; want key %q", r.Result.StructuredContent, k)
				}
			}
			for _, w := range tt.wantText {
				if !strings.Contains(r.Text(), w) {
					t.Errorf("vm_metrics text = %q; want it to contain %q", r.Text(), w)
				}
			}
			if tt.bins.BinaryFunc != nil && g.count("/usr/local/bin/vmgate-guest", "metrics", "--sample-ms", "250") == 0 && tt.name != "host only" {
				t.Errorf("vmgate-guest metrics --sample-ms 250 never ran; commands %v", g.argvs)
			}
		})
	}
}
