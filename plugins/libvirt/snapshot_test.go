package libvirt

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/vmgate/vmgate/hypervisor"
)

func TestToSnapshot(t *testing.T) {
	tests := []struct {
		name string
		xml  string
		want hypervisor.Snapshot
	}{
		{"system checkpoint of a running domain", `<domainsnapshot><name>s1</name><description>before &amp; after</description>
<state>running</state><parent><name>s0</name></parent><creationTime>1796119094</creationTime>
<memory snapshot='internal'/><disks><disk name='vda' snapshot='internal'/></disks><domain type='qemu'/></domainsnapshot>`,
			hypervisor.Snapshot{Name: "s1", ID: "libvirt:1796119094:running", Description: "before & after", Parent: "s0", Memory: true, CreatedAt: time.Unix(1796119094, 0).UTC()}},
		{"disk snapshot of a shut off domain", `<domainsnapshot><name>off</name><state>shutoff</state>
<creationTime>1796119000</creationTime><memory snapshot='no'/></domainsnapshot>`,
			hypervisor.Snapshot{Name: "off", ID: "libvirt:1796119000:shutoff", CreatedAt: time.Unix(1796119000, 0).UTC()}},
		{"older libvirt without a memory element", `<domainsnapshot><name>old</name><state>running</state></domainsnapshot>`,
			hypervisor.Snapshot{Name: "old", Memory: true}},
		{"external disk-only", `<domainsnapshot><name>ext</name><state>disk-snapshot</state><memory snapshot='no'/><creationTime>x</creationTime></domainsnapshot>`,
			hypervisor.Snapshot{Name: "ext"}},
	}
	for _, tt := range tests {
		got, err := toSnapshot(tt.xml)
		if err != nil || got != tt.want {
			t.Errorf("%s: toSnapshot() = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
	if _, err := toSnapshot("<domainsnapshot><name>"); err == nil {
		t.Errorf("toSnapshot(truncated XML) = nil error; want one")
	}
}

func TestMetricsFromParams(t *testing.T) {
	p := func(field string, v any) golibvirt.TypedParam {
		return golibvirt.TypedParam{Field: field, Value: golibvirt.TypedParamValue{I: v}}
	}
	params := []golibvirt.TypedParam{
		p("state.state", int32(1)), p("cpu.time", uint64(7439795893)), p("vcpu.current", uint32(2)),
		p("balloon.maximum", uint64(262144)), p("balloon.current", uint64(131072)), p("balloon.rss", uint64(200000)),
		p("block.count", uint32(2)), p("block.0.name", "vda"), p("block.0.rd.bytes", uint64(100)), p("block.0.wr.bytes", uint64(200)),
		p("block.0.rd.reqs", uint64(3)), p("block.0.wr.reqs", uint64(4)), p("block.1.rd.bytes", uint64(1)), p("block.1.wr.bytes", uint64(2)),
		p("block.1.allocation", uint64(999)),
		p("net.count", uint32(1)), p("net.0.rx.bytes", uint64(110)), p("net.0.tx.bytes", uint64(602)), p("net.0.rx.pkts", uint64(9)),
		p("cpu.user", int64(-1)),
	}
	m := metricsFromParams(params)
	u := func(p *uint64) any {
		if p == nil {
			return nil
		}
		return *p
	}
	checks := []struct {
		what      string
		got, want any
	}{
		{"source", m.Source, "libvirt"}, {"vcpus", m.VCPUs, 2},
		{"cpu", u(m.CPUTimeNS), uint64(7439795893)}, {"memory", u(m.MemoryBytes), uint64(256 << 20)},
		{"balloon", u(m.BalloonBytes), uint64(128 << 20)}, {"rss", u(m.HostRSSBytes), uint64(200000 * 1024)},
		{"disk read", u(m.DiskReadBytes), uint64(101)}, {"disk write", u(m.DiskWriteBytes), uint64(202)},
		{"disk read ops", u(m.DiskReadOps), uint64(3)}, {"disk write ops", u(m.DiskWriteOps), uint64(4)},
		{"net rx", u(m.NetRxBytes), uint64(110)}, {"net tx", u(m.NetTxBytes), uint64(602)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("metricsFromParams() %s = %v; want %v", c.what, c.got, c.want)
		}
	}
	// No block or net groups: those counters are not reported (nil), not zero.
	m = metricsFromParams([]golibvirt.TypedParam{p("cpu.time", uint64(1))})
	if m.DiskReadBytes != nil || m.NetRxBytes != nil || m.BalloonBytes != nil {
		t.Errorf("metricsFromParams(cpu only) = %+v; want unreported figures nil", m)
	}
}

// snapFake is a fakeConn with libvirt's snapshot calls over a map of
// snapshots, answering as libvirtd does (error numbers included).
type snapFake struct {
	*fakeConn
	snaps   map[string]string // name -> XML
	creates int
	reverts []string
	// createErr, when set, is DomainSnapshotCreateXML's error.
	createErr error
}

func noSnapshot(name string) error {
	return golibvirt.Error{Code: uint32(golibvirt.ErrNoDomainSnapshot), Message: "Domain snapshot not found: no domain snapshot with matching name '" + name + "'"}
}

func (f *snapFake) DomainSnapshotCreateXML(dom golibvirt.Domain, desc string, flags uint32) (golibvirt.DomainSnapshot, error) {
	f.creates++
	if f.createErr != nil {
		return golibvirt.DomainSnapshot{}, f.createErr
	}
	x, err := toSnapshot(desc)
	if err != nil {
		return golibvirt.DomainSnapshot{}, err
	}
	f.snaps[x.Name] = "<domainsnapshot><name>" + x.Name + "</name><state>running</state><creationTime>1796119094</creationTime><memory snapshot='internal'/></domainsnapshot>"
	return golibvirt.DomainSnapshot{Name: x.Name, Dom: dom}, nil
}
func (f *snapFake) DomainListAllSnapshots(dom golibvirt.Domain, _ int32, _ uint32) ([]golibvirt.DomainSnapshot, int32, error) {
	var out []golibvirt.DomainSnapshot
	for name := range f.snaps {
		out = append(out, golibvirt.DomainSnapshot{Name: name, Dom: dom})
	}
	return out, int32(len(out)), nil
}
func (f *snapFake) DomainSnapshotLookupByName(dom golibvirt.Domain, name string, _ uint32) (golibvirt.DomainSnapshot, error) {
	if _, ok := f.snaps[name]; !ok {
		return golibvirt.DomainSnapshot{}, noSnapshot(name)
	}
	return golibvirt.DomainSnapshot{Name: name, Dom: dom}, nil
}
func (f *snapFake) DomainSnapshotGetXMLDesc(s golibvirt.DomainSnapshot, _ uint32) (string, error) {
	x, ok := f.snaps[s.Name]
	if !ok {
		return "", noSnapshot(s.Name)
	}
	return x, nil
}
func (f *snapFake) DomainSnapshotCurrent(golibvirt.Domain, uint32) (golibvirt.DomainSnapshot, error) {
	return golibvirt.DomainSnapshot{}, golibvirt.Error{Code: uint32(golibvirt.ErrNoDomainSnapshot), Message: "the domain does not have a current snapshot"}
}
func (f *snapFake) DomainRevertToSnapshot(s golibvirt.DomainSnapshot, _ uint32) error {
	f.reverts = append(f.reverts, s.Name)
	return nil
}
func (f *snapFake) DomainSnapshotDelete(s golibvirt.DomainSnapshot, _ golibvirt.DomainSnapshotDeleteFlags) error {
	delete(f.snaps, s.Name)
	return nil
}

func snapDriver(t *testing.T, state golibvirt.DomainState) (*Driver, *snapFake) {
	t.Helper()
	fc := newFake()
	fc.state = func(golibvirt.Domain) (int32, error) { return int32(state), nil }
	f := &snapFake{fakeConn: fc, snaps: map[string]string{}}
	d, err := New(Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	d.dial = func() (conn, error) { return f, nil }
	t.Cleanup(func() { d.Close() })
	return d, f
}

func TestSnapshotsOnFakeLibvirt(t *testing.T) {
	ctx := context.Background()
	d, f := snapDriver(t, golibvirt.DomainRunning)
	snap, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Description: "d <&>", Memory: true})
	if err != nil || snap.Name != "s1" || !snap.Memory || !snap.Current || snap.CreatedAt.IsZero() {
		t.Fatalf("SnapshotCreate() = %+v, %v; want s1, memory, current, with a time", snap, err)
	}
	if _, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true}); !errors.Is(err, hypervisor.ErrSnapshotExists) {
		t.Errorf("SnapshotCreate(s1 again) = %v; want ErrSnapshotExists", err)
	}
	if f.creates != 1 {
		t.Errorf("DomainSnapshotCreateXML called %d times; want once (the taken name refused before)", f.creates)
	}
	if err := d.SnapshotRevert(ctx, "vm1", "nope"); !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		t.Errorf("SnapshotRevert(nope) = %v; want ErrSnapshotNotFound", err)
	}
	if err := d.SnapshotDelete(ctx, "vm1", "s1"); err != nil {
		t.Errorf("SnapshotDelete(s1) = %v", err)
	}
	if err := d.SnapshotDelete(ctx, "vm1", "s1"); !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		t.Errorf("SnapshotDelete(s1 again) = %v; want ErrSnapshotNotFound", err)
	}
	f.createErr = golibvirt.Error{Code: uint32(golibvirt.ErrConfigUnsupported), Message: "unsupported configuration: internal snapshot for disk vda unsupported for storage type raw"}
	_, err = d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s2", Memory: true})
	if !errors.Is(err, hypervisor.ErrNotSupported) || !strings.Contains(err.Error(), "storage type raw") {
		t.Errorf("SnapshotCreate() refused by libvirt = %v; want ErrNotSupported with libvirt's reason", err)
	}
	if _, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "x"}); !errors.Is(err, hypervisor.ErrInvalidArgument) {
		t.Errorf("SnapshotCreate(name %q) = %v; want ErrInvalidArgument", "x", err)
	}
}

