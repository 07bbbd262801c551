package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/mcptest"
)

func TestAdvanceUnits(t *testing.T) {
	c := func(max int64) policy.Counter { return policy.Counter{Key: "k", Window: time.Minute, Max: max} }
	tests := []struct {
		counters []policy.Counter
		want     int64
	}{
		{[]policy.Counter{c(600)}, 30},
		{[]policy.Counter{c(1_000_000_000)}, maxAdvanceUnits},
		{[]policy.Counter{c(600), c(60)}, 3},
		{[]policy.Counter{c(39)}, 0}, // one unit only: no advance
		{[]policy.Counter{c(40)}, 2},
		{[]policy.Counter{c(0)}, 0},
		{nil, maxAdvanceUnits},
	}
	for _, tt := range tests {
		if got := advanceUnits(tt.counters); got != tt.want {
			t.Errorf("advanceUnits(%v) = %d; want %d", tt.counters, got, tt.want)
		}
	}
}

// durableLog is the real audit log with a note of how much of its file is
// known durable: everything written when an Append (fsync always) returned.
// Cutting the file there is what a power loss can leave at worst.
type durableLog struct {
	*audit.Log
	mu      sync.Mutex
	durable int64
}

func (d *durableLog) Append(ctx context.Context, rec audit.Record) (uint64, error) {
	seq, err := d.Log.Append(ctx, rec)
	if err == nil {
		fi, serr := os.Stat(d.Path())
		if serr != nil {
			return seq, serr
		}
		d.mu.Lock()
		d.durable = max(d.durable, fi.Size())
		d.mu.Unlock()
	}
	return seq, err
}

var _ writtenAppender = (*durableLog)(nil)

// powerLoss copies the log as a power loss could leave it: cut at the last
// point known durable.
func (d *durableLog) powerLoss(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	n := d.durable
	d.mu.Unlock()
	cut := filepath.Join(t.TempDir(), "after-power-loss.log")
	if err := os.WriteFile(cut, b[:n], 0o600); err != nil {
		t.Fatal(err)
	}
	return cut
}

