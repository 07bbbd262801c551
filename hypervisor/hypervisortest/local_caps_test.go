package hypervisortest

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// The local driver's optional capabilities. Its "VM" is the host, so:
// snapshots are disk-only copies of the harness's scratch directory (the
// only part of this "VM" a revert may touch); the network is the host's
// (net.Interfaces, MACs from /sys/class/net like a guest agent reports
// them); the metrics are the host's (/proc/stat, /proc/meminfo).

var (
	_ hypervisor.Snapshotter    = (*localDriver)(nil)
	_ hypervisor.GuestNetworker = (*localDriver)(nil)
	_ hypervisor.MetricsReader  = (*localDriver)(nil)
)

// localSnapshots are snapshots of the scratch directory's regular files.
type localSnapshots struct {
	mu    sync.Mutex // guards byName and order
	saved map[string]localSnapshot
	order []string
}

type localSnapshot struct {
	info  hypervisor.Snapshot
	files map[string][]byte // base name -> content
}

func (d *localDriver) SnapshotModes() hypervisor.SnapshotModes {
	return hypervisor.SnapshotModes{DiskOnly: true}
}

func (d *localDriver) snapCheck(ctx context.Context, op, vm string) error {
	if err := d.check(ctx, vm); err != nil {
		return fmt.Errorf("local: %s: %w", op, err)
	}
	if vm != d.vm || d.dir == "" {
		return fmt.Errorf("local: %s: %w: only %s's scratch directory can be snapshotted", op, hypervisor.ErrNotSupported, d.vm)
	}
	return nil
}

func (d *localDriver) SnapshotCreate(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
	if err := hypervisor.ValidateSnapshotRequest(req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("local: snapshot create: %w", err)
	}
	if err := hypervisor.CheckSnapshotMode(d.SnapshotModes(), req); err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("local: snapshot create: %w", err)
	}
	if err := d.snapCheck(ctx, "snapshot create", vm); err != nil {
		return hypervisor.Snapshot{}, err
	}
	d.snaps.mu.Lock()
	defer d.snaps.mu.Unlock()
	if _, ok := d.snaps.saved[req.Name]; ok {
		return hypervisor.Snapshot{}, fmt.Errorf("local: snapshot create: %w: %q", hypervisor.ErrSnapshotExists, req.Name)
	}
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return hypervisor.Snapshot{}, fmt.Errorf("local: snapshot create: %w", err)
	}
	files := map[string][]byte{}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.dir, e.Name()))
		if err != nil {
			return hypervisor.Snapshot{}, fmt.Errorf("local: snapshot create: %w", err)
		}
		files[e.Name()] = b
	}
	info := hypervisor.Snapshot{Name: req.Name, ID: "local:" + rand.Text(), Description: req.Description, CreatedAt: time.Now().UTC()}
	if d.snaps.saved == nil {
		d.snaps.saved = map[string]localSnapshot{}
	}
	d.snaps.saved[req.Name] = localSnapshot{info: info, files: files}
	d.snaps.order = append(d.snaps.order, req.Name)
	return info, nil
}

func (d *localDriver) SnapshotList(ctx context.Context, vm string) ([]hypervisor.Snapshot, error) {
	if err := d.snapCheck(ctx, "snapshot list", vm); err != nil {
		return nil, err
	}
	d.snaps.mu.Lock()
	defer d.snaps.mu.Unlock()
	out := []hypervisor.Snapshot{}
	for _, name := range d.snaps.order {
		out = append(out, d.snaps.saved[name].info)
	}
	return out, nil
}

func (d *localDriver) SnapshotRevert(ctx context.Context, vm, name string) error {
	if err := hypervisor.ValidateSnapshotName(name); err != nil {
		return fmt.Errorf("local: snapshot revert: %w", err)
	}
	if err := d.snapCheck(ctx, "snapshot revert", vm); err != nil {
		return err
	}
	d.snaps.mu.Lock()
	defer d.snaps.mu.Unlock()
	s, ok := d.snaps.saved[name]
	if !ok {
		return fmt.Errorf("local: snapshot revert: %w: %q", hypervisor.ErrSnapshotNotFound, name)
	}
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return fmt.Errorf("local: snapshot revert: %w", err)
	}
	for _, e := range ents {
		if _, keep := s.files[e.Name()]; !keep && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(d.dir, e.Name())); err != nil {
				return fmt.Errorf("local: snapshot revert: %w", err)
			}
		}
	}
	for base, b := range s.files {
		if err := os.WriteFile(filepath.Join(d.dir, base), b, 0o644); err != nil {
			return fmt.Errorf("local: snapshot revert: %w", err)
		}
	}
	return nil
}

