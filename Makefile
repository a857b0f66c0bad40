# nox-mesh-host. Two commands for a newcomer on a fresh machine (root, Go):
#   make demo   the main job on an embedded default
#   make test   every test, installing the Debian packages the tests need
SHELL   := /bin/bash
.SHELLFLAGS := -o pipefail -c
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GO      ?= go
BIN     := bin
# The agent compares its build with the executor's at every hello, and
# restarts onto its own new binary when they differ: stamp both the same.
BUILD   ?= $(VERSION)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.build=$(BUILD)
export CGO_ENABLED := 0

.PHONY: all build test test-deps demo bench bench-scale chaos soak fuzz lint deps clean package package-files deb apk arch tarball

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# Debian packages the tests need, installed only when missing.
# nfpm, which the package targets run as a tool, is fetched here: on a
# fresh machine its first run says "go: downloading" on standard error,
# which the package test holds the targets never to do.
test-deps:
	bash tests/install-deps.sh
	@$(NFPM) --version >/dev/null

# Every test: unit tests, fuzz seeds, the import rules, the rescue command
# end to end (crash and hostile-user tests). Runs as root.
test: test-deps
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 25m ./...
	$(GO) test -count=1 -tags chaosclock ./clock

demo: build
	bash examples/demo.sh $(BIN)

bench:
	bash tests/bench/run.sh

# The fleet at scale: NODES simulated nodes (the agent's own link
# code, in this one process, each against an in-process stand-in for its
# executor) against `mesh-control serve` and its embedded broker, a child
# process built into the bench's work directory. Prints a table, MISS for
# each target missed; docs/benchmarks.md keeps the figures. CLUSTER=1
# measures against three nats-server processes (built from the module)
# configured by broker-config --cluster (RESOLVER=1: in NATS operator mode,
# broker-config --cluster --resolver); CONTENDED=1 keeps one core busy
# throughout (a process of the bench's own) and judges the contended
# targets. BENCH_SCALE_ARGS go to the bench
# (e.g. "-overlay-timeout 5m", "-profile DIR" for CPU profiles,
# "-declares-only" for three fan-outs' declares with no agent linked);
# TAGS=benchconstwindow builds the bench with the fan-outs' window held at
# 256, to compare with the adapting one.
NODES   ?= 10000
CLUSTER ?=
RESOLVER ?=
CONTENDED ?=
bench-scale:
	$(GO) run $(if $(TAGS),-tags $(TAGS)) ./tests/bench/scale -nodes $(NODES) $(if $(filter 1,$(CLUSTER)),-cluster) $(if $(filter 1,$(RESOLVER)),-resolver) $(if $(filter 1,$(CONTENDED)),-contended) $(BENCH_SCALE_ARGS)

# The chaos run: a control side, NODES_CHAOS nodes (real executors and
# agents, each in its own namespace and state) and the real CLI, driven by
# STEPS steps of operators' commands and faults drawn from SEED (empty: a
# seed from the clock, printed), the invariants checked after each. A
# failure prints its seed and steps: make chaos SEED=N replays it.
# docs/chaos.md. `make test` runs a few fixed seeds (TestChaosShort).
SEED        ?=
STEPS       ?= 200
NODES_CHAOS ?= 3
chaos:
	$(GO) run ./tests/chaos -steps $(STEPS) -nodes $(NODES_CHAOS) $(if $(SEED),-seed $(SEED)) $(CHAOS_ARGS)

# The soak: the chaos run's mesh with no fault, for SOAK_TIME, through as
# many declarations (drift repairs, archive changes, revocations and
# re-enrolments) as it allows, every state, daemon and stream sampled; it
# fails for whatever still grows over its second half, and prints the table.
SOAK_TIME ?= 30m
soak:
	$(GO) run ./tests/chaos -soak $(SOAK_TIME) -nodes $(NODES_CHAOS) $(if $(SEED),-seed $(SEED)) $(CHAOS_ARGS)

