package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/libvirttest"
	"github.com/vmgate/vmgate/policy/store/bolt"
)

// lifecyclePolicy is the policy of TestNodeSDKLifecycle: the built-in
// policy's quota of 2 VMs per grant, list_vms, exec and vm_delete.
const lifecyclePolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "vm_agent_exec": {},
    "vm_create": {
      "limits": [
        { "counter": "vms_per_grant", "kind": "quota", "max": 2, "scope": "grant" },
        { "counter": "vm_memory_per_grant", "kind": "quota", "max": 2048, "scope": "grant", "weight": "args.memory_mb" }
      ],
      "lease": { "default_ttl": "10m", "max_ttl": "1h" }
    },
    "vm_delete": {}
  }
}
`

// TestNodeSDKLifecycle runs lifecycle.test.mjs against a server whose lab
// backend makes VMs from template "lab" (the lab image, a fresh overlay
// each), then checks that nothing is left: no VM directory (overlay,
// sockets), no QEMU process of the lab, no lease in the store.
func TestNodeSDKLifecycle(t *testing.T) {
	labtest.RequireQEMU(t)
	node := requireNode(t)
	vm := labtest.VM(t, vmName)
	img := labtest.Image(t)
	bin, state, cfgPath := lifecycleSetup(t, fmt.Sprintf(`backends:
  - name: lab
    driver: qemu
    settings:
      lab: true
      vms:
        - {name: %s, qmp: %q, qga: %q}
templates:
  - name: lab
    backend: lab
    source: {image: %q}
    memory_mb: {default: 256, min: 128, max: 512}
