package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
)

// qmpSnapFake answers the QMP commands of snapshots as QEMU 7.2 does (as
// seen on a lab VM): jobs that conclude at once (or after pending polls),
// "Snapshot 'x' already exists in one or more devices" for a taken tag,
// "... does not exist ..." for a missing one on load (leaving the VM in
// restore-vm), and a snapshot-delete of a missing tag that succeeds.
type qmpSnapFake struct {
	mu sync.Mutex
	// disks are query-block's inserted devices: node name -> driver.
	disks  []fakeDisk
	snaps  []fakeSnap
	status string
	jobs   []qmpJob
	// pending polls a job answers "running" before it concludes.
	pending int
	// loadErr, when set, makes snapshot-load's job fail with it.
	loadErr string
	log     []string
}

type fakeDisk struct {
	node, drv string
	ro        bool
}

type fakeSnap struct {
	name    string
	vmstate int64
	sec     int64
}

func (f *qmpSnapFake) run(_ context.Context, command string) (string, error) {
	var req struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal([]byte(command), &req); err != nil {
		return "", err
	}
	var args struct {
		JobID string `json:"job-id"`
		ID    string `json:"id"`
		Tag   string `json:"tag"`
	}
	json.Unmarshal(req.Arguments, &args)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, req.Execute+" "+args.Tag+args.ID)
	ret := func(v any) (string, error) {
		b, _ := json.Marshal(map[string]any{"return": v, "id": 1})
		return string(b), nil
	}
	switch req.Execute {
	case "query-status":
		return ret(map[string]any{"status": f.status, "running": f.status == "running"})
	case "cont":
		f.status = "running"
		return ret(map[string]any{})
	case "query-block":
		var out []any
		for _, d := range f.disks {
			var snaps []any
			for _, s := range f.snaps {
				snaps = append(snaps, map[string]any{"id": "1", "name": s.name, "vm-state-size": s.vmstate, "date-sec": s.sec, "date-nsec": 0, "vm-clock-sec": 0, "vm-clock-nsec": 0})
			}
			out = append(out, map[string]any{"device": "", "locked": false, "removable": false, "type": "unknown",
				"inserted": map[string]any{"file": "/vm/" + d.node + ".img", "node-name": d.node, "ro": d.ro, "drv": d.drv,
					"encrypted": false, "backing_file_depth": 0, "detect_zeroes": "off", "bps": 0, "bps_rd": 0, "bps_wr": 0,
					"iops": 0, "iops_rd": 0, "iops_wr": 0, "write_threshold": 0, "cache": map[string]any{"writeback": true, "direct": false, "no-flush": false},
					"image": map[string]any{"filename": "/vm/" + d.node + ".img", "format": d.drv, "virtual-size": 1 << 26, "snapshots": snaps}}})
		}
		return ret(out)
	case "snapshot-save", "snapshot-load", "snapshot-delete":
		job := qmpJob{ID: args.JobID, Type: req.Execute, Status: "running"}
		switch req.Execute {
		case "snapshot-save":
			if f.find(args.Tag) >= 0 {
				job.Error = fmt.Sprintf("Snapshot '%s' already exists in one or more devices", args.Tag)
			} else {
				f.snaps = append(f.snaps, fakeSnap{name: args.Tag, vmstate: 1 << 20, sec: 1796119094 + int64(len(f.snaps))})
			}
		case "snapshot-load":
			switch {
			case f.loadErr != "":
				job.Error, f.status = f.loadErr, "restore-vm"
			case f.find(args.Tag) < 0:
				job.Error, f.status = fmt.Sprintf("Snapshot '%s' does not exist in one or more devices", args.Tag), "restore-vm"
			}
		case "snapshot-delete":
			if i := f.find(args.Tag); i >= 0 {
				f.snaps = append(f.snaps[:i], f.snaps[i+1:]...)
			}
		}
		f.jobs = append(f.jobs, job)
		return ret(map[string]any{})
	case "query-jobs":
		for i := range f.jobs {
			if f.jobs[i].Status == "running" {
				if f.pending > 0 {
					f.pending--
				} else {
					f.jobs[i].Status = "concluded"
				}
			}
		}
		return ret(f.jobs)
	case "job-dismiss":
		for i, j := range f.jobs {
			if j.ID == args.ID {
				f.jobs = append(f.jobs[:i], f.jobs[i+1:]...)
				return ret(map[string]any{})
			}
		}
		return "", &QMPError{Class: "GenericError", Desc: "Job not found"}
	}
	return "", &QMPError{Class: "CommandNotFound", Desc: "The command " + req.Execute + " has not been found"}
}

