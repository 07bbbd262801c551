package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/policy/store/redis"
)

// quotaPolicy: at most 3 VMs alive on the whole deployment, leases of
// ttl (whole seconds).
func quotaPolicy(ttl time.Duration) string {
	return strings.ReplaceAll(quotaPolicyText, "TTL", fmt.Sprintf("%ds", int(ttl.Seconds())))
}

const quotaPolicyText = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": {},
    "vm_create": {
      "limits": [ { "counter": "fleet_vms", "kind": "quota", "max": 3, "scope": "global" } ],
      "lease": { "default_ttl": "TTL", "max_ttl": "TTL" }
    },
    "vm_delete": {}
  }
}
`

// TestVMQuotaReplicas: 8 concurrent vm_create calls on two replicas that
// share Redis and a lab directory create exactly 3 VMs (the quota); both
// replicas are then killed with SIGKILL while the VMs are leased, one is
// restarted, and its reaper deletes the VMs when their leases end: no QEMU
// process, no VM directory, no lease is left.
func TestVMQuotaReplicas(t *testing.T) {
	labtest.RequireQEMU(t)
	binary(t)
	img := labtest.Image(t)
	addr, _, _ := redistest.Start(t)
	labDir := filepath.Join(t.TempDir(), "lab")
	t.Cleanup(func() { killQEMUUnder(t, labDir) })
	// Configured VMs are not needed: a ghost keeps the backend's vms list
	// like the other cases'.
	ghost := &lab.VM{Name: "ghost", QMPSocket: filepath.Join(t.TempDir(), "qmp.sock"), QGASocket: filepath.Join(t.TempDir(), "qga.sock")}
	templates := fmt.Sprintf("templates:\n  - name: lab\n    backend: lab\n    source: {image: %q}\n    memory_mb: {default: 128}\n", img.Dir)
	token, prefix := newToken(), "chaos-"+newToken()[:8]+":"
	// The leases must outlast the creates and both kills (a lease starts
	// when its VM has booted; the boots run together), and the test then
	// waits for them to end: 45 s on an idle machine plus 15 s per unit of
	// load factor above 1 (CI: the whole test took 127 s with 90 s leases;
	// at load 12 on two cores, leases scaled in full, 45 s × 6, made it
	// 364 s).
	policy := quotaPolicy(30*time.Second + time.Duration(testload.Factor()*float64(15*time.Second)))
	var cfgs []setup
	var procs []*serveProc
	for range 2 {
		s := writeConfig(t, configOpts{
			store: "redis", redisURL: "redis://" + addr, prefix: prefix,
			grants: []grantSpec{{name: "agent", token: token, policy: policy}},
			vms:    []*lab.VM{ghost}, labDir: labDir, templates: templates,
		})
		cfgs = append(cfgs, s)
		procs = append(procs, startServe(t, s.cfg))
	}
	ctx, cancel := testload.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var mu sync.Mutex
	outcomes := map[string]int{}
	var made []string
	var wg sync.WaitGroup
	for i := range 8 {
		c := newHTTPClient(procs[i%2].url, token)
		if err := c.initialize(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			r, err := c.call(ctx, "vm_create", map[string]any{"template": "lab", "name": fmt.Sprintf("q%d", i)})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				outcomes["error: "+err.Error()]++
				return
			}
			outcomes[r.outcome()]++
			if r.outcome() == "ok" {
				made = append(made, fmt.Sprintf("q%d", i))
			}
		})
	}
	wg.Wait()
	if outcomes["ok"] != 3 || outcomes["[QUOTA EXCEEDED]"] != 5 {
		t.Fatalf("8 concurrent vm_create against a quota of 3 on 2 replicas: %v; want 3 ok, 5 [QUOTA EXCEEDED]", outcomes)
	}
	if procs := qemuUnderDir(labDir); len(procs) != 3 {
		t.Errorf("QEMU processes in the lab directory = %d; want the 3 created VMs", len(procs))
	}
	// kill -9 while the VMs are leased; the VMs outlive their servers.
	for _, p := range procs {
		p.kill()
	}
	if procs := qemuUnderDir(labDir); len(procs) != 3 {
		t.Fatalf("QEMU processes after kill -9 of both servers = %d; want 3 (the VMs outlive them)", len(procs))
	}
	p := startServe(t, cfgs[1].cfg)
	defer p.stop()
	st, err := redis.Open("redis://"+addr, redis.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// The reaper deletes a lease's record after its VM is gone: wait for
	// both, VMs and records.
	err = until(5*time.Minute, func() error {
		if procs := qemuUnderDir(labDir); len(procs) != 0 {
			return fmt.Errorf("%d QEMU processes still run", len(procs))
		}
		if ents, _ := os.ReadDir(labDir); len(ents) != 0 {
			return fmt.Errorf("%d VM directories left", len(ents))
		}
		if leases, err := st.ListLeases(ctx); err != nil || len(leases) != 0 {
			return fmt.Errorf("leases left in Redis = %+v, %v; want none", leases, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("after the restart the leases' end should delete %v and their records: %v", made, err)
	}
	report.add("vm quota", "8 concurrent vm_create, 2 replicas on Redis, quota 3; kill -9 both, restart one",
		fmt.Sprintf("created %d (want 3), all deleted at lease end after the restart", outcomes["ok"]))
}

// qemuUnderDir lists the pids of QEMU processes whose command line names dir.
func qemuUnderDir(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), "qemu-system") && strings.Contains(string(cmd), dir+"/") {
			out = append(out, e.Name())
		}
	}
	return out
}

// killQEMUUnder kills, by pid, the QEMU of any VM a failed run left in dir.
func killQEMUUnder(t *testing.T, dir string) {
	for _, pid := range qemuUnderDir(dir) {
		var n int
		if _, err := fmt.Sscan(pid, &n); err != nil {
			continue
		}
		if p, err := os.FindProcess(n); err == nil && !errors.Is(p.Kill(), os.ErrProcessDone) {
			t.Logf("killed leftover QEMU %d", n)
		}
	}
}
