package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/internal/lab/labtest"
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
	token := rand.Text() + rand.Text()
	if err := os.WriteFile(filepath.Join(dir, "undo.json"), []byte(undoPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(token))
	cfg := fmt.Sprintf(`state_dir: %q
audit:
  fsync: always
grants:
  - name: undo
    token_sha256: %s
    policy: undo.json
    vms: ["lab/*"]
backends:
  - name: lab
    driver: qemu
    settings:
      vms:
        - {name: %s, qmp: %q, qga: %q}
`, state, hex.EncodeToString(sum[:]), vmName, vm.QMPSocket, vm.QGASocket)
	cfgPath := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	url, stop := startHTTPServer(t, bin, cfgPath)
	env := append(os.Environ(), "VMGATE_BIN="+bin, "VMGATE_E2E_CONFIG="+cfgPath, "VMGATE_E2E_STATE="+state,
		"VMGATE_E2E_VM=lab/"+vmName, "VMGATE_E2E_URL="+url, "VMGATE_E2E_UNDO_TOKEN="+token)
	runNode(t, node, env, "undo.test.mjs")
	stop()
	verify := exec.Command(bin, "audit", "verify", filepath.Join(state, "audit.log"))
	if b, err := verify.CombinedOutput(); err != nil || !strings.HasPrefix(string(b), "ok") {
		t.Errorf("vmgate audit verify = %v, %q; want ok", err, b)
	}
}
