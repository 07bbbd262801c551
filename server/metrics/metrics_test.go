package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest/fleet"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/bolt"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// fakeAuditor is an Auditor made of function fields.
type fakeAuditor struct {
	AppendFunc     func(ctx context.Context, rec audit.Record) (uint64, error)
	AppendLazyFunc func(ctx context.Context, rec audit.Record) error
}

func (f *fakeAuditor) Append(ctx context.Context, rec audit.Record) (uint64, error) {
	return f.AppendFunc(ctx, rec)
}
func (f *fakeAuditor) AppendLazy(ctx context.Context, rec audit.Record) error {
	return f.AppendLazyFunc(ctx, rec)
}

func okAuditor() *fakeAuditor {
	return &fakeAuditor{
		AppendFunc:     func(context.Context, audit.Record) (uint64, error) { return 1, nil },
		AppendLazyFunc: func(context.Context, audit.Record) error { return nil },
	}
}

// restartingDriver is a Fake with a restart count.
type restartingDriver struct {
	*hypervisortest.Fake
	n int64
}

func (r *restartingDriver) Restarts() int64 { return r.n }

// scrape returns the exposition text of m.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rr := httptest.NewRecorder()
	m.Handler().ServeHTTP(rr, httptest.NewRequest("GET", "/metrics", nil))
	if rr.Code != 200 {
		t.Fatalf("GET /metrics = %d; want 200", rr.Code)
	}
	b, _ := io.ReadAll(rr.Body)
	return string(b)
}

