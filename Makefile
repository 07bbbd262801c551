# vmgate: build, test, demo, install, package. `make test` is what CI runs
# (through .ci/run).
GO      ?= go
BIN     ?= bin
VMGATE  := $(BIN)/vmgate
PKGS    := ./...

# Install locations (make install PREFIX=… DESTDIR=…).
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib/vmgate
UNITDIR    ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
DESTDIR    ?=

# The version `vmgate version` prints and the package carries: the last
# commit's date and hash (a Debian version must start with a digit).
VERSION ?= $(shell git log -1 --format='0.0.0~git%cd.%h' --date=format:%Y%m%d%H%M%S 2>/dev/null || echo 0.0.0~dev)
# nfpm builds the .deb (no dpkg tooling needed), pinned.
NFPM    ?= github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
DEBARCH ?= $(shell $(GO) env GOARCH)

.PHONY: all build test lint demo deps clean bench bench-profile chaos chaos-long install uninstall deb

all: build

# vmgate plus the in-guest helper for both guest architectures; vmgate finds
# the helper beside its own binary or in ../lib/vmgate from it, and pushes
# it into guests that lack it.
build:
	$(GO) build -ldflags '-X main.version=$(VERSION)' -o $(VMGATE) ./cmd/vmgate
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

# vmgate in BINDIR, the guest helpers in LIBDIR, the systemd unit
# vmgate.service in UNITDIR, and SYSCONFDIR/vmgate/vmgate.yaml unless one
# is there already (packaging/).
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/vmgate
	install -m 0755 $(VMGATE) $(DESTDIR)$(BINDIR)/vmgate
	install -m 0755 $(BIN)/vmgate-guest-linux-amd64 $(BIN)/vmgate-guest-linux-arm64 $(DESTDIR)$(LIBDIR)/
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' packaging/vmgate.service.in >$(BIN)/vmgate.service
	install -m 0644 $(BIN)/vmgate.service $(DESTDIR)$(UNITDIR)/vmgate.service
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/vmgate/vmgate.yaml ]; then \
	  echo "install: keeping $(DESTDIR)$(SYSCONFDIR)/vmgate/vmgate.yaml"; \
	else \
	  install -m 0644 packaging/vmgate.yaml $(DESTDIR)$(SYSCONFDIR)/vmgate/vmgate.yaml; \
	fi

# Removes what install put in place; the config only when it is still the
# one install wrote, the state directory (/var/lib/vmgate) never.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/vmgate $(DESTDIR)$(UNITDIR)/vmgate.service \
	  $(DESTDIR)$(LIBDIR)/vmgate-guest-linux-amd64 $(DESTDIR)$(LIBDIR)/vmgate-guest-linux-arm64
	-rmdir $(DESTDIR)$(LIBDIR) 2>/dev/null
	@if cmp -s packaging/vmgate.yaml $(DESTDIR)$(SYSCONFDIR)/vmgate/vmgate.yaml; then \
	  rm -f $(DESTDIR)$(SYSCONFDIR)/vmgate/vmgate.yaml; rmdir $(DESTDIR)$(SYSCONFDIR)/vmgate 2>/dev/null || true; \
	elif [ -e $(DESTDIR)$(SYSCONFDIR)/vmgate/vmgate.yaml ]; then \
	  echo "uninstall: keeping the edited $(DESTDIR)$(SYSCONFDIR)/vmgate/vmgate.yaml"; \
	fi

# bin/vmgate_VERSION_ARCH.deb: `make install PREFIX=/usr` into a staging
# directory, packaged by nfpm (packaging/nfpm.yaml) with the config as a
# conffile.
deb:
	rm -rf $(BIN)/deb-root
	$(MAKE) install PREFIX=/usr DESTDIR=$(abspath $(BIN))/deb-root
	install -d $(BIN)/deb-root/.scripts
	install -m 0755 packaging/postinst packaging/prerm packaging/postrm $(BIN)/deb-root/.scripts/
	cd $(BIN)/deb-root && VMGATE_VERSION='$(VERSION)' VMGATE_ARCH='$(DEBARCH)' \
	  $(GO) run $(NFPM) package --config $(CURDIR)/packaging/nfpm.yaml --packager deb --target $(abspath $(BIN))/

clean:
	rm -rf $(BIN)
