# agentq: one command each for set-up, check, test, bench and demo.
# Every install step lives here, so a fresh clone on a fresh machine only needs
# Python 3.11+, Go 1.26+ and make.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: help venv lock release system-deps controlplane helm keda node-deps node image e2e check lint typecheck imports unit integration test test-fast test-kopf chaos bench bench-load bench-e2e soak demo demo-down clean polyglot-deps polyglot-generate polyglot-test

help:
	@echo "make test     set up everything, then run checks and the whole test suite (in parallel)"
	@echo "make test-fast  unit tests and the in-memory harness only (no control plane; ~1 min)"
	@echo "make demo     run agentq on the embedded control plane"
	@echo "make chaos    the seeded 1,000-task chaos run (writes docs/reliability.md); SEED=n"
	@echo "make bench    run the benchmarks (writes docs/benchmarks.md)"
	@echo "make bench-load  the operator under load on the embedded control plane (docs/benchmarks.md)"
	@echo "make bench-e2e   no-op tasks through real sidecars vs a plain client's ceiling (docs/benchmarks.md)"
	@echo "make soak     30 minutes at a steady rate with a short TTL: does anything grow (docs/benchmarks.md)"
	@echo "make check    ruff, mypy, import-linter"
	@echo "make polyglot-deps  the Go modules and npm packages of the example agents (examples/agents)"
	@echo "make polyglot-generate  their types again from docs/agent-api.openapi.yaml"
	@echo "make lock     requirements/*.lock (hashes) from the pyproject pins"
	@echo "make helm     build helm (for charts/agentq) from the Go module proxy, once per machine"
	@echo "make keda     build KEDA (operator, metrics adapter) from the Go module proxy, once per machine"
	@echo "make node     what 'agentq cluster up --node' needs (Debian packages, kubelet)"
	@echo "make image    build the agentq image (private dockerd, local Debian base)"
	@echo "make release VERSION=x.y.z  the release's artifacts into dist/release/<version>/"
	@echo "make e2e      real pods on a local node: tests/node, the chart with the e2e scenario, KEDA (root)"

# Three distributions, installed editable in one command (so that pip takes the
# local agentq-agent and agentq for the pins of the others): agentq (operator/, the
# product), agentq-agent (sdk/, the agent SDK) and agentq-dev (tools/, the control
# plane, demo, simulator); docs/install.md, "Distributions".
# Every third-party package comes from requirements/dev.lock, each file checked against
# its sha256 (--require-hashes); the three local distributions add nothing (--no-deps)
# and are built with the lock's setuptools (--no-build-isolation).
$(STAMP): pyproject.toml sdk/pyproject.toml tools/pyproject.toml requirements/dev.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet --require-hashes -r requirements/dev.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation \
	  -e ./sdk -e '.[test,dev]' -e './tools[plot]'
	touch $@

venv: $(STAMP)

# The lock files (requirements/*.lock) from the pins of the pyproject files, with
# hashes: run after changing a pin (uv, pinned here, in a virtualenv of its own).
UV_VERSION := 0.13.8
lock:
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet uv==$(UV_VERSION)
	PATH="$(CURDIR)/.lock-venv/bin:$$PATH" $(PYTHON) requirements/lock.py

# libfaketime lets a test step the operator's wall clock for real; PostgreSQL's server
# backs the fenced-sink tests. Installed from Debian's packages when missing and we may
# (root with apt-get); elsewhere their tests are skipped and say so.
system-deps:
	@if ! command -v faketime >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing faketime (Debian package)"; \
	    (apt-get install -y -qq faketime >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq faketime >/dev/null 2>&1)) || \
	    echo "warning: could not install faketime; its test will be skipped"; \
	  else echo "note: faketime not installed; the wall-clock test will be skipped"; fi; \
	fi
	@# PostgreSQL's server: the fenced-sink tests start a real one as their own process.
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing postgresql (Debian package)"; \
	    (apt-get install -y -qq postgresql >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq postgresql >/dev/null 2>&1)) || \
	    echo "warning: could not install postgresql; the PostgreSQL fencing tests will fail"; \
	  else echo "note: postgresql not installed; the PostgreSQL fencing tests will be skipped"; fi; \
	fi

# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from the Go
# module proxy once per machine (cached outside the repo), or finds them.
controlplane: venv
	$(BIN)/agentq cluster build

# helm (charts/agentq's tests, make e2e), built the same way into
# ~/.cache/agentq/helm/<version>/helm, or found (a helm of that version on PATH).
helm: venv
	$(BIN)/agentq cluster build --helm

# KEDA (an agent pool scaled 0 -> N -> 0 on the queue; docs/autoscaling.md; make test's
# KEDA integration tests and make e2e), its
# module downloaded from the Go module proxy and built, binaries into
# ~/.cache/agentq/keda/<version>/bin and its Go build cache (>3 GB) into
# ~/.cache/agentq/keda/<version>/gocache: ~17 min cold on 2 cores, minutes warm.
keda: venv
	$(BIN)/agentq cluster build --keda