func (f *qmpSnapFake) find(name string) int {
	for i, s := range f.snaps {
		if s.name == name {
			return i
		}
	}
	return -1
}

func (f *qmpSnapFake) sent(prefix string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, l := range f.log {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func newSnapDriver(t *testing.T, f *qmpSnapFake) *Driver {
	t.Helper()
	if f.status == "" {
		f.status = "running"
	}
	return newFakeDriver(t, Config{}, map[string]*fakeAgent{"vm1": {t: t}}, map[string]*fakeMonitor{"vm1": {run: f.run}})
}

func TestSnapshotCreateListDeleteOnFakeQEMU(t *testing.T) {
	ctx := context.Background()
	f := &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}, {node: "disk1", drv: "qcow2"}, {node: "cd", drv: "raw", ro: true}}, pending: 3}
	d := newSnapDriver(t, f)
	snap, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Description: "first", Memory: true})
	if err != nil {
		t.Fatalf("SnapshotCreate() = %v", err)
	}
	if snap.Name != "s1" || !snap.Memory || snap.SizeBytes != 1<<20 || snap.Description != "first" || snap.CreatedAt.Unix() != 1796119094 {
		t.Errorf("SnapshotCreate() = %+v; want s1 with memory, 1 MiB, its description and QEMU's date", snap)
	}
	saves := f.sent("snapshot-save")
	if len(saves) != 1 {
		t.Fatalf("snapshot-save sent %d times; want 1", len(saves))
	}
	var save struct {
		Arguments struct {
			Vmstate string   `json:"vmstate"`
			Devices []string `json:"devices"`
		} `json:"arguments"`
	}
	for _, c := range d.vms["vm1"].mon.(*fakeMonitor).sent() {
		if strings.Contains(c, `"snapshot-save"`) {
			json.Unmarshal([]byte(c), &save)
		}
	}
	if save.Arguments.Vmstate != "disk0" || strings.Join(save.Arguments.Devices, ",") != "disk0,disk1" {
		t.Errorf("snapshot-save arguments = %+v; want the VM state on disk0 and both writable qcow2 disks (not the read-only cd)", save.Arguments)
	}
	if len(f.jobs) != 0 {
		t.Errorf("jobs left in QEMU: %+v; want every job dismissed", f.jobs)
	}
	if _, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true}); !errors.Is(err, hypervisor.ErrSnapshotExists) {
		t.Errorf("SnapshotCreate(s1 again) = %v; want ErrSnapshotExists", err)
	}
	list, err := d.SnapshotList(ctx, "vm1")
	if err != nil || len(list) != 1 || list[0].Description != "first" {
		t.Errorf("SnapshotList() = %+v, %v; want s1 with the description kept (in memory for a configured VM)", list, err)
	}
	if err := d.SnapshotDelete(ctx, "vm1", "s1"); err != nil {
		t.Fatalf("SnapshotDelete() = %v", err)
	}
	n := len(f.sent("snapshot-delete"))
	// QEMU's snapshot-delete succeeds for a missing tag: the driver must say not found itself.
	if err := d.SnapshotDelete(ctx, "vm1", "s1"); !errors.Is(err, hypervisor.ErrSnapshotNotFound) {
		t.Errorf("SnapshotDelete(s1 again) = %v; want ErrSnapshotNotFound", err)
	}
	if len(f.sent("snapshot-delete")) != n {
		t.Errorf("a second SnapshotDelete sent snapshot-delete; want the missing snapshot refused before")
	}
	// The description went with it: a new s1 has none.
	if _, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true}); err != nil {
		t.Fatal(err)
	}
	if list, _ := d.SnapshotList(ctx, "vm1"); len(list) != 1 || list[0].Description != "" {
		t.Errorf("SnapshotList() after delete and create = %+v; want s1 without the old description", list)
	}
}

