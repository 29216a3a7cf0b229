#!/usr/bin/env bash
# Installs agentd on a VM as a systemd service, in place of Istio's sidecar package
# (istio.service): the binaries, the unit, the istio-proxy user and Istio's VM directories, and
# optionally the files Istio's VM onboarding produced (`istioctl x workload entry configure`).
#
#   sudo scripts/install-vm.sh [--bin DIR] [--files DIR] [--sockets] [--no-start]
#
#   --bin DIR     the built binaries (default: bin, from `make build`)
#   --files DIR   onboarding files to install where Istio puts them: cluster.env, mesh.yaml,
#                 root-cert.pem, istio-token, hosts (appended to /etc/hosts)
#   --sockets     also enable the socket units, so that systemd holds the xDS and DNS sockets
#                 across restarts of agentd itself
#   --no-start    install and enable, but do not start
#
# With DESTDIR set, it installs under that directory only and skips what needs the live system
# (user, ownership, /etc/hosts, systemctl), for packaging and tests.
# Traffic capture (iptables) is not agentd's: keep Istio's istio-iptables, or your own rules.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=bin files="" sockets=false start=true
while [ $# -gt 0 ]; do
	case "$1" in
	--bin) bin=$2; shift 2 ;;
	--files) files=$2; shift 2 ;;
	--sockets) sockets=true; shift ;;
	--no-start) start=false; shift ;;
	-h | --help) sed -n '2,18p' "$0"; exit 0 ;;
	*) echo "install-vm: unknown argument $1" >&2; exit 2 ;;
	esac
done

dest=${DESTDIR:-}
live=true
[ -n "$dest" ] && live=false
if $live && [ "$(id -u)" != 0 ]; then
	echo "install-vm: run as root (or set DESTDIR to stage the files)" >&2
	exit 1
fi

libdir=/usr/local/lib/agentd
helpers=(xds-proxy sds-server dns-proxy prober)
[ -x "$bin/agentd" ] || { echo "install-vm: $bin/agentd missing: run make build first" >&2; exit 1; }

# The user Envoy and agentd run as (Istio's VM package creates the same one).
if $live && ! id istio-proxy >/dev/null 2>&1; then
	useradd --system --user-group --no-create-home --home-dir /var/lib/istio --shell /usr/sbin/nologin istio-proxy
fi

# One executable for the whole tree: the helpers are links to agentd, which serves a helper by
# the name it runs as, so the kernel maps its pages once for every process (about half the
# tree's memory of one binary per helper: scripts/bench/footprint.sh). A helper's own binary
# from `make build` is for `agentd swap`.
install -d "$dest$libdir" "$dest/usr/local/bin"
install -m 0755 "$bin/agentd" "$dest$libdir/agentd"
for h in "${helpers[@]}"; do
	ln -sf agentd "$dest$libdir/$h"
done
ln -sf "$libdir/agentd" "$dest/usr/local/bin/agentd"

# Istio's VM layout, owned by istio-proxy as Istio's onboarding instructions do.
dirs=(/etc/istio/proxy /etc/istio/config /etc/certs /var/lib/istio/envoy /var/lib/istio/data /var/run/secrets/tokens)
install -d "${dirs[@]/#/$dest}"

if [ -n "$files" ]; then
	install -m 0644 "$files/cluster.env" "$dest/var/lib/istio/envoy/cluster.env"
	install -m 0644 "$files/mesh.yaml" "$dest/etc/istio/config/mesh"
	install -m 0644 "$files/root-cert.pem" "$dest/etc/certs/root-cert.pem"
	install -m 0600 "$files/istio-token" "$dest/var/run/secrets/tokens/istio-token"
	if [ -f "$files/hosts" ]; then
		if $live; then
			cat "$files/hosts" >>/etc/hosts
		else
			echo "install-vm: DESTDIR set: not appending $files/hosts to /etc/hosts"
		fi
	fi
fi

units=(agentd.service)
$sockets && units+=(agentd-xds.socket agentd-dns-udp.socket agentd-dns-tcp.socket)
install -d "$dest/etc/systemd/system"
for u in "${units[@]}"; do
	install -m 0644 "deploy/systemd/$u" "$dest/etc/systemd/system/$u"
done

if ! $live; then
	echo "install-vm: staged under $dest (user, ownership and systemctl skipped)"
	exit 0
fi

chown -R istio-proxy:istio-proxy "${dirs[@]}" /var/lib/istio
if [ ! -x /usr/local/bin/envoy ]; then
	echo "install-vm: no Envoy at /usr/local/bin/envoy: install it there, or set DISABLE_ENVOY=true" \
		"(systemctl edit agentd: Environment=DISABLE_ENVOY=true) for proxyless gRPC and DNS only" >&2
fi
systemctl daemon-reload
systemctl enable "${units[@]}"
if $start; then
	$sockets && systemctl start agentd-xds.socket agentd-dns-udp.socket agentd-dns-tcp.socket
	# Without --no-block, systemctl would wait for READY=1, i.e. for the control plane.
	systemctl start --no-block agentd.service
	echo "install-vm: agentd starting: systemctl status agentd; agentd status --root /"
fi
