#!/usr/bin/env bash
# `make run`: agentd on this machine against a local control plane. It starts, each in its own
# process group with its log in the run directory:
#   - cmd/sample-backend, a gRPC backend (the health service) on 127.0.0.1:50051;
#   - cmd/devplane, the local stand-in for istiod (xDS, the DNS name table, a CA), serving
#     deploy/examples/services.yaml on 127.0.0.1:15010, with one WasmPlugin whose module
#     devplane serves on its debug address (127.0.0.1:15014);
#   - agentd, rooted in the run directory, with Envoy if `envoy` is on PATH, else proxyless
#     (--disable-envoy): a proxyless gRPC client resolves xds:/// names through it;
# makes one proxyless call, asks agentd's XDS socket for the WasmPlugin as Envoy does (xds-proxy
# fetches the module, caches it under the run directory's var/lib/istio/data and answers with
# the local file), waits until agentd is ready, prints what to try, and waits.
# Ctrl-C stops agentd (which drains its children), then devplane, then the backend.
#
#   scripts/run.sh [--smoke]
#
# --smoke runs the suggested commands itself, checks their answers, stops everything and exits
# (0 when all passed). Environment: BIN (binaries, default bin), RUN_DIR (default a new temp
# directory), XDS_ADDR, DNS_ADDR, STATUS_PORT, BACKEND_ADDR, DEBUG_ADDR (addresses; defaults
# Istio's ports on 127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=false
case "${1:-}" in
--smoke) smoke=true ;;
"") ;;
*) echo "usage: $0 [--smoke]" >&2; exit 2 ;;
esac

BIN=$(cd "${BIN:-bin}" && pwd)
XDS_ADDR=${XDS_ADDR:-127.0.0.1:15010}
DNS_ADDR=${DNS_ADDR:-127.0.0.1:15053}
STATUS_PORT=${STATUS_PORT:-15020}
BACKEND_ADDR=${BACKEND_ADDR:-127.0.0.1:50051}
DEBUG_ADDR=${DEBUG_ADDR:-127.0.0.1:15014}
RUN_DIR=${RUN_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/agentd-run.XXXXXX")}
RUN_DIR=$(mkdir -p "$RUN_DIR" && cd "$RUN_DIR" && pwd)
for b in agentd xds-proxy sds-server dns-proxy prober devplane sample-backend sample-client; do
	[ -x "$BIN/$b" ] || { echo "run: $BIN/$b missing: run make build (make run does)" >&2; exit 1; }
done

names=() pids=()
# start NAME CMD...: runs CMD in its own process group (Ctrl-C reaches only this script),
# logging to RUN_DIR/NAME.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$RUN_DIR/$name.log" 2>&1 &
	names+=("$name") pids+=($!)
}
# stop ends what was started, last first, each gracefully (SIGTERM) and waited for.
stop() {
	local status=$?
	trap - EXIT INT TERM
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		if kill -TERM "${pids[i]}" 2>/dev/null; then
			echo "run: stopping ${names[i]} (pid ${pids[i]})"
		fi
		wait "${pids[i]}" 2>/dev/null || true
	done
	echo "run: stopped; logs and state are in $RUN_DIR"
	exit "$status"
}
trap stop EXIT
trap 'exit 130' INT TERM

# wait_for WHAT SECONDS CMD...: runs CMD every 0.2s until it succeeds.
wait_for() {
	local what=$1 deadline=$((SECONDS + $2))
	shift 2
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			echo "run: timed out waiting for $what; see the logs in $RUN_DIR" >&2
			return 1
		fi
		local i
		for i in "${!pids[@]}"; do
			kill -0 "${pids[i]}" 2>/dev/null || { echo "run: ${names[i]} exited; see $RUN_DIR/${names[i]}.log" >&2; return 1; }
		done
		sleep 0.2
	done
}

# http_get PORT PATH: prints the status line and body of GET http://127.0.0.1:PORT/PATH
# (bash's /dev/tcp: no curl needed).
http_get() {
	exec 3<>"/dev/tcp/127.0.0.1/$1"
	printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
	cat <&3
	exec 3<&-
}

