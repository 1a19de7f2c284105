# gpuguard build and test entry points. `make test` is what CI and newcomers run.
GO ?= go
BIN ?= bin
STATICCHECK_VERSION ?= v0.8.2
FUZZTIME ?= 30s
BENCHTIME ?= 1s

.PHONY: all build build-gpuguard build-agent test unit lint fuzz bench clean tools

all: build

build: build-gpuguard build-agent

# The admission binary is static (distroless image): no cgo.
build-gpuguard:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/gpuguard .

# The node agent needs cgo for NVML (dlopened at Init, so no driver is needed to build).
build-agent:
	@if [ -d cmd/gpuguard-agent ]; then CGO_ENABLED=1 $(GO) build -trimpath -o $(BIN)/gpuguard-agent ./cmd/gpuguard-agent; fi

test: lint unit fuzz

unit: build-gpuguard
	$(GO) test -count=1 ./...

lint: $(BIN)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(BIN)/staticcheck ./...

$(BIN)/staticcheck:
	GOBIN=$(CURDIR)/$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# Bounded fuzzing of the policy engine, seeded from the golden fixtures.
fuzz:
	$(GO) test ./policy -run '^$$' -fuzz '^FuzzEvaluate$$' -fuzztime $(FUZZTIME)

bench:
	$(GO) test ./... -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME)

clean:
	rm -rf $(BIN)
