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
log=$(mktemp -t tenantplane-faults.XXXXXX)
trap 'rm -f "$log"' EXIT
echo "fault drills: building the test binary (release)"
$cargo test -p tenantplane --locked --release --test sync_faults --no-run
echo "fault drills: ${FAULT_BURST:-300} pods through one tenant, four faults, one at a time"
bash "$here/isolated.sh" $cargo test -p tenantplane --locked --offline --release --test sync_faults \
  -- --nocapture 2>&1 | tee "$log" | grep --line-buffered -E '^(fault drill|settling after|the leader killed|host API server ready|[0-9]+ copies after|test )' || true
echo
echo "fault drills, ${FAULT_BURST:-300} pods each:"
grep '^fault drill' "$log" | sed 's/^fault drill | /  /' || true
if ! grep -q '^test result: ok' "$log"; then
  echo "a drill failed; its output:" >&2
  grep -E -A30 'panicked|FAILED|failures:' "$log" | head -120 >&2
  exit 1
fi