func TestSnapshotRefusalsOnFakeQEMU(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		fake  *qmpSnapFake
		call  func(d *Driver) error
		want  error
		sends string // a command that must not be sent
	}{
		{"writable raw disk", &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}, {node: "d1", drv: "raw"}}},
			func(d *Driver) error {
				_, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true})
				return err
			}, hypervisor.ErrNotSupported, "snapshot-save"},
		{"no disk", &qmpSnapFake{},
			func(d *Driver) error {
				_, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true})
				return err
			}, hypervisor.ErrNotSupported, "snapshot-save"},
		{"disk only", &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}},
			func(d *Driver) error {
				_, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1"})
				return err
			}, hypervisor.ErrSnapshotDiskOnly, "query-block"},
		{"bad name", &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}},
			func(d *Driver) error { return d.SnapshotRevert(ctx, "vm1", "1") }, hypervisor.ErrInvalidArgument, "query-block"},
		{"revert missing", &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}},
			func(d *Driver) error { return d.SnapshotRevert(ctx, "vm1", "nope") }, hypervisor.ErrSnapshotNotFound, "snapshot-load"},
		{"revert without VM state", &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}, snaps: []fakeSnap{{name: "diskonly"}}},
			func(d *Driver) error { return d.SnapshotRevert(ctx, "vm1", "diskonly") }, hypervisor.ErrNotSupported, "snapshot-load"},
		{"revert bound to another identity", &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}, snaps: []fakeSnap{{name: "s1", vmstate: 4096, sec: 1796119094}}},
			func(d *Driver) error {
				return d.SnapshotRevertID(ctx, "vm1", "s1", "qemu:1:1796119093.000000000:4096:0.000000000")
			}, hypervisor.ErrSnapshotChanged, "snapshot-load"},
		{"QEMU not running", &qmpSnapFake{status: "shutdown"},
			func(d *Driver) error {
				d.vms["vm1"].mon.(*fakeMonitor).connect = refused
				_, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true})
				return err
			}, hypervisor.ErrVMNotRunning, "snapshot-save"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newSnapDriver(t, tt.fake)
			if _, err := d.lookup("test", "vm1"); err != nil {
				t.Fatal(err)
			}
			err := tt.call(d)
			if !errors.Is(err, tt.want) {
				t.Errorf("error %v; want %v", err, tt.want)
			}
			if got := tt.fake.sent(tt.sends); len(got) != 0 {
				t.Errorf("sent %q; want nothing of %s", got, tt.sends)
			}
		})
	}
}

func TestSnapshotFailedLoadOnFakeQEMU(t *testing.T) {
	ctx := context.Background()
	// The snapshot vanished between the check and the load: QEMU refuses
	// before loading anything and leaves the VM stopped; the driver resumes it.
	f := &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}, snaps: []fakeSnap{{name: "s1", vmstate: 1}},
		loadErr: "Snapshot 's1' does not exist in one or more devices"}
	d := newSnapDriver(t, f)
	err := d.SnapshotRevert(ctx, "vm1", "s1")
	var je *jobError
	if !errors.Is(err, hypervisor.ErrSnapshotNotFound) || !errors.As(err, &je) || !strings.Contains(err.Error(), "failed in QEMU: Snapshot 's1' does not exist") {
		t.Errorf("SnapshotRevert() = %v; want QEMU's reason, matching ErrSnapshotNotFound", err)
	}
	if f.status != "running" || len(f.sent("cont")) != 1 {
		t.Errorf("after a load QEMU refused: status %q, cont sent %d times; want the VM resumed once", f.status, len(f.sent("cont")))
	}

	// A load that failed midway: the VM stays stopped and the error says so.
	f = &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}, snaps: []fakeSnap{{name: "s1", vmstate: 1}},
		loadErr: "Error -22 while loading VM state"}
	d = newSnapDriver(t, f)
	err = d.SnapshotRevert(ctx, "vm1", "s1")
	if err == nil || !strings.Contains(err.Error(), "Error -22 while loading VM state") || !strings.Contains(err.Error(), "left the VM stopped") {
		t.Errorf("SnapshotRevert() = %v; want QEMU's reason and that the VM is left stopped", err)
	}
	if len(f.sent("cont")) != 0 {
		t.Errorf("cont sent after a half-done load; want the VM left stopped")
	}
}

