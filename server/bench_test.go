package server

import (
	"bytes"
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/bolt"
	"github.com/vmgate/vmgate/policy/store/memory"
)

// The gate's cost: the same no-op tools/call (vm_status on a fake driver)
// through HandleMessage of a bare mcp-go server, and through the gate with
// a real policy (with a counter), bbolt with NoSync and the audit log.
// Compare Gated (fsync always: one shared fsync per call) and GatedNoFsync
// (fsync interval: the gate's own cost) against Bare in the same run.

const benchCall = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/vm1"}}}`

func bareServer(b *testing.B) *mcpserver.MCPServer {
	var calls atomic.Int64
	drv := countingFake(&calls)
	s := mcpserver.NewMCPServer("bare", "1", mcpserver.WithToolCapabilities(false))
	spec := catalogue(DefaultLimits)[1] // vm_status
	if spec.name != "vm_status" {
		b.Fatalf("catalogue()[1] = %s; want vm_status", spec.name)
	}
	s.AddTool(spec.mcpTool(), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		st, err := drv.Status(ctx, "vm1")
		if err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent(string(st.State))}, StructuredContent: st}, nil
	})
	return s
}

func gatedServer(b *testing.B, fsync string, mem bool) *Server {
	dir := b.TempDir()
	eng, err := policy.Parse("bench.json", []byte(`{"version":"1","default":"allow",
		"all_tools":{"limits":[{"counter":"all_calls","window":"second","max":100000000,"scope":"grant"}]}}`))
	if err != nil {
		b.Fatal(err)
	}
	var st store.Store = memory.New()
	if !mem {
		bs, err := bolt.Open(filepath.Join(dir, "store.db"), bolt.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		st = bs
	}
	b.Cleanup(func() { st.Close() })
	log, err := audit.Open(filepath.Join(dir, "audit.log"), audit.Options{Fsync: fsync})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { log.Close() })
	var calls atomic.Int64
	s, err := New(Config{
		Grants:   []Grant{{Name: "local", Policy: eng}},
		Backends: []Backend{{Name: "lab", Driver: countingFake(&calls)}},
		Store:    st, Audit: log,
	})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func benchBare(b *testing.B, parallel bool) {
	s := bareServer(b)
	ctx := context.Background()
	run := func() {
		if resp := s.HandleMessage(ctx, []byte(benchCall)); resp == nil {
			b.Fatal("no response")
		}
	}
	benchLoop(b, parallel, run)
}

func benchGated(b *testing.B, fsync string, mem, parallel bool) {
	s := gatedServer(b, fsync, mem)
	c := &conn{grant: s.grants["local"], transport: "stdio"}
	ctx := context.Background()
	run := func() {
		out := s.handle(ctx, c, []byte(benchCall))
		if len(out) == 0 || bytes.Contains(out, []byte(`"isError":true`)) {
			b.Fatalf("gated call failed: %s", out)
		}
	}
	benchLoop(b, parallel, run)
}

func benchLoop(b *testing.B, parallel bool, run func()) {
	b.ReportAllocs()
	if !parallel {
		for b.Loop() {
			run()
		}
		return
	}
	b.SetParallelism(16) // 32 goroutines on 2 cores
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			run()
		}
	})
}

func BenchmarkGateBare(b *testing.B)                 { benchBare(b, false) }
func BenchmarkGateGated(b *testing.B)                { benchGated(b, audit.FsyncAlways, false, false) }
func BenchmarkGateGatedNoFsync(b *testing.B)         { benchGated(b, audit.FsyncInterval, false, false) }
func BenchmarkGateGatedNoFsyncMemory(b *testing.B)   { benchGated(b, audit.FsyncInterval, true, false) }
func BenchmarkGateBareParallel(b *testing.B)         { benchBare(b, true) }
func BenchmarkGateGatedParallel(b *testing.B)        { benchGated(b, audit.FsyncAlways, false, true) }
func BenchmarkGateGatedNoFsyncParallel(b *testing.B) { benchGated(b, audit.FsyncInterval, false, true) }

// TestBenchCallSucceeds makes sure the benchmarks measure a call that
// passes the gate and reaches the driver, not a refusal.
func TestBenchCallSucceeds(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	r := f.send(t, benchCall)
	if r.Result == nil || r.Result.IsError || f.calls.Load() != 1 {
		t.Fatalf("bench call = %q, driver calls %d; want success and 1", r.text(), f.calls.Load())
	}
}
