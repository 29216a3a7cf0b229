#!/usr/bin/env bash
# Benchmarks dns-proxy behind `agentd run` against dnsmasq serving the same records, with
# dnsperf, in one run, side by side: table hits (1000 mesh names) and forwarded names (1000
# names answered by an upstream dnsmasq that both forward to). Then the same table-hit load
# during `agentd swap dns-proxy` and during a `kill -9` of dns-proxy, and table-hit and
# forwarded loads during five kills in a row, printing lost queries.
#
# Usage: scripts/bench/dns.sh        (DURATION=10 seconds per run, CLIENTS=4, OUTSTANDING=100,
#                                     NAMES=1000)
# Needs: go, dnsperf, dnsmasq, dig, curl, python3. Everything listens on 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/bench/lib.sh
. scripts/bench/lib.sh

DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-4}
OUTSTANDING=${OUTSTANDING:-100}
NAMES=${NAMES:-1000}

bench_init
echo "building agentd and helpers..." >&2
go build -o "$work/bin/" ./cmd/...

# Records: mesh names (svcN.nsM.svc.cluster.local) and forwarded names (fwdN.example.net).
: >"$work/mesh.hosts"
: >"$work/fwd.hosts"
: >"$work/hits.txt"
: >"$work/fwd.txt"
json='{"@type":"type.googleapis.com/istio.networking.nds.v1.NameTable","table":{'
for i in $(seq 0 $((NAMES - 1))); do
	ns="ns$((i % 10))"
	host="svc$i.$ns.svc.cluster.local"
	ip="10.$((i / 65536 % 256)).$((i / 256 % 256)).$((i % 256))"
	echo "$ip $host" >>"$work/mesh.hosts"
	echo "$host A" >>"$work/hits.txt"
	echo "198.51.$((i / 256 % 256)).$((i % 256)) fwd$i.example.net" >>"$work/fwd.hosts"
	echo "fwd$i.example.net A" >>"$work/fwd.txt"
	[ "$i" -gt 0 ] && json+=','
	json+="\"$host\":{\"ips\":[\"$ip\"],\"registry\":\"Kubernetes\",\"shortname\":\"svc$i\",\"namespace\":\"$ns\"}"
done
json+='}}'

# The upstream resolver both forward to, and dnsmasq as the local DNS under test (no cache for
# forwarded names: dns-proxy does not cache either, as Istio's does not).
up=$(freeport)
start_dnsmasq "$up" --addn-hosts="$work/fwd.hosts" --cache-size=10000 --dns-forward-max=1000
dm=$(freeport)
start_dnsmasq "$dm" --addn-hosts="$work/mesh.hosts" --server="127.0.0.1#$up" --cache-size=0 --dns-forward-max=1000
dm_pid=$!

# agentd with DNS capture on, resolving through the same upstream.
printf 'nameserver 127.0.0.1:%s\nsearch ns0.svc.cluster.local svc.cluster.local cluster.local\n' "$up" >"$work/resolv.conf"
ad=$(freeport)
mkdir -p "$work/root"
ISTIO_META_DNS_CAPTURE=true POD_NAMESPACE=ns0 "$work/bin/agentd" run --root "$work/root" --helpers-dir "$work/bin" \
	--disable-envoy --dns-address "127.0.0.1:$ad" --resolv-conf "$work/resolv.conf" --ready-timeout 5s --status-port "$(freeport)" \
	>"$work/agentd.log" 2>&1 &
agentd_pid=$!
pids+=($agentd_pid)
sock="$work/root/var/run/agentd/control.sock"
for i in $(seq 100); do
	curl -sf --unix-socket "$sock" -X POST --data-binary "$json" http://agentd/v1/publish/name-table >/dev/null && break
	[ "$i" = 100 ] && { echo "cannot publish the name table on agentd's control socket" >&2; cat "$work/agentd.log" >&2; exit 1; }
	sleep 0.1
done
wait_answer "$up" fwd0.example.net
wait_answer "$dm" svc0.ns0.svc.cluster.local
wait_answer "$ad" svc0.ns0.svc.cluster.local

perf() { # PORT FILE [PID]: "qps avg_latency_ms lost sent cpu_us_per_query agentd_cpu_us_per_query"
	# (cpu of PID, and of the agentd process itself, which holds dns-proxy's sockets)
	local before=0 after=0 abefore aafter
	[ -n "${3:-}" ] && before=$(cputicks "$3")
	abefore=$(cputicks "$agentd_pid")
	dnsperf -s 127.0.0.1 -p "$1" -d "$2" -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING" -t 5 >"$work/dnsperf.out" 2>&1
	[ -n "${3:-}" ] && after=$(cputicks "$3")
	aafter=$(cputicks "$agentd_pid")
	awk -v ticks=$((after - before)) -v aticks=$((aafter - abefore)) -v hz="$(getconf CLK_TCK)" '
		/Queries sent:/ {sent=$3}
		/Queries lost:/ {lost=$3}
		/Queries completed:/ {done=$3}
		/Queries per second:/ {qps=$4}
		/Average Latency/ {lat=$4 * 1000}
		END {printf "%.0f %.3f %d %d %.1f %.1f\n", qps, lat, lost, sent, (done > 0 ? ticks / hz * 1e6 / done : 0),
			(done > 0 ? aticks / hz * 1e6 / done : 0)}' "$work/dnsperf.out"
}

