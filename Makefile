# durabletrain developer entry points. `make demo` and `make test` are the two
# commands of the README; both install what they need first.

GO        ?= go
# OpenBLAS through cgo makes the native trainer about 4x faster than pure Go.
TAGS      ?= openblas
# One OpenBLAS thread per rank: ranks are the parallelism.
export OPENBLAS_NUM_THREADS ?= 1
export OMP_NUM_THREADS      ?= 1
# Everything but the integration package (it links the Temporal server: 10 more minutes under -race).
RACE      := ./collective/... ./dataset/... ./checkpoint/... ./trainer/... ./spec/... ./workflows/... ./activities/... ./gpuworker/... ./tune/... ./telemetry/...

# The longest-running test packages, named first so that they start first: two packages run at
# a time, and one of them left to run alone at the end kept a core idle (integration 440 s,
# deploy 216 s, chaos 209 s on a 2-core VM, 2026-11-28).
SLOWEST   := ./integration/ ./deploy/ ./chaos/

.PHONY: chaos images minio fake-gcs-server azurite temporal-cli deps deps-test deps-bench demo demo-direct test test-steps test-race test-python python-env venv bins fuzz bench bench-allreduce bench-train bench-checkpoint bench-s3 bench-lightning bench-ray bench-scale vet

deps:
	@scripts/deps.sh

deps-test:
	@scripts/deps.sh test

deps-bench:
	@scripts/deps.sh bench

## demo: the embedded Temporal server with its UI, two worker processes, and a
## 2-rank, 10-epoch Fashion-MNIST run (KEEP=1 leaves the server and workers up)
demo: deps
	TAGS='$(TAGS)' scripts/demo.sh

## demo-direct: the same training with the ranks as plain processes, no Temporal
demo-direct: deps
	$(GO) run -tags '$(TAGS)' ./bench train -peers=false -ranks 2 -epochs 10

# The two tools the tests run are built without the compiler's optimisations (-N -l) for all but
# the standard library, whose compiled packages every other build shares: a cold build of each
# costs about 30% less CPU (CLI 240 -> 172 CPU-seconds, MinIO 224 -> 149, on a 2-core KVM VM,
# 2026-11-28), and neither is what a test measures. `make bench-s3` builds its own, optimised MinIO.
TOOLFLAGS := -ldflags=-w '-gcflags=all=-N -l' -gcflags=std=

## temporal-cli: the Temporal CLI v1.5.1 in bin/, for the test that drives a run with it
temporal-cli: bin/temporal
bin/temporal:
	GOBIN='$(CURDIR)/bin' $(GO) install $(TOOLFLAGS) github.com/temporalio/cli/cmd/temporal@v1.5.1

## minio: the MinIO server (S3-compatible) in bin/, built from the Go module proxy, for the S3 tests
MINIO_VERSION := v0.0.0-20260212201848-7aac2a2c5b7c
minio: bin/minio
bin/minio:
	GOBIN='$(CURDIR)/bin' $(GO) install $(TOOLFLAGS) github.com/minio/minio@$(MINIO_VERSION)
bin/bench/minio:
	GOBIN='$(CURDIR)/bin/bench' $(GO) install github.com/minio/minio@$(MINIO_VERSION)

## fake-gcs-server: the Google Cloud Storage emulator in bin/, built from the Go module proxy, for the gs:// tests
FAKE_GCS_VERSION := v1.56.1
fake-gcs-server: bin/fake-gcs-server
bin/fake-gcs-server:
	GOBIN='$(CURDIR)/bin' $(GO) install $(TOOLFLAGS) github.com/fsouza/fake-gcs-server@$(FAKE_GCS_VERSION)
bin/bench/fake-gcs-server:
	GOBIN='$(CURDIR)/bin/bench' $(GO) install github.com/fsouza/fake-gcs-server@$(FAKE_GCS_VERSION)

## azurite: Azurite, the Azure Storage emulator (Node.js), in bin/azurite from the npm registry at the
## versions testkit/azurite/package-lock.json pins, for the azblob:// tests
azurite: bin/azurite/node_modules/.bin/azurite-blob
bin/azurite/node_modules/.bin/azurite-blob: testkit/azurite/package.json testkit/azurite/package-lock.json
	mkdir -p bin/azurite
	cp testkit/azurite/package.json testkit/azurite/package-lock.json bin/azurite/
	cd bin/azurite && npm ci --no-audit --no-fund --loglevel=error
	touch $@

