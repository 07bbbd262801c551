// Package metrics is vmgate's Prometheus instrumentation: calls by tool,
// decision and grant; the latency of the durable decision record and of
// whole calls; store and audit errors; plugin restarts; pending approvals;
// VMs by state. It uses a private registry (nothing global), served as the
// Prometheus text format by Handler. The registry also holds the Go runtime
// collector (go_goroutines, go_memstats_*, …) and the process collector
// (process_open_fds, process_resident_memory_bytes, …) of the vmgate
// process itself, so a leak of goroutines or descriptors shows on /metrics.
//
// Counting stays off the gate's hot path in cost: Metrics wraps the audit
// log (Auditor) and the store (Store) that the gate already calls, so the
// gate needs no hook of its own. Every label combination a call can produce
// is resolved to its prometheus.Counter or Observer once, in New, and kept
// in immutable maps: counting a call is a map lookup and an atomic add, with
// no lock and no allocation. Label values come from closed sets (the tools
// and grants given to New, the known decisions and outcomes); anything else
// (an unknown tool name an agent made up) is counted under "other", so an
// agent cannot blow up the series count.
//
// Gauges that need a backend (pending approvals, VMs by state, plugin
// restarts) are collected when /metrics is scraped, each bounded by
// Options.ScrapeTimeout; a backend that fails is counted in
// vmgate_scrape_errors and its VMs are left out of that scrape.
//
// Cardinality is bounded by the configuration, never by the fleet: no
// series carries a VM's name, so a thousand VMs cost what ten do (the
// series count is tools × decisions × grants, tools × outcomes, backends ×
// states, plus fixed ones). Only Options.PerVMLabels adds a series per
// VM, vmgate_vm_state, built from each scrape's listing and kept nowhere
// in between: a VM that is gone leaves no series behind.
package metrics

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/internal/vmpage"
	"github.com/vmgate/vmgate/policy/audit"
)

// Other is the label value of a tool, grant, decision or outcome outside
// the closed sets Metrics knows.
const Other = "other"

// Decisions are the decision label values. Besides the audit log's own
// words, "approved" is a call that went through on a granted approval and
// "approval_required" a call that was parked (both are "approve" in the
// log; the first is made durable before dispatch, the second is not).
func Decisions() []string { return slices.Clone(decisions) }

// decisions are Decisions, read on every call.
var decisions = []string{
	"allow", "deny", "approved", "approval_required", "rate_limited", "invalid", "unknown_vm", "error",
	"approval_granted", "approval_denied", Other,
}

// Outcomes are the outcome label values of finished calls.
func Outcomes() []string { return slices.Clone(outcomeNames) }

var outcomeNames = []string{"ok", "error", "timed_out", "not_run", Other}

// Auditor is the audit log as the gate uses it (the same method set as
// server.Auditor, so a wrapped log plugs into server.Config.Audit).
type Auditor interface {
	Append(ctx context.Context, rec audit.Record) (uint64, error)
	AppendLazy(ctx context.Context, rec audit.Record) error
}

// Backend is one hypervisor backend whose VMs are counted by state.
type Backend struct {
	Name   string
	Driver hypervisor.Driver
}

// Restarter is an optional capability of a driver: one that restarts a
// plugin process (pluginhost.Supervisor) reports how often it did.
type Restarter interface {
	Restarts() int64
}

// Options configure New.
type Options struct {
	// Tools and Grants are the label values counted by name; others are Other.
	Tools  []string
	Grants []string
	// Backends are counted by VM state at scrape time (and their plugin
	// restarts, when a driver is a Restarter).
	Backends []Backend
	// PendingApprovals returns the number of pending approvals at scrape
	// time; nil leaves the gauge out.
	PendingApprovals func(ctx context.Context) (int, error)
	// NotificationsDropped returns the notifications the server dropped
	// because a client's queue was full (server.NotificationsDropped);
	// nil leaves the counter out.
	NotificationsDropped func() uint64
	// ScrapeTimeout bounds each scrape-time call (default 2 s).
	ScrapeTimeout time.Duration
	// Replica, when set, is the value of a constant label replica on every
	// series (the Go and process collectors' too), so that each of several
	// replicas behind one address labels itself. One value per process:
	// it adds no series.
	Replica string
	// PerVMLabels (config metrics.per_vm_labels) adds one series per VM
	// that a backend lists at scrape time: vmgate_vm_state{backend, vm,
	// state} 1. With a thousand VMs that is a thousand series (about 80
	// bytes each in every scrape); off by default.
	PerVMLabels bool
}

