# gpuguard build and test entry points. `make test` is what CI and newcomers
# run; `make help` lists every target. The first line of the comment above a
# target is its summary in `make help`.
GO ?= go
BIN ?= bin
STATICCHECK_VERSION ?= v0.8.2
# Fuzz budgets are execution counts (about 30 s each on 2 cores): a
# wall-clock -fuzztime races Go's fuzzing coordinator at its deadline on a
# loaded machine and fails with "context deadline exceeded" having found
# nothing. FUZZTIME (e.g. 5m) overrides both, for longer runs by hand.
FUZZTIME ?=
FUZZ_EVALUATE ?= 300000x
FUZZ_PARITY ?= 20000x
BENCHTIME ?= 1s
# One set of build flags for every go command make runs, the tests' own
# builds of the binaries among them: -trimpath, as the release and upstream
# builds need it, so that all of them share one build cache instead of
# compiling the dependency graph once per flag set.
export GOFLAGS := $(strip $(filter-out -trimpath,$(GOFLAGS)) -trimpath)

E2E_TIMEOUT ?= 40m

# Where the node benchmark keeps its node's state: tmpfs where there is one,
# so that disk flushes do not swamp the differences it measures.
NODE_BENCH_TMPDIR ?= $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm || echo $${TMPDIR:-/tmp})

.PHONY: all help deps deps-check check-tree build build-gpuguard build-agent test unit lint fuzz bench e2e upstream demo bench-e2e scale clean images push images-reproducible upstream-charts dist

# Both binaries, into bin/.
all: build

# Every target with its summary.
help:
	@echo "make TARGET, where TARGET is one of:"; awk -f hack/make-help.awk $(firstword $(MAKEFILE_LIST))

# Both binaries, into bin/.
build: build-gpuguard build-agent

# The gpuguard binary (webhook, check, audit, render-cel): static, no cgo.
build-gpuguard:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/gpuguard ./cmd/gpuguard

# The node agent: cgo for NVML, which it dlopens at start (no driver needed to build).
build-agent:
	CGO_ENABLED=1 $(GO) build -trimpath -o $(BIN)/gpuguard-agent ./cmd/gpuguard-agent

# Install the Debian packages of hack/packages.txt that are missing, and prove them.
# Cross compilers and their C libraries, runc, nftables, iproute2: installed
# when missing (as root), then proved to work, a cgo program linking for every
# image platform.
deps:
	bash hack/install-deps.sh

# Every test: system packages, lint, unit, upstream charts, fuzz, images, e2e.
# The release images are built twice to the same digests; the end-to-end
# suites run a real kube-apiserver, etcd, kubelet and containerd built from
# pinned sources, which hack/test.sh builds beside the Go steps.
test: deps
	bash hack/test.sh

# Both images as multi-platform OCI image indexes with SBOMs, without Docker.
# Into an OCI image layout (hack/release; docs/release.md). The agent's cgo
# build needs a C cross compiler and C library for the other platform, which
# hack/install-deps.sh installs from Debian when missing.
PLATFORMS ?= linux/amd64,linux/arm64
IMAGES ?= _output/images
images:
	bash hack/install-deps.sh --platforms $(PLATFORMS) build images
	$(GO) run ./hack/release images --out $(IMAGES) --platforms $(PLATFORMS)

# Push the images and the chart, pinned to them by digest, to REGISTRY.
# REGISTRY is host[:port][/path]; PLAIN_HTTP=1 for a registry without TLS.
# The CLI's release archives (linux, darwin, windows), SHA256SUMS and the krew
# plugin manifest, into _output/dist (hack/release dist; docs/release.md).
dist:
	$(GO) run ./hack/release dist --out _output/dist

push: images
	@if [ -z "$(REGISTRY)" ]; then echo "usage: make push REGISTRY=host[:port][/path] [PLAIN_HTTP=1]" >&2; exit 2; fi
	$(GO) run ./hack/release push --registry $(REGISTRY) --layout $(IMAGES) $(if $(PLAIN_HTTP),--plain-http)

# make images twice: both layouts' index.json must be byte for byte the same.
# index.json holds every index's and SBOM's digest.
images-reproducible:
	$(MAKE) --no-print-directory images IMAGES=_output/images
	$(MAKE) --no-print-directory images IMAGES=_output/images-again
	@cmp _output/images/index.json _output/images-again/index.json && \
		echo "make images is reproducible: both builds gave the same digests"

# Unit and package tests: go test ./...
unit: build-gpuguard
	$(GO) test -count=1 ./...

# The presets against the upstream charts, rendered at pinned versions.
# Fetched through the Go module proxy (charts/upstream_test.go,
# docs/compatibility.md).
upstream-charts:
	$(GO) test -count=1 -tags upstream -run '^(TestUpstreamCharts|TestUpstreamWorkloadCorpus|TestInfrastructureCorpus|TestCorpusKAIFractions|TestCorpusHAMiShapes|TestCheckOnUpstreamMLSamples)$$' ./charts/ .