// advanceServer is a server whose grant may call vm_status max times a
// minute and vm_agent_exec freely, over the real audit log (fsync always,
// no timed flush) and the counters `vmgate serve` uses.
func advanceServer(t *testing.T, max string, now func() time.Time) (*Server, *durableLog) {
	t.Helper()
	log, err := audit.Open(filepath.Join(t.TempDir(), "audit.log"), audit.Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	eng, err := policy.Parse("adv.json", []byte(`{"version":"1","default":"deny",
		"all_tools":{"limits":[{"counter":"all_calls","window":"minute","max":`+max+`,"scope":"grant"}]},
		"tools":{"vm_status":{},"vm_agent_exec":{}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	dl := &durableLog{Log: log}
	s, err := New(Config{
		Grants:   []Grant{{Name: "local", Policy: eng}},
		Backends: []Backend{{Name: "lab", Driver: hypervisortest.Counting(&calls)}},
		Store:    memory.New(), Audit: dl, Now: now,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dl
}

func handleOK(t *testing.T, s *Server, c *Conn, msg string) {
	t.Helper()
	out := s.Handle(context.Background(), c, []byte(msg))
	if !bytes.Contains(out, []byte(`"result"`)) || bytes.Contains(out, []byte(`"isError":true`)) {
		t.Fatalf("handle(%s) = %s; want a successful result", msg, out)
	}
}

// records reads the log at path by kind.
func recordsByKind(t *testing.T, path string) map[audit.Kind][]audit.Record {
	t.Helper()
	out := map[audit.Kind][]audit.Record{}
	if err := audit.Read(path, func(r audit.Record) error {
		out[r.Kind] = append(out[r.Kind], r)
		return nil
	}); err != nil {
		t.Fatalf("audit.Read(%s) = %v", path, err)
	}
	return out
}

// TestAdvancesCoverSequentialCalls: 70 sequential rate-limited read-only
// calls (max 640 a minute: advances of 32) open three advances, each made
// durable before the calls that use it (three fsyncs in all); every
// decision names its advance, no advance is used more than its units, and
// an exhausted one gets its end record.
func TestAdvancesCoverSequentialCalls(t *testing.T) {
	s, log := advanceServer(t, "640", nil)
	c := &Conn{Grant: s.grants["local"], Transport: "stdio"}
	before := log.Stats()
	const n = 70
	for i := range n {
		handleOK(t, s, c, mcptest.ToolCall(i+1, "vm_status", `{"vm":"lab/vm1"}`))
	}
	if got := log.Stats().Syncs - before.Syncs; got != 3 {
		t.Errorf("%d calls cost %d fsyncs; want 3 (one per advance of 32)", n, got)
	}
	s.Close() // ends the open advance
	log.Close()
	recs := recordsByKind(t, log.Path())
	checkAdvances(t, recs, n)
	if got := len(recs[audit.KindAdvance]); got != 3 {
		t.Errorf("advance records = %d; want 3", got)
	}
	ends := map[string]int64{}
	for _, r := range recs[audit.KindAdvanceEnd] {
		ends[r.CallID] = r.Units
	}
	for i, a := range recs[audit.KindAdvance] {
		want := int64(32)
		if i == 2 {
			want = n - 64 // the last one, ended by Close
		}
		if got, ok := ends[a.CallID]; !ok || got != want {
			t.Errorf("end record of advance %d (%s) = %d, %v; want %d units used", i, a.CallID, got, ok, want)
		}
	}
}

// checkAdvances checks the advance invariants of a log holding calls
// decisions: every decision names an advance recorded before it, with the
// same counters, and no advance is named more often than its units.
func checkAdvances(t *testing.T, recs map[audit.Kind][]audit.Record, calls int) {
	t.Helper()
	units := map[string]int64{}
	for _, a := range recs[audit.KindAdvance] {
		units[a.CallID] = a.Units
		if a.Units != 32 || a.ValidMS != advanceLife.Milliseconds() || len(a.Counters) != 1 {
			t.Errorf("advance record %+v; want 32 units for %v over all_calls", a, advanceLife)
		}
	}
	if got := len(recs[audit.KindDecision]); got != calls {
		t.Errorf("decision records = %d; want %d", got, calls)
	}
	used := map[string]int64{}
	for _, d := range recs[audit.KindDecision] {
		if _, ok := units[d.Advance]; !ok {
			t.Errorf("decision %s names advance %q, which is not in the log before it", d.CallID, d.Advance)
		}
		used[d.Advance]++
	}
	for id, u := range used {
		if u > units[id] {
			t.Errorf("advance %s named by %d decisions; it holds %d units", id, u, units[id])
		}
	}
}

// TestAdvancesConcurrentCalls: 96 calls from 16 goroutines never use an
// advance past its units and never leave a decision without one.
func TestAdvancesConcurrentCalls(t *testing.T) {
	s, log := advanceServer(t, "640", nil)
	c := &Conn{Grant: s.grants["local"], Transport: "stdio"}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 6 {
				handleOK(t, s, c, mcptest.ToolCall(g*100+i+1, "vm_status", `{"vm":"lab/vm1"}`))
			}
		})
	}
	wg.Wait()
	s.Close()
	log.Close()
	recs := recordsByKind(t, log.Path())
	checkAdvances(t, recs, 96)
	if got := len(recs[audit.KindAdvance]); got < 3 {
		t.Errorf("advance records = %d; want at least 3 for 96 calls of 32-unit advances", got)
	}
}

// TestAdvanceExpires: an advance is not used after its time; the next call
// opens a new one and the old one is ended with the units it gave out.
func TestAdvanceExpires(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC).UnixNano())
	s, log := advanceServer(t, "640", func() time.Time { return time.Unix(0, clock.Load()) })
	c := &Conn{Grant: s.grants["local"], Transport: "stdio"}
	for i := range 3 {
		handleOK(t, s, c, mcptest.ToolCall(i+1, "vm_status", `{"vm":"lab/vm1"}`))
	}
	clock.Add(int64(advanceLife))
	before := log.Stats()
	handleOK(t, s, c, mcptest.ToolCall(9, "vm_status", `{"vm":"lab/vm1"}`))
	if got := log.Stats().Syncs - before.Syncs; got != 1 {
		t.Errorf("the first call after the advance's time cost %d fsyncs; want 1 (a new advance)", got)
	}
	log.Close()
	recs := recordsByKind(t, log.Path())
	if len(recs[audit.KindAdvance]) != 2 || len(recs[audit.KindAdvanceEnd]) != 1 {
		t.Fatalf("advances %d, ends %d; want 2 advances and the first one ended", len(recs[audit.KindAdvance]), len(recs[audit.KindAdvanceEnd]))
	}
	first, end := recs[audit.KindAdvance][0], recs[audit.KindAdvanceEnd][0]
	if end.CallID != first.CallID || end.Units != 3 {
		t.Errorf("end record %s units %d; want %s with 3", end.CallID, end.Units, first.CallID)
	}
	last := recs[audit.KindDecision][3]
	if last.Advance == first.CallID || last.Advance != recs[audit.KindAdvance][1].CallID {
		t.Errorf("the call after expiry names advance %s; want the second one", last.Advance)
	}
}

// TestAdvancesOnlyForReadOnlyCalls: a call that can change a guest waits
// for the fsync of its own decision record, and so does a read-only call
// whose counter is too small for an advance (max 30: one unit would be a
// twentieth of it... less than two).
func TestAdvancesOnlyForReadOnlyCalls(t *testing.T) {
	t.Run("destructive", func(t *testing.T) {
		s, log := advanceServer(t, "640", nil)
		c := &Conn{Grant: s.grants["local"], Transport: "stdio"}
		before := log.Stats()
		for i := range 3 {
			handleOK(t, s, c, mcptest.ToolCall(i+1, "vm_agent_exec", `{"vm":"lab/vm1","command":["true"]}`))
		}
		if got := log.Stats().Syncs - before.Syncs; got != 3 {
			t.Errorf("3 execs cost %d fsyncs; want 3", got)
		}
		log.Close()
		if recs := recordsByKind(t, log.Path()); len(recs[audit.KindAdvance]) != 0 {
			t.Errorf("execs opened %d advances; want none", len(recs[audit.KindAdvance]))
		}
	})
	t.Run("small counter", func(t *testing.T) {
		s, log := advanceServer(t, "30", nil)
		c := &Conn{Grant: s.grants["local"], Transport: "stdio"}
		before := log.Stats()
		for i := range 3 {
			handleOK(t, s, c, mcptest.ToolCall(i+1, "vm_status", `{"vm":"lab/vm1"}`))
		}
		if got := log.Stats().Syncs - before.Syncs; got != 3 {
			t.Errorf("3 calls under max 30 cost %d fsyncs; want 3", got)
		}
	})
}

// TestAdvanceSurvivesPowerLoss is the reason advances exist: cut the log
// where a power loss could (after the last record known durable: the
// advance), and the counters rebuilt from what is left still hold every
// call that ran, although their decision records are gone. A log left by
// a crash of the process (complete, no end record) holds them too, plus
// the unused units until the advance's window passes; a log left by a
// clean stop holds exactly the calls.
func TestAdvanceSurvivesPowerLoss(t *testing.T) {
	s, log := advanceServer(t, "640", nil)
	c := &Conn{Grant: s.grants["local"], Transport: "stdio"}
	const n = 10
	for i := range n {
		handleOK(t, s, c, mcptest.ToolCall(i+1, "vm_status", `{"vm":"lab/vm1"}`))
	}
	now := time.Now()
	count := func(path string) (restored int, decisions int) {
		rs, err := audit.Reservations(path, now)
		if err != nil {
			t.Fatalf("Reservations(%s) = %v", filepath.Base(path), err)
		}
		restored = len(rs)
		decisions = len(recordsByKind(t, path)[audit.KindDecision])
		return restored, decisions
	}
	lost := log.powerLoss(t)
	if got, decisions := count(lost); got < n || decisions >= n {
		t.Errorf("after a power loss: %d reservations restored from %d surviving decision records; want at least the %d calls made, with some records lost (else the test proves nothing)", got, decisions, n)
	}
	crashed := filepath.Join(t.TempDir(), "crashed.log")
	copyFile(t, log.Path(), crashed)
	if got, decisions := count(crashed); got != 32 || decisions != n {
		t.Errorf("after a crash: %d reservations from %d decisions; want 32 (the %d calls and the advance's unused units)", got, decisions, n)
	}
	s.Close()
	log.Close()
	if got, _ := count(log.Path()); got != n {
		t.Errorf("after a clean stop: %d reservations; want exactly the %d calls", got, n)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAdvanceFailureRefusesAndRetries: an advance that cannot be made
// durable refuses the call with its reservation refunded, and the next call
// tries a new advance.
func TestAdvanceFailureRefusesAndRetries(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	rec := &audittest.Recorder{AppendErr: func(r audit.Record) error {
		if r.Kind == audit.KindAdvance && fail.Load() {
			return errors.New("disk full")
		}
		return nil
	}}
	eng, err := policy.Parse("adv.json", []byte(`{"version":"1","default":"deny",
		"all_tools":{"limits":[{"counter":"all_calls","window":"minute","max":40,"scope":"grant"}]},
		"tools":{"vm_status":{}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	s, err := New(Config{
		Grants:   []Grant{{Name: "local", Policy: eng}},
		Backends: []Backend{{Name: "lab", Driver: hypervisortest.Counting(&calls)}},
		Store:    memory.New(), Audit: writtenRecorder{rec},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f := &fixture{s: s}
	r := f.call(t, "vm_status", `{"vm":"lab/vm1"}`)
	if !strings.Contains(r.Text(), "audit log is unavailable") {
		t.Fatalf("vm_status with the advance failing = %s; want the audit log refusal", r.Text())
	}
	fail.Store(false)
	for i := range 40 { // the refused call's unit was refunded: 40 fit
		if r := f.call(t, "vm_status", `{"vm":"lab/vm1"}`); mcptest.HasTag(r, TagRateLimited) || mcptest.HasTag(r, TagDenied) {
			t.Fatalf("call %d after the failure = %s; want it through (the refused call's reservation refunded)", i, r.Text())
		}
	}
	advances := 0
	for _, r := range rec.Records() {
		if r.Kind == audit.KindAdvance {
			advances++
		}
	}
	if advances != 20 { // 40 calls, advances of 2 (max 40 / 20)
		t.Errorf("advance records = %d; want 20", advances)
	}
}

// writtenRecorder is a recorder with AppendWritten, as the real log has.
type writtenRecorder struct{ *audittest.Recorder }

func (w writtenRecorder) AppendWritten(ctx context.Context, rec audit.Record) (uint64, error) {
	return w.Recorder.Append(ctx, rec)
}