type callKey struct{ tool, decision, grant string }
type outcomeKey struct{ tool, outcome string }

// Metrics holds the registry and the pre-resolved series.
type Metrics struct {
	reg  *prometheus.Registry
	opts Options

	// The maps below are filled in New and only read afterwards: safe for
	// concurrent use without a lock.
	calls       map[callKey]prometheus.Counter
	outcomes    map[outcomeKey]prometheus.Counter
	duration    map[string]prometheus.Observer // by tool
	commit      prometheus.Observer
	auditErrors map[string]prometheus.Counter // by kind: decision, outcome
	storeErrors map[string]prometheus.Counter // by op
}

// StoreOps are the op label values of vmgate_store_errors_total.
func StoreOps() []string {
	return []string{
		"reserve", "refund", "create_approval", "get_approval", "list_approvals", "decide_approval", "consume_approval",
		"create_session", "get_session", "list_sessions", "touch_session", "delete_session",
		"acquire_lease", "get_lease", "list_leases", "update_lease", "release_lease",
		"put_snapshot", "get_snapshot", "list_snapshots", "delete_snapshot",
	}
}

// New builds the metrics and registers them in a new private registry.
func New(o Options) (*Metrics, error) {
	if o.ScrapeTimeout <= 0 {
		o.ScrapeTimeout = 2 * time.Second
	}
	tools := closedSet(o.Tools)
	grants := closedSet(o.Grants)
	for _, b := range o.Backends {
		if b.Name == "" || b.Driver == nil {
			return nil, fmt.Errorf("metrics: new: backend %q without a name or a driver", b.Name)
		}
	}
	m := &Metrics{
		reg:         prometheus.NewRegistry(),
		opts:        o,
		calls:       map[callKey]prometheus.Counter{},
		outcomes:    map[outcomeKey]prometheus.Counter{},
		duration:    map[string]prometheus.Observer{},
		auditErrors: map[string]prometheus.Counter{},
		storeErrors: map[string]prometheus.Counter{},
	}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmgate_calls_total",
		Help: "tools/call requests by tool, decision and grant (approval decisions of the operator included).",
	}, []string{"tool", "decision", "grant"})
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmgate_call_outcomes_total",
		Help: "Dispatched calls by tool and outcome.",
	}, []string{"tool", "outcome"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vmgate_call_duration_seconds",
		Help:    "Time from the gate receiving a dispatched call to its outcome (decision, backend work and reply).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"tool"})
	commit := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "vmgate_decision_commit_seconds",
		Help:    "Time to make a decision record durable before dispatch (the write and the shared fsync).",
		Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .5, 1},
	})
	auditErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmgate_audit_errors_total",
		Help: "Audit records that could not be written, by kind (a decision error refuses the call).",
	}, []string{"kind"})
	storeErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmgate_store_errors_total",
		Help: "Store operations that failed for a reason other than a full counter or a bad argument, by op.",
	}, []string{"op"})
	process := []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	var reg prometheus.Registerer = m.reg
	if o.Replica != "" {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"replica": o.Replica}, m.reg)
	}
	for _, c := range append(process, calls, outcomes, duration, commit, auditErrors, storeErrors, &scrapeCollector{m: m}) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: new: %w", err)
		}
	}
	for _, t := range tools {
		for _, d := range decisions {
			for _, g := range grants {
				m.calls[callKey{t, d, g}] = calls.WithLabelValues(t, d, g)
			}
		}
		for _, oc := range outcomeNames {
			m.outcomes[outcomeKey{t, oc}] = outcomes.WithLabelValues(t, oc)
		}
		m.duration[t] = duration.WithLabelValues(t)
	}
	m.commit = commit
	for _, k := range []string{string(audit.KindDecision), string(audit.KindOutcome)} {
		m.auditErrors[k] = auditErrors.WithLabelValues(k)
	}
	for _, op := range StoreOps() {
		m.storeErrors[op] = storeErrors.WithLabelValues(op)
	}
	return m, nil
}

