package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/lab"
	"github.com/vmgate/vmgate/internal/redistest"
	"github.com/vmgate/vmgate/internal/testload"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/server/operator"
)

// The failover case: three `vmgate serve` replicas on a Redis primary, its
// replica and three Sentinels. Agents call list_vms within one budget for
// the whole deployment; approval-gated agents call it through an
// operator's approvals; the primary is killed with SIGKILL halfway through
// the budget.

const (
	failoverAgentPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": { "limits": [ { "counter": "failover_fleet", "window": "10m", "max": %d, "scope": "global" } ] }
  }
}
`
	failoverGatedPolicy = `{
  "version": "1",
  "default": "deny",
  "tools": {
    "list_vms": { "action": "approve", "approval": { "channel": "operator", "ttl": "10m" } }
  }
}
`
	failoverPassword = "chaos-failover-pass"
	// Clients: agentClients limited ones and gatedClients approval-gated
	// ones, spread over the three replicas.
	agentClients = 24
	gatedClients = 8
	// refusalBackoff is how long a client waits after a refusal before it
	// calls again (clients back off; it keeps the refusals countable).
	refusalBackoff = 50 * time.Millisecond
	// approvalsBeforeKill: approvals flow before the primary is killed.
	approvalsBeforeKill = 5
	// refusedTag is the reply to a call the store could not decide.
	refusedTag = "[POLICY DENIED]"
	// maxCallTime: a call refused during the failover is answered within
	// it (the store's timeout is 1 s with the ack timeout below); longer
	// is a hang.
	maxCallTime = 5 * time.Second
)

// failoverRig is the deployment of the case.
type failoverRig struct {
	d                      *redistest.Deployment
	setups                 []setup
	procs                  []*serveProc
	agent, gated, operator string // tokens
	max                    int    // the agents' budget
}

// startFailoverRig starts the Redis deployment and three replicas whose
// agents share a budget of max calls.
func startFailoverRig(t *testing.T, max int) *failoverRig {
	t.Helper()
	rig := &failoverRig{agent: newToken(), gated: newToken(), operator: newToken(), max: max}
	rig.d = redistest.StartSentinel(t, redistest.SentinelOptions{Password: failoverPassword, DownAfter: time.Second, FailoverTimeout: 3 * time.Second})
	addrs, _ := json.Marshal(rig.d.SentinelAddrs())
	// The ack timeout is twice the default: on a test machine this loaded
	// a replica can be starved of the CPU for longer than 250 ms, and a
	// refusal before the kill would blur what the failover costs.
	sentinel := fmt.Sprintf("{master: %s, addrs: %s, password_file: redis.pass, ack_timeout_ms: 500}", redistest.MasterName, addrs)
	ghost := &lab.VM{Name: "ghost", QMPSocket: filepath.Join(t.TempDir(), "qmp.sock"), QGASocket: filepath.Join(t.TempDir(), "qga.sock")}
	prefix := "chaos-" + newToken()[:8] + ":"
	for i := range 3 {
		s := writeConfig(t, configOpts{
			store: "redis", sentinel: sentinel, prefix: prefix,
			grants: []grantSpec{
				{name: "agent", token: rig.agent, policy: fmt.Sprintf(failoverAgentPolicy, max)},
				{name: "gated", token: rig.gated, policy: failoverGatedPolicy},
			},
			vms: []*lab.VM{ghost}, metrics: true, replica: fmt.Sprintf("fo-%d", i), operatorToken: rig.operator,
		})
		// password_file is relative to vmgate.yaml.
		if err := os.WriteFile(filepath.Join(s.dir, "redis.pass"), []byte(failoverPassword+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		rig.setups = append(rig.setups, s)
	}
	var wg sync.WaitGroup
	procs := make([]*serveProc, 3)
	errs := make([]error, 3)
	for i, s := range rig.setups {
		wg.Go(func() { procs[i], errs[i] = launchServe(s.cfg) })
	}
	wg.Wait()
	for i, p := range procs {
		if p != nil {
			t.Cleanup(func() { p.kill() })
		}
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	rig.procs = procs
	return rig
}

// TestFailover: see the comment at the top of the file. Through the
// failover no call is allowed beyond the budget (the store waits for the
// replica: the bound is zero), no approval is used twice, every allowed
// call has its decision and outcome records, calls are refused at once
// during the election and allowed again after it. It also runs an approval
// across the replicas first: parked through one, listed with the CLI on
// another's socket and on /ui of the third, granted on /ui, consumed
// through the second.
func TestFailover(t *testing.T) {
	binary(t)
	max := 300
	if currentMode().name == "long" {
		max = 3000
	}
	start := time.Now()
	rig := startFailoverRig(t, max)
	ctx, cancel := testload.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := rig.approvalAcrossReplicas(ctx); err != nil {
		t.Fatal(err)
	}
	// That call ran on its approval: the logs hold one more than the load's.
	const usedBefore = 1
	fl := newFailoverLoad(rig)
	tl, err := fl.run(ctx, t)
	if err != nil {
		t.Error(err)
	}
	metrics := rig.scrapeMetrics(ctx)
	var wg sync.WaitGroup
	for _, p := range rig.procs {
		wg.Go(func() {
			if err := p.stop(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err != nil {
		return
	}
	rig.check(t, fl, tl, metrics, usedBefore)
	t.Logf("the case took %v (the build of vmgate aside)", time.Since(start))
}

// approvalAcrossReplicas: an approval parked through replica 0 is listed
// by the CLI on replica 1's socket and on /ui of replica 2, granted on
// /ui of replica 2 and consumed through replica 1; replica 0's CLI then
// shows it consumed, and the same call parks anew through replica 2.
func (rig *failoverRig) approvalAcrossReplicas(ctx context.Context) error {
	clients := make([]*httpClient, 3)
	for i, p := range rig.procs {
		clients[i] = newHTTPClient(p.url, rig.gated)
		if err := clients[i].initialize(ctx); err != nil {
			return err
		}
	}
	r, err := clients[0].call(ctx, "list_vms", map[string]any{})
	if err != nil {
		return err
	}
	id, err := approvalID(r)
	if err != nil {
		return fmt.Errorf("replica 0: %w", err)
	}
	if st, err := approvalState(rig.setups[1].cfg, id); err != nil || st != "pending" {
		return fmt.Errorf("vmgate approvals on replica 1's socket: %s is %q (%v); want pending", id, st, err)
	}
	ui, err := loginUI(ctx, strings.TrimSuffix(rig.procs[2].url, "/mcp"), rig.operator)
	if err != nil {
		return fmt.Errorf("replica 2 /ui: %w", err)
	}
	if err := ui.approve(ctx, id); err != nil {
		return fmt.Errorf("replica 2 /ui: %w", err)
	}
	if r, err = clients[1].call(ctx, "list_vms", map[string]any{}); err != nil || r.outcome() != "ok" {
		return fmt.Errorf("replica 1: the granted call = %s, %v (%.300s); want ok", r.outcome(), err, r.Body)
	}
	if st, err := approvalState(rig.setups[0].cfg, id); err != nil || st != "consumed" {
		return fmt.Errorf("vmgate approvals on replica 0's socket: %s is %q (%v); want consumed", id, st, err)
	}
	r, err = clients[2].call(ctx, "list_vms", map[string]any{})
	if err != nil {
		return err
	}
	if again, err := approvalID(r); err != nil || again == id {
		return fmt.Errorf("replica 2: the same call after its approval was used = %s (%v); want a new approval", again, err)
	}
	return nil
}

// approvalView is what `vmgate approvals list --json` prints of one.
type approvalView struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// listApprovals runs `vmgate approvals list --json` on cfg's socket.
func listApprovals(cfg string) ([]approvalView, error) {
	out, err := runVMGate("approvals", "list", "--json", "--config", cfg)
	if err != nil {
		return nil, fmt.Errorf("vmgate approvals list: %v: %s", err, tail(out, 5))
	}
	var list []approvalView
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("vmgate approvals list --json: %v: %.300s", err, out)
	}
	return list, nil
}

// approvalState is approval id's state as the CLI lists it on cfg's socket.
func approvalState(cfg, id string) (string, error) {
	list, err := listApprovals(cfg)
	if err != nil {
		return "", err
	}
	for _, a := range list {
		if a.ID == id {
			return a.State, nil
		}
	}
	return "", fmt.Errorf("%s is not listed", id)
}

// uiClient is an operator logged in to /ui.
type uiClient struct {
	base string
	hc   *http.Client
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// loginUI logs in to base/ui with the operator token.
func loginUI(ctx context.Context, base, token string) (*uiClient, error) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	u := &uiClient{base: base, hc: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
	page, err := u.get(ctx, "/ui/login")
	if err != nil {
		return nil, err
	}
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		return nil, fmt.Errorf("no CSRF field on the login page: %.300s", page)
	}
	page, err = u.post(ctx, "/ui/login", url.Values{"csrf": {m[1]}, "token": {token}})
	if err != nil {
		return nil, err
	}
	if strings.Contains(page, "not the operator token") {
		return nil, fmt.Errorf("the operator token was refused")
	}
	return u, nil
}

// approve finds approval id on the page and grants it there.
func (u *uiClient) approve(ctx context.Context, id string) error {
	page, err := u.get(ctx, "/ui/")
	if err != nil {
		return err
	}
	m := csrfField.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, id) {
		return fmt.Errorf("the page does not list approval %s: %.500s", id, page)
	}
	page, err = u.post(ctx, "/ui/decide", url.Values{"csrf": {m[1]}, "id": {id}, "action": {"approve"}, "reason": {"chaos failover"}})
	if err != nil {
		return err
	}
	if !strings.Contains(page, id+": granted") {
		return fmt.Errorf("granting %s on /ui: the page does not say granted: %.500s", id, page)
	}
	return nil
}

func (u *uiClient) get(ctx context.Context, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.base+path, nil)
	if err != nil {
		return "", err
	}
	return u.do(req)
}

func (u *uiClient) post(ctx context.Context, path string, form url.Values) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return u.do(req)
}

func (u *uiClient) do(req *http.Request) (string, error) {
	resp, err := u.hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s %s = %s: %.300s", req.Method, req.URL.Path, resp.Status, b)
	}
	return string(b), nil
}

// failoverLoad is the load of the case and what the clients saw.
type failoverLoad struct {
	rig  *failoverRig
	stop chan struct{}
	wg   sync.WaitGroup

	agentOK, gatedOK  atomic.Int64
	halfway           chan struct{} // closed when the agents used half their budget
	mu                sync.Mutex    // guards the fields below
	kill              time.Time     // when the primary was killed (zero before)
	flow              time.Time     // the first agent call allowed after the kill
	limitedAfterFlow  int           // agent calls refused as over the budget after flow
	gatedOKAfterKill  int
	refused           int // calls refused (store unavailable)
	refusedBeforeKill int
	maxRefusedTime    time.Duration
	slowest           time.Duration
	slowestOutcome    string
	operatorErrors    int
	outcomes          map[string]int // every reply by outcome
}

func newFailoverLoad(rig *failoverRig) *failoverLoad {
	return &failoverLoad{rig: rig, stop: make(chan struct{}), halfway: make(chan struct{}), outcomes: map[string]int{}}
}

func (fl *failoverLoad) stopped() bool {
	select {
	case <-fl.stop:
		return true
	default:
		return false
	}
}

// start runs the gated agents and the operator (agents: false), or the
// agents (true), until stop.
func (fl *failoverLoad) start(ctx context.Context, agents bool) {
	if !agents {
		fl.wg.Go(func() { fl.operate() })
	}
	for i := range agentClients + gatedClients {
		gated := i >= agentClients
		if gated == agents {
			continue
		}
		tok := fl.rig.agent
		if gated {
			tok = fl.rig.gated
		}
		c := newHTTPClient(fl.rig.procs[i%3].url, tok)
		fl.wg.Go(func() { fl.client(ctx, c, gated) })
	}
}

// client calls list_vms until stop, backing off after a refusal.
func (fl *failoverLoad) client(ctx context.Context, c *httpClient, gated bool) {
	for !fl.stopped() {
		if c.session == "" {
			if err := c.initialize(ctx); err != nil {
				fl.record(gated, reply{}, err, time.Now(), 0)
				time.Sleep(refusalBackoff)
				continue
			}
		}
		start := time.Now()
		r, err := c.call(ctx, "list_vms", map[string]any{})
		if out := fl.record(gated, r, err, start, time.Since(start)); out != "ok" {
			time.Sleep(refusalBackoff)
		}
	}
}

// record notes the reply to a call sent at start and returns its outcome.
func (fl *failoverLoad) record(gated bool, r reply, err error, start time.Time, took time.Duration) string {
	out := r.outcome()
	if err != nil {
		out = "transport: " + err.Error()
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.outcomes[out]++
	if took > fl.slowest {
		fl.slowest, fl.slowestOutcome = took, out
	}
	killed := !fl.kill.IsZero()
	sentAfterKill := killed && start.After(fl.kill)
	switch {
	case out == "ok" && gated:
		fl.gatedOK.Add(1)
		if sentAfterKill {
			fl.gatedOKAfterKill++
		}
	case out == "ok":
		if fl.agentOK.Add(1) == int64(fl.rig.max/2) {
			close(fl.halfway)
		}
		if sentAfterKill && fl.flow.IsZero() {
			fl.flow = time.Now()
		}
	case out == "[RATE LIMITED]" && !gated && !fl.flow.IsZero():
		fl.limitedAfterFlow++
	case out == refusedTag:
		fl.refused++
		fl.maxRefusedTime = max(fl.maxRefusedTime, took)
		if !killed {
			fl.refusedBeforeKill++
		}
	}
	return out
}

// operate grants every pending approval: listed through one replica's
// operator socket, granted through the next one's, round robin (the
// protocol `vmgate approvals` speaks, without a process per request);
// failures during the failover are counted and retried.
func (fl *failoverLoad) operate() {
	socks := make([]string, len(fl.rig.setups))
	for i, s := range fl.rig.setups {
		socks[i] = filepath.Join(s.state, operator.SocketName)
	}
	for i := 0; !fl.stopped(); i++ {
		err := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := operator.Call(ctx, socks[i%3], operator.Request{Op: operator.OpList})
			if err != nil {
				return err
			}
			for _, a := range resp.Approvals {
				if a.State != store.ApprovalPending {
					continue
				}
				if _, err := operator.Call(ctx, socks[(i+1)%3], operator.Request{Op: operator.OpGrant, ID: a.ID, Reason: "chaos failover"}); err != nil {
					return err
				}
			}
			return nil
		}()
		if err != nil {
			fl.mu.Lock()
			fl.operatorErrors++
			fl.mu.Unlock()
			time.Sleep(refusalBackoff)
		}
	}
}

// failoverTimes are the failover's moments, from the kill.
type failoverTimes struct {
	elected, replicaBack, flow time.Duration
}

// run starts the approvals flowing, then the agents; it waits for half
// the agents' budget, kills the primary, brings it back as a
// replica once Sentinel promoted the other, and waits until calls flow
// again: an agent call allowed, the budget then exhausted (every later
// agent call over it), an approval consumed. It stops the load.
func (fl *failoverLoad) run(ctx context.Context, t *testing.T) (failoverTimes, error) {
	var tl failoverTimes
	defer func() { close(fl.stop); fl.wg.Wait() }()
	fl.start(ctx, false)
	if err := until(60*time.Second, func() error {
		if g := fl.gatedOK.Load(); g < approvalsBeforeKill {
			return fmt.Errorf("%d of %d approvals consumed before the agents start", g, approvalsBeforeKill)
		}
		return nil
	}); err != nil {
		return tl, err
	}
	fl.start(ctx, true)
	select {
	case <-fl.halfway:
	case <-time.After(testload.Scale(60 * time.Second)):
		return tl, fmt.Errorf("%d of %d agent calls allowed before the kill after 60 s", fl.agentOK.Load(), fl.rig.max/2)
	}
	d := fl.rig.d
	old := d.Servers[0]
	fl.mu.Lock()
	old.Stop() // SIGKILL
	kill := time.Now()
	fl.kill = kill
	fl.mu.Unlock()
	primary, err := d.WaitFailover(old, 30*time.Second)
	if err != nil {
		return tl, err
	}
	tl.elected = time.Since(kill)
	if err := d.RestartAsReplica(old, primary, 30*time.Second); err != nil {
		return tl, err
	}
	tl.replicaBack = time.Since(kill)
	err = until(60*time.Second, func() error {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		if fl.flow.IsZero() || fl.limitedAfterFlow < agentClients || fl.gatedOKAfterKill == 0 {
			return fmt.Errorf("after the failover: first allowed call at %v, %d calls over the budget since, %d approvals consumed",
				fl.flow, fl.limitedAfterFlow, fl.gatedOKAfterKill)
		}
		tl.flow = fl.flow.Sub(kill)
		return nil
	})
	fl.mu.Lock()
	t.Logf("failover: elected after %v, replica back after %v, calls allowed again after %v; replies %v; operator errors %d", tl.elected, tl.replicaBack, tl.flow, fl.outcomes, fl.operatorErrors)
	fl.mu.Unlock()
	return tl, err
}

// check recomputes the promises from the three audit logs and the metrics.
func (rig *failoverRig) check(t *testing.T, fl *failoverLoad, tl failoverTimes, metrics []string, usedBefore int) {
	var logs []string
	for _, s := range rig.setups {
		logs = append(logs, s.auditLog)
	}
	recs, err := readLogs(logs...)
	if err != nil {
		t.Fatal(err)
	}
	lim := checkLimits(recs)
	allowed := 0
	for _, r := range recs {
		if r.Kind == audit.KindDecision && r.Grant == "agent" && r.Decision == "allow" {
			allowed++
		}
	}
	overshoot := max(allowed-rig.max, 0)
	if len(lim.violations) > 0 || overshoot > 0 {
		t.Errorf("the budget of %d was exceeded by %d: %v", rig.max, overshoot, lim.violations)
	}
	if n := fl.agentOK.Load(); int(n) != allowed {
		t.Errorf("agents saw %d calls allowed, the logs hold %d", n, allowed)
	}
	pairs := checkPairs(recs)
	if len(pairs.missing)+len(pairs.orphans)+len(pairs.dupes) > 0 {
		t.Errorf("records: %d allowed calls without an outcome %v, orphan outcomes %v, duplicates %v", len(pairs.missing), pairs.missing, pairs.orphans, pairs.dupes)
	}
	used, twice := approvalUses(recs)
	if len(twice) > 0 || int64(used) != fl.gatedOK.Load()+int64(usedBefore) {
		t.Errorf("approvals: %d consumed calls in the logs, %d seen by the clients (+%d before the load); used twice: %v", used, fl.gatedOK.Load(), usedBefore, twice)
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.refusedBeforeKill > 0 || fl.refused == 0 {
		var why []string
		for _, r := range recs {
			if r.Kind == audit.KindDecision && r.Decision == "error" && r.Time.Before(fl.kill) && len(why) < 3 {
				why = append(why, r.Reason)
			}
		}
		t.Errorf("%d calls refused before the kill, %d in all; want none before and some during the failover (%q)", fl.refusedBeforeKill, fl.refused, why)
	}
	if fl.slowest > maxCallTime || strings.HasPrefix(fl.slowestOutcome, "transport") {
		t.Errorf("the slowest call took %v (%s); want every call answered within %v", fl.slowest, fl.slowestOutcome, maxCallTime)
	}
	for _, l := range logs {
		if _, err := verifyLog(l, ""); err != nil {
			t.Error(err)
		}
	}
	for i, body := range metrics {
		// Every replica labels its series with its own name.
		if want := fmt.Sprintf(`replica="fo-%d"`, i); !strings.Contains(body, "vmgate_calls_total{") || !strings.Contains(body, want) {
			t.Errorf("replica %d's /metrics does not label its calls with %s: %.300s", i, want, body)
		}
	}
	report.add("failover", fmt.Sprintf("3 servers × %d clients (%d within %d/10 min, %d approval-gated), Redis primary + replica + 3 Sentinels, primary SIGKILLed at half the budget",
		agentClients+gatedClients, agentClients, rig.max, gatedClients),
		fmt.Sprintf("overshoot %d (bound 0), %d approvals consumed, none twice; %d calls refused during the failover (each within %v), new primary after %.1f s, old one back as replica after %.1f s, calls allowed again after %.1f s",
			overshoot, used, fl.refused, fl.maxRefusedTime.Round(time.Millisecond), tl.elected.Seconds(), tl.replicaBack.Seconds(), tl.flow.Seconds()))
}

// approvalUses counts the calls that ran on an approval (a decision record
// naming it, and an outcome) and lists the approvals that ran more than one.
func approvalUses(recs []audit.Record) (used int, twice []string) {
	ran := map[string]bool{}
	for _, r := range recs {
		if r.Kind == audit.KindOutcome {
			ran[r.CallID] = true
		}
	}
	per := map[string]int{}
	for _, r := range recs {
		if r.Kind == audit.KindDecision && r.ApprovalID != "" && ran[r.CallID] {
			used++
			if per[r.ApprovalID]++; per[r.ApprovalID] == 2 {
				twice = append(twice, r.ApprovalID)
			}
		}
	}
	return used, twice
}

// scrapeMetrics returns each replica's /metrics text (an error's text
// when a scrape fails).
func (rig *failoverRig) scrapeMetrics(ctx context.Context) []string {
	out := make([]string, len(rig.procs))
	for i, p := range rig.procs {
		out[i] = func() string {
			u, err := p.metricsURL()
			if err != nil {
				return err.Error()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if err != nil {
				return err.Error()
			}
			resp, err := scrapeClient.Do(req)
			if err != nil {
				return err.Error()
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				return err.Error()
			}
			return string(b)
		}()
	}
	return out
}