# Longer fuzzing than the seeds `make test` runs.
FUZZTIME ?= 60s
fuzz:
	$(GO) test ./shapes -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME)
	$(GO) test ./shapes -run '^$$' -fuzz FuzzFastDecode -fuzztime $(FUZZTIME)
	$(GO) test ./shapes -run '^$$' -fuzz FuzzAppendJSONString -fuzztime $(FUZZTIME)
	$(GO) test ./shapes -run '^$$' -fuzz FuzzParseRoster -fuzztime $(FUZZTIME)
	$(GO) test ./executor/store -run '^$$' -fuzz FuzzJournal -fuzztime $(FUZZTIME)
	$(GO) test ./executor/store -run '^$$' -fuzz FuzzSnapshot -fuzztime $(FUZZTIME)
	$(GO) test ./executor/store -run '^$$' -fuzz FuzzHistory -fuzztime $(FUZZTIME)
	$(GO) test ./executor/engine -run '^$$' -fuzz FuzzReadArchive -fuzztime $(FUZZTIME) -fuzzminimizetime 5s
	$(GO) test ./wire -run '^$$' -fuzz FuzzFrame -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzOpen$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzParseToken$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzParseGrant$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzOpenRotation$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzDecodeRotationChain$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzParseBrokerPins$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzParseRekeyAnswer$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzParseUserJWT$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzOpenSealed$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzReadRequest$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzReadAnswer$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzLinkErrorText$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzParseEnrolRefusal$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzParseStoreCopy$$' -fuzztime $(FUZZTIME)
	$(GO) test ./executor/dockerapi -run '^$$' -fuzz FuzzReadResponse -fuzztime $(FUZZTIME)
	$(GO) test ./executor/profile -run '^$$' -fuzz FuzzParseProc -fuzztime $(FUZZTIME)
	$(GO) test ./executor/edit -run '^$$' -fuzz '^FuzzRegion$$' -fuzztime $(FUZZTIME)
	$(GO) test ./executor/edit -run '^$$' -fuzz '^FuzzKeys$$' -fuzztime $(FUZZTIME)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...