row() { # LABEL FILE: agentd, dnsmasq, dnsmasq, agentd (load on this shared machine drifts), averaged
	local a1 a2 d1 d2
	a1=$(perf "$ad" "$2" "$(dns_proxy_pid)")
	d1=$(perf "$dm" "$2" "$dm_pid")
	d2=$(perf "$dm" "$2" "$dm_pid")
	a2=$(perf "$ad" "$2" "$(dns_proxy_pid)")
	printf "%s\n%s\n%s\n%s\n" "$a1" "$a2" "$d1" "$d2" | awk -v label="$1" '
		{q[NR]=$1; l[NR]=$2; lost[NR]=$3; c[NR]=$5; ac[NR]=$6}
		END {
			aq=(q[1]+q[2])/2; dq=(q[3]+q[4])/2
			printf "%-12s %10.0f %7.3f %5d %7.1f %7.1f   %10.0f %7.3f %5d %7.1f   %6.2f\n", label,
				aq, (l[1]+l[2])/2, lost[1]+lost[2], (c[1]+c[2])/2, (ac[1]+ac[2])/2,
				dq, (l[3]+l[4])/2, lost[3]+lost[4], (c[3]+c[4])/2, (dq > 0 ? aq / dq : 0)
		}'
}

dns_proxy_pid() {
	"$work/bin/agentd" status --root "$work/root" --json | python3 -c '
import json, sys
print(next(c["pid"] for c in json.load(sys.stdin)["children"] if c["name"] == "dns-proxy"))'
}

echo
echo "dnsperf, UDP, ${DURATION}s per run (two runs each, in the order agentd dnsmasq dnsmasq agentd), $CLIENTS clients,"
echo "$OUTSTANDING outstanding, $NAMES names; $(nproc) cores shared with dnsperf"
echo "(cpu = CPU time of dns-proxy or dnsmasq per answered query, in microseconds; agentd = CPU"
echo "time of the agentd process itself, which holds dns-proxy's sockets, per query)"
printf "%-12s %10s %7s %5s %7s %7s   %10s %7s %5s %7s   %6s\n" "" "agentd qps" "avg ms" "lost" "cpu us" "agentd" "dnsmasq" "avg ms" "lost" "cpu us" "ratio"
row "table hits" "$work/hits.txt"
row "forwarded" "$work/fwd.txt"

disrupted() { # LABEL FILE COMMAND...: dnsperf load of FILE with COMMAND run a third of the way in
	local label=$1 file=$2; shift 2
	perf "$ad" "$file" >"$work/perf.out" &
	local perf_pid=$!
	sleep "$((DURATION / 3))"
	"$@"
	wait "$perf_pid"
	read -r q l lost sent _ <"$work/perf.out"
	printf "%-30s %12s %10s %6s of %s sent\n" "$label" "$q" "$l" "$lost" "$sent"
}

cp "$work/bin/dns-proxy" "$work/dns-proxy-new"
swap() { "$work/bin/agentd" swap dns-proxy --root "$work/root" --binary "$work/dns-proxy-new" >/dev/null; }
kill9() {
	local old
	old=$(dns_proxy_pid)
	kill -9 "$old"
	for _ in $(seq 200); do
		local now
		now=$(dns_proxy_pid 2>/dev/null || echo 0)
		[ "$now" != 0 ] && [ "$now" != "$old" ] && break
		sleep 0.05
	done
}
kill9x5() { # five kills, each once the last one's process is back, 0.5 s apart
	for _ in 1 2 3 4 5; do kill9; sleep 0.5; done
}

echo
echo "through agentd while dns-proxy is replaced (lost = no answer within 5 s; dnsperf sends"
echo "each query once: a resolver would retry, dnsperf counts it lost)"
printf "%-30s %12s %10s %6s\n" "" "qps" "avg ms" "lost"
disrupted "steady (baseline)" "$work/hits.txt" true
disrupted "agentd swap dns-proxy" "$work/hits.txt" swap
disrupted "kill -9 dns-proxy" "$work/hits.txt" kill9
disrupted "5 x kill -9, table hits" "$work/hits.txt" kill9x5
disrupted "5 x kill -9, forwarded" "$work/fwd.txt" kill9x5
