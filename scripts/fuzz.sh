#!/usr/bin/env bash
# Runs every Go fuzz target in the module for FUZZTIME (default 10s) each. Corpora live in each
# package's testdata/fuzz; new crashers are written there and fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
found=0
while IFS= read -r file; do
	pkg=./$(dirname "$file")
	for target in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/'); do
		echo "-- $pkg $target ($fuzztime)"
		go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" "$pkg"
		found=$((found + 1))
	done
done < <(grep -rlE '^func Fuzz' --include='*_test.go' internal cmd 2>/dev/null | sort)
echo "fuzzed $found targets"
