#!/usr/bin/env bash
# Runs Istio's pilot-agent and agentd one after the other on the same stand-ins, as an injected
# sidecar with DNS capture and two app probes (httpGet + tcpSocket), and prints side by side
# with ratios: exec to /healthz/ready 200, the PSS sum of the agent's processes (Envoy not
# counted) idle and after load, DNS table hits and forwarded names (dnsperf: qps and the
# agent's CPU time per query), app probes through the status port (wrk: rate, and the p99
# latency added over calling the app directly, one connection).
#
# Everything runs in a private network and mount namespace (unshare -nm, as root): Istio's fixed
# ports (15000, 15010, 15020, 15021, 15053, 15090) and port 53 are the namespace's own, and the
# agents' /etc/resolv.conf is a bind mount naming an upstream dnsmasq on 127.0.0.1:53. The
# stand-ins: devplane as a plaintext xDS server and Istio CA on 127.0.0.1:15010 (NAMES services,
# which reach both agents' DNS tables over NDS), test/envoy-standin as Envoy (Envoy cannot be
# installed here), a tiny Go HTTP app on 127.0.0.1:8080 for the probes. Both agents run as the
# injected container runs them: `pilot-agent proxy sidecar` in a folder that stands for the
# pod's / (Istio's bootstrap template at ./var/lib/istio/envoy/, the CA root at
# ./var/run/secrets/istio/root-cert.pem), with the same environment; agentd at the installed
# layout (static build, helpers as links to agentd, a link named pilot-agent).
#
# A pilot-agent from Istio's source (about 2 minutes on 2 cores):
#   git clone https://github.com/istio/istio && cd istio && CGO_ENABLED=0 go build ./pilot/cmd/pilot-agent
#
# Usage: PILOT_AGENT=/path/to/pilot-agent scripts/bench/peer.sh
#   ROUNDS=2 (each agent once per round, pilot-agent first), STARTS=6 (starts alone, the two
#   agents alternating, for the start's median), NAMES=1000, DNS_SECS=5,
#   PROBE_SECS=5, TEMPLATE=../shared/reference/istio/envoy_bootstrap_tmpl.json,
#   AGENTD_ENV='GOGC=100' (extra environment for agentd only, to try a setting).
# Needs: root (unshare), go, python3, curl, dig, dnsperf, dnsmasq, wrk.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/bench/lib.sh
. scripts/bench/lib.sh

ROUNDS=${ROUNDS:-2}
STARTS=${STARTS:-6}
NAMES=${NAMES:-1000}
DNS_SECS=${DNS_SECS:-5}
PROBE_SECS=${PROBE_SECS:-5}
TEMPLATE=${TEMPLATE:-../shared/reference/istio/envoy_bootstrap_tmpl.json}
APP_PORT=8080

if [ -z "${PEER_INSIDE:-}" ]; then
	[ -n "${PILOT_AGENT:-}" ] || { echo "peer.sh: set PILOT_AGENT to a pilot-agent binary (see the header)" >&2; exit 2; }
	[ -x "$PILOT_AGENT" ] || { echo "peer.sh: $PILOT_AGENT is not an executable" >&2; exit 2; }
	[ -r "$TEMPLATE" ] || { echo "peer.sh: no bootstrap template at $TEMPLATE" >&2; exit 2; }
	for tool in unshare curl dig dnsperf dnsmasq wrk python3; do
		command -v "$tool" >/dev/null || { echo "peer.sh: $tool not found" >&2; exit 2; }
	done
	bench_init
	echo "building agentd, the helpers, devplane, the Envoy stand-in and the app..." >&2
	build_tree "$work/bin" ./cmd/agentd ./cmd/devplane ./test/envoy-standin
	ln -s agentd "$work/bin/links/pilot-agent"
	mv "$work/bin/envoy-standin" "$work/bin/envoy" # Envoy's name: excluded from the agents' sums
	build_app "$work/bin/app"
	cp "$PILOT_AGENT" "$work/bin/istio-pilot-agent"
	cp "$TEMPLATE" "$work/template.json"
	echo "machine before: $(uptime)"
	PEER_INSIDE=1 work=$work unshare -nm --propagation private bash "$0"
	echo "machine after:  $(uptime)"
	exit 0
fi

# Inside the namespaces from here on.
pids=()
trap 'for p in "${pids[@]}"; do kill -9 -- "-$p" "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT
ip link set lo up

