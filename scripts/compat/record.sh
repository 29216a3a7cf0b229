#!/usr/bin/env bash
# Records what Istio's pilot-agent gives Envoy for each case of a cases folder (Envoy's
# bootstrap, its argv, the gRPC bootstrap), as ../shared/reference/istio/cases was recorded,
# runs agentd the same way (with the template in its root, and without: agentd's own
# bootstrap), and prints the differences. See docs/compat.md.
#
#   scripts/compat/record.sh PILOT_AGENT TEMPLATE [OUT] [CASES]
#
# PILOT_AGENT: a pilot-agent binary (CGO_ENABLED=0 go build ./pilot/cmd/pilot-agent in an
# istio/istio checkout); TEMPLATE: that version's tools/packaging/common/envoy_bootstrap.json;
# OUT: where the recordings go (default: a new temp folder); CASES: the cases to run (default
# ../shared/reference/istio/cases: each has config.env, a shell fragment over the base
# environment, and optionally root/, copied into the pod's /).
#
# Each run is in a private network namespace (unshare -n: Istio's fixed ports), with devplane
# as the plaintext ADS server and CA on 127.0.0.1:15010 and test/envoy-standin as Envoy.
# Needs: go, unshare and ip (root or user namespaces), python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
pilot_agent=$(realpath "$1")
template=$(realpath "$2")
out=${3:-$(mktemp -d /tmp/agentd-compat-record.XXXXXX)}
cases=$(realpath "${4:-../shared/reference/istio/cases}")
mkdir -p "$out"
out=$(realpath "$out")

bin=$(mktemp -d /tmp/agentd-compat-bin.XXXXXX)
trap 'rm -rf "$bin"' EXIT
echo "== building agentd, its helpers, devplane and the Envoy stand-in"
go build -o "$bin/" ./cmd/... ./test/envoy-standin

# run_case AGENT CASE_DIR DEST: AGENT is pilot-agent, agentd-template or agentd-own.
run_case() {
	local agent=$1 case_dir=$2 dest=$3
	local stack
	stack=$(mktemp -d /tmp/compat.XXXXXX)
	local root=$stack/root
	mkdir -p "$dest"
	[ -d "$case_dir/root" ] && cp -a "$case_dir/root" "$root"
	mkdir -p "$root"/etc/istio/proxy "$root"/etc/istio/config "$root"/var/lib/istio/envoy "$root"/var/lib/istio/data \
		"$root"/var/run/secrets/istio "$root"/var/run/secrets/tokens "$root"/var/run/secrets/workload-spiffe-uds
	echo token >"$root/var/run/secrets/tokens/istio-token"
	echo "services: []" >"$stack/services.yaml"
	ln -s "$bin/envoy-standin" "$stack/envoy"
	local cmd
	case $agent in
	pilot-agent) cmd=("$pilot_agent" proxy sidecar); cp "$template" "$root/var/lib/istio/envoy/envoy_bootstrap_tmpl.json" ;;
	agentd-template) cmd=("$bin/agentd" proxy sidecar --root "$root" --helpers-dir "$bin"); cp "$template" "$root/var/lib/istio/envoy/envoy_bootstrap_tmpl.json" ;;
	agentd-own) cmd=("$bin/agentd" proxy sidecar --root "$root" --helpers-dir "$bin") ;;
	esac
	# The base environment of the recordings (../shared/reference/istio/README.md), then the case's.
	env -i PATH="$PATH" HOME="$stack" BIN="$bin" ROOT="$root" STACK="$stack" STACK_ENVOY="$stack/envoy" \
		COMPAT_HERE="$case_dir" ENVOY_STANDIN_RECORD="$stack/record" \
		POD_NAME=bench-0 POD_NAMESPACE=default SERVICE_ACCOUNT=default INSTANCE_IP=127.0.0.1 \
		ISTIO_META_CLUSTER_ID=Kubernetes ISTIO_META_MESH_ID=cluster.local TRUST_DOMAIN=cluster.local \
		CLOUD_PLATFORM=none ISTIO_META_DNS_CAPTURE=true DNS_PROXY_ADDR=127.0.0.1:15053 \
		PILOT_CERT_PROVIDER=istiod CA_ADDR=127.0.0.1:15010 \
		PROXY_CONFIG='{"discoveryAddress":"127.0.0.1:15010","controlPlaneAuthPolicy":"NONE","binaryPath":"'"$stack"'/envoy","statusPort":15020,"proxyAdminPort":15000}' \
		setsid unshare -n -- bash -c '
			ip link set lo up
			"$BIN/devplane" -xds-address 127.0.0.1:15010 -debug-address "" -services "$STACK/services.yaml" \
				-ca-root-out "$ROOT/var/run/secrets/istio/root-cert.pem" -log-level warn &
			for i in $(seq 100); do [ -s "$ROOT/var/run/secrets/istio/root-cert.pem" ] && break; sleep 0.1; done
			set -a; . "$COMPAT_HERE/config.env"; set +a
			cd "$ROOT"
			exec "$@"' bash "${cmd[@]}" >"$dest/agent.log" 2>&1 &
	local pid=$!
	local i
	for i in $(seq 600); do
		[ -s "$stack/record/bootstrap.json" ] && [ -s "$root/etc/istio/proxy/grpc-bootstrap.json" ] && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	sleep 0.2
	kill -KILL -- "-$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	if [ ! -s "$stack/record/bootstrap.json" ]; then
		echo "   $agent: Envoy did not start (see $dest/agent.log)"
	else
		python3 - "$stack" "$root" "$dest" <<'PY'
