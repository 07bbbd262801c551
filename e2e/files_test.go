package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// filesPolicy is the grant "files": both file tools limited to
// /tmp/vmgate-e2e-files/* by a glob, no symlink followed (the defaults).
const filesPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "vm_file_read": { "require": [ { "path": "args.path", "op": "glob", "value": "/tmp/vmgate-e2e-files/*" } ] },
    "vm_file_write": { "require": [ { "path": "args.path", "op": "glob", "value": "/tmp/vmgate-e2e-files/*" } ] }
  }
}
`

// followPolicy is the grant "follow": the same glob, and reads follow
// symlinks, so the policy decides again on the real path.
const followPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "vm_file_read": {
      "require": [ { "path": "args.path", "op": "glob", "value": "/tmp/vmgate-e2e-files/*" } ],
      "files": { "follow_symlinks": true }
    }
  }
}
`

// filesFixture plants the directory files.test.mjs works in and prints the
// hashes of the files the links point at.
const filesFixture = `set -e
D=/tmp/vmgate-e2e-files
rm -rf $D /root/vmgate-e2e-secret
mkdir -p $D
printf 'root only' > /root/vmgate-e2e-secret && chmod 0600 /root/vmgate-e2e-secret
printf plain > $D/plain
ln -s /root/vmgate-e2e-secret $D/link
ln -s /etc/passwd $D/passwd
ln -s $D/plain $D/inside
head -c 16777216 /dev/urandom > $D/big
sha256sum /etc/passwd /root/vmgate-e2e-secret`

// filesAfter is what the guest must show after files.test.mjs: the link
// targets as before, the link still a link, the new files' modes.
const filesAfter = `D=/tmp/vmgate-e2e-files
sha256sum /etc/passwd /root/vmgate-e2e-secret
test -L $D/passwd && echo passwd is a link
cd $D && stat -c '%n %a' new-default new-0600 && cat new-default && echo
test -e $D/new-setuid || echo no new-setuid`

// TestNodeSDKFiles runs files.test.mjs (the official MCP SDK over stdio)
// against symlinks out of the allowed directory, then checks the guest.
func TestNodeSDKFiles(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	dir := t.TempDir()
	bin := buildVMGate(t, dir)
	for name, doc := range map[string]string{"files.json": filesPolicy, "follow.json": followPolicy} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	state := filepath.Join(dir, "state")
	cfg := fmt.Sprintf(`state_dir: %q
grants:
  - name: files
    policy: files.json
    vms: ["lab/*"]
  - name: follow
    policy: follow.json
    vms: ["lab/*"]
backends:
  - name: lab
    driver: qemu
    settings:
      vms:
        - {name: %s, qmp: %q, qga: %q}
`, state, vmName, vm.QMPSocket, vm.QGASocket)
	cfgPath := filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	before := guestRun(t, vm, "/bin/sh", "-c", filesFixture)
	defer guestRun(t, vm, "/bin/sh", "-c", "rm -rf /tmp/vmgate-e2e-files /root/vmgate-e2e-secret")

	runNode(t, node, append(os.Environ(), "VMGATE_BIN="+bin, "VMGATE_E2E_CONFIG="+cfgPath, "VMGATE_E2E_STATE="+state, "VMGATE_E2E_VM=lab/"+vmName), "files.test.mjs")

	got := guestRun(t, vm, "/bin/sh", "-c", filesAfter)
	want := before + "passwd is a link\nnew-default 644\nnew-0600 600\nmade by e2e\nno new-setuid\n"
	if got != want {
		t.Errorf("guest after files.test.mjs:\n%s\nwant:\n%s", got, want)
	}
}
