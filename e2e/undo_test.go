package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/qmp"
	"github.com/vmgate/vmgate/internal/testload"
)

// undoPolicy is the policy of the grant "undo" (undo.test.mjs): an exec
// that runs rm -rf gets a snapshot first, snapshot_revert needs an
// operator, destroyed sessions keep their files for an hour.
const undoPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "vm_status": {},
    "vm_network": {},
    "vm_metrics": {},
    "snapshot_list": {},
    "snapshot_delete": {},
    "snapshot_revert": { "action": "approve", "approval": { "channel": "operator", "ttl": "10m" } },
    "vm_agent_exec": {
      "snapshot_before": { "retention": "1h", "if": [ { "path": "args.shell", "op": "contains", "value": "rm -rf" } ] }
    },
    "create_session": {},
    "destroy_session": { "keep_files": "1h" },
    "restore_session_files": {}
  }
}
`

// TestNodeSDKUndo runs undo.test.mjs against `vmgate serve --http` on the
// lab VM: snapshot_before and an approved revert, the session trash,
// vm_network and vm_metrics under load.
func TestNodeSDKUndo(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	dir := t.TempDir()
	bin := buildVMGate(t, dir)
	state := filepath.Join(dir, "state")
	cfgPath, token := bearerConfig(t, dir, "undo", undoPolicy, vm)
	url, stop := startHTTPServer(t, bin, cfgPath)
	env := append(os.Environ(), "VMGATE_BIN="+bin, "VMGATE_E2E_CONFIG="+cfgPath, "VMGATE_E2E_STATE="+state,
		"VMGATE_E2E_VM=lab/"+vmName, "VMGATE_E2E_URL="+url, "VMGATE_E2E_UNDO_TOKEN="+token)
	t.Cleanup(func() { dropUndoSnapshots(t, vm.QMPSocket) })
	runNode(t, node, env, "undo.test.mjs")
	stop()
	verify := exec.Command(bin, "audit", "verify", filepath.Join(state, "audit.log"))
	if b, err := verify.CombinedOutput(); err != nil || !strings.HasPrefix(string(b), "ok") {
		t.Errorf("vmgate audit verify = %v, %q; want ok", err, b)
	}
}

// alphaPolicy is grant alpha's (undo-grants.test.mjs): an exec that runs
// rm -rf gets an undo snapshot first.
const alphaPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "snapshot_list": {},
    "vm_agent_exec": {
      "snapshot_before": { "retention": "1h", "if": [ { "path": "args.shell", "op": "contains", "value": "rm -rf" } ] }
    }
  }
}
`

// betaPolicy is grant beta's: every snapshot tool, without approval, and
// exec (to plant files).
const betaPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "vm_agent_exec": {},
    "snapshot_list": {},
    "snapshot_create": {},
    "snapshot_revert": {},
    "snapshot_delete": {}
  }
}
`

// TestNodeSDKUndoTwoGrants runs undo-grants.test.mjs (issue 29, finding
// 4) against `vmgate serve --http` with grants alpha and beta on two lab
// VMs, restarting the server between its two phases: beta cannot delete,
// revert or re-create alpha's undo snapshot; the approval shows when the
// snapshot was taken and what call it undoes; after the restart, with the
// same snapshot name on both VMs, vmgate undo reverts the VM of the call
// only; a snapshot replaced behind vmgate's back (straight on QMP) is
// refused and nothing is reverted.
func TestNodeSDKUndoTwoGrants(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	twin := labtest.Start(t, lab.Spec{Name: "e2e-twin"})
	dir := t.TempDir()
	bin := buildVMGate(t, dir)
	state := filepath.Join(dir, "state")
	alpha, beta := rand.Text()+rand.Text(), rand.Text()+rand.Text()
	for name, doc := range map[string]string{"alpha.json": alphaPolicy, "beta.json": betaPolicy} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	hash := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	cfg := fmt.Sprintf(`state_dir: %q
audit:
  fsync: always
grants:
  - name: alpha
    token_sha256: %s
    policy: alpha.json
    vms: ["lab/*"]
  - name: beta
    token_sha256: %s
    policy: beta.json
    vms: ["lab/*"]
backends:
  - name: lab
    driver: qemu
    settings:
      vms:
        - {name: %s, qmp: %q, qga: %q}
        - {name: twin, qmp: %q, qga: %q}
`, state, hash(alpha), hash(beta), vmName, vm.QMPSocket, vm.QGASocket, twin.QMPSocket, twin.QGASocket)
	cfgPath := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dropUndoSnapshots(t, vm.QMPSocket)
		guestRun(t, vm, "/bin/sh", "-c", "rm -rf /data/undo-e2e /tmp/undo-ram /tmp/after-forge")
	})
	env := append(os.Environ(), "VMGATE_BIN="+bin, "VMGATE_E2E_CONFIG="+cfgPath, "VMGATE_E2E_STATE="+state,
		"VMGATE_E2E_VM=lab/"+vmName, "VMGATE_E2E_TWIN_VM=lab/twin", "VMGATE_E2E_VM_QMP="+vm.QMPSocket, "VMGATE_E2E_TWIN_QMP="+twin.QMPSocket,
		"VMGATE_E2E_ALPHA_TOKEN="+alpha, "VMGATE_E2E_BETA_TOKEN="+beta, "VMGATE_E2E_SHARED="+filepath.Join(dir, "shared.json"))
	for _, phase := range []string{"1", "2"} {
		url, stop := startHTTPServer(t, bin, cfgPath)
		runNode(t, node, append(env, "VMGATE_E2E_URL="+url, "VMGATE_E2E_PHASE="+phase), "undo-grants.test.mjs")
		stop()
	}
	verify := exec.Command(bin, "audit", "verify", filepath.Join(state, "audit.log"))
	if b, err := verify.CombinedOutput(); err != nil || !strings.HasPrefix(string(b), "ok") {
		t.Errorf("vmgate audit verify = %v, %q; want ok", err, b)
	}
}

// dropUndoSnapshots deletes the undo snapshots left on a lab VM (straight
// on QMP: no grant may), so that later tests find the disk as before.
func dropUndoSnapshots(t *testing.T, sock string) {
	ctx, cancel := testload.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	raw, err := qmp.Call(ctx, sock, "query-block", nil)
	if err != nil {
		t.Logf("cleanup: query-block: %v", err)
		return
	}
	var blocks []struct {
		Inserted *struct {
			Image struct {
				Snapshots []struct {
					Name string `json:"name"`
				} `json:"snapshots"`
			} `json:"image"`
		} `json:"inserted"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		t.Logf("cleanup: query-block: %v", err)
		return
	}
	seen := map[string]bool{}
	for _, b := range blocks {
		if b.Inserted == nil {
			continue
		}
		for _, sn := range b.Inserted.Image.Snapshots {
			if strings.HasPrefix(sn.Name, "vmgate-undo-") && !seen[sn.Name] {
				seen[sn.Name] = true
				if _, err := qmp.Call(ctx, sock, "human-monitor-command", map[string]any{"command-line": "delvm " + sn.Name}); err != nil {
					t.Logf("cleanup: delvm %s: %v", sn.Name, err)
				}
			}
		}
	}
}