// TestSnapshotRevertIDOnFakeLibvirt: a revert bound to an identity reverts
// only while the snapshot's creation time and state are still those.
func TestSnapshotRevertIDOnFakeLibvirt(t *testing.T) {
	ctx := context.Background()
	d, f := snapDriver(t, golibvirt.DomainRunning)
	snap, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true})
	if err != nil || snap.ID != "libvirt:1796119094:running" {
		t.Fatalf("SnapshotCreate() = %+v, %v; want the identity of its creation time and state", snap, err)
	}
	f.snaps["s1"] = "<domainsnapshot><name>s1</name><state>running</state><creationTime>1796119099</creationTime></domainsnapshot>"
	if err := d.SnapshotRevertID(ctx, "vm1", "s1", snap.ID); !errors.Is(err, hypervisor.ErrSnapshotChanged) || len(f.reverts) != 0 {
		t.Errorf("SnapshotRevertID(a snapshot made anew) = %v, reverts %q; want ErrSnapshotChanged and none", err, f.reverts)
	}
	if err := d.SnapshotRevertID(ctx, "vm1", "s1", "libvirt:1796119099:running"); err != nil || len(f.reverts) != 1 {
		t.Errorf("SnapshotRevertID(its identity) = %v, reverts %q; want one revert", err, f.reverts)
	}
	if err := d.SnapshotRevertID(ctx, "vm1", "nope", "libvirt:1:running"); !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		t.Errorf("SnapshotRevertID(nope) = %v; want ErrSnapshotNotFound", err)
	}
}

func TestSnapshotOfAStoppedDomain(t *testing.T) {
	d, f := snapDriver(t, golibvirt.DomainShutoff)
	_, err := d.SnapshotCreate(context.Background(), "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true})
	if !errors.Is(err, hypervisor.ErrVMNotRunning) {
		t.Errorf("SnapshotCreate() of a shut off domain = %v; want ErrVMNotRunning", err)
	}
	if f.creates != 0 {
		t.Errorf("DomainSnapshotCreateXML called %d times; want none", f.creates)
	}
}

// A connection without the snapshot calls is refused cleanly, as not supported.
func TestSnapshotsNeedTheConnection(t *testing.T) {
	d, _ := fakeDriver(t, newFake())
	_, err := d.SnapshotList(context.Background(), "vm1")
	if !errors.Is(err, hypervisor.ErrNotSupported) {
		t.Errorf("SnapshotList() over a connection without snapshot calls = %v; want ErrNotSupported", err)
	}
}
