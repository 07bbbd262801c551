package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/lab/labtest"
	"github.com/vmgate/vmgate/internal/testload"
)

// loadPolicy lets every tool through with limits tight enough that the load
// hits them all the time: the campaign is about the limits holding.
const loadPolicy = `{
  "version": "1",
  "default": "deny",
  "all_tools": { "limits": [ { "counter": "all_calls", "window": "10s", "max": 300, "scope": "grant" } ] },
  "tools": {
    "list_vms": { "_why": "a window longer than any run: reached after 6 calls however slow the machine",
      "limits": [ { "counter": "lists", "window": "hour", "max": 6, "scope": "grant" } ] },
    "vm_status": { "limits": [ { "counter": "status", "window": "2s", "max": 20, "scope": ["grant", "vm"] } ] },
    "list_processes": { "limits": [ { "counter": "ps", "window": "5s", "max": 6, "scope": "vm" } ] },
    "list_sessions": {},
    "vm_agent_exec": {
      "deny_if": [ { "path": "args.shell", "op": "exists" } ],
      "limits": [ { "counter": "exec_per_vm", "window": "5s", "max": 12, "scope": ["grant", "vm"] } ]
    },
    "vm_agent_exec_status": {},
    "create_session": { "limits": [ { "counter": "sessions", "window": "minute", "max": 4, "scope": "grant" } ] },
    "kill_process": { "limits": [ { "counter": "kill_process_rate", "window": "3s", "max": 5, "scope": "grant" } ] },
    "destroy_session": { "action": "approve", "approval": { "channel": "operator", "ttl": "15m" } },
    "vm_file_read": { "limits": [ { "counter": "reads", "window": "1s", "max": 5, "scope": "global" } ] },
    "vm_file_write": {
      "require": [ { "path": "args.path", "op": "glob", "value": "/tmp/chaos-*" } ],
      "limits": [ { "counter": "writes", "window": "2s", "max": 4, "scope": "grant" } ]
    },
    "vm_power": { "action": "deny", "reason": "power is off limits in the chaos campaign" }
  }
}
`

// caller is what the mixer needs of a client: one tools/call.
type caller interface {
	call(ctx context.Context, tool string, args any) (reply, error)
}

// tally counts what the clients saw.
type tally struct {
	mu       sync.Mutex     // guards outcomes and errs
	outcomes map[string]int // reply.outcome() → count
	errs     []string       // transport errors (first few)
	answered atomic.Int64   // tools/calls that got a reply
	failed   atomic.Int64   // tools/calls that got none
}

func newTally() *tally { return &tally{outcomes: map[string]int{}} }

func (t *tally) add(r reply, err error) {
	if err != nil {
		t.failed.Add(1)
		t.mu.Lock()
		if len(t.errs) < 5 {
			t.errs = append(t.errs, err.Error())
		}
		t.mu.Unlock()
		return
	}
	t.answered.Add(1)
	t.mu.Lock()
	t.outcomes[r.outcome()]++
	t.mu.Unlock()
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.outcomes))
	for k := range t.outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, t.outcomes[k])
	}
	return strings.TrimSpace(b.String())
}

// rateLimited is how many of t's calls were refused on a limit.
func (t *tally) rateLimited() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.outcomes["[RATE LIMITED]"]
}

// loadCap bounds how long endLoad lets the load run past its duration
// while the limits have not been reached yet (a busy machine makes each
// call slower, so fewer calls fit in the duration).
const loadCap = 8

// endLoad cancels the load once it has run for d and every tally has seen
// a call refused on a limit (the campaign is about limits holding, so a
// load that reached none would prove nothing), or after loadCap × d.
func endLoad(ctx context.Context, cancel context.CancelFunc, d time.Duration, tallies ...*tally) {
	defer cancel()
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		elapsed := time.Since(start)
		if elapsed >= loadCap*d {
			return
		}
		if elapsed < d {
			continue
		}
		reached := true
		for _, t := range tallies {
			reached = reached && t.rateLimited() > 0
		}
		if reached {
			return
		}
	}
}

