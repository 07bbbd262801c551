package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/internal/testload"
)

// replicaPolicy: one budget of 10 calls a minute for the whole deployment.
const replicaPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": { "limits": [ { "counter": "fleet", "window": "minute", "max": 10, "scope": "global" } ] }
  }
}
`

// TestReplicas runs three `vmgate serve` processes on one Redis store and
// one policy (10 calls a minute, global): together they allow exactly 10,
// counted from the three audit logs and by the clients.
func TestReplicas(t *testing.T) {
	binary(t)
	addr, _, _ := redistest.Start(t)
	md := currentMode()
	// The VM behind the backend does not need to exist: list_vms answers
	// without it, and three servers do not compete for one guest agent.
	ghost := &lab.VM{Name: "ghost", QMPSocket: filepath.Join(t.TempDir(), "qmp.sock"), QGASocket: filepath.Join(t.TempDir(), "qga.sock")}
	token := newToken()
	prefix := "chaos-" + newToken()[:8] + ":"
	var logs []string
	var procs []*serveProc
	for range 3 {
		s := writeConfig(t, configOpts{
			store: "redis", redisURL: "redis://" + addr, prefix: prefix,
			grants: []grantSpec{{name: "agent", token: token, policy: replicaPolicy}},
			vms:    []*lab.VM{ghost},
		})
		logs = append(logs, s.auditLog)
		procs = append(procs, startServe(t, s.cfg))
	}
	ctx, cancel := testload.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	tl := newTally()
	var wg sync.WaitGroup
	start := time.Now()
	for _, p := range procs {
		for range md.replicaCli {
			c := newHTTPClient(p.url, token)
			if err := c.initialize(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				for range 10 {
					tl.add(c.call(ctx, "list_vms", map[string]any{}))
				}
			})
		}
	}
	wg.Wait()
	if el := time.Since(start); el > 50*time.Second {
		t.Fatalf("the replica calls took %v; the check needs them inside one minute", el)
	}
	for _, p := range procs {
		if err := p.stop(); err != nil {
			t.Error(err)
		}
	}
	recs, err := readLogs(logs...)
	if err != nil {
		t.Fatal(err)
	}
	allowed := decisions(recs)["allow"]
	lim := checkLimits(recs)
	tl.mu.Lock()
	ok := tl.outcomes["ok"]
	tl.mu.Unlock()
	if allowed != 10 || lim.reservations != 10 || ok != 10 {
		t.Errorf("3 replicas allowed %d calls (%d reservations in the logs, clients saw %d ok); want exactly 10 (%s)", allowed, lim.reservations, ok, tl)
	}
	if n := tl.failed.Load(); n != 0 {
		t.Errorf("%d calls got no reply: %v", n, tl.errs)
	}
	for _, l := range logs {
		if _, err := verifyLog(l, ""); err != nil {
			t.Error(err)
		}
	}
	report.add("replicas", fmt.Sprintf("3 servers × %d clients × 10 calls, one Redis, limit 10/min", md.replicaCli),
		fmt.Sprintf("allowed %d (want 10), %s", allowed, tl))
}