// value finds the sample line name{labels} and returns its value text.
func value(text, series string) string {
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

func newMetrics(t *testing.T, o Options) *Metrics {
	t.Helper()
	if o.Tools == nil {
		o.Tools = []string{"list_vms", "destroy_session"}
	}
	if o.Grants == nil {
		o.Grants = []string{"local"}
	}
	m, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

func TestCallsByToolDecisionGrant(t *testing.T) {
	m := newMetrics(t, Options{})
	a := m.Auditor(okAuditor())
	ctx := context.Background()
	tests := []struct {
		name   string
		lazy   bool
		rec    audit.Record
		series string
	}{
		{"allowed", false, audit.Record{Kind: audit.KindDecision, Tool: "list_vms", Grant: "local", Decision: "allow"},
			`vmgate_calls_total{decision="allow",grant="local",tool="list_vms"}`},
		{"parked", true, audit.Record{Kind: audit.KindDecision, Tool: "destroy_session", Grant: "local", Decision: "approve"},
			`vmgate_calls_total{decision="approval_required",grant="local",tool="destroy_session"}`},
		{"approved", false, audit.Record{Kind: audit.KindDecision, Tool: "destroy_session", Grant: "local", Decision: "approve"},
			`vmgate_calls_total{decision="approved",grant="local",tool="destroy_session"}`},
		{"rate limited", true, audit.Record{Kind: audit.KindDecision, Tool: "list_vms", Grant: "local", Decision: "rate_limited"},
			`vmgate_calls_total{decision="rate_limited",grant="local",tool="list_vms"}`},
		{"made-up tool", true, audit.Record{Kind: audit.KindDecision, Tool: "rm_rf_everything", Grant: "local", Decision: "invalid"},
			`vmgate_calls_total{decision="invalid",grant="local",tool="other"}`},
		{"unknown grant and decision", true, audit.Record{Kind: audit.KindDecision, Tool: "list_vms", Grant: "mallory", Decision: "weird"},
			`vmgate_calls_total{decision="other",grant="other",tool="list_vms"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := value(scrape(t, m), tt.series)
			var err error
			if tt.lazy {
				err = a.AppendLazy(ctx, tt.rec)
			} else {
				_, err = a.Append(ctx, tt.rec)
			}
			if err != nil {
				t.Fatalf("append: %v", err)
			}
			after := value(scrape(t, m), tt.series)
			if before != "0" || after != "1" {
				t.Errorf("%s = %q then %q; want 0 then 1", tt.series, before, after)
			}
		})
	}
	if n := strings.Count(scrape(t, m), "rm_rf_everything"); n != 0 {
		t.Errorf("made-up tool name appears %d times in the exposition; want 0", n)
	}
}

func TestOutcomesAndDurations(t *testing.T) {
	m := newMetrics(t, Options{})
	a := m.Auditor(okAuditor())
	for _, ms := range []float64{2, 3000} {
		if err := a.AppendLazy(context.Background(), audit.Record{Kind: audit.KindOutcome, Tool: "list_vms", Outcome: "ok", DurationMS: ms}); err != nil {
			t.Fatal(err)
		}
	}
	text := scrape(t, m)
	for series, want := range map[string]string{
		`vmgate_call_outcomes_total{outcome="ok",tool="list_vms"}`:         "2",
		`vmgate_call_duration_seconds_count{tool="list_vms"}`:              "2",
		`vmgate_call_duration_seconds_bucket{tool="list_vms",le="0.0025"}`: "1",
		`vmgate_call_duration_seconds_bucket{tool="list_vms",le="+Inf"}`:   "2",
		`vmgate_call_duration_seconds_sum{tool="list_vms"}`:                "3.002",
		`vmgate_call_outcomes_total{outcome="timed_out",tool="list_vms"}`:  "0",
		`vmgate_call_duration_seconds_count{tool="destroy_session"}`:       "0",
		`vmgate_decision_commit_seconds_count`:                             "0",
	} {
		if got := value(text, series); got != want {
			t.Errorf("%s = %q; want %q", series, got, want)
		}
	}
}

func TestAuditAndStoreErrors(t *testing.T) {
	m := newMetrics(t, Options{})
	boom := errors.New("disk full")
	a := m.Auditor(&fakeAuditor{
		AppendFunc:     func(context.Context, audit.Record) (uint64, error) { return 0, boom },
		AppendLazyFunc: func(context.Context, audit.Record) error { return boom },
	})
	ctx := context.Background()
	if _, err := a.Append(ctx, audit.Record{Kind: audit.KindDecision, Tool: "list_vms", Grant: "local", Decision: "allow"}); !errors.Is(err, boom) {
		t.Errorf("Append = %v; want the wrapped log's error", err)
	}
	if err := a.AppendLazy(ctx, audit.Record{Kind: audit.KindOutcome, Tool: "list_vms", Outcome: "ok"}); !errors.Is(err, boom) {
		t.Errorf("AppendLazy = %v; want the wrapped log's error", err)
	}
	s := m.Store(memory.New())
	c := []policy.Counter{{Key: "k", Name: "k", Window: time.Minute, Max: 1}}
	now := time.Now()
	if err := s.ReserveAll(ctx, "a", now, c); err != nil {
		t.Fatal(err)
	}
	var le *store.LimitedError
	if err := s.ReserveAll(ctx, "b", now, c); !errors.As(err, &le) {
		t.Fatalf("ReserveAll over the limit = %v; want a *LimitedError", err)
	}
	if _, err := s.DecideApproval(ctx, "nope", true, "op", "", now); !errors.Is(err, store.ErrUnknownApproval) {
		t.Fatalf("DecideApproval(unknown) = %v; want ErrUnknownApproval", err)
	}
	text := scrape(t, m)
	for series, want := range map[string]string{
		`vmgate_audit_errors_total{kind="decision"}`:                         "1",
		`vmgate_audit_errors_total{kind="outcome"}`:                          "1",
		`vmgate_store_errors_total{op="reserve"}`:                            "0", // a full counter is a verdict
		`vmgate_store_errors_total{op="decide_approval"}`:                    "0", // an unknown id is the caller's
		`vmgate_calls_total{decision="allow",grant="local",tool="list_vms"}`: "0",
	} {
		if got := value(text, series); got != want {
			t.Errorf("%s = %q; want %q", series, got, want)
		}
	}
	failing := m.Store(&failingStore{err: fmt.Errorf("redis: %w", store.ErrUnavailable)})
	if err := failing.ReserveAll(ctx, "c", now, c); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ReserveAll = %v; want ErrUnavailable", err)
	}
	if got := value(scrape(t, m), `vmgate_store_errors_total{op="reserve"}`); got != "1" {
		t.Errorf(`vmgate_store_errors_total{op="reserve"} = %q after an unavailable store; want 1`, got)
	}
}

// failingStore is a store.Store whose every method fails with err.
type failingStore struct {
	store.Store
	err error
}

func (f *failingStore) ReserveAll(context.Context, string, time.Time, []policy.Counter) error {
	return f.err
}

func TestScrapeTimeGauges(t *testing.T) {
	drv := &restartingDriver{Fake: &hypervisortest.Fake{
		ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
			return []hypervisor.VM{{Name: "a", State: hypervisor.StateRunning}, {Name: "b", State: hypervisor.StateRunning},
				{Name: "c", State: hypervisor.StateStopped}, {Name: "d", State: "exploded"}}, nil
		},
	}, n: 3}
	broken := &hypervisortest.Fake{} // ListVMs fails: not supported
	pending, dropped := 0, uint64(0)
	m := newMetrics(t, Options{
		Backends:             []Backend{{Name: "lab", Driver: drv}, {Name: "pve", Driver: broken}},
		PendingApprovals:     func(context.Context) (int, error) { return pending, nil },
		NotificationsDropped: func() uint64 { return dropped },
	})
	text := scrape(t, m)
	for series, want := range map[string]string{
		`vmgate_vms{backend="lab",state="running"}`:   "2",
		`vmgate_vms{backend="lab",state="stopped"}`:   "1",
		`vmgate_vms{backend="lab",state="unknown"}`:   "1",
		`vmgate_vms{backend="lab",state="paused"}`:    "0",
		`vmgate_plugin_restarts_total{backend="lab"}`: "3",
		`vmgate_scrape_errors{source="backend/pve"}`:  "1",
		`vmgate_pending_approvals`:                    "0",
		`vmgate_notifications_dropped_total`:          "0",
	} {
		if got := value(text, series); got != want {
			t.Errorf("%s = %q; want %q", series, got, want)
		}
	}
	pending, drv.n, dropped = 2, 4, 7
	text = scrape(t, m)
	if got := value(text, "vmgate_notifications_dropped_total"); got != "7" {
		t.Errorf("vmgate_notifications_dropped_total = %q after 7 drops; want 7", got)
	}
	if got := value(text, "vmgate_pending_approvals"); got != "2" {
		t.Errorf("vmgate_pending_approvals = %q after two parked calls; want 2", got)
	}
	if got := value(text, `vmgate_plugin_restarts_total{backend="lab"}`); got != "4" {
		t.Errorf("vmgate_plugin_restarts_total = %q after a restart; want 4", got)
	}
}

// number parses the value of series in text as a float.
func number(t *testing.T, text, series string) float64 {
	t.Helper()
	v := value(text, series)
	if v == "" {
		t.Fatalf("%s is not on /metrics", series)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s = %q: %v", series, v, err)
	}
	return f
}

// TestRuntimeMetrics checks that the private registry carries the Go
// runtime and process collectors, and that go_goroutines follows the
// process: parked goroutines show up, and go once released.
func TestRuntimeMetrics(t *testing.T) {
	m := newMetrics(t, Options{})
	before := number(t, scrape(t, m), "go_goroutines")
	if before <= 0 {
		t.Fatalf("go_goroutines = %v; want > 0", before)
	}
	const parked = 50
	release := make(chan struct{})
	var started, done sync.WaitGroup
	for range parked {
		started.Add(1)
		done.Go(func() {
			started.Done()
			<-release
		})
	}
	started.Wait()
	// Other goroutines of the test binary come and go meanwhile, so compare
	// the scraped value with the runtime's own count around the same scrape
	// (the scrape itself adds a few).
	lo := runtime.NumGoroutine()
	during := number(t, scrape(t, m), "go_goroutines")
	hi := runtime.NumGoroutine()
	close(release)
	done.Wait()
	const slack = 5
	if during < float64(parked) || during < float64(min(lo, hi)-slack) || during > float64(max(lo, hi)+slack) {
		t.Errorf("go_goroutines = %v with %d parked goroutines; want about the runtime's count %d..%d", during, parked, lo, hi)
	}
	text := scrape(t, m)
	for _, series := range []string{"go_threads", "go_goroutines"} {
		if got := number(t, text, series); got <= 0 {
			t.Errorf("%s = %v; want > 0", series, got)
		}
	}
	if runtime.GOOS == "linux" {
		for _, series := range []string{"process_open_fds", "process_resident_memory_bytes", "process_start_time_seconds"} {
			if got := number(t, text, series); got <= 0 {
				t.Errorf("%s = %v; want > 0", series, got)
			}
		}
	}
}

func TestNewRejectsBadBackends(t *testing.T) {
	tests := []struct {
		name string
		b    Backend
	}{
		{"no name", Backend{Driver: &hypervisortest.Fake{}}},
		{"no driver", Backend{Name: "lab"}},
	}
	for _, tt := range tests {
		if _, err := New(Options{Backends: []Backend{tt.b}}); err == nil {
			t.Errorf("New(%s) = nil error; want one", tt.name)
		}
	}
}

// BenchmarkAppend compares a decision record appended through the
// counting wrapper with the bare log (a no-op here), so the ratio is the
// cost of counting on the gate's path. Run with -benchmem: both must show
// 0 allocs/op.
func BenchmarkAppend(b *testing.B) {
	m, err := New(Options{Tools: []string{"list_vms"}, Grants: []string{"local"}})
	if err != nil {
		b.Fatal(err)
	}
	rec := audit.Record{Kind: audit.KindDecision, Tool: "list_vms", Grant: "local", Decision: "allow"}
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		a    Auditor
	}{{"bare", okAuditor()}, {"counted", m.Auditor(okAuditor())}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.a.Append(ctx, rec)
				bc.a.AppendLazy(ctx, rec)
			}
		})
	}
}

// TestStoreKeepsSessions: wrapping a store that keeps sessions keeps them
// (the server otherwise falls back to memory and forgets them at restart);
// a store without sessions does not gain the interface.
func TestStoreKeepsSessions(t *testing.T) {
	m := newMetrics(t, Options{})
	ctx := context.Background()
	// What vmgate serve runs with store: bolt: counters in memory, approvals
	// and sessions in bbolt.
	db, err := bolt.Open(filepath.Join(t.TempDir(), "store.db"), bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := memory.NewSplit(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	ss, ok := m.Store(inner).(store.Sessions)
	if !ok {
		t.Fatalf("Store(memory store).(store.Sessions) = false; want the sessions carried over")
	}
	now := time.Now()
	if err := ss.CreateSession(ctx, store.Session{ID: "0123456789abcdef", Grant: "local", VM: "lab/vm1", Created: now}); err != nil {
		t.Fatalf("CreateSession through the wrapper: %v", err)
	}
	got, err := inner.GetSession(ctx, "0123456789abcdef")
	if err != nil || got.Grant != "local" {
		t.Errorf("inner GetSession = %+v, %v; want the session created through the wrapper", got, err)
	}
	if _, err := ss.GetSession(ctx, "nope"); !errors.Is(err, store.ErrUnknownSession) {
		t.Errorf("GetSession(unknown) = %v; want ErrUnknownSession", err)
	}
	type approvalsOnly struct{ store.Store }
	if _, ok := m.Store(approvalsOnly{inner}).(store.Sessions); ok {
		t.Errorf("Store(store without sessions).(store.Sessions) = true; want false")
	}
}

// failingSessions is a store that keeps sessions, every session method
// failing with err.
type failingSessions struct {
	failingStore
}

func (f *failingSessions) CreateSession(context.Context, store.Session) error { return f.err }
func (f *failingSessions) GetSession(context.Context, string) (store.Session, error) {
	return store.Session{}, f.err
}
func (f *failingSessions) ListSessions(context.Context, string, string) ([]store.Session, error) {
	return nil, f.err
}
func (f *failingSessions) TouchSession(context.Context, string, time.Time) error { return f.err }
func (f *failingSessions) DeleteSession(context.Context, string, time.Time) (store.Session, error) {
	return store.Session{}, f.err
}

// TestSessionStoreErrors: a failing session operation is counted under its
// own op (and does not panic for want of a series).
func TestSessionStoreErrors(t *testing.T) {
	m := newMetrics(t, Options{})
	ctx := context.Background()
	now := time.Now()
	inner := &failingSessions{failingStore{err: fmt.Errorf("bolt: %w", store.ErrUnavailable)}}
	ss, ok := m.Store(inner).(store.Sessions)
	if !ok {
		t.Fatalf("Store(session store).(store.Sessions) = false; want true")
	}
	tests := []struct {
		op  string
		run func() error
	}{
		{"create_session", func() error { return ss.CreateSession(ctx, store.Session{ID: "0123456789abcdef"}) }},
		{"get_session", func() error { _, err := ss.GetSession(ctx, "0123456789abcdef"); return err }},
		{"list_sessions", func() error { _, err := ss.ListSessions(ctx, "", ""); return err }},
		{"touch_session", func() error { return ss.TouchSession(ctx, "0123456789abcdef", now) }},
		{"delete_session", func() error { _, err := ss.DeleteSession(ctx, "0123456789abcdef", now); return err }},
	}
	for _, tt := range tests {
		if err := tt.run(); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s = %v; want ErrUnavailable", tt.op, err)
		}
	}
	text := scrape(t, m)
	for _, tt := range tests {
		series := `vmgate_store_errors_total{op="` + tt.op + `"}`
		if got := value(text, series); got != "1" {
			t.Errorf("%s = %q; want 1", series, got)
		}
	}
}

// TestReplicaLabel: with Options.Replica every sample line carries the
// constant label replica (one value: no series added); without it none does.
func TestReplicaLabel(t *testing.T) {
	for _, replica := range []string{"gate-2", ""} {
		m := newMetrics(t, Options{Replica: replica, PendingApprovals: func(context.Context) (int, error) { return 1, nil }})
		if _, err := m.Auditor(okAuditor()).Append(context.Background(), audit.Record{Kind: audit.KindDecision, Tool: "list_vms", Grant: "local", Decision: "allow"}); err != nil {
			t.Fatal(err)
		}
		text := scrape(t, m)
		lines, labelled := 0, 0
		for line := range strings.SplitSeq(text, "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			lines++
			if strings.Contains(line, `replica="gate-2"`) {
				labelled++
			}
		}
		want := 0
		if replica != "" {
			want = lines
		}
		if lines == 0 || labelled != want {
			t.Errorf("Replica %q: %d of %d sample lines carry replica=\"gate-2\"; want %d", replica, labelled, lines, want)
		}
		if replica != "" && value(text, `vmgate_calls_total{decision="allow",grant="local",replica="gate-2",tool="list_vms"}`) != "1" {
			t.Errorf("the allowed call is not counted under its replica label:\n%s", text)
		}
	}
}

// fleetBackends are backends fleet drivers (fleet.Fleet) with n
// VMs in all; vm00002 of the first is stopped.
func fleetBackends(t *testing.T, backends, n int) []Backend {
	t.Helper()
	var out []Backend
	for i := range backends {
		f, err := fleet.New(context.Background(), &fleet.Settings{VMs: n / backends})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := f.Power(context.Background(), "vm00002", hypervisor.PowerStop); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, Backend{Name: fmt.Sprintf("pve%d", i), Driver: f})
	}
	return out
}

// vmgateSeries counts the vmgate_ sample lines of text whose name starts
// with prefix.
func vmgateSeries(text, prefix string) int {
	n := 0
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			n++
		}
	}
	return n
}

// TestCardinalityBounded: the series do not grow with the fleet (12 VMs
// or 1,000 over 4 backends give as many vmgate_ series, none with a VM's
// name) unless PerVMLabels asks for one series per VM, which then are
// exactly the VMs listed, with their states.
func TestCardinalityBounded(t *testing.T) {
	count := func(n int, perVM bool) (series, perVMSeries int, text string) {
		m := newMetrics(t, Options{Backends: fleetBackends(t, 4, n), PerVMLabels: perVM})
		text = scrape(t, m)
		return vmgateSeries(text, "vmgate_"), vmgateSeries(text, "vmgate_vm_state{"), text
	}
	small, _, _ := count(12, false)
	big, _, text := count(1000, false)
	if small != big || strings.Contains(text, `vm="`) {
		t.Errorf("vmgate_ series with 12 VMs, 1,000 VMs = %d, %d (a vm label: %v); want the same, none", small, big, strings.Contains(text, `vm="`))
	}
	if got := value(text, `vmgate_vms{backend="pve0",state="stopped"}`); got != "1" {
		t.Errorf(`vmgate_vms{backend="pve0",state="stopped"} = %q; want 1`, got)
	}
	withVMs, perVM, text := count(1000, true)
	if perVM != 1000 || withVMs != big+1000 {
		t.Errorf("with PerVMLabels: %d vmgate_ series, %d vmgate_vm_state; want %d and 1000", withVMs, perVM, big+1000)
	}
	for series, want := range map[string]string{
		`vmgate_vm_state{backend="pve0",state="stopped",vm="vm00002"}`: "1",
		`vmgate_vm_state{backend="pve3",state="running",vm="vm00250"}`: "1",
		`vmgate_vm_state{backend="pve0",state="running",vm="vm00002"}`: "",
	} {
		if got := value(text, series); got != want {
			t.Errorf("%s = %q; want %q", series, got, want)
		}
	}
}

// TestPerVMStateOfOddStates: a VM in a state outside States is counted,
// and labelled, as unknown.
func TestPerVMStateOfOddStates(t *testing.T) {
	odd := &hypervisortest.Fake{ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
		return []hypervisor.VM{{Name: "x", State: "hibernating"}}, nil
	}}
	text := scrape(t, newMetrics(t, Options{Backends: []Backend{{Name: "lab", Driver: odd}}, PerVMLabels: true}))
	for _, series := range []string{`vmgate_vms{backend="lab",state="unknown"}`, `vmgate_vm_state{backend="lab",state="unknown",vm="x"}`} {
		if got := value(text, series); got != "1" {
			t.Errorf("%s = %q; want 1", series, got)
		}
	}
}
