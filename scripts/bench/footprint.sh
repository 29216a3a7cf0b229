#!/usr/bin/env bash
# Measures what agentd's process tree costs: the memory of every process (RSS and PSS from
# /proc/<pid>/smaps_rollup, PSS splitting pages shared between processes) and the sums, idle
# (Istio's defaults: no app probe, no DNS capture; then again with an app probe, which starts
# the prober) and with a NAMES-name table (and a pod's search list) and NAMES endpoints flowing
# from devplane (a generated services file, rewritten PUSHES times so that every endpoint
# moves), and the start-to-ready time
# without Envoy (agentd exec to /healthz/ready answering 200, median of RUNS). Each for the
# two layouts of the helpers directory: "separate" (one binary per helper) and "links" (links
# to agentd, which serves a helper by the name it runs as: one executable file for the tree).
# Binaries are built as the image builds them (static, stripped).
# Istio's pilot-agent, one process doing all of it, on this kind of machine: about 37 MB RSS
# idle, 53 MB with a 10 000-name table, ready in 120-150 ms.
#
# Usage: scripts/bench/footprint.sh   (NAMES=10000 PUSHES=3 RUNS=5 LAYOUTS="separate links")
#        HELPERS_ENV='GOGC=50' scripts/bench/footprint.sh   (extra environment for agentd)
# Needs: go, curl, python3. Everything listens on loopback.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/bench/lib.sh
. scripts/bench/lib.sh

NAMES=${NAMES:-10000}
PUSHES=${PUSHES:-3}
RUNS=${RUNS:-5}
LAYOUTS=${LAYOUTS:-separate links}

bench_init

echo "building agentd, the helpers, devplane and the Envoy stand-in..." >&2
build_tree "$work/bin" ./cmd/agentd ./cmd/xds-proxy ./cmd/sds-server ./cmd/dns-proxy ./cmd/prober ./cmd/devplane ./test/envoy-standin


# devplane: xDS on a loopback address of its own (port 15010, plaintext), the CA on 127.0.0.1.
xds="127.$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1)).$((RANDOM % 250 + 1)):15010"
ca="127.0.0.1:$(freeport)"
services "$work/services.yaml" 0 10000
"$work/bin/devplane" --services "$work/services.yaml" --xds-address "$xds" --debug-address "" \
	--ca-address "$ca" --ca-root-out "$work/ca-root.pem" >"$work/devplane.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$work/ca-root.pem" ] && break; sleep 0.05; done

agentd_pid=
status_port=
helpers_dir=
# start_agentd ROOT ARGS...: agentd run in the background on status_port (pick one first with
# status_port=$(freeport): python's start is not agentd's); sets agentd_pid.
start_agentd() {
	local root=$1; shift
	mkdir -p "$root"
	# shellcheck disable=SC2086 # HELPERS_ENV and extra_env are lists of NAME=VALUE words
	env CA_ADDR="$ca" CA_ROOT_CA="$work/ca-root.pem" ECC_SIGNATURE_ALGORITHM=ECDSA \
		POD_NAME=app-1 POD_NAMESPACE=default SERVICE_ACCOUNT=default INSTANCE_IP=127.0.0.1 \
		${HELPERS_ENV:-} ${extra_env:-} \
		"$work/bin/agentd" run --root "$root" --helpers-dir "$helpers_dir" --discovery-address "$xds" \
		--dns-address 127.0.0.1:0 --status-port "$status_port" "$@" >"$root.log" 2>&1 &
	agentd_pid=$!
	pids+=("$agentd_pid")
}
wait_ready() { # TIMEOUT_S: until /healthz/ready answers 200
	local deadline=$(($(now_ms) + $1 * 1000))
	until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$status_port/healthz/ready")" = 200 ]; do
		if [ "$(now_ms)" -gt "$deadline" ]; then
			echo "agentd not ready within $1 s" >&2
			return 1
		fi
		sleep 0.002
	done
}
stop_agentd() {
	kill -TERM "$agentd_pid" 2>/dev/null || true
	wait "$agentd_pid" 2>/dev/null || true
}

memory() { # TITLE
	echo
	echo "== $1 =="
	memory_table "$agentd_pid"
}

for layout in $LAYOUTS; do
	case $layout in
	separate) helpers_dir=$work/bin ;;
	links) helpers_dir=$work/bin/links ;;
	*) echo "unknown layout $layout" >&2; exit 2 ;;
	esac
	echo
	echo "#### helpers layout: $layout"
	extra_env=
	services "$work/services.yaml" 0 10000
	# 1. Start to ready, without Envoy, no DNS capture: every helper ready (sds-server with its
	# workload certificate from devplane's CA).
	times=()
	for i in $(seq "$RUNS"); do
		status_port=$(freeport)
		t0=$(now_ms)
		start_agentd "$work/$layout-ready$i" --disable-envoy
		wait_ready 30
		times+=($(($(now_ms) - t0)))
		[ "$i" = "$RUNS" ] || stop_agentd
	done
	sorted=$(printf "%s\n" "${times[@]}" | sort -n | tr '\n' ' ')
	echo "start to ready without Envoy ($layout): median $(printf "%s\n" "${times[@]}" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}') ms of $RUNS runs ($sorted ms)"
	sleep 3
	memory "idle, without Envoy ($layout)"
	stop_agentd

	# 1b. The same with an app probe (a pod with a liveness probe): the prober runs.
	extra_env='ISTIO_KUBE_APP_PROBERS={"/app-health/app/livez":{"httpGet":{"path":"/healthz","port":8080}}}'
	status_port=$(freeport)
	start_agentd "$work/$layout-probe" --disable-envoy
	wait_ready 30
	sleep 3
	memory "idle with an app probe, without Envoy ($layout)"
	stop_agentd

	# 2. A NAMES-name table and NAMES endpoints: the Envoy stand-in subscribes to every cluster's
	# endpoints through xds-proxy, DNS capture makes xds-proxy ask for the name table, which
	# reaches dns-proxy over the bus.
	services "$work/services.yaml" "$NAMES" 10000
	# A pod's resolv.conf: Kubernetes' search list (dns-proxy answers each name with the first
	# search domain appended too). No query goes upstream here.
	printf 'nameserver 127.0.0.1\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n' >"$work/resolv.conf"
	extra_env="ISTIO_META_DNS_CAPTURE=true ENVOY_STATUS_PORT=$(freeport) ENVOY_PROMETHEUS_PORT=$(freeport)"
	extra_env+=" PROXY_CONFIG={\"controlPlaneAuthPolicy\":\"NONE\",\"proxyAdminPort\":$(freeport)}"
	status_port=$(freeport)
	start_agentd "$work/$layout-full" --envoy-binary "$work/bin/envoy-standin" --resolv-conf "$work/resolv.conf"
	wait_ready 120
	sleep 3
	memory "$NAMES names and $NAMES endpoints, steady, Envoy stand-in as the xDS client ($layout)"
	for p in $(seq "$PUSHES"); do
		services "$work/services.yaml" "$NAMES" $((10000 + p))
		sleep 3
	done
	memory "after $PUSHES pushes moving all $NAMES endpoints ($layout)"
	stop_agentd
done
