#!/usr/bin/env bash
# Regenerates the Go code beside every .proto under proto/ with pinned generator versions.
# Usage: scripts/gen-proto.sh [OUTDIR]   (OUTDIR defaults to proto/; the drift test uses a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=v1.36.12      # google.golang.org/protobuf, same as go.mod
PROTOC_GEN_GO_GRPC=v1.6.2   # google.golang.org/grpc/cmd/protoc-gen-go-grpc
out=${1:-proto}

bin=$(go env GOPATH)/bin
want() { # want TOOL VERSION MODULE
	if ! "$bin/$1" --version 2>/dev/null | grep -q "${2#v}"; then
		GOFLAGS= go install "$3@$2"
	fi
}
command -v protoc >/dev/null || { echo "gen-proto: protoc not found (apt-get install protobuf-compiler)" >&2; exit 1; }
want protoc-gen-go "$PROTOC_GEN_GO" google.golang.org/protobuf/cmd/protoc-gen-go
want protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC" google.golang.org/grpc/cmd/protoc-gen-go-grpc

mkdir -p "$out"
PATH="$bin:$PATH" protoc -I proto \
	--go_out="$out" --go_opt=paths=source_relative \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
	$(find proto -name "*.proto" | sort)