// mix issues random calls of every tool against vm until ctx ends.
func mix(ctx context.Context, c caller, vm string, worker int, tl *tally) {
	rng := rand.New(rand.NewPCG(uint64(worker), uint64(time.Now().UnixNano())))
	var session, execID string
	for ctx.Err() == nil {
		var tool string
		var args map[string]any
		switch n := rng.IntN(20); {
		case n < 2:
			tool, args = "list_vms", map[string]any{}
		case n < 4:
			tool, args = "vm_status", map[string]any{"vm": vm}
		case n < 5:
			tool, args = "list_processes", map[string]any{"vm": vm}
		case n < 6:
			tool, args = "list_sessions", map[string]any{"vm": vm}
		case n < 9:
			tool, args = "vm_agent_exec", map[string]any{"vm": vm, "command": []string{"echo", "chaos", fmt.Sprint(worker)}, "timeout_s": 20}
			if session != "" && rng.IntN(2) == 0 {
				args["session"] = session
			}
		case n < 10:
			tool, args = "vm_agent_exec", map[string]any{"vm": vm, "command": []string{"sleep", "1"}, "wait": false}
		case n < 11:
			if execID == "" {
				continue
			}
			tool, args = "vm_agent_exec_status", map[string]any{"vm": vm, "exec_id": execID}
		case n < 12:
			tool, args = "create_session", map[string]any{"vm": vm, "ttl_s": 120}
		case n < 13:
			// A pid no small guest has: an allowed call with nothing to kill.
			tool, args = "kill_process", map[string]any{"vm": vm, "pid": 4000000 + rng.IntN(100000), "signal": "TERM"}
		case n < 14:
			if session == "" {
				continue
			}
			tool, args = "destroy_session", map[string]any{"vm": vm, "session": session}
		case n < 16:
			tool, args = "vm_file_read", map[string]any{"vm": vm, "path": "/etc/hostname", "max_bytes": 256}
		case n < 18:
			tool, args = "vm_file_write", map[string]any{"vm": vm, "path": fmt.Sprintf("/tmp/chaos-%d", worker), "content": "load"}
		case n < 19:
			tool, args = "vm_file_write", map[string]any{"vm": vm, "path": "/etc/chaos", "content": "denied"}
		default:
			tool, args = "vm_power", map[string]any{"vm": vm, "action": "reboot"}
		}
		// A call once sent runs to its reply: the end of the run does not
		// cut it off, so every decision record has a client that saw it.
		cctx, cancel := testload.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		r, err := c.call(cctx, tool, args)
		cancel()
		tl.add(r, err)
		if err != nil || r.Result == nil || r.Result.IsError {
			continue
		}
		var sc struct {
			Session string `json:"session"`
			ExecID  string `json:"exec_id"`
		}
		_ = json.Unmarshal(r.Result.Structured, &sc)
		switch tool {
		case "create_session":
			if sc.Session != "" {
				session = sc.Session
			}
		case "vm_agent_exec":
			if sc.ExecID != "" {
				execID = sc.ExecID
			}
		}
	}
}

// stdioCaller runs calls over one stdio connection, matching replies by id.
type stdioCaller struct {
	c       *stdioClient
	mu      sync.Mutex // guards pending
	pending map[string]chan reply
}

func newStdioCaller(c *stdioClient) *stdioCaller {
	s := &stdioCaller{c: c, pending: map[string]chan reply{}}
	go func() {
		for l := range c.lines {
			r := reply{Body: l}
			if r.parseRPC(l) != nil {
				continue
			}
			s.mu.Lock()
			ch := s.pending[string(r.ID)]
			delete(s.pending, string(r.ID))
			s.mu.Unlock()
			if ch != nil {
				ch <- r
			}
		}
	}()
	return s
}

// forget drops the waiter of a call that ended without its reply.
func (s *stdioCaller) forget(key string) {
	s.mu.Lock()
	delete(s.pending, key)
	s.mu.Unlock()
}

func (s *stdioCaller) call(ctx context.Context, tool string, args any) (reply, error) {
	id := s.c.nextID.Add(1)
	body, err := callBody(id, tool, args)
	if err != nil {
		return reply{}, err
	}
	key := strconv.FormatInt(id, 10)
	ch := make(chan reply, 1)
	s.mu.Lock()
	s.pending[key] = ch
	s.mu.Unlock()
	if err := s.c.send(body); err != nil {
		s.forget(key)
		return reply{}, err
	}
	select {
	case r := <-ch:
		return r, nil
	case <-time.After(testload.Scale(2 * time.Minute)):
		s.forget(key)
		return reply{}, fmt.Errorf("chaos: stdio: no reply to %s within 2 min", tool)
	case <-ctx.Done():
		s.forget(key)
		return reply{}, ctx.Err()
	}
}