# The local node (`agentq cluster up --node`, `make e2e`): Debian's containerd,
# runc, CNI plugins and iptables/nftables, and for building images Debian's
# dockerd and debootstrap (installed as root with apt-get; no service is started).
NODE_PACKAGES := containerd runc containernetworking-plugins iptables nftables docker.io debootstrap

node-deps:
	@e2e/node/install-deps.sh $(NODE_PACKAGES)

# kubelet, kube-scheduler and the pause program, built like the control plane.
node: venv node-deps controlplane
	$(BIN)/agentq cluster build --node

# The agentq image, built with a private dockerd on a local Debian base (no
# registry needed), saved to ~/.cache/agentq/images/agentq-dev.tar and imported
# into the local node if one runs.
image: venv node-deps
	$(BIN)/agentq cluster image

# Real pods on a local node (root), on one cluster, in this order: tests/node (node
# lifecycle, crash recovery, the image as non-root); the Helm chart installed, the e2e
# scenario on it (e2e/test_scenario.py's run_scenario), the chart upgraded to a second
# build with tasks running and uninstalled (e2e/test_helm.py); an agent pool
# autoscaled by KEDA 0 -> N -> 0 (e2e/test_keda.py); leaving the host as it found it.
# Builds what it needs first (packages, kubelet, image, helm, KEDA). The scenario on
# the kustomize base: pytest e2e/test_scenario.py (e2e/kind/run.sh on kind).
# Then two teams sharing one agent pool on the kustomize base (e2e/test_tenancy.py),
# on a cluster of its own.
e2e: venv node image helm keda
	AGENTQ_REQUIRE_NODE=1 $(BIN)/pytest -s tests/node e2e/test_helm.py e2e/test_keda.py
	AGENTQ_REQUIRE_NODE=1 $(BIN)/pytest -s e2e/test_tenancy.py

# A release's artifacts into dist/release/<version>/ (tools/src/agentq/release.py;
# docs/upgrading.md, "Releases"): the image (built here: root, a private dockerd) and its
# digest, the rendered manifests and CRDs, the chart package, wheels and sdists of agentq
# and agentq-agent, the CHANGELOG section and SHA256SUMS. A VERSION that is not semver,
# has no CHANGELOG.md section or is not the sources' version is refused before anything
# is built. RELEASE_ARGS adds options (--image-archive PATH: retag that image instead).
VERSION ?=
RELEASE_ARGS ?=
release: venv
	@if [ -z "$(VERSION)" ]; then echo "error: say the version: make release VERSION=x.y.z"; exit 2; fi
	$(BIN)/python -m agentq.release --check-only "$(VERSION)"
	$(MAKE) --no-print-directory node-deps controlplane helm
	$(BIN)/python -m agentq.release "$(VERSION)" --out dist/release $(RELEASE_ARGS)

lint: venv
	$(BIN)/ruff check operator sdk tools tests bench e2e image requirements
	$(BIN)/ruff format --check operator sdk tools tests bench e2e image requirements

typecheck: venv
	$(BIN)/mypy

# agentq imported first: its __init__ joins the three source roots into the package,
# where import-linter finds the modules of all three.
imports: venv
	$(BIN)/python -c 'import sys, agentq, importlinter.cli; sys.exit(importlinter.cli.lint_imports_command())'

check: lint typecheck imports

unit: venv
	$(BIN)/pytest tests/unit sdk/tests

integration: venv system-deps controlplane helm keda polyglot-deps
	$(BIN)/pytest tests/integration

# Parallel runs (pytest-xdist): TEST_WORKERS processes against one shared control plane
# and work handed out in groups (tests/parallel.py, tests/conftest.py). Most of
# the suite waits on real time (leases, processes), so more workers than cores pay: 4
# measured best on 2 cores (docs/testing.md). PYTEST_FLAGS adds options
# (.ci/run: --durations=20).
TEST_WORKERS ?= 4
FAST_WORKERS ?= 2
PYTEST_FLAGS ?=
PARALLEL = --dist loadscope --no-loadscope-reorder

# The fast tier: unit tests and the in-memory harness (tests/harness.py); no control
# plane, no process of the product started.
test-fast: venv
	$(BIN)/pytest -m unit -n $(FAST_WORKERS) $(PARALLEL) $(PYTEST_FLAGS) tests/unit tests/chaos sdk/tests

# Everything but tests/node (real pods on a local node, `make e2e`): unit, integration
# and slow, in parallel.
test: venv system-deps controlplane helm keda polyglot-deps check
	$(BIN)/pytest -m "not node" -n $(TEST_WORKERS) $(PARALLEL) $(PYTEST_FLAGS)

# The operator's liveness tests again with kopf's watches (--watcher kopf): both watcher
# modes are held to the same guarantees (docs/operator.md); CI runs both.
test-kopf: venv system-deps controlplane
	AGENTQ_TEST_WATCHER=kopf $(BIN)/pytest -n $(TEST_WORKERS) $(PARALLEL) $(PYTEST_FLAGS) \
	  tests/integration/test_operator_liveness.py

