package proxmox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/pveemu"
	"github.com/vmgate/vmgate/internal/testload"
)

// The conformance suite on a three-node emulated cluster: VM 101 (the lab
// VM t1) migrates online from node to node between the suite's groups;
// node pve-3 is offline, with VM 104 on it; 103 (noexec) is on pve-2 and
// 102 (no QEMU, stopped) on pve-2.

// clusterMoves are where VM 101 migrates before a group: each group after
// a move calls it first, before anything reads the view again.
var clusterMoves = map[string]string{"Exec": "pve-2", "Files": "pve", "Network": "pve-2", "Metrics": "pve"}

// startCluster starts the three-node emulator with pve-3 offline.
func startCluster(t *testing.T, v pveemu.Version) *testEmu {
	t.Helper()
	t1 := labtest.VM(t, "t1")
	noexec := labtest.VM(t, "noexec")
	e := pveemu.Start(t, pveemu.Options{Version: v, Nodes: []string{"pve", "pve-2", "pve-3"}})
	if err := e.AddToken(pveemu.Token{ID: emuTokenID, Secret: emuSecret,
		ACL: []pveemu.ACL{{Path: "/vms", Privs: driverPrivs(v), Propagate: true}}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []pveemu.VMSpec{
		{VMID: 101, Node: "pve", Name: "t1", Machine: pveemu.NewLabMachine(t1)},
		{VMID: 102, Node: "pve-2", Name: "off"},
		{VMID: 103, Node: "pve-2", Name: "noexec", Machine: pveemu.NewLabMachine(noexec)},
		{VMID: 104, Node: "pve-3", Name: "far", Running: true},
	} {
		if err := e.AddVM(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.SetNodeOnline("pve-3", false); err != nil {
		t.Fatal(err)
	}
	ca, secret := e.ClientFiles(t, emuSecret)
	return &testEmu{Emulator: e, cfg: Config{URL: e.URL(), TokenID: emuTokenID, TokenSecretFile: secret, CAFile: ca}}
}

// migrate moves vmid to node through the emulator's migrate_vm.
func migrate(t *testing.T, e *testEmu, vmid int, node string) {
	t.Helper()
	ctx, cancel := testload.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Migrate(ctx, vmid, node); err != nil {
		t.Fatalf("Migrate(%d, %s) = %v", vmid, node, err)
	}
}

// followed checks the exchanges since a move of vmid from node from to to:
// the first request about it went to from, was answered that the config is
// not there, and was sent again to to.
func followed(t *testing.T, log []pveemu.Exchange, vmid int, from, to string) {
	t.Helper()
	old := fmt.Sprintf("/api2/json/nodes/%s/qemu/%d/", from, vmid)
	for i, x := range log {
		if !strings.Contains(x.Request, old) {
			continue
		}
		if !strings.HasPrefix(x.Response, "500 Configuration file 'nodes/"+from+"/") {
			t.Errorf("after the move of %d from %s: %q answered %q; want load_config's wrong node", vmid, from, x.Request, x.Response)
			return
		}
		again := strings.Replace(x.Request, old, fmt.Sprintf("/api2/json/nodes/%s/qemu/%d/", to, vmid), 1)
		for _, y := range log[i+1:] {
			if y.Request == again && strings.HasPrefix(y.Response, "200 ") {
				return
			}
		}
		t.Errorf("after the move of %d from %s to %s: %q never sent again to %s", vmid, from, to, x.Request, to)
		return
	}
	t.Errorf("after the move of %d from %s to %s: no request went to %s; want the view's stale node tried first", vmid, from, to, from)
}

// noneTo fails for any request sent to node.
func noneTo(t *testing.T, log []pveemu.Exchange, node string) {
	t.Helper()
	for _, x := range log {
		if strings.Contains(x.Request, "/api2/json/nodes/"+node+"/") {
			t.Errorf("request %q sent to offline node %s", x.Request, node)
		}
	}
}

// clusterHarness is the suite's harness on the cluster; with follow, it
// checks at each move that the driver followed the previous one.
func clusterHarness(e *testEmu, d hypervisor.Driver, follow bool) hypervisortest.Harness {
	at := "pve"
	return hypervisortest.Harness{Driver: d, VM: "101", NoExecVM: "103", UnknownVM: "999",
		Capabilities: pveCapabilities, DiskDir: "/data",
		BeforeGroup: func(t *testing.T, group string) {
			to, ok := clusterMoves[group]
			if !ok {
				return
			}
			log := e.Transcript()
			noneTo(t, log, "pve-3")
			if follow && group != "Exec" {
				followed(t, log, 101, previous(at), at)
			}
			e.ResetTranscript()
			migrate(t, e, 101, to)
			at = to
		}}
}

// previous is where VM 101 was before it moved to node.
func previous(node string) string {
	if node == "pve" {
		return "pve-2"
	}
	return "pve"
}

// offlineChecks: the VM on the offline node reports so, calls on it fail
// naming the node, and nothing reaches the node.
func offlineChecks(t *testing.T, e *testEmu, d hypervisor.Driver) {
	ctx := ctxT(t)
	e.ResetTranscript()
	vms, err := d.ListVMs(ctx)
	if err != nil {
		t.Fatalf("ListVMs() = %v", err)
	}
	found := false
	for _, vm := range vms {
		if vm.Name == "104" {
			// No name: pve-3 went offline before pvestatd broadcast 104.
			found = true
			if vm.State != hypervisor.StateUnknown || vm.Info != "node pve-3 (offline)" {
				t.Errorf("ListVMs() lists 104 as %+v; want state unknown, info naming pve-3 offline", vm)
			}
		}
	}
	if !found {
		t.Errorf("ListVMs() = %+v; want 104 listed", vms)
	}
	st, err := d.Status(ctx, "104")
	if err != nil || st.State != hypervisor.StateUnknown || st.Detail != "node pve-3 offline" || st.AgentConnected {
		t.Errorf("Status(104) = %+v, %v; want unknown, node pve-3 offline", st, err)
	}
	for name, call := range map[string]func() error{
		"Power":     func() error { return d.Power(ctx, "104", hypervisor.PowerStart) },
		"AgentInfo": func() error { _, err := d.AgentInfo(ctx, "104"); return err },
		"ExecStart": func() error {
			_, err := d.ExecStart(ctx, "104", hypervisor.ExecRequest{Argv: []string{"/bin/true"}})
			return err
		},
		"FileRead": func() error { _, err := d.FileRead(ctx, "104", "/etc/hostname", 10); return err },
	} {
		err := call()
		if !errors.Is(err, hypervisor.ErrBackend) || !strings.Contains(err.Error(), "node pve-3, which is offline") {
			t.Errorf("%s(104) = %v; want %v naming offline node pve-3", name, err, hypervisor.ErrBackend)
		}
	}
	noneTo(t, e.Transcript(), "pve-3")
}

// TestConformanceCluster runs the suite in this process against the
// cluster. The driver trusts its view for an hour here, so each move is
// found by a wrong-node answer and followed, which the harness checks.
func TestConformanceCluster(t *testing.T) {
	e := startCluster(t, pveemu.PVE92())
	d := newDriver(t, e.cfg)
	d.place.ttl = time.Hour
	hypervisortest.Run(t, clusterHarness(e, d, true))
	t.Run("Cluster", func(t *testing.T) {
		t.Run("LastMoveFollowed", func(t *testing.T) {
			// The Metrics group called 101 after the last move.
			followed(t, e.Transcript(), 101, "pve-2", "pve")
		})
		t.Run("OfflineNode", func(t *testing.T) { offlineChecks(t, e, d) })
		t.Run("ExecAcrossMigration", func(t *testing.T) { execAcrossMigration(t, e, d) })
		t.Run("TaskAfterOfflineMigration", func(t *testing.T) { taskAfterMove(t, e, d) })
	})
}

// TestConformanceClusterPlugin runs the suite on the cluster through the
// plugin boundary, on PVE 8.4, with the driver's own view lifetime.
func TestConformanceClusterPlugin(t *testing.T) {
	e := startCluster(t, pveemu.PVE84())
	d := launchPlugin(t, e.cfg)
	hypervisortest.Run(t, clusterHarness(e, d, false))
	t.Run("Cluster/OfflineNode", func(t *testing.T) { offlineChecks(t, e, d) })
}

// execAcrossMigration: a command started before VM 101 migrates is
// polled to its end on the node it moved to.
func execAcrossMigration(t *testing.T, e *testEmu, d hypervisor.Driver) {
	ctx := ctxT(t)
	h, err := d.ExecStart(ctx, "101", hypervisor.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 1; echo moved"}})
	if err != nil {
		t.Fatalf("ExecStart(101) = %v", err)
	}
	migrate(t, e, 101, "pve-2")
	var b hypervisor.Backoff
	for {
		st, err := d.ExecStatus(ctx, "101", h)
		if err != nil {
			t.Fatalf("ExecStatus(101) after the migration = %v", err)
		}
		if st.Exited {
			if st.ExitCode != 0 || string(st.Stdout) != "moved\n" {
				t.Errorf("ExecStatus(101) = exit %d, stdout %q; want 0, %q", st.ExitCode, st.Stdout, "moved\n")
			}
			return
		}
		if err := b.Sleep(ctx, time.Second); err != nil {
			t.Fatalf("waiting for the command: %v", err)
		}
	}
}

// taskAfterMove: VM 102 migrates offline (stopped) from pve-2 to pve; a
// start through the stale view runs a task on pve-2 that finds no config,
// and the driver starts it again on pve.
func taskAfterMove(t *testing.T, e *testEmu, d *Driver) {
	ctx := ctxT(t)
	if _, err := d.Status(ctx, "102"); err != nil { // the view knows 102 on pve-2
		t.Fatalf("Status(102) = %v", err)
	}
	migrate(t, e, 102, "pve")
	e.ResetTranscript()
	if err := d.Power(ctx, "102", hypervisor.PowerStart); err != nil {
		t.Fatalf("Power(102, start) after its migration = %v", err)
	}
	failed, again := false, false
	for _, x := range e.Transcript() {
		failed = failed || strings.Contains(x.Response, `"exitstatus":"Configuration file 'nodes/pve-2/qemu-server/102.conf' does not exist"`)
		again = again || (failed && strings.HasPrefix(x.Request, "POST /api2/json/nodes/pve/qemu/102/status/start"))
	}
	if !failed || !again {
		t.Errorf("Power(102, start) after its migration: a failed qmstart task on pve-2 %v, started again on pve %v; want both", failed, again)
	}
	if st, err := d.Status(ctx, "102"); err != nil || st.State != hypervisor.StateRunning {
		t.Errorf("Status(102) = %+v, %v; want running", st, err)
	}
}
