# agentd: `make run` starts it locally on the embedded default; `make test` is the test suite.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
# The Istio release agentd is built for: the one pinned in the image's Dockerfile.
ISTIO_VERSION := $(shell sed -n 's/^ARG ISTIO_VERSION=//p' deploy/docker/Dockerfile)
BUILDINFO := github.com/agentd/agentd/internal/buildinfo
LDFLAGS := -X $(BUILDINFO).Version=$(VERSION) -X $(BUILDINFO).Commit=$(COMMIT) -X $(BUILDINFO).IstioVersion=$(ISTIO_VERSION)
BIN     ?= bin

.PHONY: build test run fuzz proto bench istio-version

# Static, as the image builds it (deploy/docker/Dockerfile); urfave/cli's manual-page writer
# and gRPC's request tracing (golang.org/x/net/trace, never enabled) left out: their
# initialisers cost every process of the tree (docs/footprint.md).
build:
	CGO_ENABLED=0 go build -trimpath -tags urfave_cli_no_docs,grpcnotrace -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

test:
	scripts/test.sh

run: build
	scripts/run.sh

fuzz:
	FUZZTIME=$${FUZZTIME:-30s} scripts/fuzz.sh

proto:
	scripts/gen-proto.sh

bench: build
	scripts/bench/all.sh

istio-version:
	@echo $(ISTIO_VERSION)
