package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/guest/image"
	"github.com/vmgate/vmgate/guest/qga"
	"github.com/vmgate/vmgate/internal/lab"
)

// createPolicy allows what row 10 calls: vm_create with a lease, exec and
// vm_delete.
const createPolicy = `{"version":"1","default":"deny",
  "tools":{"list_vms":{},"vm_agent_exec":{},"vm_delete":{},
    "vm_create":{"limits":[{"counter":"vms","kind":"quota","max":4,"scope":"grant"}],"lease":{"default_ttl":"10m","max_ttl":"10m"}}}}`

// createMark marks the baseline's VMs (lab.Create's owner file).
const createMark = "Lbenchbaseline01"

// createRow measures row 10: the time from vm_create (MCP stdio, gate,
// lease and quota in the store, QEMU driver plugin booting the lab image
// on a fresh overlay, waiting for its agent) to the first successful exec
// in the new VM, against the same boot done by internal/lab directly
// (lab.Create, which also waits for the agent) and a raw guest-exec. Each
// side deletes its VM before the other runs. Without QEMU the row is
// skipped, unless VMGATE_REQUIRE_VM is set.
func createRow(ctx context.Context, vmgate string, warmup, pairs int) *Row {
	row := &Row{ID: "10", Unit: "s",
		What: "vm_create to first exec on the lab template (MCP stdio, gate, lease, QEMU plugin, TCG boot) / lab.Create to first raw guest-exec"}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		if os.Getenv("VMGATE_REQUIRE_VM") != "" {
			row.Err = fmt.Errorf("%w and VMGATE_REQUIRE_VM is set", errQEMUMissing)
		} else {
			row.Skip = errQEMUMissing.Error()
		}
		return row
	}
	l, err := startLab(ctx, vmgate, 1) // builds the image in the lab's state directory (one VM, unused)
	defer l.stopLogged()
	if err != nil {
		row.Err = err
		return row
	}
	cfg, err := l.writeCreateConfig()
	if err != nil {
		row.Err = err
		return row
	}
	row.Err = Interleave(ctx, row, warmup, pairs,
		func(ctx context.Context) (float64, error) { return l.viaVMGate(ctx, cfg) },
		func(ctx context.Context) (float64, error) { return l.viaLab(ctx) })
	return row
}

// writeCreateConfig writes a config whose backend "lab" makes VMs from
// template "lab" (the newest image in the state directory).
func (l *labEnv) writeCreateConfig() (string, error) {
	pol := filepath.Join(l.stateDir, "bench-create-policy.json")
	if err := os.WriteFile(pol, []byte(createPolicy), 0o600); err != nil {
		return "", err
	}
	cfg := "state_dir: " + strconv.Quote(l.stateDir) + "\n" +
		"audit: {fsync: always}\n" +
		"grants: [{name: local, policy: " + strconv.Quote(pol) + "}]\n" +
		"backends: [{name: lab, driver: qemu, settings: {lab: true}}]\n" +
		"templates: [{name: lab, backend: lab}]\n"
	p := filepath.Join(l.stateDir, "bench-create.yaml")
	return p, os.WriteFile(p, []byte(cfg), 0o600)
}

// viaVMGate times vm_create and the first exec in the VM, then deletes it.
func (l *labEnv) viaVMGate(ctx context.Context, cfg string) (float64, error) {
	p, err := l.serve(ctx, cfg)
	if err != nil {
		return 0, err
	}
	stopped := false
	defer func() {
		if !stopped {
			p.kill() // kill waits for the process: once, and not after stop
		}
	}()
	t0 := time.Now()
	res, err := p.client.callTool(ctx, "vm_create", `{"template":"lab"}`)
	if err != nil {
		return 0, err
	}
	var made struct {
		VM string `json:"vm"`
	}
	if err := json.Unmarshal(res.StructuredContent, &made); err != nil || made.VM == "" {
		return 0, fmt.Errorf("vm_create: no vm in %s (%v)", res.StructuredContent, err)
	}
	if _, err := p.client.callTool(ctx, "vm_agent_exec", `{"vm":`+strconv.Quote(made.VM)+`,"command":["/bin/true"]}`); err != nil {
		return 0, err
	}
	took := time.Since(t0)
	if _, err := p.client.callTool(ctx, "vm_delete", `{"vm":`+strconv.Quote(made.VM)+`}`); err != nil {
		return 0, err
	}
	stopped = true
	return took.Seconds(), p.stop()
}

// viaLab times lab.Create and a raw guest-exec, then removes the VM.
func (l *labEnv) viaLab(ctx context.Context) (float64, error) {
	img, err := image.Newest(l.stateDir) // the image vm_create boots (a nil Image would build one)
	if err != nil {
		return 0, err
	}
	name := "base" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	t0 := time.Now()
	vm, err := lab.Create(ctx, lab.Spec{Name: name, StateDir: l.stateDir, Image: &img}, createMark)
	if err != nil {
		return 0, err
	}
	defer lab.Remove(context.Background(), l.stateDir, name, createMark)
	c := qga.New(vm.QGASocket)
	defer c.Close()
	if _, err := rawExec(ctx, c, 0); err != nil {
		return 0, err
	}
	return time.Since(t0).Seconds(), nil
}
