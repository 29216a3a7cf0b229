#!/usr/bin/env bash
# Benchmarks kubelet app probes answered through agentd's status port (status server → probe
# socket → prober → app) against calling the app directly, with wrk (Debian's). The tree is
# `agentd run --disable-envoy` with devplane as its CA and control plane; the app is a tiny Go
# HTTP server. Usage: scripts/bench/probe.sh [SECONDS] [CONNECTIONS]   (default 10, 16)
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/bench/lib.sh
. scripts/bench/lib.sh
secs=${1:-10}
conns=${2:-16}
command -v wrk >/dev/null || { echo "probe.sh: wrk not found (apt-get install wrk)" >&2; exit 1; }

bench_init
go build -o "$work/bin/" ./cmd/...
build_app "$work/bin/app"

app=$(freeport) status=$(freeport) ca=$(freeport) xds=$(freeport)
echo "services: []" >"$work/services.yaml"
"$work/bin/app" "$app" & pids+=($!)
"$work/bin/devplane" --services "$work/services.yaml" --xds-address "127.0.0.1:$xds" --debug-address "" \
	--ca-address "127.0.0.1:$ca" --ca-root-out "$work/ca-root.pem" >"$work/devplane.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do [ -s "$work/ca-root.pem" ] && break; sleep 0.1; done

mkdir -p "$work/root"
# PROBE_ENV adds settings, e.g. PROBE_ENV=ENABLE_PROBE_KEEPALIVE_CONNECTIONS=true.
env CA_ADDR="127.0.0.1:$ca" CA_ROOT_CA="$work/ca-root.pem" ECC_SIGNATURE_ALGORITHM=ECDSA INSTANCE_IP=127.0.0.1 ${PROBE_ENV:-} \
	PROXY_CONFIG='{"controlPlaneAuthPolicy":"NONE"}' \
	ISTIO_KUBE_APP_PROBERS="{\"/app-health/app/readyz\":{\"httpGet\":{\"path\":\"/ok\",\"port\":$app},\"timeoutSeconds\":1}}" \
	"$work/bin/agentd" run --root "$work/root" --helpers-dir "$work/bin" --disable-envoy \
	--status-port "$status" --dns-address 127.0.0.1:0 --discovery-address "127.0.0.1:$xds" \
	>"$work/agentd.log" 2>&1 & pids+=($!)
"$work/bin/agentd" wait --url "http://127.0.0.1:$status/healthz/ready" --timeoutSeconds 60 --periodMillis 100 2>/dev/null \
	|| { echo "agentd did not become ready:" >&2; tail -20 "$work/agentd.log" >&2; exit 1; }

rps() { # rps LABEL URL [wrk args]: prints "LABEL <requests/s>" and checks every answer was 2xx
	local label=$1 url=$2 out
	shift 2
	out=$(wrk_run "$url" "$secs" 2 "$conns" "$@")
	printf '%s %s\n' "$label" "${out%% *}"
}

echo "== app probes: $conns connections, ${secs}s each, $(nproc) CPUs =="
{
	rps direct "http://127.0.0.1:$app/ok"
	rps direct-close "http://127.0.0.1:$app/ok" -H "Connection: close"
	rps status-port "http://127.0.0.1:$status/app-health/app/readyz"
} | tee "$work/figures"
awk '
{ v[$1] = $2 }
END {
	printf "\n%-42s %10.0f /s\n", "app directly (keep-alive)", v["direct"]
	printf "%-42s %10.0f /s\n", "app directly (new connection per request)", v["direct-close"]
	printf "%-42s %10.0f /s\n", "through the status port (/app-health)", v["status-port"]
	printf "ratio status port / direct keep-alive:       %.2f\n", v["status-port"] / v["direct"]
	printf "ratio status port / direct new connection:   %.2f\n", v["status-port"] / v["direct-close"]
}' "$work/figures"