import json, os, sys
stack, root, dest = sys.argv[1:]
def norm(s):
    return s.replace(root, "$ROOT").replace(stack, "$STACK")
def load(path):
    text = norm(open(path).read())
    try:
        doc = json.loads(text)
    except ValueError:  # Envoy reads a .json that is not strict JSON as YAML
        import yaml
        doc = yaml.safe_load(text)
    meta = doc.get("node", {}).get("metadata", {})
    if meta.get("ISTIO_VERSION"):
        meta["ISTIO_VERSION"] = "<version>"
    return doc
def dump(doc, name):
    with open(os.path.join(dest, name), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
dump(load(os.path.join(stack, "record", "bootstrap.json")), "bootstrap.json")
dump(load(os.path.join(root, "etc/istio/proxy/grpc-bootstrap.json")), "grpc-bootstrap.json")
open(os.path.join(dest, "envoy-argv.txt"), "w").write(norm(open(os.path.join(stack, "record", "envoy-argv.txt")).read()))
# Files pilot-agent writes beside the bootstrap (compat_test.go's sideFiles).
for name in ("lightstep_access_token.txt",):
    p = os.path.join(root, "etc/istio/proxy", name)
    if os.path.exists(p):
        open(os.path.join(dest, name), "w").write(open(p).read())
PY
	fi
	rm -rf "$stack"
}

for case_dir in "$cases"/*/; do
	name=$(basename "$case_dir")
	echo "== $name"
	for agent in pilot-agent agentd-template agentd-own; do
		run_case "$agent" "${case_dir%/}" "$out/$agent/$name"
	done
done

echo "== differences of agentd's outputs from pilot-agent's (as data; none printed: equal)"
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def diff(path, got, want, acc):
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got)):
            if k not in got: acc.append(f"{path}.{k}: missing")
            elif k not in want: acc.append(f"{path}.{k}: unexpected {json.dumps(got[k])[:100]}")
            else: diff(f"{path}.{k}", got[k], want[k], acc)
    elif isinstance(want, list) and isinstance(got, list):
        for i in range(max(len(got), len(want))):
            if i >= len(got): acc.append(f"{path}[{i}]: missing")
            elif i >= len(want): acc.append(f"{path}[{i}]: unexpected")
            else: diff(f"{path}[{i}]", got[i], want[i], acc)
    elif got != want:
        acc.append(f"{path}: got {json.dumps(got)[:100]}, want {json.dumps(want)[:100]}")
ref = os.path.join(out, "pilot-agent")
for name in sorted(os.listdir(ref)):
    for agent in ("agentd-template", "agentd-own"):
        for f in ("bootstrap.json", "grpc-bootstrap.json", "envoy-argv.txt", "lightstep_access_token.txt"):
            a, b = os.path.join(out, agent, name, f), os.path.join(ref, name, f)
            if f == "lightstep_access_token.txt" and not os.path.exists(a) and not os.path.exists(b):
                continue  # written with a Lightstep tracer only
            if not os.path.exists(a) or not os.path.exists(b):
                print(f"{name} {agent} {f}: not recorded"); continue
            if f == "lightstep_access_token.txt":
                if open(a).read() != open(b).read():
                    print(f"{name} {agent} {f}: differs")
                continue
            if f.endswith(".txt"):
                if open(a).read().split() != open(b).read().split():
                    print(f"{name} {agent} {f}: differs")
                continue
            acc = []
            diff("", json.load(open(a)), json.load(open(b)), acc)
            for d in acc:
                print(f"{name} {agent} {f}: {d}")
PY
echo "recordings: $out (pilot-agent/CASE holds the files to copy into a cases folder)"