# Upstream DNS: dnsmasq on 127.0.0.1:53 with the forwarded names, named by the pod's resolv.conf.
dns_names "$NAMES" "$work/mesh.hosts" "$work/fwd.hosts" "$work/hits.txt" "$work/fwd.txt"
start_dnsmasq 53 --addn-hosts="$work/fwd.hosts" --cache-size=10000 --dns-forward-max=1000
printf 'nameserver 127.0.0.1\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n' >"$work/resolv.conf"
mount --bind "$work/resolv.conf" /etc/resolv.conf

services "$work/services.yaml" "$NAMES" 9080
setsid "$work/bin/devplane" --services "$work/services.yaml" --xds-address 127.0.0.1:15010 --debug-address "" \
	--ca-root-out "$work/ca-root.pem" >"$work/devplane.log" 2>&1 &
pids+=($!)
setsid "$work/bin/app" "$APP_PORT" &
pids+=($!)
for _ in $(seq 200); do [ -s "$work/ca-root.pem" ] && break; sleep 0.05; done
wait_answer 53 fwd0.example.net

probers="{\"/app-health/app/readyz\":{\"httpGet\":{\"path\":\"/ok\",\"port\":$APP_PORT},\"timeoutSeconds\":1},"
probers+="\"/app-health/app/livez\":{\"tcpSocket\":{\"port\":$APP_PORT},\"timeoutSeconds\":1}}"
status=http://127.0.0.1:15020

# launch NAME BINARY TAG: starts one agent as the injected container runs it, in its own root
# ($work/NAME-TAG) and session, and waits until /healthz/ready answers 200. Sets pid (the
# session's leader), ready (ms from exec) and start_cpu (ms of CPU the agent's processes used
# until then, Envoy not counted).
launch() {
	local name=$1 bin=$2 tag=$3 root=$work/$1-$3 extra=()
	mkdir -p "$root/var/lib/istio/envoy" "$root/var/run/secrets/istio" "$root/etc/istio/proxy"
	cp "$work/template.json" "$root/var/lib/istio/envoy/envoy_bootstrap_tmpl.json"
	cp "$work/ca-root.pem" "$root/var/run/secrets/istio/root-cert.pem"
	# shellcheck disable=SC2206 # AGENTD_ENV is a list of NAME=VALUE words
	[ "$name" = agentd ] && extra=(${AGENTD_ENV:-})
	local t0
	t0=$(now_ms)
	(cd "$root" && exec setsid env POD_NAME=bench-0 POD_NAMESPACE=default SERVICE_ACCOUNT=default INSTANCE_IP=127.0.0.1 \
		ISTIO_META_CLUSTER_ID=Kubernetes ISTIO_META_MESH_ID=cluster.local TRUST_DOMAIN=cluster.local \
		CLOUD_PLATFORM=none ISTIO_META_DNS_CAPTURE=true DNS_PROXY_ADDR=127.0.0.1:15053 \
		PILOT_CERT_PROVIDER=istiod CA_ADDR=127.0.0.1:15010 ISTIO_KUBE_APP_PROBERS="$probers" \
		PROXY_CONFIG="{\"discoveryAddress\":\"127.0.0.1:15010\",\"controlPlaneAuthPolicy\":\"NONE\",\"binaryPath\":\"$work/bin/envoy\",\"statusPort\":15020,\"proxyAdminPort\":15000}" \
		"${extra[@]}" "$bin" proxy sidecar --domain default.svc.cluster.local >"$root.log" 2>&1) &
	pid=$!
	pids+=("$pid")
	until [ "$(curl -s -o /dev/null -w '%{http_code}' "$status/healthz/ready")" = 200 ]; do
		if [ $(($(now_ms) - t0)) -gt 60000 ] || ! kill -0 "$pid" 2>/dev/null; then
			echo "$name not ready within 60 s; its log:" >&2
			tail -30 "$root.log" >&2
			return 1
		fi
		sleep 0.002
	done
	ready=$(($(now_ms) - t0))
	# shellcheck disable=SC2046 # a list of pids
	start_cpu=$(($(cputicks $(agent_pids "$pid")) * 1000 / $(getconf CLK_TCK)))
}

