package server

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit/audittest"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
)

type fixture struct {
	s     *Server
	rec   *audittest.Recorder
	store store.Store
	calls *atomic.Int64 // driver calls
	now   *atomic.Int64 // unix nanoseconds of the fake clock
}

type fixtureOpts struct {
	policy string   // for grant "local"
	vms    []string // visible VM globs of "local"
	// otherPolicy and otherVMs are grant "other"'s (default: allow all,
	// other/*).
	otherPolicy string
	otherVMs    []string
	store       store.Store
	rec         *audittest.Recorder
	driver      *hypervisortest.Fake // nil: countingFake
	bins        guestctl.Binaries    // nil: the host's builds
	timeouts    catalog.Timeouts     // zero values: the defaults
	grace       time.Duration        // 0: DefaultShutdownGrace
}

func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	if o.policy == "" {
		o.policy = mcptest.AllowAll
	}
	eng, err := policy.Parse("test.json", []byte(o.policy))
	if err != nil {
		t.Fatalf("policy.Parse: %v", err)
	}
	if o.otherPolicy == "" {
		o.otherPolicy = mcptest.AllowAll
	}
	if o.otherVMs == nil {
		o.otherVMs = []string{"other/*"}
	}
	other, err := policy.Parse("other.json", []byte(o.otherPolicy))
	if err != nil {
		t.Fatalf("policy.Parse: %v", err)
	}
	f := &fixture{calls: new(atomic.Int64), now: new(atomic.Int64), rec: o.rec, store: o.store}
	f.now.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	if f.rec == nil {
		f.rec = &audittest.Recorder{}
	}
	if f.rec.Now == nil {
		f.rec.Now = func() time.Time { return time.Unix(0, f.now.Load()) }
	}
	if f.store == nil {
		f.store = memory.New()
	}
	drv := o.driver
	if drv == nil {
		drv = hypervisortest.Counting(f.calls)
	}
	f.s, err = New(Config{
		Grants: []Grant{
			{Name: "local", Policy: eng, VMs: o.vms, TokenSHA256: mcptest.SHA256Hex("local-token")},
			{Name: "other", Policy: other, VMs: o.otherVMs, TokenSHA256: mcptest.SHA256Hex("other-token")},
		},
		Backends:      []Backend{{Name: "lab", Driver: drv}, {Name: "other", Driver: drv}},
		Store:         f.store,
		Audit:         f.rec,
		AuditRecords:  f.rec.Each,
		Now:           func() time.Time { return time.Unix(0, f.now.Load()) },
		Timeouts:      o.timeouts,
		ShutdownGrace: o.grace,

		GuestBinaries: o.bins,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return f
}

func (f *fixture) advance(d time.Duration) { f.now.Add(int64(d)) }

// send runs raw through the stdio path of grant "local" and decodes the reply.
func (f *fixture) send(t testing.TB, raw string) mcptest.Reply {
	t.Helper()
	return f.sendAs(t, "local", raw)
}

func (f *fixture) sendAs(t testing.TB, grant, raw string) mcptest.Reply {
	t.Helper()
	out := f.s.Handle(context.Background(), &Conn{Grant: f.s.grants[grant], Transport: "stdio"}, []byte(raw))
	var r mcptest.Reply
	if out == nil {
		return r
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("reply %.200q: %v", out, err)
	}
	f.checkOutput(t, raw, out)
	return r
}

func (f *fixture) call(t testing.TB, tool, args string) mcptest.Reply {
	t.Helper()
	return f.send(t, mcptest.ToolCall(1, tool, args))
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