// TestLoad runs the mode's clients for its duration over HTTP (against
// vm1) and stdio (one client, another server, vm2), then checks the limits,
// the record pairs, the chain, and fd and goroutine growth of the HTTP
// server (goroutines read from its /metrics, served on a port of its own).
func TestLoad(t *testing.T) {
	labtest.RequireQEMU(t)
	md := currentMode()
	binary(t)
	v1, v2 := labtest.VM(t, vm1), labtest.VM(t, vm2)
	token := newToken()
	httpSetup := writeConfig(t, configOpts{
		grants:  []grantSpec{{name: "agent", token: token, policy: loadPolicy}},
		vms:     []*lab.VM{v1},
		metrics: true,
	})
	stdioSetup := writeConfig(t, configOpts{
		grants: []grantSpec{{name: "local", policy: loadPolicy}},
		vms:    []*lab.VM{v2},
	})
	srv := startServe(t, httpSetup.cfg)
	metricsURL, err := srv.metricsURL()
	if err != nil {
		t.Fatal(err)
	}
	sc, err := startStdio(vmgateBin, stdioSetup.cfg, "local")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.close(5 * time.Second) })
	if err := sc.initialize(); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	clients := make([]*httpClient, md.clients)
	for i := range clients {
		clients[i] = newHTTPClient(srv.url, token)
		if err := clients[i].initialize(ctx); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	// Warm up (first agent connection, helper push), then take the baseline.
	warm := newTally()
	for _, w := range []struct {
		tool string
		args map[string]any
	}{{"list_vms", map[string]any{}}, {"vm_status", map[string]any{"vm": "lab/" + vm1}}, {"list_processes", map[string]any{"vm": "lab/" + vm1}}} {
		r, err := clients[0].call(ctx, w.tool, w.args)
		warm.add(r, err)
	}
	if warm.failed.Load() != 0 {
		t.Fatalf("warm-up calls failed: %v", warm.errs)
	}
	fdBefore, err := fds(srv.pid())
	if err != nil {
		t.Fatal(err)
	}
	thrBefore, _ := threads(srv.pid())
	grBefore, err := sample(ctx, metricsURL, "go_goroutines")
	if err != nil {
		t.Fatal(err)
	}

	tl, stl := newTally(), newTally()
	lctx, cancel := context.WithCancel(ctx)
	go endLoad(lctx, cancel, md.load, tl, stl)
	loadStart := time.Now()
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() { mix(lctx, c, "lab/"+vm1, i, tl) })
	}
	scaller := newStdioCaller(sc)
	// Four mixers share the one stdio connection (replies matched by id), so
	// the stdio server sees calls in flight and its limits are reached.
	for i := range 4 {
		wg.Go(func() { mix(lctx, scaller, "lab/"+vm2, 1000+i, stl) })
	}
	wg.Wait()
	cancel()
	loadTook := time.Since(loadStart).Round(time.Second)
	t.Logf("http: %d answered, %d failed: %s", tl.answered.Load(), tl.failed.Load(), tl)
	t.Logf("stdio: %d answered, %d failed: %s", stl.answered.Load(), stl.failed.Load(), stl)
	if n := tl.failed.Load() + stl.failed.Load(); n != 0 {
		t.Errorf("%d calls got no reply; first errors: %v %v", n, tl.errs, stl.errs)
	}
	if tl.answered.Load() < int64(md.clients) {
		t.Errorf("only %d calls answered over HTTP by %d clients in %v", tl.answered.Load(), md.clients, loadTook)
	}

	// Let idle connections and finished calls go, then compare fds.
	for _, c := range clients {
		c.hc.CloseIdleConnections()
	}
	var fdAfter int
	for range 20 {
		time.Sleep(250 * time.Millisecond)
		if fdAfter, err = fds(srv.pid()); err != nil {
			t.Fatal(err)
		}
		if fdAfter <= fdBefore+fdTolerance {
			break
		}
	}
	thrAfter, _ := threads(srv.pid())
	// Goroutines: served connections, finished calls' watchdogs and timers
	// take a moment to go; poll for up to 10 s.
	var grAfter float64
	for range 40 {
		if grAfter, err = sample(ctx, metricsURL, "go_goroutines"); err != nil {
			t.Fatal(err)
		}
		if grAfter <= grBefore+goroutineTolerance {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if grAfter > grBefore+goroutineTolerance {
		t.Errorf("goroutines of vmgate serve: %v before the load, %v after 10 s to settle; want at most %d more", grBefore, grAfter, goroutineTolerance)
	}
	if fdAfter > fdBefore+fdTolerance {
		t.Errorf("open fds of vmgate serve: %d before the load, %d after; want at most %d more", fdBefore, fdAfter, fdTolerance)
	}
	t.Logf("fds %d → %d, goroutines %v → %v, threads %d → %d", fdBefore, fdAfter, grBefore, grAfter, thrBefore, thrAfter)

	if err := srv.stop(); err != nil {
		t.Fatal(err)
	}
	if err := sc.close(30 * time.Second); err != nil {
		t.Fatalf("stdio server: %v\n%s", err, tail(sc.stderr.String(), 30))
	}

	held, lost := true, 0
	for _, side := range []struct {
		name  string
		log   string
		tally *tally
		warm  int64
	}{{"http", httpSetup.auditLog, tl, warm.answered.Load()}, {"stdio", stdioSetup.auditLog, stl, 0}} {
		recs, err := readLogs(side.log)
		if err != nil {
			t.Fatal(err)
		}
		lim := checkLimits(recs)
		for _, v := range lim.violations {
			t.Errorf("%s: limit broken: %s", side.name, v)
		}
		held = held && len(lim.violations) == 0
		pr := checkPairs(recs)
		lost += len(pr.missing) + len(pr.orphans) + len(pr.dupes)
		if len(pr.missing) > 0 {
			t.Errorf("%s: %d allowed calls without an outcome record after a clean shutdown, e.g. %v", side.name, len(pr.missing), pr.missing[:min(3, len(pr.missing))])
		}
		if len(pr.orphans)+len(pr.dupes) > 0 {
			t.Errorf("%s: outcomes without decisions %v, duplicate records %v", side.name, pr.orphans, pr.dupes)
		}
		// One decision record per answered tools/call: none lost, none extra.
		dec := 0
		for _, n := range decisions(recs) {
			dec += n
		}
		if want := int(side.tally.answered.Load() + side.warm); dec != want {
			lost += abs(dec - want)
			t.Errorf("%s: %d decision records for %d answered tools/calls; want one each", side.name, dec, want)
		}
		for _, r := range recs {
			if r.Kind == "decision" && r.Decision == "invalid" {
				t.Errorf("%s: the mixer sent an invalid call: %s %v: %s", side.name, r.Tool, r.Args, r.Reason)
			}
		}
		if _, err := verifyLog(side.log, ""); err != nil {
			t.Error(err)
		}
		t.Logf("%s: %d counter keys, %d reservations, tightest window margin %v; decisions %v", side.name, lim.keys, lim.reservations, lim.tightest, decisions(recs))
		if lim.reservations == 0 || decisions(recs)["rate_limited"] == 0 {
			t.Errorf("%s: the load reserved %d counters and was rate limited %d times; want both > 0 (the limits were not exercised)", side.name, lim.reservations, decisions(recs)["rate_limited"])
		}
	}
	report.add("load", fmt.Sprintf("%d HTTP + 1 stdio client (4 callers) × %v, every tool", md.clients, loadTook),
		fmt.Sprintf("%d calls, limits held: %v, records lost: %d", tl.answered.Load()+stl.answered.Load(), held, lost))
	report.add("load", "fds, goroutines (go_goroutines on /metrics) and threads of vmgate serve, before → after",
		fmt.Sprintf("fds %d → %d, goroutines %v → %v (threads %d → %d)", fdBefore, fdAfter, grBefore, grAfter, thrBefore, thrAfter))
}

// fdTolerance is how many more fds the server may hold after the load
// than before: connections still closing, the agent reconnected, and the
// idle call-socket connections the server keeps to its one plugin (the
// pool is bounded; a leak grows past it).
const fdTolerance = 6 + hypervisor.MaxIdleCallConns

// goroutineTolerance is how many more goroutines the server may run after
// the load than before. Most fds the tolerance above allows for carry a
// goroutine or two (a served connection has its reader; a reconnected
// guest agent channel its reader and keepalive); an idle call-socket
// connection carries none (its caller reads it); the scrape's own
// goroutines are there in both samples. 10 covers those. A leak of one goroutine
// per call (or per connection) grows by hundreds in the short run alone.
const goroutineTolerance = 10

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
