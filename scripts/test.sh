#!/usr/bin/env bash
# Runs vet, checks that go.mod says which requirements are direct (go mod
# tidy -diff), runs the whole test suite, keeps the verbose log, and prints
# a summary. With VMGATE_REQUIRE_VM=1 (CI) a skipped test fails the run
# unless scripts/test-skips.allow lists it.
set -euo pipefail
cd "$(dirname "$0")/.."

go vet ./...
if ! go mod tidy -diff >/dev/null; then
	echo "go.mod or go.sum is not tidy (run go mod tidy):"
	go mod tidy -diff || true
	exit 1
fi

# The long poles first. go test runs -p packages at a time (one per core)
# in the order given, so a long package started last is the run's tail:
# in CI run 38 (2 cores), go list's order kept one core busy 1,451 s where
# longest-first needs 1,339 s. The list is the packages' wall times there,
# longest first; packages not on it follow in go list's order.
long_poles=(
	internal/guestctl plugins/virtualbox e2e chaos plugins/proxmox plugins/libvirt
	plugins/qemu internal/lab internal/pluginhost internal/pveemu internal/readmetest
	hypervisor/hypervisortest internal/vboxemu cmd/vmgate-guest guest/image
)
mod=$(go list -m)
mapfile -t all < <(go list ./...)
pkgs=()
for p in "${long_poles[@]}"; do
	if [[ " ${all[*]} " == *" $mod/$p "* ]]; then pkgs+=("$mod/$p"); fi
done
for p in "${all[@]}"; do
	if [[ " ${pkgs[*]} " != *" $p "* ]]; then pkgs+=("$p"); fi
done

log=$(mktemp -t vmgate-test.XXXXXX.log)
status=0
# -timeout is a backstop per package: the tests' own waits are bounded
# (their deadlines scale with the machine's load up to a cap: package
# internal/testload), and on a busy machine a VM-heavy package takes
# several times its idle 10 minutes.
go test -count=1 -timeout 60m -v "${pkgs[@]}" >"$log" 2>&1 || status=$?
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

# Skipped tests as "PACKAGE TEST" (go test prints each package's output
# together, ending with its ok/FAIL line), and node test runs that skipped.
skipped=$(awk -v mod="github.com/vmgate/vmgate" '
	$1 == "---" && $2 == "SKIP:" { pending[n++] = $3; next }
	/ℹ skipped [1-9]/ { pending[n++] = "(node tests: " $NF " skipped)"; next }
	/^(ok|FAIL|\?)[[:space:]]/ {
		pkg = $2
		if (pkg == mod) pkg = "."; else sub("^" mod "/", "", pkg)
		for (i = 0; i < n; i++) print pkg " " pending[i]
		n = 0
	}' "$log")
if [ -n "${VMGATE_REQUIRE_VM:-}" ] && [ -n "$skipped" ]; then
	unlisted=$(grep -vxF -f <(grep -vE '^\s*(#|$)' scripts/test-skips.allow) <<<"$skipped" || true)
	if [ -n "$unlisted" ]; then
		echo "VMGATE_REQUIRE_VM is set and these tests skipped (not on scripts/test-skips.allow):"
		echo "$unlisted"
		[ "$status" -ne 0 ] || status=1
	fi
fi
if [ "$status" -ne 0 ]; then
	echo "tests failed (status $status); full log: $log"
	tail -n 60 "$log"
fi
exit "$status"