func TestSnapshotJobTimeoutOnFakeQEMU(t *testing.T) {
	f := &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}, pending: 1 << 30}
	d := newSnapDriver(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Memory: true})
	if !errors.Is(err, hypervisor.ErrTimeout) || !strings.Contains(err.Error(), "goes on in QEMU") {
		t.Errorf("SnapshotCreate() with a job that never concludes = %v; want ErrTimeout saying the job goes on", err)
	}
	// The next operation dismisses the job once QEMU has concluded it.
	f.mu.Lock()
	f.pending = 0
	f.mu.Unlock()
	if _, err := d.SnapshotList(context.Background(), "vm1"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SnapshotCreate(context.Background(), "vm1", hypervisor.SnapshotRequest{Name: "s2", Memory: true}); err != nil {
		t.Fatalf("SnapshotCreate(s2) = %v", err)
	}
	if len(f.jobs) != 0 {
		t.Errorf("jobs left: %+v; want the stale one dismissed too", f.jobs)
	}
}

func TestSnapshotLockHonoursContext(t *testing.T) {
	var s snapState
	if err := s.lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.lock(ctx); !errors.Is(err, hypervisor.ErrTimeout) {
		t.Errorf("lock() while held = %v; want ErrTimeout once ctx ends", err)
	}
	s.unlock()
	if err := s.lock(context.Background()); err != nil {
		t.Errorf("lock() after unlock = %v", err)
	}
}

// A lab VM's descriptions live in its directory; a damaged file is read as
// none and replaced, and an entry of the same name but another time (a
// snapshot remade outside vmgate) is not shown.
func TestSnapshotDescriptionsOfALabVM(t *testing.T) {
	labDir := t.TempDir()
	dir := filepath.Join(labDir, "vm1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vm.json"), []byte(`{"name":"vm1"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(dir, SnapshotMetaName)
	if err := os.WriteFile(meta, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &qmpSnapFake{status: "running", disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}}
	d := newFakeDriver(t, Config{LabDir: labDir}, nil, map[string]*fakeMonitor{"vm1": {run: f.run}})
	ctx := context.Background()
	if _, err := d.SnapshotCreate(ctx, "vm1", hypervisor.SnapshotRequest{Name: "s1", Description: "kept", Memory: true}); err != nil {
		t.Fatalf("SnapshotCreate() = %v", err)
	}
	b, err := os.ReadFile(meta)
	var metas []snapMeta
	if err != nil || json.Unmarshal(b, &metas) != nil || len(metas) != 1 || metas[0].Description != "kept" {
		t.Fatalf("%s = %s, %v; want the one description", meta, b, err)
	}
	// The snapshot is remade outside vmgate: same name, another time.
	f.mu.Lock()
	f.snaps[0].sec++
	f.mu.Unlock()
	list, err := d.SnapshotList(ctx, "vm1")
	if err != nil || len(list) != 1 || list[0].Description != "" {
		t.Errorf("SnapshotList() = %+v, %v; want s1 without the description of the older s1", list, err)
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, ".snapshots-*")); len(ents) != 0 {
		t.Errorf("temporary files left: %q", ents)
	}
}

// TestSnapshotRevertIDOnFakeQEMU: a revert bound to the identity the
// listing gives loads the snapshot.
func TestSnapshotRevertIDOnFakeQEMU(t *testing.T) {
	ctx := context.Background()
	f := &qmpSnapFake{disks: []fakeDisk{{node: "disk0", drv: "qcow2"}}, snaps: []fakeSnap{{name: "s1", vmstate: 4096, sec: 1796119094}}}
	d := newSnapDriver(t, f)
	list, err := d.SnapshotList(ctx, "vm1")
	if err != nil || len(list) != 1 || list[0].ID != "qemu:1:1796119094.000000000:4096:0.000000000" {
		t.Fatalf("SnapshotList = %+v, %v; want s1 with its identity", list, err)
	}
	if err := d.SnapshotRevertID(ctx, "vm1", "s1", list[0].ID); err != nil {
		t.Fatalf("SnapshotRevertID(its own identity) = %v", err)
	}
	if got := f.sent("snapshot-load"); len(got) != 1 {
		t.Errorf("sent %q; want one snapshot-load", got)
	}
}