# quit: stops the agent launch started (POST /quitquitquit, then SIGKILL to what is left) and
# waits until nothing answers on the status port, which the next agent takes.
quit() {
	curl -s -o /dev/null -X POST "$status/quitquitquit" || true
	for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -9 -- "-$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	for _ in $(seq 100); do curl -s -o /dev/null "$status/healthz/ready" || break; sleep 0.1; done
}

# run_agent NAME BINARY ROUND: one agent from exec to stop; appends its figures to results.
run_agent() {
	local name=$1 bin=$2 round=$3 pid ready start_cpu
	launch "$name" "$bin" "$round" || return 1
	sleep 3
	local idle procs
	idle=$(pss_mb $(agent_pids "$pid"))
	procs=$(agent_pids "$pid" | wc -l)
	{ echo "$name round $round, idle:"; memory_table "$pid"; } >>"$work/detail"

	# The name table arrived (NDS), and both probes answer.
	wait_answer 15053 svc0.ns0.svc.cluster.local
	for probe in readyz livez; do
		local code
		code=$(curl -s -o /dev/null -w '%{http_code}' "$status/app-health/app/$probe")
		[ "$code" = 200 ] || { echo "$name: /app-health/app/$probe answered $code" >&2; return 1; }
	done

	local hits fwd
	# shellcheck disable=SC2046 # a list of pids
	hits=$(dnsperf_run 15053 "$work/hits.txt" "$DNS_SECS" 4 100 $(agent_pids "$pid"))
	# shellcheck disable=SC2046
	fwd=$(dnsperf_run 15053 "$work/fwd.txt" "$DNS_SECS" 4 100 $(agent_pids "$pid"))

	# Probes: the rate with wrk 2 threads x 16 connections, then the latency with one connection,
	# direct and through the status port one after the other.
	local rate direct1 status1 t0 t1 probe_cpu ceiling
	# The ceiling of any prober here: the app with a new connection per request (a probe makes one).
	ceiling=$(wrk_run "http://127.0.0.1:$APP_PORT/ok" "$PROBE_SECS" 2 16 -H "Connection: close")
	t0=$(cputicks $(agent_pids "$pid"))
	rate=$(wrk_run "$status/app-health/app/readyz" "$PROBE_SECS" 2 16)
	t1=$(cputicks $(agent_pids "$pid"))
	probe_cpu=$(awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" -v rate="${rate%% *}" -v s="$PROBE_SECS" \
		'BEGIN {printf "%.1f", (rate > 0 ? t / hz * 1e6 / (rate * s) : 0)}')
	direct1=$(wrk_run "http://127.0.0.1:$APP_PORT/ok" "$PROBE_SECS" 1 1)
	status1=$(wrk_run "$status/app-health/app/readyz" "$PROBE_SECS" 1 1)
	sleep 3
	local loaded
	loaded=$(pss_mb $(agent_pids "$pid"))
	{ echo "$name round $round, after load:"; memory_table "$pid"; } >>"$work/detail"

	quit

	echo "$name $round $ready $idle $loaded $procs $hits $fwd $rate $direct1 $status1 $probe_cpu ${ceiling%% *}" >>"$work/results"
	echo "$name round $round: ready $ready ms, idle $idle MB ($procs processes), after load $loaded MB" >&2
}

: >"$work/results"
: >"$work/detail"
: >"$work/starts"
# Starts alone, the two agents alternating: start times move with the machine's load, so the
# figure is the median of several, each agent's starts interleaved with the other's.
declare -A agent_bin=([pilot-agent]=$work/bin/istio-pilot-agent [agentd]=$work/bin/links/pilot-agent)
for i in $(seq "$STARTS"); do
	for agent in pilot-agent agentd; do
		launch "$agent" "${agent_bin[$agent]}" "start$i"
		quit
		echo "$agent $ready $start_cpu" >>"$work/starts"
	done
done
for round in $(seq "$ROUNDS"); do
	for agent in pilot-agent agentd; do
		run_agent "$agent" "${agent_bin[$agent]}" "$round"
	done
done

echo "memory of each process (smaps_rollup):"
cat "$work/detail"
echo
python3 - "$work/results" "$NAMES" "$DNS_SECS" "$PROBE_SECS" "$(nproc)" "$work/starts" <<'EOF'
import statistics
import sys
path, names, dns_secs, probe_secs, cpus, starts_path = sys.argv[1:]
starts = {"pilot-agent": [], "agentd": []}
for line in open(starts_path):
    f = line.split()
    starts[f[0]].append((float(f[1]), float(f[2])))
cols = ("round ready idle loaded procs hits_qps hits_lat hits_lost hits_sent hits_cpu "
        "fwd_qps fwd_lat fwd_lost fwd_sent fwd_cpu rate rate_p50 rate_p99 direct_rps direct_p50 direct_p99 "
        "one_rps one_p50 one_p99 probe_cpu ceiling").split()
runs = {"pilot-agent": [], "agentd": []}
for line in open(path):
    f = line.split()
    r = dict(zip(cols, map(float, f[1:])))
    r["added"] = r["one_p99"] - r["direct_p99"]
    r["added50"] = r["one_p50"] - r["direct_p50"]
    runs[f[0]].append(r)
p, a = runs["pilot-agent"], runs["agentd"]

def vals(rs, k, fmt):
    return ", ".join(fmt.format(r[k]) for r in rs)

def mean(rs, k):
    return sum(r[k] for r in rs) / len(rs)

def span(xs):
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"

rows = [
    ("exec → /healthz/ready 200, in the rounds (ms)", "ready", "{:.0f}", ""),
    ("PSS sum of the agent's processes, idle (MB)", "idle", "{:.1f}", "≤ 1"),
    ("the same after DNS and probe load (MB)", "loaded", "{:.1f}", "≤ 1"),
    ("DNS table hits (qps)", "hits_qps", "{:.0f}", "no regression"),
    ("DNS table hits, agent CPU per query (µs)", "hits_cpu", "{:.1f}", ""),
    ("DNS forwarded (qps)", "fwd_qps", "{:.0f}", "no regression"),
    ("DNS forwarded, agent CPU per query (µs)", "fwd_cpu", "{:.1f}", ""),
    ("app probes through :15020, wrk 2×16 (/s)", "rate", "{:.0f}", "≥ 2"),
    ("app probes, agent CPU per probe (µs)", "probe_cpu", "{:.0f}", ""),
    ("the app directly, new connection per request, wrk 2×16 (/s): any prober's ceiling", "ceiling", "{:.0f}", ""),
    ("probe's added p50 over the app, 1 connection (ms)", "added50", "{:.3f}", ""),
    ("probe's added p99 over the app, 1 connection (ms)", "added", "{:.3f}", "agentd < 1 ms"),
]
print(f"{len(p)} rounds on {cpus} CPUs, each round pilot-agent then agentd; DNS: dnsperf 4 clients x 100 outstanding,")
print(f"{dns_secs} s, {names} names; probes: wrk {probe_secs} s. Processes: pilot-agent {vals(p, 'procs', '{:.0f}')},"
      f" agentd {vals(a, 'procs', '{:.0f}')} (Envoy not counted).")
print(f"Starts alone: {len(starts['agentd'])} of each agent, alternating.")
print()
print("| figure | pilot-agent | agentd | agentd / pilot-agent | goal |")
print("|---|---|---|---|---|")
for title, i, goal in (("exec → /healthz/ready 200, median of the starts alone (ms)", 0, "≤ 1"),
                       ("CPU of the agent's processes from exec to ready, median (ms; Envoy not counted)", 1, "")):
    ps, as_ = [x[i] for x in starts["pilot-agent"]], [x[i] for x in starts["agentd"]]
    if not ps or not as_:
        continue
    pm, am = statistics.median(ps), statistics.median(as_)
    ratio = f"{am / pm:.2f}" if pm > 0 else "-"
    print(f"| {title} | {span(ps)} | {span(as_)} | {ratio} | {goal} |")
for title, k, fmt, goal in rows:
    pm, am = mean(p, k), mean(a, k)
    ratio = f"{am / pm:.2f}" if pm > 0 and am >= 0 else "-"
    print(f"| {title} | {vals(p, k, fmt)} | {vals(a, k, fmt)} | {ratio} | {goal} |")
lost = sum(r["hits_lost"] + r["fwd_lost"] for r in p + a)
print()
print(f"DNS queries lost (no answer within 5 s), all runs: {lost:.0f}. The app called directly, 1 connection"
      f" (before each agent's figure): p50 {vals(p + a, 'direct_p50', '{:.3f}')} ms, p99 {vals(p + a, 'direct_p99', '{:.3f}')} ms.")
EOF
