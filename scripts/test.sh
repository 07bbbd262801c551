#!/usr/bin/env bash
# Runs vet and the whole test suite, keeps the verbose log, and prints a
# summary that shows which tests ran on a real VM (and that none was skipped
# when VMGATE_REQUIRE_VM=1).
set -euo pipefail
cd "$(dirname "$0")/.."

go vet ./...

log=$(mktemp -t vmgate-test.XXXXXX.log)
status=0
go test -count=1 -timeout 20m -v ./... >"$log" 2>&1 || status=$?
# bench/ is a module of its own (it carries OPA for the decision baseline).
if [ "$status" -eq 0 ]; then
	(cd bench && go vet ./... && go test -count=1 -timeout 10m -v ./...) >>"$log" 2>&1 || status=$?
fi

# Top-level results, skips and failures; the package lines last (go test's own closing lines).
grep -E '^(--- (PASS|FAIL|SKIP)|panic:)' "$log" || true
skips=$(grep -cE '^\s*--- SKIP' "$log" || true)
echo "skipped tests (any level): $skips"
grep -E -B2 -A12 '^\s*--- FAIL' "$log" | head -n 300 || true
grep -E '^(ok|FAIL|\?)\s' "$log" || true
if [ "$status" -ne 0 ]; then
	echo "go test failed (exit $status); full log: $log"
	tail -n 60 "$log"
fi
exit "$status"
