#!/usr/bin/env bash
# Run `cargo test` (the arguments after the script's name go to it) and, at the end, print how
# long each test binary took, slowest first, and the total: the suite's budget is watched with
# this table. The output of cargo and the tests passes through unchanged; the exit code is
# cargo's. The table is also kept in $TENANTPLANE_CACHE/test-times.tsv (seconds, CPU busy, binary).
#
# A binary's time runs from cargo's `Running …` (or `Doc-tests …`) line to the next one, so it
# counts the binary's start-up and every test in it. Beside it, how busy the machine's CPUs were
# meanwhile (from /proc/stat, every process on the machine): a binary far below 100% waits on
# timers and polls, and more of its tests could run at once; one near 100% is bound by the CPU.
#
# Usage: timed.sh CARGO [ARG…]
set -uo pipefail
(($# > 0)) || { echo "usage: timed.sh CARGO [ARG…]" >&2; exit 2; }
cache="${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}"

# The machine's CPU ticks so far, busy and in all, as "BUSY TOTAL".
ticks() {
  local _ user nice system idle iowait irq softirq steal
  read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
  echo "$((user + nice + system + irq + softirq + steal)) $((user + nice + system + idle + iowait + irq + softirq + steal))"
}

table() {
  local started="$EPOCHREALTIME" current="before the first binary" began="$EPOCHREALTIME" line
  local first_ticks since
  first_ticks="$(ticks)"
  since="$first_ticks"
  local -a rows=()
  close() {
    local now
    now="$(ticks)"
    rows+=("$(awk -v a="$began" -v b="$EPOCHREALTIME" -v t0="$since" -v t1="$now" 'BEGIN {
      split(t0, x, " "); split(t1, y, " "); total = y[2] - x[2]
      printf "%.1f\t%s", b - a, (total > 0 ? sprintf("%d%%", 100 * (y[1] - x[1]) / total) : "-") }')	$current")
    since="$now"
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
  echo "test time by binary, slowest first (seconds, and how busy the CPUs were meanwhile):"
  awk -F'\t' '{ printf "  %8.1f  %4s  %s\n", $1, $2, $3 }' "$cache/test-times.tsv"
  awk -v a="$started" -v b="$EPOCHREALTIME" -v n="${#rows[@]}" -v t0="$first_ticks" -v t1="$(ticks)" \
    'BEGIN { split(t0, x, " "); split(t1, y, " "); total = y[2] - x[2]
      printf "  %8.1f  %4s  in all (%d binaries and the time before the first)\n", b - a,
        (total > 0 ? sprintf("%d%%", 100 * (y[1] - x[1]) / total) : "-"), n - 1 }'
}

"$@" 2>&1 | table
exit "${PIPESTATUS[0]}"