# System packages, tree size, gofmt, go vet and staticcheck.
# The system packages' proof comes first: a missing C header fails in seconds.
lint: deps-check check-tree $(BIN)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags e2e,upstream ./...
	$(BIN)/staticcheck -tags e2e,upstream ./...

# Prove the packages of hack/packages.txt work, installing nothing.
deps-check:
	bash hack/install-deps.sh --check

# Fail on a tracked file over 5 MB: a binary committed by mistake costs every clone.
check-tree:
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 5*1024*1024 {print $$2}'); \
	if [ -n "$$big" ]; then echo "tracked files over 5 MB (binaries and build outputs do not belong in git): $$big" >&2; exit 1; fi; \
	echo "no tracked file over 5 MB"

$(BIN)/staticcheck:
	GOBIN=$(CURDIR)/$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Bounded fuzzing: the engine alone, then the engine against the CEL backstop.
# Seeded from the golden fixtures; the backstop is evaluated in-process.
fuzz:
	$(GO) test ./policy -run '^$$' -fuzz '^FuzzEvaluate$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_EVALUATE))
	$(GO) test ./cel -run '^$$' -fuzz '^FuzzParity$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_PARITY))

# In-process benchmarks of every package (docs/benchmarks.md).
bench:
	$(GO) test ./... -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME)

# Pinned upstream binaries (kube-apiserver, etcd) built from source into _output/bin.
upstream:
	bash hack/build-upstream.sh

# The end-to-end suites: control plane and node side by side, then the cluster.
# The cluster suite runs after them, since it runs a kubelet too and a machine
# holds one.
e2e: upstream node-binaries
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) ./e2e/ ./e2e/node/
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) ./e2e/cluster/
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v ./e2e/scale/

# The scale suite at the fleet size of docs/reliability.md: KWOK's simulated
# GPU nodes against a real kube-apiserver, the background audit measured
# (make e2e runs it on a small fleet). Not part of make test.
SCALE_FLEET ?= -scale.nodes=1000 -scale.pods=30000 -scale.namespaces=300 -scale.heartbeat-window=2m
scale: upstream
	$(GO) test -tags e2e -count=1 -timeout 90m -v -run . ./e2e/scale/ -args $(SCALE_FLEET)

.PHONY: node-binaries e2e-node demo-node e2e-cluster cluster

# The node and cluster stack, built from pinned sources into _output/bin.
# kubelet, containerd, the NVIDIA Container Runtime, runc, and the rest of a
# cluster: controller manager, scheduler, kube-proxy, kubectl, helm, CNI
# plugins; see docs/node-e2e.md.
node-binaries:
	bash hack/build-node.sh

# Only the node suite: real kubelet, containerd and NVIDIA runtime, fake GPUs.
# Pods without and with gpuguard. Needs root; skips elsewhere.
e2e-node: upstream node-binaries
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v ./e2e/node/

# Only the cluster suite: the README's Helm walkthrough, verbatim.
# With the real helm and kubectl on a whole single-node cluster built from
# pinned sources (root; skips elsewhere).
e2e-cluster: upstream node-binaries
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v ./e2e/cluster/

# A whole single-node cluster with gpuguard's image loaded (root; Ctrl-C stops it).
# For following the README's "Install" without a cluster of one's own.
cluster: node-binaries
	$(GO) run ./hack/localcluster

# The leak and the fix side by side on a real node, as a table (root).
demo-node: upstream node-binaries
	$(GO) run ./e2e/node/demo

# Pod create latency and throughput through a real API server with and
# without gpuguard, then container create latency at a real containerd with
# and without the node enforcer (root; skips elsewhere).
bench-e2e: upstream node-binaries
	bash hack/bench-run.sh $(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -run '^$$' -bench PodCreate ./e2e/
	TMPDIR=$(NODE_BENCH_TMPDIR) bash hack/bench-run.sh $(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -run '^$$' -bench ContainerCreate ./e2e/node/

# A local control plane with gpuguard installed; applies examples/ through it.
# Shows what the API server did with each object.
demo: upstream
	$(GO) run ./e2e/demo

# The binaries of hack/gpu-check.sh, for a GPU machine without a Go toolchain.
GPU_CHECK_DIR ?= _gpu
.PHONY: gpu-check-binaries
gpu-check-binaries:
	CGO_ENABLED=1 $(GO) test -c -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/discovery.test ./agent/discovery
	CGO_ENABLED=1 $(GO) test -c -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/verify.test ./agent/verifier
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/gpuguard-agent ./cmd/gpuguard-agent

# Remove bin/ (the built binaries and staticcheck).
clean:
	rm -rf $(BIN)