# Each binary's dependency list, checked in so a new one shows up in review.
deps:
	for c in cmd/*/; do GOOS=linux GOARCH=amd64 $(GO) list -deps ./$$c > $$c/deps.txt; done

# Packages, with nfpm run as a tool (the module does not depend on it): a
# .deb, an Alpine .apk, an Arch package and a tarball of the static
# binaries, into $(DIST)/. The binaries are stamped with the package's
# version, which the upgrade compares with the declared one.
NFPM        ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
DIST        ?= dist
PKG_ARCH    ?= amd64
PKG_VERSION ?= $(shell v=$$(git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null) && echo $${v\#v} || echo 0.0.$$(git rev-list --count HEAD 2>/dev/null || echo 0))
PKG_TARBALL := nox-mesh-host-$(PKG_VERSION)-linux-$(PKG_ARCH).tar.gz
# The carried bundle the packages ship (/usr/lib/nox-mesh-host/foundation.lock)
# and whose SHA-256 the executor is stamped with: `mesh-executor reconcile`
# applies that bundle and no other. BUNDLE=FILE builds packages that carry
# another (docs/operations.md, "Another bundle").
BUNDLE      ?= packaging/foundation.lock
BUNDLE_SHA   = $(shell sha256sum < $(BUNDLE) | cut -d' ' -f1)
# The package targets say only the files they made, a path a line, which
# a script may read; V=1 says every command as make runs it, and nfpm's
# own words. Errors are said either way (on standard error), and a
# failed nfpm fails the target through the pipe (pipefail).
ifeq ($(V),1)
Q    :=
MADE := cat
else
Q    := @
# nfpm says its errors on standard output, beside the packager it uses
# and the package it made: the package's path is kept, the errors go to
# standard error.
MADE := awk '/^created package: /{ print substr($$0, 18); next } /^using [a-z]+ packager\.\.\.$$/{ next } { print > "/dev/stderr" }'
endif

package:
	$(Q)rm -rf $(DIST)
	@# The version and build this make computed, so that a commit landing
	@# meanwhile cannot stamp the binaries with another than the packages'.
	$(Q)$(MAKE) --no-print-directory package-files PKG_VERSION=$(PKG_VERSION) BUILD=$(BUILD)
	$(Q)for p in deb apk archlinux; do \
		DIST=$(DIST) BUNDLE=$(BUNDLE) PKG_VERSION=$(PKG_VERSION) PKG_ARCH=$(PKG_ARCH) $(NFPM) package -f packaging/nfpm.yaml -p $$p -t $(DIST)/ | $(MADE) || exit 1; \
	done
	@# The tarballs: the files at the paths the packages install them
	@# (packaging/tarball.sh), `tar -xzf … -C /` on a machine with no
	@# package manager; linux carries the control side and the bundle, so a
	@# first node is raised from the tarball alone.
	$(Q)sh packaging/tarball.sh $(DIST)/bin $(DIST)/$(PKG_TARBALL) $(BUNDLE) $(DIST)/share && echo $(DIST)/$(PKG_TARBALL)
	@# Cross-compiled static binaries: linux/arm64 (with the control side
	@# and the bundle it is stamped with), and android/arm64 (the root
	@# helper and the app's agent; no libc, Android's loader only; a partial
	@# host raises no control side).
	$(Q)CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -trimpath -ldflags '-s -w -X main.version=$(PKG_VERSION) -X main.build=$(BUILD) -X main.bundle=$(BUNDLE_SHA)' \
		-o $(DIST)/linux-arm64/ ./cmd/mesh-executor ./cmd/mesh-agent ./cmd/mesh-launch ./cmd/mesh-control
	$(Q)sh packaging/tarball.sh $(DIST)/linux-arm64 $(DIST)/nox-mesh-host-$(PKG_VERSION)-linux-arm64.tar.gz $(BUNDLE) $(DIST)/share && echo $(DIST)/nox-mesh-host-$(PKG_VERSION)-linux-arm64.tar.gz
	$(Q)CGO_ENABLED=0 GOOS=android GOARCH=arm64 $(GO) build -trimpath -ldflags '-s -w -X main.version=$(PKG_VERSION) -X main.build=$(BUILD)' \
		-o $(DIST)/android-arm64/ ./cmd/mesh-executor ./cmd/mesh-agent ./cmd/mesh-launch
	$(Q)tar -C $(DIST)/android-arm64 --owner=0 --group=0 --mode=0755 -czf $(DIST)/nox-mesh-host-$(PKG_VERSION)-android-arm64.tar.gz mesh-executor mesh-agent mesh-launch && echo $(DIST)/nox-mesh-host-$(PKG_VERSION)-android-arm64.tar.gz
	$(Q)cd $(DIST) && sha256sum *.deb *.apk *.pkg.tar.zst *.tar.gz > SHA256SUMS && echo $(DIST)/SHA256SUMS

# What every package carries, into $(DIST)/: the static binaries, stamped
# (bin/), and the completions (bash, zsh, fish) and man pages (share/),
# from each binary's own command definitions (cmdline), made by binaries
# built for this host (host/). package and each of deb, apk, arch and
# tarball start from it, so one system's package is the same as that
# system's from package.
package-files:
	@test -s $(BUNDLE) || { echo "BUNDLE=$(BUNDLE): no such bundle" >&2; exit 1; }
	$(Q)rm -rf $(DIST)/bin $(DIST)/host $(DIST)/share && mkdir -p $(DIST)/bin
	$(Q)GOOS=linux GOARCH=$(PKG_ARCH) $(GO) build -trimpath -ldflags '-s -w -X main.version=$(PKG_VERSION) -X main.build=$(BUILD) -X main.bundle=$(BUNDLE_SHA)' \
		-o $(DIST)/bin/ ./cmd/mesh-executor ./cmd/mesh-agent ./cmd/mesh-launch ./cmd/mesh-control
	@# Stamped too: each man page's header says the version it documents.
	$(Q)$(GO) build -ldflags '-X main.version=$(PKG_VERSION) -X main.build=$(BUILD)' -o $(DIST)/host/ ./cmd/mesh-executor ./cmd/mesh-agent ./cmd/mesh-launch ./cmd/mesh-control
	$(Q)sh packaging/gen-share.sh $(DIST)/host $(DIST)

# One system's package on request, into $(DIST)/ beside what is there
# already (package starts $(DIST)/ afresh): make deb, make apk, make arch
# (nfpm's archlinux), make tarball (linux/PKG_ARCH, as package's).
deb apk arch: package-files
	$(Q)DIST=$(DIST) BUNDLE=$(BUNDLE) PKG_VERSION=$(PKG_VERSION) PKG_ARCH=$(PKG_ARCH) $(NFPM) package -f packaging/nfpm.yaml -p $(if $(filter arch,$@),archlinux,$@) -t $(DIST)/ | $(MADE)

tarball: package-files
	$(Q)sh packaging/tarball.sh $(DIST)/bin $(DIST)/$(PKG_TARBALL) $(BUNDLE) $(DIST)/share && echo $(DIST)/$(PKG_TARBALL)

clean:
	rm -rf $(BIN)
