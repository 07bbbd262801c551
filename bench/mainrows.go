package main

import (
	"context"
	"path/filepath"
)

// The rows that reuse the main module's own benchmarks. They need
// unexported code (the gate's in-process harness in server, go-plugin
// glue in internal/pluginhost, the per-record-fsync mode of policy/audit),
// which a separate module cannot import, so the bench command runs their
// test binaries (built by scripts/bench.sh with `go test -c`) and reads
// the metrics they report.

// mainTests locates the test binaries and the source tree.
type mainTests struct {
	Bins string // directory with server.test, audit.test, pluginhost.test, guestctl.test
	Src  string // root of the main module
}

func (m mainTests) bin(name, pkg string) testBinary {
	return testBinary{Path: filepath.Join(m.Bins, name+".test"), Dir: filepath.Join(m.Src, filepath.FromSlash(pkg))}
}

// gateRows measures the whole gate (policy, store, fsync'd audit) against
// a bare mcp-go server with the same no-op tool, through the server
// package's end-to-end benchmarks. One run of a benchmark with
// -test.benchtime 1x is one round: bare then gated, each a batch of calls
// after a warm-up; successive runs make the pairs.
func gateRows(ctx context.Context, m mainTests, warmup, pairs int) []*Row {
	srv := m.bin("server", "server")
	stdio := &Row{ID: "2a", Unit: "µs",
		What: "gate cost, stdio sequential: p50 latency of a no-op call, vmgate gate (policy, store, fsync'd audit) / bare mcp-go"}
	const stdioName = "BenchmarkE2EStdio/store=split/fsync=always"
	stdio.Err = Rounds(ctx, warmup, pairs, func(ctx context.Context, _ int, counts bool) error {
		res, err := srv.Bench(ctx, "^BenchmarkE2EStdio$/^store=split$/^fsync=always$", "1x")
		if err != nil {
			return err
		}
		gated, err := res.Metric(stdioName, "gated-p50-µs")
		if err != nil {
			return err
		}
		bare, err := res.Metric(stdioName, "bare-p50-µs")
		if err != nil {
			return err
		}
		if !counts {
			return nil
		}
		return stdio.Add(gated, bare)
	})

	http := &Row{ID: "2b", Unit: "calls/s",
		What: "gate cost, HTTP 32 concurrent clients: throughput, vmgate gate / bare mcp-go"}
	const httpName = "BenchmarkE2EHTTP/clients=32/store=split/fsync=always"
	var fsyncs []float64
	http.Err = Rounds(ctx, warmup, pairs, func(ctx context.Context, _ int, counts bool) error {
		res, err := srv.Bench(ctx, "^BenchmarkE2EHTTP$/^clients=32$/^store=split$/^fsync=always$", "1x")
		if err != nil {
			return err
		}
		gated, err := res.Metric(httpName, "gated-calls/s")
		if err != nil {
			return err
		}
		bare, err := res.Metric(httpName, "bare-calls/s")
		if err != nil {
			return err
		}
		f, err := res.Metric(httpName, "fsyncs/call")
		if err != nil {
			return err
		}
		if !counts {
			return nil
		}
		fsyncs = append(fsyncs, f)
		return http.Add(gated, bare)
	})
	if len(fsyncs) > 0 {
		med, _ := medianSpread(fsyncs)
		http.Note = "fsyncs/call " + formatRatio(med)
	}
	return []*Row{stdio, http}
}

// pluginRow is a no-op driver call (Status) through a plugin process (its
// call socket, no state cache) against the same driver in process:
// internal/pluginhost's BenchmarkCall, one sub-benchmark per run,
// alternating.
func pluginRow(ctx context.Context, m mainTests, warmup, pairs int) *Row {
	ph := m.bin("pluginhost", "internal/pluginhost")
	r := &Row{ID: "4", Unit: "µs", What: "plugin boundary: p50 of a no-op driver call, through the plugin's call socket / in process"}
	side := func(sub string) func(ctx context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			return ph.Metric(ctx, "^BenchmarkCall$/^"+sub+"$", "3000x", "BenchmarkCall/"+sub, "p50-µs")
		}
	}
	r.Err = Interleave(ctx, r, warmup, pairs, side("plugin"), side("in-process"))
	return r
}

// auditRow is appends/s at 64 writers with group commit against the same
// log committing one record per fsync: policy/audit's BenchmarkAppend, one
// sub-benchmark per run, alternating.
func auditRow(ctx context.Context, m mainTests, warmup, pairs int) *Row {
	au := m.bin("audit", "policy/audit")
	r := &Row{ID: "5", Unit: "appends/s", What: "audit: fsync'd appends/s at 64 writers, group commit / one fsync per record"}
	side := func(sub string) func(ctx context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			return au.Metric(ctx, "^BenchmarkAppend$/^writers=64$/^"+sub+"$", "2000x", "BenchmarkAppend/writers=64/"+sub, "appends/s")
		}
	}
	r.Err = Interleave(ctx, r, warmup, pairs, side("group"), side("per-record-fsync"))
	return r
}