## test: every test, the Python package's (after the Go tests: bin/devserver then links the Temporal
## server packages the integration tests compiled, instead of compiling them first, 9 minutes cold),
## again under the race detector (all but integration), and the OpenBLAS build of the native trainer
## (the one package with OpenBLAS code)
## (vet, the two tools and .venv build side by side: much of a cold build waits on downloads)
## (every link in it, of test binaries, tools and the binaries tests build, leaves out DWARF, which
## nothing here reads: it halved the integration test binary's link, 32 -> 17 CPU-seconds on a 2-core VM;
## GOFLAGS set in the environment would hide those of `go env -w`, so they are read first)
## (as root it runs with transparent huge pages "always", put back after: scripts/hugepages.sh says why)
## (the Go tests' timeout is a bound on a hang, not a speed: under scripts/loaded.sh the integration
## package took 1,497 s on a 2-core VM, 2026-12-02, against 843 s quiet, so 50 minutes)
test: deps-test
	@scripts/hugepages.sh $(MAKE) --no-print-directory test-steps
test-steps: export GOFLAGS = $(shell $(GO) env GOFLAGS) -ldflags=-w
test-steps:
	$(MAKE) -j4 vet bin/temporal bin/minio bin/fake-gcs-server azurite venv
	DURABLETRAIN_REQUIRE_SERVICES=1 $(GO) test -count=1 -timeout 50m $(SLOWEST) ./...
	$(MAKE) --no-print-directory test-python
	$(GO) test -count=1 -timeout 25m -race $(RACE)
	$(GO) test -count=1 -tags '$(TAGS)' ./trainer/native/...

## python-env: .venv, from pinned requirements (scripts/venv.sh), and the binaries the Python
## package runs (bin/starter, bin/worker, bin/devserver: durabletrain.init()'s local cluster)
python-env: bins venv
# venv: .venv alone (its build is mostly downloads: `make test` builds it beside the Go tools)
venv:
	@scripts/venv.sh
bins:
	$(GO) build -o bin/starter ./cmd/starter
	$(GO) build -o bin/worker ./cmd/worker
	$(GO) build -o bin/devserver ./cmd/devserver

## test-python: the Python package's tests (pytest, against a real local cluster) and its docstrings' examples
test-python: python-env
	cd python && ../.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 --doctest-modules durabletrain tests

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: the files above need gofmt -w"; exit 1; }

## fuzz: every fuzz test in turn for FUZZTIME each (default 60s): a stranger's handshake, damaged
## checkpoints, hostile specs, ... (`make test` runs their seed corpora; this searches past them)
fuzz:
	@set -e; for f in $$(grep -l '^func Fuzz' $$(git ls-files '*_test.go')); do \
		for t in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | cut -c6-); do \
			echo "== $$t ./$$(dirname $$f)"; \
			$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $${FUZZTIME:-60s} ./$$(dirname $$f); \
		done; \
	done

## chaos: 24 faults of six kinds injected into real training runs, with the table of what they cost,
## twice: new gangs restoring from survivors' memory, then from storage (RECOVERY=survivor|storage|both)
## (root: each worker runs in a network namespace of its own; SEED=n for another plan)
chaos: deps
	$(GO) run ./cmd/chaos -faults $${FAULTS:-24} -seed $${SEED:-1} -recovery $${RECOVERY:-both} -tags '$(TAGS)'

## images: the image durabletrain:local, FROM scratch, out of our binaries (for both compose files)
images: deps
	deploy/build-images.sh

## bench: every benchmark table (needs the peers: PyTorch, OpenMPI)
bench: deps-bench bench-allreduce bench-train bench-checkpoint bench-s3 bench-lightning

## bench-lightning: Lightning through durabletrain against Lightning under torchrun (LOAD=1: loaded)
bench-lightning: deps python-env
	OMP_NUM_THREADS=1 .venv/bin/python bench/lightning_vs_direct.py --repeats $${REPEATS:-3} $${LOAD:+--load}

## bench-ray: the same jobs through Ray Train and through durabletrain (its own .venv-ray; JOBS=, REPEATS=)
bench-ray: deps
	$(GO) run ./bench ray --jobs $${JOBS:-overhead,killed,hung} --repeats $${REPEATS:-3}

bench-allreduce: deps-bench
	$(GO) run -tags '$(TAGS)' ./bench allreduce

bench-train: deps-bench
	$(GO) run -tags '$(TAGS)' ./bench train

bench-checkpoint: deps
	$(GO) run -tags '$(TAGS)' ./bench checkpoint

bench-s3: deps-bench bin/bench/minio bin/bench/fake-gcs-server azurite
	MINIO_BIN='$(CURDIR)/bin/bench/minio' FAKE_GCS_BIN='$(CURDIR)/bin/bench/fake-gcs-server' $(GO) run ./bench s3

## bench-scale: runs on a simulated fleet of 8-GPU hosts, per host (today) and per rank (before),
## one row each (RANKS="8 64 512 2048" to choose; minutes per row at 512 ranks and more)
RANKS ?= 8 64 512
bench-scale: deps
	@for r in $(RANKS); do $(GO) run ./bench scale -ranks $$r -gpus-per-host 8 -epochs 3 || exit 1; done
	@for r in $(filter-out 8,$(RANKS)); do $(GO) run ./bench scale -ranks $$r -gpus-per-host 8 -epochs 3 -per-rank || exit 1; done
