#!/usr/bin/env bash
# vmgate against its baselines, side by side, in one run (make bench).
#
#   scripts/bench.sh [vmgate-bench flags]   build, run every benchmark, print one table
#   scripts/bench.sh profile [DIR]          CPU and allocation profiles of the gate
#                                           under load in DIR (default bin/bench-profile)
#
# The table comes from vmgate-bench (the separate Go module in bench/, which
# carries OPA so the product does not). It measures through public packages
# and the vmgate binary, and runs the main module's own benchmarks that need
# unexported code (server, policy/audit, internal/pluginhost,
# internal/guestctl) as test binaries built here. Every row is a ratio of
# two medians measured in the same run, A B A B … after a warm-up. Flags after the script name go to
# vmgate-bench, e.g. `scripts/bench.sh -pairs 8 -only gate,decide`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
GO=${GO:-go}

if [ "${1:-}" = profile ]; then
	out=${2:-bin/bench-profile}
	mkdir -p "$out"
	out=$(cd "$out" && pwd)
	load='^BenchmarkGateGatedParallel$/^store=split$/^fsync=always$'
	echo "== gate under load: $load (32 goroutines, fsync always), profiles in $out"
	$GO test ./server -count=1 -run '^$' -bench "$load" -benchtime 3s -benchmem \
		-o "$out/server.test" -cpuprofile "$out/cpu.pprof" -memprofile "$out/mem.pprof" | grep -E '^(Benchmark|ok|FAIL)'
	echo "== CPU, top 15 (flat)"
	$GO tool pprof -top -nodecount=15 "$out/server.test" "$out/cpu.pprof" 2>/dev/null | tail -n +5
	echo "== allocated space, top 15"
	$GO tool pprof -top -nodecount=15 -sample_index=alloc_space "$out/server.test" "$out/mem.pprof" 2>/dev/null | tail -n +5
	echo "== allocated objects, top 15"
	$GO tool pprof -top -nodecount=15 -sample_index=alloc_objects "$out/server.test" "$out/mem.pprof" 2>/dev/null | tail -n +5
	echo "== gate hot path, allocs/op: a bare mcp-go call, the gated call without fsync (strict decode, decide, reserve, audit encode and write)"
	hot=$("$out/server.test" -test.run '^$' -test.benchmem -test.benchtime 20000x \
		-test.bench '^BenchmarkGateBare$|^BenchmarkGateGated$/^store=split$/^fsync=none$' | grep -E '^Benchmark')
	echo "$hot"
	echo "$hot" | awk '$1 ~ /^BenchmarkGateBare-/ { for (i = 3; i < NF; i++) if ($(i+1) == "allocs/op") b = $i }
		$1 ~ /^BenchmarkGateGated\// { for (i = 3; i < NF; i++) if ($(i+1) == "allocs/op") g = $i }
		END { if (b == "" || g == "") { print "bench-profile: allocs/op missing" > "/dev/stderr"; exit 1 }
		      printf "gate hot path: %d allocs/op on top of the bare call (%d gated, %d bare)\n", g - b, g, b }'
	exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "bench: building vmgate, test binaries and vmgate-bench in $work" >&2
$GO build -o "$work/vmgate" ./cmd/vmgate
# The helper the session row pushes into the lab VM, found beside vmgate.
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $GO build -trimpath -ldflags='-s -w' -o "$work/vmgate-guest-linux-amd64" ./cmd/vmgate-guest
for pkg in server policy/audit internal/pluginhost internal/guestctl; do
	$GO test -c -o "$work/$(basename "$pkg").test" "./$pkg"
done
(cd bench && $GO build -o "$work/vmgate-bench" . && $GO build -o "$work/plugins/vmgate-plugin-fleet" ./fleetplugin)
"$work/vmgate-bench" -vmgate "$work/vmgate" -tests "$work" -src "$root" -plugins "$work/plugins" "$@"