mkdir -p "$RUN_DIR/var/run/secrets/istio"
start sample-backend "$BIN/sample-backend" --address "$BACKEND_ADDR"
sed -e "s/127.0.0.1, port: 50051/${BACKEND_ADDR%:*}, port: ${BACKEND_ADDR##*:}/" \
	-e "s#http://127.0.0.1:15014/#http://$DEBUG_ADDR/#" deploy/examples/services.yaml >"$RUN_DIR/services.yaml"
start devplane "$BIN/devplane" --xds-address "$XDS_ADDR" --debug-address "$DEBUG_ADDR" \
	--services "$RUN_DIR/services.yaml" --ca-root-out "$RUN_DIR/var/run/secrets/istio/root-cert.pem"
wait_for "devplane's CA root" 20 test -s "$RUN_DIR/var/run/secrets/istio/root-cert.pem"

envoy_args=(--disable-envoy)
mode="proxyless: no envoy on PATH, --disable-envoy"
if envoy=$(command -v envoy); then
	envoy_args=(--envoy-binary "$envoy")
	mode="with Envoy $envoy"
	# Not tried on the development machines, where Envoy cannot be installed.
	echo "run: Envoy loads the sample Wasm module itself (untested with a real Envoy: if it refuses the module, devplane logs an ECDS NACK, shown at http://$DEBUG_ADDR/debug/nacks)"
fi
# Istio's pod variables, and DNS capture on: dns-proxy answers mesh names from devplane's table.
start agentd env POD_NAME=quickstart-1 POD_NAMESPACE=default INSTANCE_IP=127.0.0.1 ISTIO_META_DNS_CAPTURE=true \
	"$BIN/agentd" run --root "$RUN_DIR" --helpers-dir "$BIN" --discovery-address "$XDS_ADDR" \
	--dns-address "$DNS_ADDR" --status-port "$STATUS_PORT" "${envoy_args[@]}"
bootstrap=$RUN_DIR/etc/istio/proxy/grpc-bootstrap.json
wait_for "agentd's gRPC bootstrap" 30 test -s "$bootstrap"

agentd=("$BIN/agentd")
client=(env "GRPC_XDS_BOOTSTRAP=$bootstrap" "$BIN/sample-client")
plugin=extensions.istio.io/trafficextension/default.sample
ecds=("$BIN/sample-client" ecds "$RUN_DIR/etc/istio/proxy/XDS" "$plugin")
plugin_sha=$(sed -n 's/^ *sha256: *\([0-9a-f]\{64\}\).*/\1/p' "$RUN_DIR/services.yaml")
echo "run: agentd $mode, root $RUN_DIR"
echo "run: a proxyless gRPC call through agentd (its xDS request also brings the DNS name table):"
"${client[@]}" --count 1
echo "run: the WasmPlugin, asked for as Envoy asks (ECDS); xds-proxy fetches the module from devplane,"
echo "     checks its sha256 ($plugin_sha), caches it and answers with the local file:"
"${ecds[@]}"
wait_for "agentd to be ready" 60 sh -c "'$BIN/agentd' status --root '$RUN_DIR' --json | grep -q '\"ready\":true'"
echo "run: xds-proxy's Wasm metrics, merged on the status port:"
http_get "$STATUS_PORT" /stats/prometheus | grep '^istio_agent_wasm_' | grep -v '_bucket{' || true

