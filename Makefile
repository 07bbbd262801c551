# vmgate: build, test, demo. `make test` is what CI runs (through .ci/run).
GO      ?= go
BIN     ?= bin
VMGATE  := $(BIN)/vmgate
PKGS    := ./...

.PHONY: all build test lint demo deps clean bench bench-profile chaos chaos-long

all: build

# vmgate plus the in-guest helper for both guest architectures; vmgate finds
# the helper beside its own binary and pushes it into guests that lack it.
build:
	$(GO) build -o $(VMGATE) ./cmd/vmgate
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/vmgate-guest-linux-amd64 ./cmd/vmgate-guest
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/vmgate-guest-linux-arm64 ./cmd/vmgate-guest

# Installs what the tests need (deps), then runs vet, the go.mod check and
# every test. Tests that need a VM boot their own lab VMs; with
# VMGATE_REQUIRE_VM=1 (CI) they fail rather than skip when QEMU is missing,
# and any skipped test not on scripts/test-skips.allow fails the run.
test: deps
	scripts/test.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# Installs what the tests need and is missing: the Debian packages (root or
# sudo), node and npm, the end-to-end tests' npm packages (scripts/deps.sh).
deps:
	scripts/deps.sh

# The main job on embedded defaults: installs what is missing, builds, boots
# the lab VM and serves vmgate over HTTP on 127.0.0.1:8707, printing how to
# connect Claude Desktop, Claude Code and the MCP Inspector.
demo:
	scripts/demo.sh

# The reliability campaign against real servers, VMs and Redis: load, replicas,
# kill -9, faults, hostile input, an initialize flood (60 s here; 10 s in the
# short form `make test` runs). The long form is bounded too (about half an hour).
chaos:
	VMGATE_CHAOS_FLOOD=60s go test -count=1 -timeout 12m -v ./chaos/

chaos-long:
	VMGATE_CHAOS=long go test -count=1 -timeout 40m -v ./chaos/
	go test -run '^$$' -fuzz FuzzDecodeArguments -fuzztime 2m ./server/

# One table of ratios against baselines measured in the same run (A B A B …
# after a warm-up): exec latency, gate cost, Decide vs OPA, plugin boundary,
# audit group commit, scale, memory. The OPA baseline lives in the separate
# bench/ module so the product does not carry it.
bench:
	scripts/bench.sh

# CPU and allocation profiles of the gate under load.
bench-profile:
	scripts/bench.sh profile $(BIN)/bench-profile

clean:
	rm -rf $(BIN)
