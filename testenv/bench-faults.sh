#!/usr/bin/env bash
# `make bench-sync FAULTS=1`: the fault drills of crates/tenantplane/tests/sync_faults.rs with
# FAULT_BURST pods each (optimised, like the benchmarks), in namespaces of their own (isolated.sh);
# their progress as they go, then one line per drill: duplicates, orphans, lost copies, status
# mismatches, and the time to settle.
#
# Usage: FAULT_BURST=N bench-faults.sh CARGO
set -euo pipefail
cargo=${1:-cargo}
here=$(cd "$(dirname "$0")" && pwd)
# The whole output is kept for a look afterwards, beside the other caches.
out=${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}/bench-faults
mkdir -p "$out"
log=$out/output.log
lines=$out/drills.txt
: >"$lines"
echo "fault drills: building the test binary (release)"
$cargo test -p tenantplane --locked --release --test sync_faults --no-run
echo "fault drills: ${FAULT_BURST:-300} pods through one tenant, four faults, one at a time"
bash "$here/isolated.sh" $cargo test -p tenantplane --locked --offline --release --test sync_faults \
  -- --nocapture 2>&1 | tee "$log" \
  | grep --line-buffered -E '^(fault drill|settling after|the leader killed|host API server ready|the tenant.s control plane is Ready|[0-9]+ copies after|test )' \
  | tee -a "$lines" || true
echo
echo "fault drills, ${FAULT_BURST:-300} pods each:"
grep '^fault drill' "$lines" | sed 's/^fault drill | /  /' || true
echo "(the whole output: $log)"
if ! grep -q '^test result: ok' "$lines"; then
  echo "a drill failed; its output:" >&2
  grep -E -A30 'panicked|FAILED|failures:' "$log" | head -120 >&2
  exit 1
fi
