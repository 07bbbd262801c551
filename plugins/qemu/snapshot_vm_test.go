package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// labCapabilities are what the QEMU driver must have on a lab VM.
var labCapabilities = hypervisor.Capabilities{
	Snapshots: true, SnapshotModes: hypervisor.SnapshotModes{Memory: true}, GuestNetwork: true, Metrics: true, Create: true, HelperChannel: true,
	// The screen, the keyboard and the console: on every VM.
	Screenshot: true, SendKeys: true, ConsoleRead: true, ConsoleWrite: true,
}

func TestCapabilities(t *testing.T) {
	d, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := hypervisor.CapabilitiesOf(d); got != labCapabilities {
		t.Errorf("CapabilitiesOf(qemu driver) = %+v; want %+v", got, labCapabilities)
	}
}

// TestConformanceSnapshots runs the snapshot suite on a lab VM of its own
// (it reverts the VM), files on the qcow2 disk (/data) included.
func TestConformanceSnapshots(t *testing.T) {
	v := labtest.Start(t, lab.Spec{Name: "snap"})
	d := labDriver(t, v)
	hypervisortest.RunSnapshots(t, hypervisortest.Harness{Driver: d, VM: "snap", DiskDir: "/data", Capabilities: labCapabilities})

	// What the suite cannot see: the descriptions of a lab VM's snapshots
	// live in its directory, and a revert restores the guest's memory (a
	// process started after the snapshot is gone, one from before is back).
	ctx, cancel := testload.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req := hypervisor.SnapshotRequest{Name: "desc-check", Description: "kept in snapshots.json", Memory: true}
	if _, err := d.SnapshotCreate(ctx, "snap", req); err != nil {
		t.Fatalf("SnapshotCreate(%+v) = %v", req, err)
	}
	b, err := os.ReadFile(filepath.Join(v.Dir, SnapshotMetaName))
	var metas []snapMeta
	if err != nil || json.Unmarshal(b, &metas) != nil || !slices.ContainsFunc(metas, func(m snapMeta) bool {
		return m.Name == req.Name && m.Description == req.Description
	}) {
		t.Errorf("%s = %s, %v; want the description of %s", SnapshotMetaName, b, err, req.Name)
	}
	sleeper, err := d.Run(ctx, "snap", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"}})
	if err != nil || sleeper.ExitCode != 0 {
		t.Fatalf("starting a sleeper = %+v, %v", sleeper, err)
	}
	pid := string(sleeper.Stdout[:len(sleeper.Stdout)-1])
	if err := d.SnapshotRevert(ctx, "snap", req.Name); err != nil {
		t.Fatalf("SnapshotRevert(%s) = %v", req.Name, err)
	}
	res, err := d.Run(ctx, "snap", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", `[ -e /proc/$1 ] && echo alive || echo gone`, "sh", pid}})
	if err != nil || string(res.Stdout) != "gone\n" {
		t.Errorf("after the revert, the sleeper (pid %s, started after the snapshot) = %q, %v; want gone", pid, res.Stdout, err)
	}
	if err := d.SnapshotDelete(ctx, "snap", req.Name); err != nil {
		t.Fatalf("SnapshotDelete(%s) = %v", req.Name, err)
	}
	b, _ = os.ReadFile(filepath.Join(v.Dir, SnapshotMetaName))
	if json.Unmarshal(b, &metas); slices.ContainsFunc(metas, func(m snapMeta) bool { return m.Name == req.Name }) {
		t.Errorf("%s = %s after SnapshotDelete; want %s gone", SnapshotMetaName, b, req.Name)
	}
	// Disk-only snapshots: QEMU cannot take them (snapshot-save always saves the VM state).
	_, err = d.SnapshotCreate(ctx, "snap", hypervisor.SnapshotRequest{Name: "diskonly", Memory: false})
	if !errors.Is(err, hypervisor.ErrSnapshotDiskOnly) {
		t.Errorf("SnapshotCreate(memory false) = %v; want ErrSnapshotDiskOnly", err)
	}
}

func TestLabGuestNetwork(t *testing.T) {
	v := labtest.VM(t, "t1")
	d := labDriver(t, v)
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ifs, err := d.GuestNetwork(ctx, "t1")
	if err != nil {
		t.Fatalf("GuestNetwork(t1) = %v", err)
	}
	var eth0 *hypervisor.NetInterface
	for i := range ifs {
		if ifs[i].Name == "eth0" {
			eth0 = &ifs[i]
		}
	}
	want := hypervisor.IPAddress{Family: "ipv4", Address: "10.0.2.15", Prefix: 24}
	if eth0 == nil || eth0.MAC != "52:54:00:12:34:56" || !slices.Contains(eth0.Addresses, want) || eth0.Stats == nil {
		t.Errorf("GuestNetwork(t1) = %+v; want eth0 52:54:00:12:34:56 with %+v and counters", ifs, want)
	}
}
