#!/usr/bin/env bash
# Runs every benchmark script of scripts/bench (each *.sh but this one, or the ones named) and
# rewrites README.md's benchmark section, between the lines <!-- bench:start --> and
# <!-- bench:end -->, with a table of the runs and each script's figures (its standard output,
# without go test's own lines). A script that fails is shown as failed, with the end of its
# error output, and makes this script exit 1 after the README is written. peer.sh (agentd side by
# side with Istio's pilot-agent) runs when PILOT_AGENT names a pilot-agent binary; lib.sh is
# the scripts' shared shell, not a benchmark.
#
# Usage: scripts/bench/all.sh [NAME.sh...]   (PILOT_AGENT=path to include peer.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."

readme=README.md
start='<!-- bench:start -->'
end='<!-- bench:end -->'
if ! grep -qxF "$start" "$readme" || ! grep -qxF "$end" "$readme"; then
	echo "$readme has no $start ... $end section" >&2
	exit 2
fi

scripts=("$@")
if [ ${#scripts[@]} -eq 0 ]; then
	for s in scripts/bench/*.sh; do
		case $(basename "$s") in
		all.sh | lib.sh) ;;
		peer.sh) [ -n "${PILOT_AGENT:-}" ] && scripts+=(peer.sh) ;;
		*) scripts+=("$(basename "$s")") ;;
		esac
	done
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
: >"$work/table"
: >"$work/figures"
for name in "${scripts[@]}"; do
	script=scripts/bench/$name
	# What it measures: the first sentence of the comment under its shebang.
	what=$(awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); printf "%s ", $0; next } NR > 1 { exit }' "$script" |
		sed -E 's/\. .*/./; s/\|/\\|/g; s/ +$//')
	echo "== $name" >&2
	t0=$(date +%s)
	if bash "$script" >"$work/out" 2>"$work/err"; then
		result=ok
	else
		result="failed ($?)"
		failed=1
	fi
	secs=$(($(date +%s) - t0))
	echo "| \`$name\` | $what | $result | ${secs} s |" >>"$work/table"
	{
		echo
		echo "#### \`$name\`"
		echo
		echo '```'
		grep -vE '^(goos|goarch|pkg|cpu):|^PASS$|^ok[[:space:]]|^Benchmark' "$work/out" | sed -e '/./,$!d' || true
		if [ "$result" != ok ]; then
			echo "--- error output (last 20 lines)"
			tail -20 "$work/err"
		fi
		echo '```'
	} >>"$work/figures"
	cat "$work/out"
done

{
	echo "Written by \`scripts/bench/all.sh\` on $(date -u +%Y-%m-%d), $(nproc) CPUs" \
		"($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), $(go env GOVERSION); the machine's" \
		"cores may be shared with other work, so take times as indicative and memory as measured."
	echo
	echo "| benchmark | what it measures | result | time |"
	echo "|---|---|---|---|"
	cat "$work/table"
	cat "$work/figures"
} >"$work/section"

awk -v start="$start" -v end="$end" -v section="$work/section" '
	$0 == start { print; while ((getline line < section) > 0) print line; skip = 1; next }
	$0 == end { skip = 0 }
	!skip { print }
' "$readme" >"$work/readme"
cp "$work/readme" "$readme"
echo "rewrote the benchmark section of $readme" >&2
exit "$failed"
