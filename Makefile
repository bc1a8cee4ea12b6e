# TenantPlane. `make test` builds what it needs (the test control plane once, then cached) and
# runs every test; `make testenv` builds only the control plane. Caches live outside the checkout.

CACHE ?= $(HOME)/.cache/tenantplane
export TENANTPLANE_CACHE := $(CACHE)
export CARGO_TARGET_DIR ?= $(CACHE)/target
export GOTOOLCHAIN := local
CARGO ?= cargo

.PHONY: test unit testenv lint crds build demo bench-controller bench-sync bench-sleep bench-snapshot conformance docs

## test: every test, unit and against the real control plane (builds the control plane if missing).
## `xtask suite` builds the test binaries, then runs up to TEST_JOBS of them at once, each in
## network, mount and PID namespaces of its own (testenv/isolated.sh), longest first, beside each
## other only while the CPU shares they used last time add up to TEST_CPU percent of the machine
## and the inotify instances they held fit in those free. A binary with real nodes holds 40 to
## 100, so the per-user limit (128 by default) is raised to TEST_INOTIFY first when lower;
## TEST_THREADS tests at once in each binary. Every binary runs even after one fails; the failures'
## logs are printed as they end, and a table of every binary's seconds at the end.
TEST_THREADS ?= 4
TEST_JOBS ?= 3
TEST_CPU ?= 100
TEST_INOTIFY ?= 512
test: testenv
	$(CARGO) run -q -p xtask --locked -- suite --jobs $(TEST_JOBS) --cpu $(TEST_CPU) --inotify-limit $(TEST_INOTIFY) --isolate testenv/isolated.sh \
	  -- --workspace --locked -- --test-threads=$(TEST_THREADS)

## unit: every test that needs no cluster (each crate's own tests, the admission rules run offline,
## the doc tests); builds no Go and starts no control plane
unit:
	$(CARGO) run -q -p xtask --locked -- suite --jobs 2 -- --workspace --locked --lib --bins --test admission

## demo: the local dev cluster with the example tenant, until Ctrl-C (state in .tenantplane/dev)
demo: testenv
	$(CARGO) build -q -p tenantplane --locked
	$(CARGO_TARGET_DIR)/debug/tenantplane dev --state-dir .tenantplane/dev

## bench-controller: N tenants (default 100) on the test control plane; prints times, requests, memory
bench-controller: N ?= 100
bench-controller: testenv
	N=$(N) $(CARGO) bench -p tenantplane --locked --bench controller

## bench-sleep: N tenants (default 10) with PODS pods each (default 3), awake and idle, then put
## to sleep, then woken one at a time; prints host memory, pods and CPU awake and asleep, the time
## from a wake request to the tenant's first answer (p50/p99), and how many idle tenants fit
bench-sleep: N ?= 10
bench-sleep: PODS ?= 3
bench-sleep: testenv
	N=$(N) PODS=$(PODS) bash testenv/isolated.sh $(CARGO) bench -p tenantplane --locked --bench sleep

## bench-snapshot: snapshots of kine-shaped databases of OBJECTS objects (default 1000,10000,50000;
## or one of SIZE_MIB MiB) while a writer commits, agent → operator → S3 store (SeaweedFS), and
## their restores; prints times and the peak memory of the agents and of the operator's side
bench-snapshot: OBJECTS ?= 1000,10000,50000
bench-snapshot: testenv
	OBJECTS=$(OBJECTS) SIZE_MIB=$(SIZE_MIB) bash testenv/isolated.sh $(CARGO) bench -p tenantplane --locked --bench snapshot

## bench-sync: IDLE pods (default 50) one at a time in an idle tenant ("idle hop" p50/p99), then N
## pods (default 1000) spread over TENANTS tenants (default 1, one operator for all) through their
## syncers, then straight on the host; prints both times and their ratio, p50/p99 of the syncers'
## hops, their stages, the tenant control planes' memory, the host's open WATCH requests per tenant,
## requests, the process's memory and CPU, and every process's CPU idle and in each run. FAULTS=1 instead runs the fault drills (tests/sync_faults.rs)
## with N pods through one tenant: the host API server restarted, the operator killed (a standby
## leads), the tenant API server restarted, kine killed; prints each drill's duplicates, orphans,
## lost copies, status mismatches and time to settle
bench-sync: N ?= 1000
bench-sync: TENANTS ?= 1
bench-sync: IDLE ?= 50
bench-sync: FAULTS ?= 0
bench-sync: testenv
ifeq ($(FAULTS),1)
	FAULT_BURST=$(N) bash testenv/bench-faults.sh $(CARGO)
else
	N=$(N) TENANTS=$(TENANTS) IDLE=$(IDLE) $(CARGO) bench -p tenantplane --locked --bench sync
endif

## conformance: the upstream [Conformance] tests on the dev cluster's host (a real node) and in a
## tenant at once, in namespaces of their own with no way out; prints the table, the host's passes
## and `conformance parity: X/Y` (CONFORMANCE_NODES, _FOCUS, _SKIP, _PROCS, _TIMEOUT: see the script)
conformance: testenv
	bash testenv/conformance.sh

## testenv: build the control plane (etcd, kube-apiserver, controller manager, scheduler, kubectl,
## kwok, kine, coredns, helm), the real node (kubelet, kube-proxy, containerd, runc, CNI plugins,
## registry) and the test world's images
testenv:
	@bash testenv/images.sh "$$(bash testenv/build.sh)" >/dev/null

## lint: rustfmt, and clippy with warnings as errors: its default lints and the workspace's
## (Cargo.toml's [workspace.lints]: a doc comment on every public item, and the clippy lints listed
## there); then no import circle between a crate's modules (xtask)
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) run -q -p xtask --locked -- circles

## docs: check every link of the README and the book, then build the book (docs/) into $(CACHE)/book;
## mdbook is installed from crates.io into $(CACHE)/tools the first time (a few minutes)
docs: MDBOOK_VERSION := 0.5.4
docs: MDBOOK := $(CACHE)/tools/bin/mdbook
docs:
	@bash docs/check-links.sh
	@if [ "$$($(MDBOOK) --version 2>/dev/null)" != "mdbook v$(MDBOOK_VERSION)" ]; then \
	  echo "docs: installing mdbook $(MDBOOK_VERSION) into $(CACHE)/tools (once, a few minutes)"; \
	  $(CARGO) install mdbook --locked --version $(MDBOOK_VERSION) \
	    --no-default-features --features search --root $(CACHE)/tools; \
	fi
	@echo "docs: building the book into $(CACHE)/book"
	@$(MDBOOK) build docs --dest-dir $(CACHE)/book

## crds: regenerate deploy/crds and the Helm chart's copy (charts/tenantplane/crds) from the Rust types
crds:
	$(CARGO) run -q -p tenantplane --locked -- crds --out deploy/crds
	$(CARGO) run -q -p tenantplane --locked -- crds --out charts/tenantplane/crds

## build: the tenantplane binary
build:
	$(CARGO) build -p tenantplane --locked
