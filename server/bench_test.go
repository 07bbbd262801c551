package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/vmgate/vmgate/hypervisor/hypervisortest"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/audit"
	"github.com/vmgate/vmgate/policy/store"
	"github.com/vmgate/vmgate/policy/store/bolt"
	"github.com/vmgate/vmgate/policy/store/memory"
	"github.com/vmgate/vmgate/server/catalog"
	"github.com/vmgate/vmgate/server/mcptest"
	"github.com/vmgate/vmgate/server/tools"
)

// The gate's cost, as the performance budget of docs/design.md asks.
//
// The no-op call is vm_status of lab/vm1 on the fake driver of the tests
// (hypervisortest.Fake: a map lookup, no I/O). The bare server is a minimal
// mcp-go server with that one tool, the same schema, calling the same fake
// driver, with no gate, no policy, no store and no audit. The gated server
// is the real Server with a policy that allows the call and reserves one
// counter, a store, and the audit log on disk (fsync always: one fsync per
// call, shared by concurrent calls).
//
// In process (one message in, one encoded response out):
//
//	go test ./server -run '^$' -bench 'BenchmarkGate' -benchmem
//
// Gated…/fsync=none uses an audit interval of an hour, so no fsync runs
// during the benchmark: the gate's own cost (strict decoding, decision,
// reservation, audit encoding and write(2)). store=bolt is bbolt with
// NoSync for counters (what serve used before); store=split is what it
// uses now (counters in memory, approvals in bbolt).
//
// End to end, bare and gated interleaved A B A B in one process, ratio of
// medians and calls/s, over stdio (sequential) and streamable HTTP
// (8 and 32 concurrent clients):
//
//	go test ./server -run '^$' -bench 'BenchmarkE2E' -benchtime 5x
//
// Each iteration is one round of both servers; the figures are custom
// metrics (p50 in µs, calls/s, ratios, fsyncs per call).

