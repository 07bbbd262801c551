package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// residentPolicy is the grant "resident" (resident.test.mjs): sessions,
// commands in them and plain ones, and a timeout cap of its own (60 s)
// above the server's (limits.max_timeout_s: 4 in its config).
const residentPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "vm_status": {},
    "create_session": {},
    "list_sessions": {},
    "destroy_session": {},
    "vm_agent_exec": { "max_timeout_s": 60 },
    "vm_agent_exec_status": {}
  }
}
`

// TestNodeSDKResident runs resident.test.mjs (the official SDK over
// stdio) on the lab VM through the resident helper on its virtio-serial
// port: a sandboxed session's command streams its output through
// vm_agent_exec_status while it runs, past the server's timeout cap (the
// grant's policy allows more) and across a restart of the server; the
// helper killed from the host side (a plain command through the guest
// agent, by pid) comes back with the session, noticed through QEMU's
// VSERPORT_CHANGE on the events monitor (the silence limit is an hour, so
// a driver that waited it out would fail the call); the session's processes
// cannot open the helper's port or socket, signal it or replace its
// binary (checked from outside).
func TestNodeSDKResident(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	if vm.HelperSocket == "" || vm.EventsSocket == "" {
		t.Fatalf("lab VM %s has no resident helper port (%q) or no events monitor (%q)", vmName, vm.HelperSocket, vm.EventsSocket)
	}
	dir := t.TempDir()
	bin := buildVMGate(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "resident.json"), []byte(residentPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	cfg := fmt.Sprintf("state_dir: %q\nlimits:\n  max_timeout_s: 4\ngrants:\n  - name: resident\n    policy: resident.json\n    vms: [\"lab/*\"]\nbackends:\n  - name: lab\n    driver: qemu\n    settings:\n      helper_silence_limit: 1h\n      vms:\n        - {name: %s, qmp: %q, qga: %q, helper: %q, events: %q}\n",
		state, vmName, vm.QMPSocket, vm.QGASocket, vm.HelperSocket, vm.EventsSocket)
	cfgPath := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	runNode(t, node, append(os.Environ(), "VMGATE_BIN="+bin, "VMGATE_E2E_CONFIG="+cfgPath, "VMGATE_E2E_STATE="+state, "VMGATE_E2E_VM=lab/"+vmName), "resident.test.mjs")
}