// closedSet is names without duplicates or empties, plus Other.
func closedSet(names []string) []string {
	out := []string{Other}
	for _, n := range names {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// Registry is the private registry (for tests and extra collectors; a
// collector registered there directly has no replica label).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// countCall counts one decision record; lazy says it was appended without
// waiting (a refused or parked call).
func (m *Metrics) countCall(rec *audit.Record, lazy bool) {
	d := rec.Decision
	switch {
	case d == "approve" && lazy:
		d = "approval_required"
	case d == "approve":
		d = "approved"
	}
	k := callKey{rec.Tool, d, rec.Grant}
	c, ok := m.calls[k]
	if !ok {
		k = m.fallback(k)
		c = m.calls[k]
	}
	c.Inc()
}

// fallback maps the unknown parts of k to Other.
func (m *Metrics) fallback(k callKey) callKey {
	if _, ok := m.duration[k.tool]; !ok {
		k.tool = Other
	}
	if !slices.Contains(decisions, k.decision) {
		k.decision = Other
	}
	if _, ok := m.calls[callKey{Other, Other, k.grant}]; !ok {
		k.grant = Other
	}
	return k
}

func (m *Metrics) countOutcome(rec *audit.Record) {
	tool := rec.Tool
	h, ok := m.duration[tool]
	if !ok {
		tool, h = Other, m.duration[Other]
	}
	h.Observe(rec.DurationMS / 1000)
	c, ok := m.outcomes[outcomeKey{tool, rec.Outcome}]
	if !ok {
		c = m.outcomes[outcomeKey{tool, Other}]
	}
	c.Inc()
}

// Auditor wraps a in an Auditor that counts every record it is given.
func (m *Metrics) Auditor(a Auditor) Auditor { return &auditor{m: m, next: a} }

type auditor struct {
	m    *Metrics
	next Auditor
}

func (a *auditor) Append(ctx context.Context, rec audit.Record) (uint64, error) {
	return a.count(rec, func() (uint64, error) { return a.next.Append(ctx, rec) })
}

// AppendWritten forwards to the wrapped log's AppendWritten (the decision
// of a read-only call that need not wait for an fsync; see server's
// appendDecision), or to its Append when it has none, counting like Append.
func (a *auditor) AppendWritten(ctx context.Context, rec audit.Record) (uint64, error) {
	w, ok := a.next.(interface {
		AppendWritten(ctx context.Context, rec audit.Record) (uint64, error)
	})
	if !ok {
		return a.Append(ctx, rec)
	}
	return a.count(rec, func() (uint64, error) { return w.AppendWritten(ctx, rec) })
}

// count runs one synchronous append and counts its record.
func (a *auditor) count(rec audit.Record, appendFn func() (uint64, error)) (uint64, error) {
	start := time.Now()
	seq, err := appendFn()
	if err != nil {
		a.m.auditErrors[string(audit.KindDecision)].Inc()
		return seq, err
	}
	if rec.Kind == audit.KindDecision {
		a.m.commit.Observe(time.Since(start).Seconds())
		a.m.countCall(&rec, false)
	}
	return seq, nil
}

func (a *auditor) AppendLazy(ctx context.Context, rec audit.Record) error {
	err := a.next.AppendLazy(ctx, rec)
	if err != nil {
		k := string(rec.Kind)
		if _, ok := a.m.auditErrors[k]; !ok {
			k = string(audit.KindOutcome)
		}
		a.m.auditErrors[k].Inc()
	}
	// The record is counted either way: the call was refused or finished
	// whether or not its record could be written.
	switch rec.Kind {
	case audit.KindDecision:
		a.m.countCall(&rec, true)
	case audit.KindOutcome:
		a.m.countOutcome(&rec)
	}
	return err
}

// storeFailure reports whether err is the store failing (not a verdict or
// a caller's mistake).
func storeFailure(err error) bool {
	return err != nil && !isClientError(err)
}

// counted runs the store op and counts its failure.
func (m *Metrics) counted(op string, err error) error {
	if storeFailure(err) {
		m.storeErrors[op].Inc()
	}
	return err
}

// scrapeCollector collects the gauges that ask a backend or the store.
type scrapeCollector struct {
	m *Metrics
}

var (
	pendingDesc  = prometheus.NewDesc("vmgate_pending_approvals", "Approvals waiting for an operator.", nil, nil)
	vmsDesc      = prometheus.NewDesc("vmgate_vms", "VMs by backend and power state.", []string{"backend", "state"}, nil)
	restartsDesc = prometheus.NewDesc("vmgate_plugin_restarts_total", "Restarts of a backend's driver plugin process.", []string{"backend"}, nil)
	vmStateDesc  = prometheus.NewDesc("vmgate_vm_state", "1 for each VM a backend lists, by its power state (only with metrics.per_vm_labels).",
		[]string{"backend", "vm", "state"}, nil)
	droppedDesc = prometheus.NewDesc("vmgate_notifications_dropped_total", "Notifications to MCP clients dropped because the client's queue was full.", nil, nil)
	scrapeDesc  = prometheus.NewDesc("vmgate_scrape_errors", "Scrape-time lookups that failed in this scrape, by source.", []string{"source"}, nil)
)

// States are the state label values of vmgate_vms (always all present).
func States() []hypervisor.State { return slices.Clone(states[:]) }

// states are States, in the order of a scrape's counts.
var states = [...]hypervisor.State{hypervisor.StateRunning, hypervisor.StatePaused, hypervisor.StateStopped, hypervisor.StateUnknown}

// stateIndex is st's index in states; a state outside them counts as
// unknown.
func stateIndex(st hypervisor.State) int {
	if i := slices.Index(states[:], st); i >= 0 {
		return i
	}
	return slices.Index(states[:], hypervisor.StateUnknown)
}

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingDesc
	ch <- vmsDesc
	ch <- restartsDesc
	ch <- scrapeDesc
	ch <- droppedDesc
	if c.m.opts.PerVMLabels {
		ch <- vmStateDesc
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	o := c.m.opts
	failed := map[string]float64{}
	var mu sync.Mutex // guards failed
	if o.PendingApprovals != nil {
		ctx, cancel := context.WithTimeout(context.Background(), o.ScrapeTimeout)
		n, err := o.PendingApprovals(ctx)
		cancel()
		if err != nil {
			failed["approvals"]++
		} else {
			ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(n))
		}
	}
	if o.NotificationsDropped != nil {
		ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(o.NotificationsDropped()))
	}
	var wg sync.WaitGroup
	for _, b := range o.Backends {
		if r, ok := b.Driver.(Restarter); ok {
			ch <- prometheus.MustNewConstMetric(restartsDesc, prometheus.CounterValue, float64(r.Restarts()), b.Name)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), o.ScrapeTimeout)
			defer cancel()
			vms, err := vmpage.List(ctx, b.Driver) // read only: the plugin host's kept list, not a copy
			if err != nil {
				mu.Lock()
				failed["backend/"+b.Name]++
				mu.Unlock()
				return
			}
			var by [len(states)]float64
			for _, vm := range vms {
				i := stateIndex(vm.State)
				by[i]++
				if o.PerVMLabels {
					ch <- prometheus.MustNewConstMetric(vmStateDesc, prometheus.GaugeValue, 1, b.Name, vm.Name, string(states[i]))
				}
			}
			for i, st := range states {
				ch <- prometheus.MustNewConstMetric(vmsDesc, prometheus.GaugeValue, by[i], b.Name, string(st))
			}
		})
	}
	wg.Wait()
	for src, n := range failed {
		ch <- prometheus.MustNewConstMetric(scrapeDesc, prometheus.GaugeValue, n, src)
	}
}