`, vmName, vm.QMPSocket, vm.QGASocket, img.Dir))
	labDir := filepath.Join(state, "lab")
	t.Cleanup(func() { stopLeftovers(t, labDir) })
	env := append(os.Environ(),
		"VMGATE_BIN="+bin,
		"VMGATE_E2E_CONFIG="+cfgPath,
		"VMGATE_E2E_STATE="+state,
		"VMGATE_E2E_VM=lab/"+vmName,
		"VMGATE_E2E_TEMPLATE=lab",
		"VMGATE_E2E_HOSTNAMES=1",
	)
	runNode(t, node, env, "lifecycle.test.mjs")

	// Nothing left: no VM directory, no QEMU of the lab, no lease.
	if ents, err := os.ReadDir(labDir); err != nil || len(ents) != 0 {
		names := []string{}
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("lab directory after the scenario: %v, %v; want it empty (no overlay, no socket)", names, err)
	}
	if procs := qemuUnder(labDir); len(procs) != 0 {
		t.Errorf("QEMU processes of the lab directory after the scenario: %v; want none", procs)
	}
	noLeases(t, state)
}

// lifecycleSetup builds vmgate and writes lifecyclePolicy and a config of
// grant "local" (stdio) with backendsAndTemplates (YAML); it returns the
// binary, the state directory and the config file.
func lifecycleSetup(t *testing.T, backendsAndTemplates string) (bin, state, cfgPath string) {
	t.Helper()
	dir := t.TempDir()
	bin = buildVMGate(t, dir)
	state = filepath.Join(dir, "state")
	if err := os.WriteFile(filepath.Join(dir, "policy.json"), []byte(lifecyclePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("state_dir: %q\naudit:\n  fsync: always\ngrants:\n  - name: local\n    policy: policy.json\n", state) + backendsAndTemplates
	cfgPath = filepath.Join(dir, "vmgate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return bin, state, cfgPath
}

// noLeases checks that the bbolt store in state holds no lease.
func noLeases(t *testing.T, state string) {
	t.Helper()
	st, err := bolt.Open(filepath.Join(state, "store.db"), bolt.Options{})
	if err != nil {
		t.Fatalf("open the store: %v", err)
	}
	defer st.Close()
	if leases, err := st.ListLeases(context.Background()); err != nil || len(leases) != 0 {
		t.Errorf("leases after the scenario = %+v, %v; want none", leases, err)
	}
}

// qemuUnder lists the pids of QEMU processes whose command line names dir.
func qemuUnder(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(cmd), "qemu-system") && strings.Contains(string(cmd), dir+"/") {
			out = append(out, e.Name())
		}
	}
	return out
}

// stopLeftovers kills, by pid, the QEMU of any VM a failed scenario left
// in dir (a passing one leaves none).
func stopLeftovers(t *testing.T, dir string) {
	for _, pid := range qemuUnder(dir) {
		var n int
		if _, err := fmt.Sscan(pid, &n); err == nil {
			if p, err := os.FindProcess(n); err == nil {
				t.Logf("killing leftover QEMU %d", n)
				p.Kill()
			}
		}
	}
}

// libvirtTemplate is the shut-off domain TestNodeSDKLifecycleLibvirt clones,
// and libvirtLabTemplate the vmgate template that clones it: the clones'
// names start with it, and domain names must differ between test runs
// (libvirttest.Name).
var (
	libvirtTemplate    = libvirttest.Name("vmgate-e2e-tmpl")
	libvirtLabTemplate = libvirttest.Name("lab")
)

// TestNodeSDKLifecycleLibvirt runs lifecycle.test.mjs through the libvirt
// driver on a real libvirtd (internal/libvirttest): template "lab-<run>" clones
// a shut-off domain onto transient overlays of its disk. Afterwards only
// the template domain is left, with no overlay next to its disk, and the
// store holds no lease.
func TestNodeSDKLifecycleLibvirt(t *testing.T) {
	labtest.RequireQEMU(t)
	libvirttest.Require(t)
	node := requireNode(t)
	env := libvirttest.Env(t)
	t.Cleanup(func() {
		if err := libvirttest.Stop(); err != nil {
			t.Errorf("stop libvirtd: %v", err)
		}
	})
	img := labtest.Image(t)
	ctx, cancel := context.WithTimeout(context.Background(), libvirttest.BootTimeout)
	defer cancel()
	spec := libvirttest.Spec{Name: libvirtTemplate, Persistent: true, DefineOnly: true, Disk: true, NIC: true}
	if _, err := env.Boot(ctx, spec, img.Kernel, img.Initrd); err != nil {
		t.Fatalf("define the template domain: %v", err)
	}
	bin, state, cfgPath := lifecycleSetup(t, fmt.Sprintf(`backends:
  - name: virt
    driver: libvirt
    settings: {uri: %q}
templates:
  - name: %s
    backend: virt
    source: {domain: %s}
    memory_mb: {default: 192, min: 128, max: 512}
`, env.URI(), libvirtLabTemplate, libvirtTemplate))
	runNode(t, node, append(os.Environ(),
		"VMGATE_BIN="+bin,
		"VMGATE_E2E_CONFIG="+cfgPath,
		"VMGATE_E2E_STATE="+state,
		"VMGATE_E2E_VM=virt/"+libvirtTemplate,
		"VMGATE_E2E_TEMPLATE="+libvirtLabTemplate,
		"VMGATE_E2E_BACKEND=virt",
	), "lifecycle.test.mjs")

	out, err := exec.Command("virsh", "-c", env.URI(), "list", "--all", "--name").CombinedOutput()
	if err != nil {
		t.Fatalf("virsh list: %v: %s", err, out)
	}
	if got := strings.Fields(string(out)); len(got) != 1 || got[0] != libvirtTemplate {
		t.Errorf("domains after the scenario = %v; want only the template %s", got, libvirtTemplate)
	}
	ents, err := os.ReadDir(filepath.Join(env.Dir, "domains", libvirtTemplate))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.Contains(e.Name(), "TRANSIENT") {
			t.Errorf("overlay %s left next to the template's disk", e.Name())
		}
	}
	noLeases(t, state)
}
