#!/usr/bin/env bash
# Run `cargo test` (the arguments after the script's name go to it) and, at the end, print how
# long each test binary took, slowest first, and the total: the suite's budget is watched with
# this table. The output of cargo and the tests passes through unchanged; the exit code is
# cargo's. The table is also kept in $TENANTPLANE_CACHE/test-times.tsv (binary, seconds).
#
# A binary's time runs from cargo's `Running …` (or `Doc-tests …`) line to the next one, so it
# counts the binary's start-up and every test in it.
#
# Usage: timed.sh CARGO [ARG…]
set -uo pipefail
(($# > 0)) || { echo "usage: timed.sh CARGO [ARG…]" >&2; exit 2; }
cache="${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}"

table() {
  local started="$EPOCHREALTIME" current="before the first binary" began="$EPOCHREALTIME" line
  local -a rows=()
  close() {
    rows+=("$(awk -v a="$began" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')	$current")
  }
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [[ $line =~ ^[[:space:]]+Running\ (.+)\ \((.*/)?([^/]+)-[0-9a-f]+\)$ ]]; then
      close
      current="${BASH_REMATCH[3]} (${BASH_REMATCH[1]})"
      began="$EPOCHREALTIME"
    elif [[ $line =~ ^[[:space:]]+Doc-tests\ (.+)$ ]]; then
      close
      current="doc tests of ${BASH_REMATCH[1]}"
      began="$EPOCHREALTIME"
    fi
  done
  close
  mkdir -p "$cache"
  printf '%s\n' "${rows[@]}" | sort -t$'\t' -k1,1 -rn > "$cache/test-times.tsv"
  echo
  echo "test time by binary, slowest first (seconds):"
  awk -F'\t' '{ printf "  %8.1f  %s\n", $1, $2 }' "$cache/test-times.tsv"
  awk -v a="$started" -v b="$EPOCHREALTIME" -v n="${#rows[@]}" \
    'BEGIN { printf "  %8.1f  in all (%d binaries and the time before the first)\n", b - a, n - 1 }'
}

"$@" 2>&1 | table
exit "${PIPESTATUS[0]}"
