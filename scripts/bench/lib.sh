# Shell shared by the benchmark scripts of scripts/bench (sourced, not run): the work folder
# and its cleanup, free ports, building the tree as the image does, the probed app, dnsmasq,
# dnsperf and wrk runs, and the memory and CPU time of a process tree.
# shellcheck shell=bash

# bench_init: a work folder ($work) removed at exit, with every pid in $pids killed.
bench_init() {
	work=$(mktemp -d)
	pids=()
	trap bench_cleanup EXIT
}
bench_cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}

# freeport: a port free for both TCP and UDP on 127.0.0.1.
freeport() {
	python3 - <<'EOF'
import socket
while True:
    t = socket.socket(); t.bind(("127.0.0.1", 0)); port = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", port)); print(port); break
    except OSError:
        pass
    finally:
        u.close(); t.close()
EOF
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# build_tree DIR PACKAGES...: the packages built as the image builds them (deploy/docker/
# Dockerfile, make build: static, no cgo, stripped, without urfave/cli's manual-page writer
# and gRPC's request tracing)
# into DIR, and DIR/links: agentd (a hard link, so that its own folder, the default helpers
# folder, is DIR/links) with each helper as a link to it (the installed layout).
build_tree() {
	local dir=$1
	shift
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -tags urfave_cli_no_docs,grpcnotrace -o "$dir/" "$@"
	mkdir -p "$dir/links"
	ln -f "$dir/agentd" "$dir/links/agentd"
	for h in xds-proxy sds-server dns-proxy prober; do ln -sf agentd "$dir/links/$h"; done
}

# build_app OUT: the probed app, a tiny Go HTTP server: `OUT PORT` answers /ok with "ok".
build_app() {
	mkdir -p "$work/app-src"
	cat >"$work/app-src/main.go" <<'EOF'
package main

import (
	"net/http"
	"os"
)

func main() {
	http.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })
	http.ListenAndServe("127.0.0.1:"+os.Args[1], nil)
}
EOF
	(cd "$work/app-src" && GOFLAGS= GO111MODULE=off go build -o "$1" .)
}

# start_dnsmasq PORT ARGS...: a dnsmasq on 127.0.0.1:PORT in the background (pid in $!).
start_dnsmasq() {
	local port=$1
	shift
	dnsmasq --keep-in-foreground --no-resolv --no-hosts --listen-address=127.0.0.1 --bind-interfaces \
		--port="$port" --conf-file=/dev/null --user=root --pid-file= --log-facility=/dev/null "$@" &
	pids+=($!)
}

# wait_answer PORT NAME: until the DNS server on 127.0.0.1:PORT answers NAME with an address.
wait_answer() {
	for _ in $(seq 150); do
		if dig @127.0.0.1 -p "$1" +tries=1 +time=1 +short "$2" A | grep -q '^[0-9]'; then return 0; fi
		sleep 0.1
	done
	echo "no answer from 127.0.0.1:$1 for $2" >&2
	return 1
}

# dns_names N MESH_HOSTS FWD_HOSTS HITS FWD: N mesh names svcI.nsJ.svc.cluster.local (hosts
# file and dnsperf input) and N forwarded names fwdI.example.net, as devplane's services()
# below and an upstream dnsmasq serve them.
dns_names() {
	awk -v n="$1" -v mh="$2" -v fh="$3" -v hits="$4" -v fwd="$5" 'BEGIN {
		for (i = 0; i < n; i++) {
			host = sprintf("svc%d.ns%d.svc.cluster.local", i, i % 10)
			printf "10.96.%d.%d %s\n", int(i / 250), i % 250 + 1, host >mh
			printf "%s A\n", host >hits
			printf "198.51.%d.%d fwd%d.example.net\n", int(i / 256) % 256, i % 256, i >fh
			printf "fwd%d.example.net A\n", i >fwd
		}
	}'
}

# services FILE N PORT: devplane's services file with N services (svcI.nsJ.svc.cluster.local
# at 10.96.x.y), one endpoint each on PORT (N names in the table, N endpoints).
services() {
	awk -v n="$2" -v port="$3" 'BEGIN {
		print "services:"
		for (i = 0; i < n; i++) {
			printf "- hostname: svc%d.ns%d.svc.cluster.local\n  namespace: ns%d\n", i, i % 10, i % 10
			printf "  addresses: [10.96.%d.%d]\n", int(i / 250), i % 250 + 1
			printf "  ports: [{name: grpc, port: 8080, protocol: GRPC}]\n"
			printf "  endpoints: [{address: 10.%d.%d.%d, port: %d}]\n", 1 + int(i / 65536), int(i / 256) % 256, i % 256, port
		}
	}' >"$1.tmp"
	mv "$1.tmp" "$1"
}

