package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestMain lets the test binary stand in for a main-module test binary:
// with BENCH_FAKE_TESTBIN set it prints benchmark output for the
// arguments it got, as `go test -c` binaries do, and exits.
// With the bareStdioArg argument it is the bare baseline server, as
// vmgate-bench is.
func TestMain(m *testing.M) {
	if ok, err := runBare(os.Args); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv("BENCH_FAKE_TESTBIN") != "" {
		os.Exit(fakeTestBinary(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeTestBinary(args []string) int {
	wd, _ := os.Getwd()
	fmt.Printf("goos: linux\npkg: fake\ncwd %s\n", wd)
	want := []string{"-test.run", "^$", "-test.bench", "^BenchmarkX$/^sub$", "-test.benchtime", "1x", "-test.count", "1"}
	if strings.Join(args, " ") != strings.Join(want, " ") {
		fmt.Fprintf(os.Stderr, "fake test binary: args %q; want %q\n", args, want)
		return 1
	}
	fmt.Printf("BenchmarkX/sub-2   \t       1\t  123456 ns/op\t  42.5 p50-µs\t %s cwd-len\n", fmt.Sprint(len(wd)))
	fmt.Println("PASS")
	return 0
}

func TestParseBenchOutput(t *testing.T) {
	out := `goos: linux
BenchmarkE2EStdio/store=split/fsync=always-2   	       1	 123 ns/op	 170.0 bare-p50-µs	 250 gated-p50-µs
    bench_test.go:12: BenchmarkE2EStdio: some log line
BenchmarkPlain 	 5000	 1.5 ns/op	 0 B/op	 0 allocs/op
BenchmarkLog says hello
PASS
`
	res, err := ParseBenchOutput([]byte(out))
	if err != nil {
		t.Fatalf("ParseBenchOutput = %v", err)
	}
	tests := []struct {
		bench, unit string
		want        float64
	}{
		{"BenchmarkE2EStdio/store=split/fsync=always", "bare-p50-µs", 170},
		{"BenchmarkE2EStdio/store=split/fsync=always", "gated-p50-µs", 250},
		{"BenchmarkE2EStdio/store=split/fsync=always", "ns/op", 123},
		{"BenchmarkPlain", "ns/op", 1.5},
		{"BenchmarkPlain", "allocs/op", 0},
	}
	for _, tt := range tests {
		if got, err := res.Metric(tt.bench, tt.unit); err != nil || got != tt.want {
			t.Errorf("Metric(%s, %s) = %v, %v; want %v", tt.bench, tt.unit, got, err, tt.want)
		}
	}
	if len(res) != 2 {
		t.Errorf("ParseBenchOutput found %d benchmarks; want 2 (log lines ignored)", len(res))
	}
	for _, q := range [][2]string{{"BenchmarkPlain", "p50-µs"}, {"BenchmarkMissing", "ns/op"}} {
		if _, err := res.Metric(q[0], q[1]); !errors.Is(err, errNoBenchmark) {
			t.Errorf("Metric(%s, %s) = %v; want errNoBenchmark", q[0], q[1], err)
		}
	}
}

func TestParseBenchOutputRejectsMalformedResults(t *testing.T) {
	tests := []struct{ name, line string }{
		{"odd fields", "BenchmarkX-2  10  5 ns/op  7"},
		{"value not a number", "BenchmarkX-2  10  five ns/op"},
		{"unit first", "BenchmarkX-2  10  ns/op 5"},
	}
	for _, tt := range tests {
		if res, err := ParseBenchOutput([]byte(tt.line + "\n")); err == nil {
			t.Errorf("%s: ParseBenchOutput(%q) = %v, nil; want an error", tt.name, tt.line, res)
		}
	}
}

func TestTestBinaryBench(t *testing.T) {
	t.Setenv("BENCH_FAKE_TESTBIN", "1")
	dir := t.TempDir()
	bin := testBinary{Path: os.Args[0], Dir: dir}
	res, err := bin.Bench(context.Background(), "^BenchmarkX$/^sub$", "1x")
	if err != nil {
		t.Fatalf("Bench = %v", err)
	}
	if v, err := res.Metric("BenchmarkX/sub", "p50-µs"); err != nil || v != 42.5 {
		t.Errorf("Metric(BenchmarkX/sub, p50-µs) = %v, %v; want 42.5", v, err)
	}
	// The binary ran in its package directory.
	if v, err := res.Metric("BenchmarkX/sub", "cwd-len"); err != nil || int(v) != len(dir) {
		t.Errorf("test binary ran in a directory of %v bytes (%v); want %s", v, err, dir)
	}
	// A failing binary is an error carrying its output.
	if _, err := bin.Bench(context.Background(), "^Other$", "1x"); err == nil || !strings.Contains(err.Error(), "want") {
		t.Errorf("Bench with args the binary refuses = %v; want an error with its output", err)
	}
	if _, err := bin.Metric(context.Background(), "^BenchmarkX$/^sub$", "1x", "BenchmarkX/sub", "allocs/op"); !errors.Is(err, errNoBenchmark) {
		t.Errorf("Metric of an unreported unit = %v; want errNoBenchmark", err)
	}
}

func TestParseFlags(t *testing.T) {
	full := []string{"-vmgate", "v", "-tests", "t", "-src", "s", "-plugins", "p"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
		only    []string
	}{
		{"defaults", full, "", groups},
		{"one group", []string{"-only", "decide"}, "", []string{"decide"}},
		{"duplicates folded", []string{"-only", "decide, decide,scale"}, "", []string{"decide", "scale"}},
		{"too few pairs", append([]string{"-pairs", "4"}, full...), "-pairs 4", nil},
		{"too many pairs", append([]string{"-pairs", "100000"}, full...), "-pairs", nil},
		{"no warm-up", append([]string{"-warmup", "0"}, full...), "-warmup 0", nil},
		{"unknown group", []string{"-only", "decide,fast"}, `unknown group "fast"`, nil},
		{"lab without binary", []string{"-only", "lab"}, "needs -vmgate", nil},
		{"gate without tests", []string{"-only", "gate", "-src", "s"}, "needs -tests", nil},
		{"audit without source", []string{"-only", "audit", "-tests", "t"}, "needs -src", nil},
		{"fleet without plugins", []string{"-only", "fleet", "-vmgate", "v"}, "needs -plugins", nil},
		{"resident without tests", []string{"-only", "resident", "-vmgate", "v", "-src", "s"}, "needs -tests", nil},
		{"resident without binary", []string{"-only", "resident", "-tests", "t", "-src", "s"}, "needs -vmgate", nil},
		{"resident", []string{"-only", "resident", "-vmgate", "v", "-tests", "t", "-src", "s"}, "", []string{"resident"}},
		{"stray argument", append(full, "extra"), "unexpected arguments", nil},
		{"unknown flag", []string{"-fast"}, "not defined", nil},
	}
	for _, tt := range tests {
		var stderr strings.Builder
		o, err := parseFlags(tt.args, &stderr)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: parseFlags(%q) = %v; want an error containing %q", tt.name, tt.args, err, tt.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(o.only, ",") != strings.Join(tt.only, ",") || o.pairs != 6 {
			t.Errorf("%s: parseFlags(%q) = %+v, %v; want groups %v, 6 pairs", tt.name, tt.args, o, err, tt.only)
		}
	}
}