func (d *localDriver) SnapshotDelete(ctx context.Context, vm, name string) error {
	if err := hypervisor.ValidateSnapshotName(name); err != nil {
		return fmt.Errorf("local: snapshot delete: %w", err)
	}
	if err := d.snapCheck(ctx, "snapshot delete", vm); err != nil {
		return err
	}
	d.snaps.mu.Lock()
	defer d.snaps.mu.Unlock()
	if _, ok := d.snaps.saved[name]; !ok {
		return fmt.Errorf("local: snapshot delete: %w: %q", hypervisor.ErrSnapshotNotFound, name)
	}
	delete(d.snaps.saved, name)
	d.snaps.order = slices.DeleteFunc(d.snaps.order, func(n string) bool { return n == name })
	return nil
}

func (d *localDriver) GuestNetwork(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) {
	if err := d.check(ctx, vm); err != nil {
		return nil, fmt.Errorf("local: guest network: %w", err)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("local: guest network: %w", err)
	}
	var out []hypervisor.NetInterface
	for _, ifc := range ifs {
		n := hypervisor.NetInterface{Name: ifc.Name}
		if b, err := os.ReadFile(filepath.Join("/sys/class/net", ifc.Name, "address")); err == nil {
			n.MAC = strings.TrimSpace(string(b))
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("local: guest network: %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			family := "ipv6"
			if ipn.IP.To4() != nil {
				family = "ipv4"
			}
			ones, _ := ipn.Mask.Size()
			n.Addresses = append(n.Addresses, hypervisor.IPAddress{Family: family, Address: ipn.IP.String(), Prefix: ones})
		}
		out = append(out, n)
	}
	return hypervisor.CleanNetInterfaces(out), nil
}

func (d *localDriver) VMMetrics(ctx context.Context, vm string) (hypervisor.VMMetrics, error) {
	if err := d.check(ctx, vm); err != nil {
		return hypervisor.VMMetrics{}, fmt.Errorf("local: metrics: %w", err)
	}
	busy, err := hostBusyNS()
	if err != nil {
		return hypervisor.VMMetrics{}, fmt.Errorf("local: metrics: %w", err)
	}
	mem, err := hostMemTotal()
	if err != nil {
		return hypervisor.VMMetrics{}, fmt.Errorf("local: metrics: %w", err)
	}
	return hypervisor.VMMetrics{Time: time.Now(), Source: "local", VCPUs: runtime.NumCPU(),
		CPUTimeNS: hypervisor.Uint64(busy), MemoryBytes: hypervisor.Uint64(mem)}, nil
}

// hostBusyNS is the host's non-idle CPU time from /proc/stat (USER_HZ 100).
func hostBusyNS() (uint64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[0] != "cpu" {
			continue
		}
		var ticks uint64
		for i, v := range fields[1:8] { // user nice system idle iowait irq softirq
			if i == 3 || i == 4 {
				continue
			}
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, err
			}
			ticks += n
		}
		return ticks * uint64(10*time.Millisecond), nil
	}
	return 0, errors.New("/proc/stat has no cpu line")
}