const benchCall = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"vm_status","arguments":{"vm":"lab/vm1"}}}`

const benchToken = "bench-token"

func bareMCP(tb testing.TB) *mcpserver.MCPServer {
	var calls atomic.Int64
	drv := hypervisortest.Counting(&calls)
	s := mcpserver.NewMCPServer("bare", "1", mcpserver.WithToolCapabilities(false))
	spec := tools.Catalogue(catalog.DefaultLimits())[1] // vm_status
	if spec.Name != "vm_status" {
		tb.Fatalf("Catalogue()[1] = %s; want vm_status", spec.Name)
	}
	s.AddTool(spec.MCPTool(), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		st, err := drv.Status(ctx, "vm1")
		if err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent(string(st.State))}, StructuredContent: st}, nil
	})
	return s
}

// benchStore names the counter store of a gated bench server.
type benchStore string

const (
	storeSplit benchStore = "split" // counters in memory, approvals in bbolt: what serve uses
	storeBolt  benchStore = "bolt"  // counters in bbolt with NoSync: what serve used before
)

type gatedBench struct {
	s   *Server
	log *audit.Log
}

// gatedServer builds the gated server. interval 0 means the default.
func gatedServer(tb testing.TB, kind benchStore, fsync string, interval time.Duration) gatedBench {
	dir := tb.TempDir()
	eng, err := policy.Parse("bench.json", []byte(`{"version":"1","default":"allow",
		"all_tools":{"limits":[{"counter":"all_calls","window":"minute","max":1000000000,"scope":"grant"}]}}`))
	if err != nil {
		tb.Fatal(err)
	}
	bs, err := bolt.Open(filepath.Join(dir, "store.db"), bolt.Options{NoSync: kind == storeBolt})
	if err != nil {
		tb.Fatal(err)
	}
	var st store.Store = bs
	if kind == storeSplit {
		if st, err = memory.NewSplit(bs); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() { st.Close() })
	log, err := audit.Open(filepath.Join(dir, "audit.log"), audit.Options{Fsync: fsync, Interval: interval})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { log.Close() })
	var calls atomic.Int64
	sum := sha256.Sum256([]byte(benchToken))
	s, err := New(Config{
		// The HTTP rounds send more than a default grant's request budget
		// (defaultHTTPRequestsPerMinute) each: the budget's count still runs
		// on every request, its refusal does not.
		Grants: []Grant{{Name: "local", Policy: eng, TokenSHA256: hex.EncodeToString(sum[:]),
			RequestsPerMinute: 1 << 30}},
		Backends: []Backend{{Name: "lab", Driver: hypervisortest.Counting(&calls)}},
		Store:    st, Audit: log,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return gatedBench{s: s, log: log}
}

// In-process benchmarks.

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

func benchBare(b *testing.B, parallel bool) {
	s := bareMCP(b)
	ctx := context.Background()
	benchLoop(b, parallel, func() {
		// Encoding the response is part of every transport's work: the
		// gated handle does it, so the bare call does too.
		resp := s.HandleMessage(ctx, []byte(benchCall))
		out, err := jsonMarshal(resp)
		if err != nil || !bytes.Contains(out, []byte(`"result"`)) || bytes.Contains(out, []byte(`"isError":true`)) {
			b.Fatalf("bare call failed: %s, %v", out, err)
		}
	})
}

func benchGated(b *testing.B, kind benchStore, fsync string, parallel bool) {
	interval := time.Duration(0)
	if fsync == "none" {
		fsync, interval = audit.FsyncInterval, time.Hour
	}
	g := gatedServer(b, kind, fsync, interval)
	c := &Conn{Grant: g.s.grants["local"], Transport: "stdio"}
	ctx := context.Background()
	before := g.log.Stats()
	benchLoop(b, parallel, func() {
		out := g.s.Handle(ctx, c, []byte(benchCall))
		if len(out) == 0 || bytes.Contains(out, []byte(`"isError":true`)) {
			b.Fatalf("gated call failed: %s", out)
		}
	})
	after := g.log.Stats()
	b.ReportMetric(float64(after.Syncs-before.Syncs)/float64(b.N), "fsyncs/op")
}

func BenchmarkGateBare(b *testing.B)         { benchBare(b, false) }
func BenchmarkGateBareParallel(b *testing.B) { benchBare(b, true) }

func BenchmarkGateGated(b *testing.B) {
	for _, kind := range []benchStore{storeSplit, storeBolt} {
		for _, fsync := range []string{audit.FsyncAlways, "none"} {
			b.Run(fmt.Sprintf("store=%s/fsync=%s", kind, fsync), func(b *testing.B) { benchGated(b, kind, fsync, false) })
		}
	}
}

func BenchmarkGateGatedParallel(b *testing.B) {
	for _, kind := range []benchStore{storeSplit, storeBolt} {
		for _, fsync := range []string{audit.FsyncAlways, "none"} {
			b.Run(fmt.Sprintf("store=%s/fsync=%s", kind, fsync), func(b *testing.B) { benchGated(b, kind, fsync, true) })
		}
	}
}

// BenchmarkGateOverhead interleaves one bare and one gated call (store
// split, no fsync) per iteration and reports the median of each and their
// difference: the gate's own cost, robust against the load of a shared
// machine, which hits both sides alike.
func BenchmarkGateOverhead(b *testing.B) {
	bare := bareMCP(b)
	g := gatedServer(b, storeSplit, audit.FsyncInterval, time.Hour)
	c := &Conn{Grant: g.s.grants["local"], Transport: "stdio"}
	ctx := context.Background()
	var sb, sg sample
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		out, err := jsonMarshal(bare.HandleMessage(ctx, []byte(benchCall)))
		t1 := time.Now()
		gout := g.s.Handle(ctx, c, []byte(benchCall))
		t2 := time.Now()
		if err != nil || bytes.Contains(out, []byte(`"isError":true`)) || bytes.Contains(gout, []byte(`"isError":true`)) {
			b.Fatalf("calls failed: %s / %s", out, gout)
		}
		sb.lat = append(sb.lat, t1.Sub(t0))
		sg.lat = append(sg.lat, t2.Sub(t1))
	}
	b.ReportMetric(float64(sb.p50().Nanoseconds())/1e3, "bare-p50-µs")
	b.ReportMetric(float64(sg.p50().Nanoseconds())/1e3, "gated-p50-µs")
	b.ReportMetric(float64((sg.p50()-sb.p50()).Nanoseconds())/1e3, "gate-p50-µs")
}

// BenchmarkGateDirect interleaves one gated call on the direct path
// (dispatch.go) and one through mcp-go's HandleMessage on the same server
// (store split, no fsync) per iteration, and reports the median of each
// and their ratio: what the direct path saves.
func BenchmarkGateDirect(b *testing.B) {
	g := gatedServer(b, storeSplit, audit.FsyncInterval, time.Hour)
	c := &Conn{Grant: g.s.grants["local"], Transport: "stdio"}
	ctx := context.Background()
	var sd, sm sample
	b.ReportAllocs()
	for b.Loop() {
		g.s.noDirect = false
		t0 := time.Now()
		dout := g.s.Handle(ctx, c, []byte(benchCall))
		t1 := time.Now()
		g.s.noDirect = true
		mout := g.s.Handle(ctx, c, []byte(benchCall))
		t2 := time.Now()
		if !bytes.Equal(dout, mout) || bytes.Contains(dout, []byte(`"isError":true`)) {
			b.Fatalf("calls differ or failed: %s / %s", dout, mout)
		}
		sd.lat = append(sd.lat, t1.Sub(t0))
		sm.lat = append(sm.lat, t2.Sub(t1))
	}
	b.ReportMetric(float64(sd.p50().Nanoseconds())/1e3, "direct-p50-µs")
	b.ReportMetric(float64(sm.p50().Nanoseconds())/1e3, "mcp-go-p50-µs")
	b.ReportMetric(float64(sd.p50())/float64(sm.p50()), "p50-ratio")
}

// End-to-end benchmarks.

// e2eConfigs are the gated servers compared with the bare one: the new
// default (split, fsync always), the same with fsync interval (the WAL
// synchronous=NORMAL class of durability), and the old default (bbolt
// NoSync counters, fsync always).
var e2eConfigs = []struct {
	kind  benchStore
	fsync string
}{{storeSplit, audit.FsyncAlways}, {storeSplit, audit.FsyncInterval}, {storeBolt, audit.FsyncAlways}}

// sample is the latencies of one side of a comparison and its wall time.
type sample struct {
	lat     []time.Duration
	elapsed time.Duration
}

func (s *sample) p50() time.Duration {
	l := slices.Clone(s.lat)
	slices.Sort(l)
	return l[len(l)/2]
}

func (s *sample) rate() float64 { return float64(len(s.lat)) / s.elapsed.Seconds() }

// report prints and records bare against gated.
func report(b *testing.B, name string, bare, gated *sample, fsyncs uint64) {
	ratio := float64(gated.p50()) / float64(bare.p50())
	rr := gated.rate() / bare.rate()
	b.ReportMetric(float64(bare.p50().Microseconds()), "bare-p50-µs")
	b.ReportMetric(float64(gated.p50().Microseconds()), "gated-p50-µs")
	b.ReportMetric(ratio, "p50-ratio")
	b.ReportMetric(bare.rate(), "bare-calls/s")
	b.ReportMetric(gated.rate(), "gated-calls/s")
	b.ReportMetric(rr, "calls/s-ratio")
	b.ReportMetric(float64(fsyncs)/float64(len(gated.lat)), "fsyncs/call")
	b.Logf("%s: bare p50 %v, %.0f calls/s; gated p50 %v, %.0f calls/s; p50 ratio %.2f, calls/s ratio %.2f; %.2f fsyncs per gated call (%d calls each)",
		name, bare.p50(), bare.rate(), gated.p50(), gated.rate(), ratio, rr, float64(fsyncs)/float64(len(gated.lat)), len(gated.lat))
}

// stdioClient talks newline-delimited JSON-RPC over OS pipes to a server
// serving on the other ends.
type stdioClient struct {
	w    *os.File
	r    *bufio.Reader
	done chan error
	stop func()
}

func startStdio(b *testing.B, serve func(ctx context.Context, in io.Reader, out io.Writer) error) *stdioClient {
	inR, inW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &stdioClient{w: inW, r: bufio.NewReaderSize(outR, 64<<10), done: make(chan error, 1)}
	go func() {
		err := serve(ctx, inR, outW)
		outW.Close()
		c.done <- err
	}()
	c.stop = func() {
		inW.Close()
		cancel()
		<-c.done
		inR.Close()
		outR.Close()
	}
	b.Cleanup(c.stop)
	c.roundTrip(b, mcptest.InitMsg)
	if _, err := c.w.Write([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n")); err != nil {
		b.Fatal(err)
	}
	return c
}

func (c *stdioClient) roundTrip(b *testing.B, msg string) []byte {
	if _, err := c.w.Write([]byte(msg + "\n")); err != nil {
		b.Fatal(err)
	}
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			b.Fatalf("stdio read: %v", err)
		}
		if bytes.Contains(line, []byte(`"id"`)) { // skip notifications
			return line
		}
	}
}

func stdioRound(b *testing.B, c *stdioClient, calls int, s *sample) {
	start := time.Now()
	for range calls {
		t0 := time.Now()
		out := c.roundTrip(b, benchCall)
		s.lat = append(s.lat, time.Since(t0))
		if !bytes.Contains(out, []byte(`"result"`)) || bytes.Contains(out, []byte(`"isError":true`)) {
			b.Fatalf("call failed: %s", out)
		}
	}
	s.elapsed += time.Since(start)
}

func BenchmarkE2EStdio(b *testing.B) {
	for _, cfg := range e2eConfigs {
		kind := cfg.kind
		b.Run(fmt.Sprintf("store=%s/fsync=%s", kind, cfg.fsync), func(b *testing.B) {
			const calls = 300
			bare := startStdio(b, func(ctx context.Context, in io.Reader, out io.Writer) error {
				return mcpserver.NewStdioServer(bareMCP(b)).Listen(ctx, in, out)
			})
			g := gatedServer(b, kind, cfg.fsync, 0)
			gated := startStdio(b, func(ctx context.Context, in io.Reader, out io.Writer) error {
				return serveStdio(ctx, g.s, "local", in, out)
			})
			var sb, sg sample
			// Warm both up outside the figures.
			stdioRound(b, bare, 20, &sample{})
			stdioRound(b, gated, 20, &sample{})
			before := g.log.Stats()
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					stdioRound(b, bare, calls, &sb)
					stdioRound(b, gated, calls, &sg)
				} else {
					stdioRound(b, gated, calls, &sg)
					stdioRound(b, bare, calls, &sb)
				}
				i++
			}
			report(b, fmt.Sprintf("stdio sequential, store %s, fsync %s", kind, cfg.fsync), &sb, &sg, g.log.Stats().Syncs-before.Syncs)
		})
	}
}

// httpClient is one MCP client over streamable HTTP with its session.
type httpClient struct {
	hc      *http.Client
	url     string
	token   string
	session string
}

func (c *httpClient) post(msg string) ([]byte, http.Header, error) {
	req, err := http.NewRequest(http.MethodPost, c.url, strings.NewReader(msg))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return nil, nil, fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	return body, resp.Header, nil
}

func newHTTPClients(b testing.TB, url, token string, n int) []*httpClient {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 2 * n, MaxIdleConnsPerHost: 2 * n}}
	b.Cleanup(hc.CloseIdleConnections)
	cs := make([]*httpClient, n)
	for i := range cs {
		c := &httpClient{hc: hc, url: url + "/mcp", token: token}
		_, h, err := c.post(mcptest.InitMsg)
		if err != nil {
			b.Fatalf("initialize: %v", err)
		}
		c.session = h.Get("Mcp-Session-Id")
		if _, _, err := c.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
			b.Fatalf("initialized: %v", err)
		}
		cs[i] = c
	}
	return cs
}

func httpRound(b testing.TB, cs []*httpClient, each int, s *sample) {
	lats := make([][]time.Duration, len(cs))
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for i, c := range cs {
		wg.Go(func() {
			for range each {
				t0 := time.Now()
				out, _, err := c.post(benchCall)
				lats[i] = append(lats[i], time.Since(t0))
				if err != nil || !bytes.Contains(out, []byte(`"result"`)) || bytes.Contains(out, []byte(`"isError":true`)) {
					failed.Store(fmt.Sprintf("call failed: %s, %v", out, err))
					return
				}
			}
		})
	}
	wg.Wait()
	s.elapsed += time.Since(start)
	if f := failed.Load(); f != nil {
		b.Fatal(f)
	}
	for _, l := range lats {
		s.lat = append(s.lat, l...)
	}
}

func BenchmarkE2EHTTP(b *testing.B) {
	for _, clients := range []int{8, 32} {
		for _, cfg := range e2eConfigs {
			kind := cfg.kind
			b.Run(fmt.Sprintf("clients=%d/store=%s/fsync=%s", clients, kind, cfg.fsync), func(b *testing.B) {
				each := 1600 / clients
				bareSrv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(bareMCP(b), mcpserver.WithEndpointPath("/mcp")))
				b.Cleanup(bareSrv.Close)
				g := gatedServer(b, kind, cfg.fsync, 0)
				gatedSrv := httptest.NewServer(httpHandler(g.s))
				b.Cleanup(gatedSrv.Close)
				bare := newHTTPClients(b, bareSrv.URL, "", clients)
				gated := newHTTPClients(b, gatedSrv.URL, benchToken, clients)
				httpRound(b, bare, 5, &sample{})
				httpRound(b, gated, 5, &sample{})
				var sb, sg sample
				before := g.log.Stats()
				i := 0
				for b.Loop() {
					if i%2 == 0 {
						httpRound(b, bare, each, &sb)
						httpRound(b, gated, each, &sg)
					} else {
						httpRound(b, gated, each, &sg)
						httpRound(b, bare, each, &sb)
					}
					i++
				}
				report(b, fmt.Sprintf("HTTP %d clients, store %s, fsync %s", clients, kind, cfg.fsync), &sb, &sg, g.log.Stats().Syncs-before.Syncs)
			})
		}
	}
}

// TestBenchHTTPRoundsSucceed runs BenchmarkE2EHTTP's rounds with 32 clients
// for more calls than a grant's default request budget, as one bench run
// does in its first minute: every call must pass (the budget once refused
// them, so row 2b of make bench failed).
func TestBenchHTTPRoundsSucceed(t *testing.T) {
	g := gatedServer(t, storeSplit, audit.FsyncInterval, 0)
	srv := httptest.NewServer(httpHandler(g.s))
	t.Cleanup(srv.Close)
	cs := newHTTPClients(t, srv.URL, benchToken, 32)
	var s sample
	httpRound(t, cs, defaultHTTPRequestsPerMinute/32+8, &s)
	if want := 32 * (defaultHTTPRequestsPerMinute/32 + 8); len(s.lat) != want {
		t.Errorf("httpRound answered %d calls; want %d", len(s.lat), want)
	}
}

// TestBenchCallSucceeds makes sure the benchmarks measure a call that
// passes the gate and reaches the driver, not a refusal.
func TestBenchCallSucceeds(t *testing.T) {
	f := newFixture(t, fixtureOpts{})
	r := f.send(t, benchCall)
	if r.Result == nil || r.Result.IsError || f.calls.Load() != 1 {
		t.Fatalf("bench call = %q, driver calls %d; want success and 1", r.Text(), f.calls.Load())
	}
}