# The seeded chaos run on its own embedded control plane (tests/chaos): 1,000 tasks,
# faults of every kind; writes its figures into docs/reliability.md.
SEED ?= 1
chaos: venv system-deps controlplane
	PYTHONPATH=tests $(BIN)/python -m chaos --seed $(SEED) --write-doc

bench: venv
	$(BIN)/python bench/scheduler_bench.py

# The operator under load (not part of make test: it takes ~15 minutes and wants a quiet
# machine). --queues 1,4: the 1,000-task backlog also over 1 and over 4 AgentQueues, against
# the plain one of the same run (issue 20: within 10 %). BENCH_LOAD_ARGS adds or overrides options, e.g. a before/after comparison:
#   git archive main | tar -x -C /tmp/main && make bench-load BENCH_LOAD_ARGS=--variants=new,baseline=/tmp/main
BENCH_LOAD_ARGS ?=
bench-load: venv controlplane
	$(BIN)/python bench/load_bench.py --variants new,kopf,threads --queues 1,4 --profile --costs --write-docs $(BENCH_LOAD_ARGS)

# No-op tasks through real sidecar + agent-sim processes, against a plain client making
# the same writes, in one run (not part of make test: a few minutes, and it wants a quiet
# machine). BENCH_E2E_ARGS adds options, e.g. --tasks 1000 --agents 8, or --src DIR to
# run another tree (git archive REV | tar -x -C DIR) for a before/after.
BENCH_E2E_ARGS ?=
bench-e2e: venv controlplane
	$(BIN)/python bench/e2e_bench.py --profile --write-docs $(BENCH_E2E_ARGS)

# 30 minutes at a steady rate with a short TTL (not part of make test); SOAK_ARGS adds
# options, e.g. --minutes 5 --rate 10. Deletion after the TTL needs branch life (issue 18).
SOAK_ARGS ?=
soak: venv controlplane
	$(BIN)/python bench/soak.py --write-docs $(SOAK_ARGS)

demo: venv controlplane
	$(BIN)/python -m agentq.demo $(DEMO_FLAGS)

# DEMO_FLAGS for make demo: --keep (leave it running to look around), --no-live, --tasks N.
# demo-down stops what `make demo DEMO_FLAGS=--keep` left running, then the control plane.
demo-down: venv
	$(BIN)/python -m agentq.demo --down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# Prometheus and promtool (Debian's package): tests/integration/test_monitoring.py runs
# them for real. A prerequisite of system-deps, so `make test` installs them when missing
# and we may (root with apt-get); without them those tests fail and say why.
system-deps: monitoring-deps
monitoring-deps:
	@if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing prometheus (Debian package)"; \
	    (apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && \
	      apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1)) || \
	    echo "warning: could not install prometheus; the monitoring tests will fail"; \
	  else echo "note: prometheus not installed; the monitoring tests will fail"; fi; \
	fi

# The example agents in Go and TypeScript (examples/agents; docs/agent-api.md, "Agents in
# Go and TypeScript"): their Go modules from the Go module proxy (go.sum) and npm
# packages from the npm registry (npm ci, package-lock.json; better-sqlite3 compiled
# against the machine's Node headers, and node_modules then kept per machine by
# ts/install.sh), then one build of each to fill the caches. Done once: the stamps are
# newer than the lock files, so a second run does nothing.
# tests/integration/test_agents_polyglot.py runs both against real sidecars.
AGENTS   := examples/agents
GO_STAMP := $(AGENTS)/go/bin/.deps-stamp
TS_STAMP := $(AGENTS)/ts/node_modules/.deps-stamp

$(GO_STAMP): $(AGENTS)/go/go.mod $(AGENTS)/go/go.sum
	@command -v go >/dev/null || { echo "error: go not found (Go 1.26+ builds the Go example agent)"; exit 1; }
	cd $(AGENTS)/go && go mod download && go build -o bin/agent ./cmd/agent && \
	  go test -count=1 -run '^$$' ./... >/dev/null && go tool oapi-codegen -version >/dev/null
	touch $@

$(TS_STAMP): $(AGENTS)/ts/package.json $(AGENTS)/ts/package-lock.json
	@command -v npm >/dev/null || { echo "error: npm not found (Node 20+ runs the TypeScript example agent)"; exit 1; }
	$(AGENTS)/ts/install.sh
	cd $(AGENTS)/ts && node_modules/.bin/tsc -p .
	touch $@

polyglot-deps: $(GO_STAMP) $(TS_STAMP)

polyglot-generate: polyglot-deps
	$(AGENTS)/generate.sh

# Their own unit tests (go test, node's test runner), without a control plane.
polyglot-test: polyglot-deps
	cd $(AGENTS)/go && go test ./...
	cd $(AGENTS)/ts && npm test