# tree PID: PID and its descendants.
tree() {
	echo "$1"
	local c
	for c in $(pgrep -P "$1" || true); do tree "$c"; done
}

# agent_pids PID: PID and its descendants without Envoy (the agent's own processes).
agent_pids() {
	local p
	for p in $(tree "$1"); do
		[ -r "/proc/$p/comm" ] && [[ $(cat "/proc/$p/comm" 2>/dev/null) != envoy* ]] && echo "$p"
	done
	return 0
}

# memory_table PID: RSS and PSS (anon and file) and threads of every process of PID's tree,
# and the sums without Envoy.
memory_table() {
	local p
	for p in $(tree "$1"); do
		[ -r "/proc/$p/smaps_rollup" ] || continue
		echo "$(cat "/proc/$p/comm") $(awk '/^Threads:/{print $2}' "/proc/$p/status")" \
			"$(awk '/^(Rss|Pss|Pss_Anon|Pss_File):/{printf "%s ", $2}' "/proc/$p/smaps_rollup")"
	done | awk '
		BEGIN { printf "%-14s %8s %8s %8s %8s %8s\n", "process", "RSS MB", "PSS MB", "anon MB", "file MB", "threads" }
		{
			printf "%-14s %8.1f %8.1f %8.1f %8.1f %8d\n", $1, $3/1024, $4/1024, $5/1024, $6/1024, $2
			if ($1 !~ /^envoy/) { rss += $3; pss += $4 }
		}
		END { printf "%-14s %8.1f %8.1f   (the agent'"'"'s processes; Envoy not counted)\n", "sum", rss/1024, pss/1024 }'
}

# pss_mb PIDS...: the sum of their PSS (/proc/PID/smaps_rollup), in MB.
pss_mb() {
	local p
	for p in "$@"; do cat "/proc/$p/smaps_rollup" 2>/dev/null || true; done |
		awk '/^Pss:/ {s += $2} END {printf "%.1f\n", s / 1024}'
}

# cputicks PIDS...: their user+system clock ticks so far.
cputicks() {
	local p
	for p in "$@"; do cat "/proc/$p/stat" 2>/dev/null || true; done | awk '{s += $14 + $15} END {print s + 0}'
}

# dnsperf_run PORT FILE SECONDS CLIENTS OUTSTANDING PIDS...: dnsperf against 127.0.0.1:PORT
# with FILE's queries; prints "qps avg_latency_ms lost sent cpu_us_per_query", the CPU time
# being that of PIDS during the run.
dnsperf_run() {
	local port=$1 file=$2 secs=$3 clients=$4 outstanding=$5
	shift 5
	local before after
	before=$(cputicks "$@")
	dnsperf -s 127.0.0.1 -p "$port" -d "$file" -l "$secs" -c "$clients" -q "$outstanding" -t 5 >"$work/dnsperf.out" 2>&1
	after=$(cputicks "$@")
	awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
		/Queries sent:/ {sent=$3}
		/Queries lost:/ {lost=$3}
		/Queries completed:/ {done=$3}
		/Queries per second:/ {qps=$4}
		/Average Latency/ {lat=$4 * 1000}
		END {printf "%.0f %.3f %d %d %.1f\n", qps, lat, lost, sent, (done > 0 ? ticks / hz * 1e6 / done : 0)}' "$work/dnsperf.out"
}

# wrk_run URL SECONDS THREADS CONNECTIONS [wrk args]: prints "requests_per_s p50_ms p99_ms"; fails
# when an answer was not 2xx.
wrk_run() {
	local url=$1 secs=$2 threads=$3 conns=$4 out
	shift 4
	out=$(wrk --latency -t"$threads" -c"$conns" -d"${secs}s" "$@" "$url")
	if grep -q "Non-2xx" <<<"$out"; then
		echo "wrk $url got non-2xx answers:" >&2
		echo "$out" >&2
		return 1
	fi
	awk '
		function ms(v) {
			if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
			if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
			if (v ~ /s$/) return substr(v, 1, length(v) - 1) * 1000
			return v
		}
		/^Requests\/sec/ {rps = $2}
		$1 == "50%" {p50 = ms($2)}
		$1 == "99%" {p99 = ms($2)}
		END {printf "%.0f %.3f %.3f\n", rps, p50, p99}' <<<"$out"
}
