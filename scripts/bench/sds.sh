#!/usr/bin/env bash
# Benchmarks sds-server: SDS pushes per second to 100 connected SotW clients on a Unix socket,
# and the CSR round trip (key + CSR + signing by a CA over loopback TLS + answer checks) with
# RSA 2048 and ECDSA P-256. Usage: scripts/bench/sds.sh [COUNT]   (runs of each, default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
count=${1:-3}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

go test -run '^$' -bench 'BenchmarkSDSPush' -benchtime 500x -count "$count" ./internal/sds | tee -a "$out"
go test -run '^$' -bench 'BenchmarkCSR' -benchtime 30x -count "$count" ./internal/caclient | tee -a "$out"

echo
echo "== sds-server figures (median of $count runs, $(nproc) CPUs) =="
awk '
function median(a, n,   i, j, t) {
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
/^BenchmarkSDSPush/ { for (i = 1; i <= NF; i++) if ($(i+1) == "pushes/s") p[++np] = $i }
/^BenchmarkCSR\/RSA/ { r[++nr] = $3 / 1e6 }
/^BenchmarkCSR\/ECDSA/ { e[++ne] = $3 / 1e6 }
END {
	printf "SDS pushes to 100 clients:     %8.0f pushes/s\n", median(p, np)
	printf "CSR round trip, RSA 2048:      %8.1f ms\n", median(r, nr)
	printf "CSR round trip, ECDSA P-256:   %8.1f ms\n", median(e, ne)
}' "$out"
