# gpuguard build and test entry points. `make test` is what CI and newcomers run.
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

E2E_TIMEOUT ?= 40m

.PHONY: all deps build build-gpuguard build-agent test unit lint fuzz bench e2e upstream demo bench-e2e clean images push images-reproducible upstream-charts

all: build

build: build-gpuguard build-agent

# The admission binary is static (distroless image): no cgo.
build-gpuguard:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/gpuguard .

# The node agent needs cgo for NVML (dlopened at Init, so no driver is needed to build).
build-agent:
	@if [ -d cmd/gpuguard-agent ]; then CGO_ENABLED=1 $(GO) build -trimpath -o $(BIN)/gpuguard-agent ./cmd/gpuguard-agent; fi

# The Debian packages of hack/packages.txt (cross compilers and their C
# libraries, runc, nftables, iproute2), installed when missing (as root) and
# proved to work: a cgo program links for every image platform.
deps:
	bash hack/install-deps.sh

# Everything: the system packages, lint, unit tests, a bounded fuzz run, the
# release images built twice to the same digests, and the end-to-end suites on
# a real kube-apiserver, etcd, kubelet and containerd built from pinned sources.
test: deps lint unit upstream-charts fuzz images-reproducible e2e

# Both images as multi-platform OCI image indexes with SBOMs, into an OCI
# image layout, without Docker (hack/release; docs/release.md). The agent's
# cgo build needs a C cross compiler and C library for the other platform,
# which hack/install-deps.sh installs from Debian when missing.
PLATFORMS ?= linux/amd64,linux/arm64
IMAGES ?= _output/images
images:
	bash hack/install-deps.sh --platforms $(PLATFORMS) build images
	$(GO) run ./hack/release images --out $(IMAGES) --platforms $(PLATFORMS)

# Push the images and the chart (pinned to them by digest) to REGISTRY
# (host[:port][/path]); PLAIN_HTTP=1 for a registry without TLS.
push: images
	@if [ -z "$(REGISTRY)" ]; then echo "usage: make push REGISTRY=host[:port][/path] [PLAIN_HTTP=1]" >&2; exit 2; fi
	$(GO) run ./hack/release push --registry $(REGISTRY) --layout $(IMAGES) $(if $(PLAIN_HTTP),--plain-http)

# make images twice: the layouts' index.json (every index's and SBOM's
# digest) must be byte for byte the same.
images-reproducible:
	$(MAKE) --no-print-directory images IMAGES=_output/images
	$(MAKE) --no-print-directory images IMAGES=_output/images-again
	@cmp _output/images/index.json _output/images-again/index.json && \
		echo "make images is reproducible: both builds gave the same digests"

unit: build-gpuguard
	$(GO) test -count=1 ./...

# The presets against the upstream charts themselves, rendered at pinned
# versions fetched through the Go module proxy (charts/upstream_test.go,
# docs/compatibility.md).
upstream-charts:
	$(GO) test -count=1 -tags upstream -run '^(TestUpstreamCharts|TestUpstreamWorkloadCorpus|TestCorpusKAIFractions|TestCorpusHAMiShapes)$$' ./charts/

# The system packages' proof comes first: a missing C header fails in seconds.
lint: $(BIN)/staticcheck
	bash hack/install-deps.sh --check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags e2e,upstream ./...
	$(BIN)/staticcheck -tags e2e,upstream ./...

$(BIN)/staticcheck:
	GOBIN=$(CURDIR)/$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Bounded fuzzing, seeded from the golden fixtures: the policy engine alone,
# then the engine against the CEL backstop evaluated in-process.
fuzz:
	$(GO) test ./policy -run '^$$' -fuzz '^FuzzEvaluate$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_EVALUATE))
	$(GO) test ./cel -run '^$$' -fuzz '^FuzzParity$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_PARITY))

bench:
	$(GO) test ./... -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME)

# Pinned upstream binaries (kube-apiserver, etcd) built from source into _output/bin.
upstream:
	bash hack/build-upstream.sh

# The control-plane and node suites run side by side; the cluster suite after
# them, since it runs a kubelet too and a machine holds one.
e2e: upstream node-binaries
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) ./e2e/ ./e2e/node/
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) ./e2e/cluster/

.PHONY: node-binaries e2e-node demo-node e2e-cluster cluster

# The node stack of e2e/node and e2e/cluster (kubelet, containerd, the NVIDIA
# Container Runtime, runc, and the rest of a cluster: controller manager,
# scheduler, kube-proxy, kubectl, helm, CNI plugins) built from pinned sources
# into _output/bin; see docs/node-e2e.md.
node-binaries:
	bash hack/build-node.sh

# Only the node suite: pods through a real kubelet, containerd and NVIDIA runtime
# on fake GPUs, without and with gpuguard. Needs root; skips elsewhere.
e2e-node: upstream node-binaries
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v ./e2e/node/

# Only the cluster suite: the README's Helm walkthrough, verbatim, with the real
# helm and kubectl on a whole single-node cluster built from pinned sources
# (root; skips elsewhere).
e2e-cluster: upstream node-binaries
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v ./e2e/cluster/

# A whole single-node cluster with gpuguard's image loaded, for following the
# README's "Install with Helm" without a cluster of one's own (root; Ctrl-C stops it).
cluster: node-binaries
	$(GO) run ./hack/localcluster

# The leak and the fix side by side, as a table (root).
demo-node: upstream node-binaries
	$(GO) run ./e2e/node/demo

# Pod create latency through a real API server with and without gpuguard.
bench-e2e: upstream
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -run '^$$' -bench PodCreate ./e2e/

# A local control plane with gpuguard installed; applies examples/ and shows what
# the API server did with each object.
demo: upstream
	$(GO) run ./e2e/demo

# The binaries of hack/gpu-check.sh (the checks that need a real GPU), built
# here to run on a GPU machine that has no Go toolchain.
GPU_CHECK_DIR ?= _gpu
.PHONY: gpu-check-binaries
gpu-check-binaries:
	CGO_ENABLED=1 $(GO) test -c -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/discovery.test ./agent/discovery
	CGO_ENABLED=1 $(GO) test -c -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/verify.test ./agent/verify
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags='-s -w' -o $(GPU_CHECK_DIR)/gpuguard-agent ./cmd/gpuguard-agent

clean:
	rm -rf $(BIN)