func hostMemTotal() (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, err := strconv.ParseUint(f[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, errors.New("/proc/meminfo has no MemTotal")
}

func TestRunSnapshotsPassesOnLocalDriver(t *testing.T) {
	d := newLocalDriver(t)
	RunSnapshots(t, d.harness(t))
	if len(d.snaps.order) != 0 {
		t.Errorf("RunSnapshots left snapshots %q; want every one it made deleted", d.snaps.order)
	}
}

func TestEverySnapshotCheckPassesOnLocalDriver(t *testing.T) {
	d := newLocalDriver(t)
	h := d.harness(t)
	h.Capabilities = hypervisor.Capabilities{Snapshots: true, GuestNetwork: true, Metrics: true}
	for _, c := range snapshotChecks {
		if r := record(c.run, h); r.Failed() || r.Skipped() {
			t.Errorf("%s on the local driver: failed %v, skipped %v; want a pass. Log:\n%s",
				c.name, r.Failed(), r.Skipped(), strings.Join(r.logs, "\n"))
		}
	}
}

func TestCapabilityChecksFailWithoutTheCapability(t *testing.T) {
	checks := map[string]func(testing.TB, Harness){
		"Network": checkGuestNetwork, "Metrics": checkMetrics, "Snapshots": checkSnapshotRevert,
	}
	for name, check := range checks {
		d := newLocalDriver(t)
		h := d.harness(t)
		h.Driver = &Fake{StatusFunc: d.Status} // no optional capability
		h.Capabilities = hypervisor.Capabilities{}
		if r := record(check, h); !r.Failed() || r.Skipped() {
			t.Errorf("%s on a driver without it, not declared: failed %v, skipped %v; want a failure (never a skip)", name, r.Failed(), r.Skipped())
		}
		h.Capabilities = hypervisor.Capabilities{Snapshots: true, GuestNetwork: true, Metrics: true}
		if r := record(check, h); !r.Failed() {
			t.Errorf("%s on a driver without it, declared by the harness: failed %v; want a failure", name, r.Failed())
		}
	}
}

func TestDeclaredCapabilities(t *testing.T) {
	d := newLocalDriver(t)
	all := hypervisor.Capabilities{Snapshots: true, GuestNetwork: true, Metrics: true}
	tests := []struct {
		name     string
		driver   hypervisor.Driver
		declared hypervisor.Capabilities
		fail     bool
	}{
		{"all, all declared", d, all, false},
		{"all, none declared", d, hypervisor.Capabilities{}, true},
		{"all, metrics left out", d, hypervisor.Capabilities{Snapshots: true, GuestNetwork: true}, true},
		{"none, none declared", &Fake{StatusFunc: d.Status}, hypervisor.Capabilities{}, false},
		{"none, network declared", &Fake{StatusFunc: d.Status}, hypervisor.Capabilities{GuestNetwork: true}, true},
	}
	for _, tt := range tests {
		h := Harness{Driver: tt.driver, VM: d.vm, Capabilities: tt.declared}
		if r := record(checkDeclaredCapabilities, h); r.Failed() != tt.fail || r.Skipped() {
			t.Errorf("checkDeclaredCapabilities(%s) failed %v, skipped %v; want failed %v", tt.name, r.Failed(), r.Skipped(), tt.fail)
		}
	}
}

func TestCapabilityChecksFailOnBrokenDrivers(t *testing.T) {
	tests := []struct {
		name    string
		check   func(testing.TB, Harness)
		breakIt func(f *Fake, d *localDriver)
	}{
		{"RevertUndoes/revert does nothing", checkSnapshotRevert, func(f *Fake, d *localDriver) {
			f.SnapshotRevertFunc = func(context.Context, string, string) error { return nil }
		}},
		{"RevertUndoes/keeps new files", checkSnapshotRevert, func(f *Fake, d *localDriver) {
			f.SnapshotRevertFunc = func(ctx context.Context, vm, name string) error {
				d.snaps.mu.Lock()
				s := d.snaps.saved[name]
				d.snaps.mu.Unlock()
				for base, b := range s.files {
					if err := os.WriteFile(filepath.Join(d.dir, base), b, 0o644); err != nil {
						return err
					}
				}
				return nil
			}
		}},
		{"RevertUndoes/description lost", checkSnapshotRevert, func(f *Fake, d *localDriver) {
			f.SnapshotCreateFunc = func(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
				req.Description = ""
				return d.SnapshotCreate(ctx, vm, req)
			}
		}},
		{"ListAndDelete/not listed", checkSnapshotListDelete, func(f *Fake, d *localDriver) {
			f.SnapshotListFunc = func(context.Context, string) ([]hypervisor.Snapshot, error) { return nil, nil }
		}},
		{"ListAndDelete/delete does nothing", checkSnapshotListDelete, func(f *Fake, d *localDriver) {
			f.SnapshotDeleteFunc = func(context.Context, string, string) error { return nil }
		}},
		{"NameTaken/replaced", checkSnapshotExists, func(f *Fake, d *localDriver) {
			f.SnapshotCreateFunc = func(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
				_ = d.SnapshotDelete(ctx, vm, req.Name)
				return d.SnapshotCreate(ctx, vm, req)
			}
		}},
		{"Missing/sentinel lost", checkSnapshotMissing, func(f *Fake, d *localDriver) {
			f.SnapshotRevertFunc = func(ctx context.Context, vm, name string) error {
				if err := d.SnapshotRevert(ctx, vm, name); err != nil {
					return errors.New(err.Error())
				}
				return nil
			}
		}},
		{"Mode/memory accepted", checkSnapshotMode, func(f *Fake, d *localDriver) {
			f.SnapshotCreateFunc = func(ctx context.Context, vm string, req hypervisor.SnapshotRequest) (hypervisor.Snapshot, error) {
				req.Memory = false
				return d.SnapshotCreate(ctx, vm, req)
			}
		}},
		{"BadNames/not validated", checkSnapshotBadNames, func(f *Fake, d *localDriver) {
			f.SnapshotDeleteFunc = func(context.Context, string, string) error { return nil }
		}},
		{"UnknownVM/list of another VM", checkSnapshotUnknownVM, func(f *Fake, d *localDriver) {
			f.SnapshotListFunc = func(ctx context.Context, _ string) ([]hypervisor.Snapshot, error) { return d.SnapshotList(ctx, d.vm) }
		}},
		{"Network/wrong MAC", checkGuestNetwork, func(f *Fake, d *localDriver) {
			f.GuestNetworkFunc = func(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) {
				ifs, err := d.GuestNetwork(ctx, vm)
				for i := range ifs {
					ifs[i].MAC = "02:00:00:00:00:01"
				}
				return ifs, err
			}
		}},
		{"Network/interface missing", checkGuestNetwork, func(f *Fake, d *localDriver) {
			f.GuestNetworkFunc = func(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) {
				ifs, err := d.GuestNetwork(ctx, vm)
				return slices.DeleteFunc(ifs, func(n hypervisor.NetInterface) bool { return n.Name != "lo" }), err
			}
		}},
		{"Network/no loopback address", checkGuestNetwork, func(f *Fake, d *localDriver) {
			f.GuestNetworkFunc = func(ctx context.Context, vm string) ([]hypervisor.NetInterface, error) {
				ifs, err := d.GuestNetwork(ctx, vm)
				for i := range ifs {
					ifs[i].Addresses = nil
				}
				return ifs, err
			}
		}},
		{"NetworkUnknownVM/answers", checkGuestNetworkUnknownVM, func(f *Fake, d *localDriver) {
			f.GuestNetworkFunc = func(ctx context.Context, _ string) ([]hypervisor.NetInterface, error) {
				return d.GuestNetwork(ctx, d.vm)
			}
		}},
		{"Metrics/CPU time frozen", checkMetrics, func(f *Fake, d *localDriver) {
			f.VMMetricsFunc = func(ctx context.Context, vm string) (hypervisor.VMMetrics, error) {
				m, err := d.VMMetrics(ctx, vm)
				m.CPUTimeNS = hypervisor.Uint64(42)
				return m, err
			}
		}},
		{"Metrics/less memory than the guest sees", checkMetrics, func(f *Fake, d *localDriver) {
			f.VMMetricsFunc = func(ctx context.Context, vm string) (hypervisor.VMMetrics, error) {
				m, err := d.VMMetrics(ctx, vm)
				m.MemoryBytes = hypervisor.Uint64(1 << 20)
				return m, err
			}
		}},
		{"Metrics/stale time", checkMetrics, func(f *Fake, d *localDriver) {
			f.VMMetricsFunc = func(ctx context.Context, vm string) (hypervisor.VMMetrics, error) {
				m, err := d.VMMetrics(ctx, vm)
				m.Time = m.Time.Add(-time.Hour)
				return m, err
			}
		}},
		{"MetricsUnknownVM/answers", checkMetricsUnknownVM, func(f *Fake, d *localDriver) {
			f.VMMetricsFunc = func(ctx context.Context, _ string) (hypervisor.VMMetrics, error) { return d.VMMetrics(ctx, d.vm) }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newLocalDriver(t)
			h := d.harness(t)
			f := delegate(d)
			tt.breakIt(f, d)
			h.Driver = f
			r := record(tt.check, h)
			if !r.Failed() || r.Skipped() {
				t.Errorf("check %s on a broken driver: failed %v, skipped %v; want a failure. Log:\n%s",
					tt.name, r.Failed(), r.Skipped(), strings.Join(r.logs, "\n"))
			}
			t.Logf("the check reported: %s", strings.Join(r.logs, " | "))
		})
	}
}