dns_host=${DNS_ADDR%:*} dns_port=${DNS_ADDR##*:}
sum_cmd="sha256sum $RUN_DIR/dns-proxy.patched | cut -d' ' -f1"
cat <<EOF

agentd is ready ($mode). Logs: $RUN_DIR/*.log. Try, in another terminal:

  $BIN/agentd status --root $RUN_DIR
  dig @$dns_host -p $dns_port reviews.default.svc.cluster.local     # 10.96.0.12, from devplane's name table
  GRPC_XDS_BOOTSTRAP=$bootstrap $BIN/sample-client --count 3
  curl -i http://127.0.0.1:$STATUS_PORT/healthz/ready
  curl -s http://127.0.0.1:$STATUS_PORT/stats/prometheus | grep -E '^(istio_agent|agentd)_' | head
  # the WasmPlugin: what Envoy is given, the cached module, the fetch and cache metrics
  ${ecds[*]}
  ls -lR $RUN_DIR/var/lib/istio/data
  curl -s http://127.0.0.1:$STATUS_PORT/stats/prometheus | grep ^istio_agent_wasm_
  # swap dns-proxy for another build while it serves, then check its new pid and SHA-256:
  cp $BIN/dns-proxy $RUN_DIR/dns-proxy.patched
  $BIN/agentd swap dns-proxy --root $RUN_DIR --binary $RUN_DIR/dns-proxy.patched --sha256 \$($sum_cmd)
  $BIN/agentd status --root $RUN_DIR
  # edit $RUN_DIR/services.yaml (e.g. move the endpoint): devplane reloads it and the client follows

EOF

if ! $smoke; then
	echo "Ctrl-C stops everything."
	wait "${pids[@]}" || true
	exit 0
fi

# --smoke: what the reader is told to try, checked.
fail=0
check() {
	local what=$1
	shift
	if out=$("$@" 2>&1); then
		echo "smoke: ok   $what"
	else
		echo "smoke: FAIL $what"$'\n'"$out" >&2
		fail=1
	fi
}
has() { grep -q -- "$1" <<<"$2"; }
status_ready() { local s; s=$("${agentd[@]}" status --root "$RUN_DIR") && echo "$s" && has "ready: true" "$s"; }
dig_mesh() { local a; a=$(dig +short +time=2 +tries=2 @"$dns_host" -p "$dns_port" reviews.default.svc.cluster.local) && echo "$a" && [ "$a" = 10.96.0.12 ]; }
client_calls() { local o; o=$("${client[@]}" --count 3) && echo "$o" && [ "$(grep -c " answered SERVING " <<<"$o")" = 3 ]; }
ready_200() { local r; r=$(http_get "$STATUS_PORT" /healthz/ready) && head -1 <<<"$r" && has " 200 " "$(head -1 <<<"$r")"; }
metrics() { local m; m=$(http_get "$STATUS_PORT" /stats/prometheus) && has "agentd_child_state" "$m"; }
# wasm_cached: Envoy is given the module file under the run directory's cache, whole (its
# sha256 is the WasmPlugin's), and the metrics counted one fetch and one cache entry.
wasm_cached() {
	local o m file
	o=$("${ecds[@]}") && echo "$o" || return 1
	file=$(sed -n "s#^$plugin: Envoy loads the Wasm module file \($RUN_DIR/var/lib/istio/data/[0-9a-f]*/$plugin_sha\.wasm\) .*#\1#p" <<<"$o")
	[ -n "$file" ] && [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$plugin_sha" ] || { echo "not the cached module"; return 1; }
	m=$(http_get "$STATUS_PORT" /stats/prometheus | grep '^istio_agent_wasm_') && echo "$m"
	has 'istio_agent_wasm_remote_fetch_count{result="success"} 1$' "$m" && has 'istio_agent_wasm_cache_entries 1$' "$m" &&
		has 'istio_agent_wasm_config_conversion_count{result="success"}' "$m"
}
no_ecds_nack() { local n; n=$(http_get "${DEBUG_ADDR##*:}" /debug/nacks) && echo "$n" && ! has TypedExtensionConfig "$n"; }
swap() {
	local old new
	old=$("${agentd[@]}" status --root "$RUN_DIR" --json)
	cp "$BIN/dns-proxy" "$RUN_DIR/dns-proxy.patched"
	"${agentd[@]}" swap dns-proxy --root "$RUN_DIR" --binary "$RUN_DIR/dns-proxy.patched" --sha256 "$(sh -c "$sum_cmd")" &&
		new=$("${agentd[@]}" status --root "$RUN_DIR" --json) && has "$RUN_DIR/dns-proxy.patched" "$new" && [ "$old" != "$new" ] && dig_mesh
}
check "agentd status: ready" status_ready
if command -v dig >/dev/null; then check "dig of a mesh name" dig_mesh; else echo "smoke: skip dig (not installed)"; fi
check "proxyless gRPC calls through agentd" client_calls
check "readiness 200" ready_200
check "metrics" metrics
check "WasmPlugin: fetched once, cached under var/lib/istio/data, Envoy given the local file" wasm_cached
if [ -n "${envoy:-}" ]; then check "Envoy did not reject the Wasm module (untested: no Envoy here)" no_ecds_nack; fi
check "swap dns-proxy, then DNS still answers" swap
exit "$fail"
