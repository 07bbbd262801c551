package pveemu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// realDir holds real Proxmox VE answers from public material (see its README).
const realDir = "../../testdata/proxmox"

func readReal(t *testing.T, name string) (string, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(realDir, name))
	if err != nil {
		t.Fatal(err)
	}
	line, body, _ := bytes.Cut(raw, []byte("\n"))
	return string(line), body
}

// TestRealAnswers: the emulator answers what real servers answered in the
// same situation, byte for byte where the version matches.
func TestRealAnswers(t *testing.T) {
	// A VM whose agent is enabled but not running, on PVE 9.0.
	_, c := emu(t, PVE90(), allVMPrivs(PVE90()), VMSpec{VMID: 198, Node: "pve", Running: true})
	line, body := readReal(t, "agent-not-running.response")
	r := c.do("GET", "/nodes/pve/qemu/198/agent/network-get-interfaces", nil)
	if got := fmt.Sprintf("%d %s", r.code, r.reason); got != line || r.raw != string(body) {
		t.Errorf("agent/network-get-interfaces = %s %s; want the real %s %s", got, r.raw, line, body)
	}
	// exec-status without pid (the real answer is from PVE 7, before the
	// body's message): same status line and errors.
	line, body = readReal(t, "exec-status-no-pid.response")
	r = c.do("GET", "/nodes/pve/qemu/198/agent/exec-status", nil)
	var real struct{ Errors map[string]string }
	json.Unmarshal(body, &real)
	if got := fmt.Sprintf("%d %s", r.code, r.reason); got != line || fmt.Sprint(r.body.Errors) != fmt.Sprint(real.Errors) {
		t.Errorf("agent/exec-status without pid = %s %v; want the real %s %v", got, r.body.Errors, line, real.Errors)
	}
}

// TestRealUPIDs: the emulator's UPID pattern takes what pve-common's own
// tests decode and refuses the rest.
func TestRealUPIDs(t *testing.T) {
	for file, valid := range map[string]bool{"upids.valid": true, "upids.invalid": false} {
		raw, err := os.ReadFile(filepath.Join(realDir, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, upid := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			if got := upidRE.MatchString(upid); got != valid {
				t.Errorf("upidRE.MatchString(%q) = %v; want %v", upid, got, valid)
			}
		}
	}
}

// TestRealCluster: the emulator's cluster/resources entries have the
// fields real ones have, a VM on a node long offline is what a real
// server listed, and a forward to an offline node fails as a real
// pveproxy's does.
func TestRealCluster(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(realDir, "cluster-resources.json"))
	if err != nil {
		t.Fatal(err)
	}
	var real struct{ Data []map[string]any }
	if err := json.Unmarshal(raw, &real); err != nil {
		t.Fatal(err)
	}
	realKeys := map[string]string{}
	for _, x := range real.Data {
		delete(x, "tags") // only for tagged VMs
		realKeys[fmt.Sprint(x["type"])] = keys(x)
	}
	e := Start(t, Options{Version: PVE92(), Nodes: threeNodes})
	e.AddToken(Token{ID: tokID, Secret: tokSecret, ACL: []ACL{{Path: "/vms", Privs: []string{"VM.Audit"}, Propagate: true},
		{Path: "/nodes", Privs: []string{"Sys.Audit"}, Propagate: true}}})
	e.AddVM(VMSpec{VMID: 100, Node: "pve-2", Name: "server1", Running: true})
	e.AddVM(VMSpec{VMID: 1002, Node: "pve-3", Running: true})
	c := newClient(t, e, tokenAuth(tokID, tokSecret))
	_, byID := c.entries("")
	for typ, id := range map[string]string{"qemu": "qemu/100", "node": "node/pve"} {
		if got := keys(byID[id]); got != realKeys[typ] {
			t.Errorf("%s entry has %s; a real one has %s", typ, got, realKeys[typ])
		}
	}

	raw, err = os.ReadFile(filepath.Join(realDir, "cluster-resources-offline-vm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var offline struct{ Data []map[string]any }
	if err := json.Unmarshal(raw, &offline); err != nil {
		t.Fatal(err)
	}
	e.SetNodeOnline("pve-3", false)
	e.advance(rrdExpire + statInterval)
	_, byID = c.entries("vm")
	if got, want := keys(byID["qemu/1002"]), keys(offline.Data[0]); got != want || byID["qemu/1002"]["status"] != offline.Data[0]["status"] {
		t.Errorf("VM on a node offline for five minutes = %v; a real one is %v", byID["qemu/1002"], offline.Data[0])
	}

	line, body := readReal(t, "proxy-no-route.response")
	r := c.do("GET", "/nodes/pve-3/qemu/1002/status/current", nil)
	if got := fmt.Sprintf("%d %s", r.code, r.reason); got != line || r.raw != string(body) {
		t.Errorf("a request for an offline node = %s %q; want the real %s %q", got, r.raw, line, body)
	}
}
