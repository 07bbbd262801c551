package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/guestctl"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// recorder is an Auditor keeping records in memory; its function fields
// let a test make appends fail.
type recorder struct {
	AppendErr func(audit.Record) error
	// now, when set, stamps records without a time (as the log does).
	now  func() time.Time
	mu   sync.Mutex // guards recs
	recs []audit.Record
}

func (r *recorder) Append(ctx context.Context, rec audit.Record) (uint64, error) {
	if r.AppendErr != nil {
		if err := r.AppendErr(rec); err != nil {
			return 0, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, r.stamp(rec))
	return uint64(len(r.recs)), nil
}

func (r *recorder) AppendLazy(ctx context.Context, rec audit.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, r.stamp(rec))
	return nil
}

func (r *recorder) stamp(rec audit.Record) audit.Record {
	if rec.Time.IsZero() && r.now != nil {
		rec.Time = r.now()
	}
	return rec
}

// each calls fn with every record, its arguments redacted as the log
// writes them (Config.AuditRecords).
func (r *recorder) each(fn func(audit.Record) error) error {
	for _, rec := range r.records() {
		rec.Args = audit.Redact(rec.Args)
		if err := fn(rec); err != nil {
			return err
		}
	}
	return nil
}

func (r *recorder) records() []audit.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Record(nil), r.recs...)
}

// countingFake is a Fake driver that counts every call and answers like a
// small healthy VM whose commands print "ok".
func countingFake(calls *atomic.Int64) *hypervisortest.Fake {
	return &hypervisortest.Fake{
		ListVMsFunc: func(ctx context.Context) ([]hypervisor.VM, error) {
			calls.Add(1)
			return []hypervisor.VM{{Name: "vm1", State: hypervisor.StateRunning}, {Name: "vm2", State: hypervisor.StateStopped}}, nil
		},
		StatusFunc: func(ctx context.Context, vm string) (hypervisor.Status, error) {
			calls.Add(1)
			if vm != "vm1" && vm != "vm2" {
				return hypervisor.Status{}, fmt.Errorf("fake: %w", hypervisor.ErrUnknownVM)
			}
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, AgentConnected: true}, nil
		},
		AgentInfoFunc: func(ctx context.Context, vm string) (hypervisor.AgentInfo, error) {
			calls.Add(1)
			return hypervisor.AgentInfo{Version: "9"}, nil
		},
		ExecStartFunc: func(ctx context.Context, vm string, req hypervisor.ExecRequest) (hypervisor.ExecHandle, error) {
			calls.Add(1)
			return hypervisor.ExecHandle{PID: 4242, StartedAt: time.Unix(1, 0)}, nil
		},
		ExecStatusFunc: func(ctx context.Context, vm string, h hypervisor.ExecHandle) (hypervisor.ExecResult, error) {
			calls.Add(1)
			return hypervisor.ExecResult{PID: h.PID, Exited: true, Stdout: []byte("exited\n")}, nil
		},
		FileReadFunc: func(ctx context.Context, vm, path string, maxBytes int64) (hypervisor.FileContent, error) {
			calls.Add(1)
			return hypervisor.FileContent{Data: []byte("hello")}, nil
		},
		FileWriteFunc: func(ctx context.Context, vm, path string, data []byte, mode uint32) error {
			calls.Add(1)
			return nil
		},
		PowerFunc: func(ctx context.Context, vm string, action hypervisor.PowerAction) error {
			calls.Add(1)
			return nil
		},
	}
}

const allowAll = `{"version":"1","default":"allow"}`

type fixture struct {
	s     *Server
	rec   *recorder
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
	rec         *recorder
	driver      *hypervisortest.Fake // nil: countingFake
	bins        guestctl.Binaries    // nil: the host's builds
}

func newFixture(t testing.TB, o fixtureOpts) *fixture {
	t.Helper()
	if o.policy == "" {
		o.policy = allowAll
	}
	eng, err := policy.Parse("test.json", []byte(o.policy))
	if err != nil {
		t.Fatalf("policy.Parse: %v", err)
	}
	if o.otherPolicy == "" {
		o.otherPolicy = allowAll
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
		f.rec = &recorder{}
	}
	if f.rec.now == nil {
		f.rec.now = func() time.Time { return time.Unix(0, f.now.Load()) }
	}
	if f.store == nil {
		f.store = memory.New()
	}
	drv := o.driver
	if drv == nil {
		drv = countingFake(f.calls)
	}
	f.s, err = New(Config{
		Grants: []Grant{
			{Name: "local", Policy: eng, VMs: o.vms, TokenSHA256: sha256hex("local-token")},
			{Name: "other", Policy: other, VMs: o.otherVMs, TokenSHA256: sha256hex("other-token")},
		},
		Backends:     []Backend{{Name: "lab", Driver: drv}, {Name: "other", Driver: drv}},
		Store:        f.store,
		Audit:        f.rec,
		AuditRecords: f.rec.each,
		Now:          func() time.Time { return time.Unix(0, f.now.Load()) },

		GuestBinaries: o.bins,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return f
}

func (f *fixture) advance(d time.Duration) { f.now.Add(int64(d)) }

// rpcReply is a JSON-RPC response as a test reads it.
type rpcReply struct {
	ID     json.RawMessage `json:"id"`
	Result *struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		StructuredContent map[string]any `json:"structuredContent"`
		IsError           bool           `json:"isError"`
		Tools             []struct {
			Name         string         `json:"name"`
			InputSchema  map[string]any `json:"inputSchema"`
			OutputSchema map[string]any `json:"outputSchema"`
			Annotations  map[string]any `json:"annotations"`
		} `json:"tools"`
	} `json:"result"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (r rpcReply) text() string {
	if r.Result == nil || len(r.Result.Content) == 0 {
		return ""
	}
	return r.Result.Content[0].Text
}

// send runs raw through the stdio path of grant "local" and decodes the reply.
func (f *fixture) send(t testing.TB, raw string) rpcReply {
	t.Helper()
	return f.sendAs(t, "local", raw)
}

func (f *fixture) sendAs(t testing.TB, grant, raw string) rpcReply {
	t.Helper()
	out := f.s.handle(context.Background(), &conn{grant: f.s.grants[grant], transport: "stdio"}, []byte(raw))
	var r rpcReply
	if out == nil {
		return r
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("reply %.200q: %v", out, err)
	}
	f.checkOutput(t, raw, out)
	return r
}

// toolCall builds a tools/call message with arguments as raw JSON.
func toolCall(id int, tool, args string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, id, tool, args)
}

func (f *fixture) call(t testing.TB, tool, args string) rpcReply {
	t.Helper()
	return f.send(t, toolCall(1, tool, args))
}

func hasTag(r rpcReply, tag string) bool {
	return r.Result != nil && r.Result.IsError && strings.HasPrefix(r.text(), tag+" ")
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
