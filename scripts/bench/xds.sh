#!/usr/bin/env bash
# Benchmarks xds-proxy: an Envoy-like ADS client receives the full state and then pushes of
# every endpoint (default 10 000 endpoints in 2 000 clusters), straight from devplane and
# through `agentd run --disable-envoy`'s xds-proxy, in one run, for SotW and delta, and
# prints the times, their ratio and xds-proxy's memory (RSS).
#
# Usage: scripts/bench/xds.sh   (CLUSTERS=2000 ENDPOINTS=10000 PUSHES=10 ROUNDS=3)
# Needs: go. Everything listens on loopback (devplane on 127.x.y.z:15010) or Unix sockets.
set -euo pipefail
cd "$(dirname "$0")/../.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "building agentd and helpers..." >&2
go build -o "$work/bin/" ./cmd/... ./scripts/bench/xdsbench
"$work/bin/xdsbench" -agentd "$work/bin/agentd" -agentd-log "$work/agentd.log" \
	-clusters "${CLUSTERS:-2000}" -endpoints "${ENDPOINTS:-10000}" \
	-pushes "${PUSHES:-10}" -rounds "${ROUNDS:-3}" || { tail -50 "$work/agentd.log" >&2; exit 1; }
