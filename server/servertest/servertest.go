// Package servertest builds a gated server for the tests of the
// transports (server/stdio, server/mcphttp, server/operator) and of the
// packages beside them: two grants ("local" and "other", with tokens
// "local-token" and "other-token"), two backends ("lab" and "other") on one
// fake driver, a memory store, an audit log in memory and a clock the test
// moves.
package servertest

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
	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
)

// Options change the fixture; the zero value allows everything.
type Options struct {
	Policy string   // grant "local"'s (default: allow all)
	VMs    []string // visible VM globs of "local" (default: every VM)
	// OtherPolicy and OtherVMs are grant "other"'s (default: allow all,
	// other/*).
	OtherPolicy string
	OtherVMs    []string
	Store       store.Store          // default: memory
	Rec         *audittest.Recorder  // default: a new one
	Driver      *hypervisortest.Fake // default: hypervisortest.Counting
	Bins        guestctl.Binaries    // default: the host's builds
	Timeouts    catalog.Timeouts     // zero values: the defaults
	Grace       time.Duration        // 0: server.DefaultShutdownGrace
}

// Fixture is a gated server and what its test watches.
type Fixture struct {
	S     *server.Server
	Rec   *audittest.Recorder
	Store store.Store
	Calls *atomic.Int64 // driver calls of the default driver
	now   *atomic.Int64 // unix nanoseconds of the fake clock
}

// New builds the fixture; the server is closed when t ends.
func New(t testing.TB, o Options) *Fixture {
	t.Helper()
	f := &Fixture{Calls: new(atomic.Int64), now: new(atomic.Int64), Rec: o.Rec, Store: o.Store}
	f.now.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	if f.Rec == nil {
		f.Rec = &audittest.Recorder{}
	}
	if f.Rec.Now == nil {
		f.Rec.Now = f.Now
	}
	if f.Store == nil {
		f.Store = memory.New()
	}
	drv := o.Driver
	if drv == nil {
		drv = hypervisortest.Counting(f.Calls)
	}
	if o.OtherVMs == nil {
		o.OtherVMs = []string{"other/*"}
	}
	s, err := server.New(server.Config{
		Grants: []server.Grant{
			{Name: "local", Policy: parse(t, o.Policy), VMs: o.VMs, TokenSHA256: mcptest.SHA256Hex("local-token")},
			{Name: "other", Policy: parse(t, o.OtherPolicy), VMs: o.OtherVMs, TokenSHA256: mcptest.SHA256Hex("other-token")},
		},
		Backends: []server.Backend{{Name: "lab", Driver: drv}, {Name: "other", Driver: drv}},
		Store:    f.Store, Audit: f.Rec, AuditRecords: f.Rec.Each, Now: f.Now,
		Timeouts: o.Timeouts, ShutdownGrace: o.Grace, GuestBinaries: o.Bins,
	})
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	f.S = s
	t.Cleanup(func() { s.Close() })
	return f
}

// parse is the engine of doc (default: allow all).
func parse(t testing.TB, doc string) *policy.Engine {
	t.Helper()
	if doc == "" {
		doc = mcptest.AllowAll
	}
	eng, err := policy.Parse("test.json", []byte(doc))
	if err != nil {
		t.Fatalf("policy.Parse: %v", err)
	}
	return eng
}

// Now is the fixture's clock.
func (f *Fixture) Now() time.Time { return time.Unix(0, f.now.Load()) }

// Advance moves the clock on by d.
func (f *Fixture) Advance(d time.Duration) { f.now.Add(int64(d)) }

// SendAs runs raw as a message of grant over stdio through the gate and
// decodes the reply (a zero Reply for none).
func (f *Fixture) SendAs(t testing.TB, grant, raw string) mcptest.Reply {
	t.Helper()
	g, ok := f.S.Grant(grant)
	if !ok {
		t.Fatalf("no grant %q", grant)
	}
	out := f.S.Handle(context.Background(), &server.Conn{Grant: g, Transport: "stdio"}, []byte(raw))
	var r mcptest.Reply
	if out == nil {
		return r
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("reply %.200q: %v", out, err)
	}
	return r
}

// Call runs a tools/call of tool with args (raw JSON) as grant "local".
func (f *Fixture) Call(t testing.TB, tool, args string) mcptest.Reply {
	t.Helper()
	return f.SendAs(t, "local", mcptest.ToolCall(1, tool, args))
}

// SetPolicy makes doc grant's policy (a reload, as SIGHUP does).
func (f *Fixture) SetPolicy(t testing.TB, grant, doc string) {
	t.Helper()
	if err := f.S.SetPolicy(grant, parse(t, doc)); err != nil {
		t.Fatalf("SetPolicy(%s): %v", grant, err)
	}
}
