package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// errNoBenchmark is returned when a test binary ran no benchmark of the
// asked name or reported no such metric: the benchmark was renamed or
// removed in the main module.
var errNoBenchmark = errors.New("benchmark not found")

// Results are the metrics of every benchmark a run reported, by name
// (without the -GOMAXPROCS suffix) and unit.
type Results map[string]map[string]float64

// Metric returns one metric of one benchmark.
func (r Results) Metric(bench, unit string) (float64, error) {
	m, ok := r[bench]
	if !ok {
		return 0, fmt.Errorf("%w: %s", errNoBenchmark, bench)
	}
	v, ok := m[unit]
	if !ok {
		return 0, fmt.Errorf("%w: %s reported no %q", errNoBenchmark, bench, unit)
	}
	return v, nil
}

var procsSuffix = regexp.MustCompile(`-[0-9]+$`)

// ParseBenchOutput reads the result lines of `go test -bench` output:
//
//	BenchmarkX/sub-2   5   123 ns/op   4.5 p50-µs
//
// Other lines are ignored. A result line with an odd number of value and
// unit fields or a value that is not a number is an error.
func ParseBenchOutput(out []byte) (Results, error) {
	res := Results{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.ParseUint(f[1], 10, 64); err != nil {
			continue // a log line that happens to start with the name
		}
		name := procsSuffix.ReplaceAllString(f[0], "")
		rest := f[2:]
		if len(rest)%2 != 0 {
			return nil, fmt.Errorf("bench: result line %q: odd number of value/unit fields", sc.Text())
		}
		m := map[string]float64{}
		for i := 0; i < len(rest); i += 2 {
			v, err := strconv.ParseFloat(rest[i], 64)
			if err != nil {
				return nil, fmt.Errorf("bench: result line %q: %w", sc.Text(), err)
			}
			m[rest[i+1]] = v
		}
		res[name] = m
	}
	return res, sc.Err()
}

// testBinary is a test binary of the main module built with `go test -c`,
// run in its package directory as `go test` would.
type testBinary struct {
	Path string // the binary
	Dir  string // the package directory
}

// Bench runs the benchmarks matching pattern (a -test.bench expression)
// with the given -test.benchtime, and flags of the test binary's own, and
// returns their results.
func (t testBinary) Bench(ctx context.Context, pattern, benchtime string, flags ...string) (Results, error) {
	cmd := exec.CommandContext(ctx, t.Path, append([]string{"-test.run", "^$", "-test.bench", pattern,
		"-test.benchtime", benchtime, "-test.count", "1"}, flags...)...)
	cmd.Dir = t.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("bench: %s -test.bench %s: %w: %s", t.Path, pattern, err, tail(out.Bytes(), 2000))
	}
	return ParseBenchOutput(out.Bytes())
}

// Metric runs one benchmark and returns one of its metrics.
func (t testBinary) Metric(ctx context.Context, pattern, benchtime, name, unit string) (float64, error) {
	res, err := t.Bench(ctx, pattern, benchtime)
	if err != nil {
		return 0, err
	}
	return res.Metric(name, unit)
}

// tail returns at most the last n bytes of b as a string.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
