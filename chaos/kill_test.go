package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
)

// TestKill9 kills `vmgate serve` with SIGKILL at random points under load,
// restarts it on the same state, and checks across all rounds: the limits
// held (so no reservation was lost by a restart), the audit chain verifies
// (a torn last line is reported and the chain continues), a pending
// approval survives, and no child of the server outlives it.
func TestKill9(t *testing.T) {
	labtest.RequireQEMU(t)
	md := currentMode()
	binary(t)
	v1 := labtest.VM(t, vm1)
	token := newToken()
	s := writeConfig(t, configOpts{
		grants: []grantSpec{{name: "agent", token: token, policy: loadPolicy}},
		vms:    []*lab.VM{v1},
	})
	ctx := context.Background()

	// A pending approval made before the first kill.
	p, err := launchServe(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := newHTTPClient(p.url, token)
	if err := c.initialize(ctx); err != nil {
		t.Fatal(err)
	}
	// A session that exists: destroying one that does not is refused
	// before an operator is asked.
	cr, err := c.call(ctx, "create_session", map[string]any{"vm": "lab/" + vm1, "ttl_s": 600})
	var made struct {
		Session string `json:"session"`
	}
	if err != nil || cr.outcome() != "ok" || json.Unmarshal(cr.Result.Structured, &made) != nil || made.Session == "" {
		p.kill()
		t.Fatalf("create_session = %v, %v; want a session", cr.outcome(), err)
	}
	r, err := c.call(ctx, "destroy_session", map[string]any{"vm": "lab/" + vm1, "session": made.Session})
	if err != nil || r.outcome() != "[APPROVAL REQUIRED]" {
		p.kill()
		t.Fatalf("destroy_session = %v, %v; want [APPROVAL REQUIRED]", r.outcome(), err)
	}
	var parked struct {
		ApprovalID string `json:"approval_id"`
	}
	if err := json.Unmarshal(r.Result.Structured, &parked); err != nil || parked.ApprovalID == "" {
		p.kill()
		t.Fatalf("parked call's structuredContent %s has no approval_id (%v)", r.Result.Structured, err)
	}

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	orphansChecked, tornInjected := 0, false
	tl := newTally()
	for round := range md.kills {
		if round > 0 {
			if p, err = launchServe(s.cfg); err != nil {
				t.Fatalf("round %d: restart after kill -9: %v", round, err)
			}
		}
		lctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i := range md.clients / 2 {
			hc := newHTTPClient(p.url, token)
			if err := hc.initialize(ctx); err != nil {
				cancel()
				p.kill()
				t.Fatalf("round %d: %v", round, err)
			}
			wg.Go(func() { mix(lctx, hc, "lab/"+vm1, round*1000+i, tl) })
		}
		time.Sleep(time.Duration(300+rng.IntN(int(md.killEvery/time.Millisecond))) * time.Millisecond)
		kids := descendants(p.pid())
		p.kill() // SIGKILL by pid, and wait
		cancel()
		wg.Wait()
		// Pdeathsig: every child goes with the server.
		deadline := time.Now().Add(5 * time.Second)
		for _, k := range kids {
			for alive(k.pid) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if alive(k.pid) {
				t.Errorf("round %d: child %d (%s) of the killed server is still running", round, k.pid, k.cmdline)
			}
			if strings.Contains(k.cmdline, "qemu-system") {
				t.Errorf("round %d: the server had a qemu child %d: lab VMs belong to the test", round, k.pid)
			}
			orphansChecked++
		}
		if !alive(v1.PID) {
			t.Fatalf("round %d: the lab VM's QEMU (pid %d) died with the server", round, v1.PID)
		}
		if round == 0 {
			// A write torn by the crash: a record cut short without a newline.
			f, err := os.OpenFile(s.auditLog, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteString(`{"seq":999999,"prev_hash":"00","time":"2026-`)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			tornInjected = true
		}
	}

	// Last start: clean, then the checks.
	p, err = launchServe(s.cfg)
	if err != nil {
		t.Fatalf("start after the last kill: %v", err)
	}
	if !strings.Contains(strings.ToLower(p.stderr.String()), "torn") {
		t.Errorf("the restarts never reported a torn line; stderr of the last start:\n%s", tail(p.stderr.String(), 20))
	}
	out, err := runVMGate("approvals", "list", "--json", "--config", s.cfg)
	if err != nil {
		t.Errorf("vmgate approvals list: %v: %s", err, out)
	}
	var list []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Errorf("vmgate approvals list --json: %v: %.300s", err, out)
	}
	survived := false
	for _, a := range list {
		if strings.EqualFold(a.ID, parked.ApprovalID) && a.State == "pending" {
			survived = true
		}
	}
	if !survived {
		t.Errorf("approval %s is not pending after %d kills; approvals list: %s", parked.ApprovalID, md.kills, out)
	}
	if err := p.stop(); err != nil {
		t.Error(err)
	}

	recs, err := readLogs(s.auditLog)
	if err != nil {
		t.Fatal(err)
	}
	lim := checkLimits(recs)
	for _, v := range lim.violations {
		t.Errorf("limit broken across kill -9 and restart: %s", v)
	}
	vout, err := verifyLog(s.auditLog, "")
	if err != nil {
		t.Error(err)
	}
	if tornInjected && !strings.Contains(vout, "torn line") {
		t.Errorf("vmgate audit verify did not report the torn line: %s", vout)
	}
	pr := checkPairs(recs)
	if len(pr.orphans)+len(pr.dupes) > 0 {
		t.Errorf("outcomes without decisions %v, duplicate records %v", pr.orphans, pr.dupes)
	}
	t.Logf("%d rounds, clients saw %s (%d cut off by kills); %d reservations on %d keys, tightest margin %v; %d allowed calls lost their outcome to a crash (allowed)",
		md.kills, tl, tl.failed.Load(), lim.reservations, lim.keys, lim.tightest, len(pr.missing))
	report.add("kill -9", fmt.Sprintf("%d kills under %d clients, restart on the same state", md.kills, md.clients/2),
		fmt.Sprintf("limits held: %v, chain ok: %v, torn line reported: %v, approval survived: %v, children left: 0 of %d",
			len(lim.violations) == 0, err == nil, strings.Contains(vout, "torn line"), survived, orphansChecked))
}
