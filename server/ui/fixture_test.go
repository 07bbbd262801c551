package ui_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/hypervisor"
	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/internal/mcpcall"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server"
	"github.com/vmgate/vmgate/server/mcphttp"
	"github.com/vmgate/vmgate/server/metrics"
	"github.com/vmgate/vmgate/server/tools"
	"github.com/vmgate/vmgate/server/ui"
)

const (
	operatorToken = "operator-token-for-tests"
	agentToken    = "agent-grant-token"
	operatorName  = "alice"
	// approvePower parks every vm_power call until an operator decides;
	// every other tool is allowed, list_vms within a small budget.
	approvePower = `{"version":"1","default":"allow","tools":{
		"vm_power":{"action":"approve","approval":{"channel":"operator","ttl":"10m"}},
		"list_vms":{"limits":[{"counter":"list_rate","window":"minute","max":50,"scope":"grant"}]}}}`
)

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// fixture is a real vmgate server (gate, memory store, audit log on disk,
// metrics) over a Fake driver, with the MCP endpoint, /ui and /metrics on
// one httptest listener, mounted the way `vmgate serve --http` mounts them.
type fixture struct {
	url       string
	srv       *server.Server
	page      *ui.Handler
	auditPath string
	powers    atomic.Int64 // Power calls that reached the driver
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{}
	dir := t.TempDir()
	f.auditPath = filepath.Join(dir, "audit.log")
	log, err := audit.Open(f.auditPath, audit.Options{Fsync: audit.FsyncInterval})
	if err != nil {
		t.Fatalf("audit.Open: %v", err)
	}
	t.Cleanup(func() { log.Close() })
	eng, err := policy.Parse("policy.json", []byte(approvePower))
	if err != nil {
		t.Fatalf("policy.Parse: %v", err)
	}
	drv := &hypervisortest.Fake{
		ListVMsFunc: func(context.Context) ([]hypervisor.VM, error) {
			return []hypervisor.VM{{Name: "vm1", State: hypervisor.StateRunning, Info: "lab VM"}, {Name: "vm2", State: hypervisor.StateStopped}}, nil
		},
		StatusFunc: func(_ context.Context, vm string) (hypervisor.Status, error) {
			if vm == "vm2" {
				return hypervisor.Status{Name: vm, State: hypervisor.StateStopped}, nil
			}
			return hypervisor.Status{Name: vm, State: hypervisor.StateRunning, AgentConnected: true, AgentVersion: "9.2"}, nil
		},
		PowerFunc: func(context.Context, string, hypervisor.PowerAction) error {
			f.powers.Add(1)
			return nil
		},
	}
	mem := memory.New()
	m, err := metrics.New(metrics.Options{
		Tools: tools.Names(), Grants: []string{"agent"},
		Backends: []metrics.Backend{{Name: "lab", Driver: drv}},
		PendingApprovals: func(ctx context.Context) (int, error) {
			list, err := mem.ListApprovals(ctx, time.Now())
			n := 0
			for _, a := range list {
				if a.State == store.ApprovalPending {
					n++
				}
			}
			return n, err
		},
	})
	if err != nil {
		t.Fatalf("metrics.New: %v", err)
	}
	st := m.Store(mem)
	f.srv, err = server.New(server.Config{
		Grants:   []server.Grant{{Name: "agent", TokenSHA256: sha(agentToken), Policy: eng}},
		Backends: []server.Backend{{Name: "lab", Driver: drv}},
		Store:    st, Audit: m.Auditor(log),
	})
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	f.page, err = ui.New(ui.Config{
		Approvals: f.srv.Approvals(), AuditPath: f.auditPath,
		Backends:    []ui.Backend{{Name: "lab", Driver: drv}},
		TokenSHA256: sha(operatorToken), OperatorName: operatorName,
	})
	if err != nil {
		t.Fatalf("ui.New: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", mcphttp.New(f.srv, mcphttp.Options{}))
	mux.Handle(ui.Prefix+"/", f.page)
	mux.Handle("/metrics", m.Handler())
	ts := httptest.NewServer(mux)
	t.Cleanup(func() {
		ts.Close()
		f.srv.Close()
	})
	f.url = ts.URL
	return f
}

// call makes one tools/call as the agent over streamable HTTP.
func (f *fixture) call(t *testing.T, tool, args string) mcpcall.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := mcpcall.Call(ctx, mcpcall.Options{URL: f.url + "/mcp", Token: agentToken}, tool, []byte(args))
	if err != nil {
		t.Fatalf("Call(%s, %s) = %v", tool, args, err)
	}
	return res
}

// park makes a call the policy parks and returns its approval id.
func (f *fixture) park(t *testing.T, args string) string {
	t.Helper()
	res := f.call(t, "vm_power", args)
	if !res.IsError || !strings.HasPrefix(res.Text, server.TagApproval) {
		t.Fatalf("Call(vm_power, %s) = %+v; want %s", args, res, server.TagApproval)
	}
	sc, _ := res.StructuredContent.(map[string]any)
	id, _ := sc["approval_id"].(string)
	if id == "" {
		t.Fatalf("Call(vm_power) structuredContent = %v; want an approval_id", res.StructuredContent)
	}
	return id
}

// auditRecords reads the log (after the lazy records had time to land).
func (f *fixture) auditRecords(t *testing.T) []audit.Record {
	t.Helper()
	var recs []audit.Record
	err := audit.Read(f.auditPath, func(r audit.Record) error {
		recs = append(recs, r)
		return nil
	})
	if err != nil {
		t.Fatalf("audit.Read: %v", err)
	}
	return recs
}
