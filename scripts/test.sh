#!/usr/bin/env bash
# The test suite, as CI runs it: vet, unit tests with the race detector, end-to-end tests with
# the real binaries, and short fuzzing runs of every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== go vet"
go vet ./...
echo "== unit tests (-race)"
go test -race -count=1 -timeout 10m ./internal/... ./cmd/... ./proto/...
echo "== deployment files (deploy/ is a nested module: ./... above does not enter it)"
(cd deploy && go vet ./... && go test -count=1 -timeout 5m ./...)
echo "== end-to-end and repository tests"
go test -count=1 -timeout 15m ./test/...
echo "== fuzzing (short runs)"
FUZZTIME=${FUZZTIME:-5s} scripts/fuzz.sh
