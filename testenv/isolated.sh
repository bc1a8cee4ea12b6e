#!/usr/bin/env bash
# Run a command in network, mount and PID namespaces of its own: only loopback (up), no route out,
# mounts that never reach the machine's, and every process it leaves killed with it. `make test`
# and `make conformance` run the tests this way, so a real node's pods can dial what they like
# and no packet leaves the machine.
#
# Usage: isolated.sh COMMAND [ARG…]
set -euo pipefail
(($# > 0)) || { echo "usage: isolated.sh COMMAND [ARG…]" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "isolated.sh: needs root (network namespaces)" >&2; exit 1; }
exec unshare --net --mount --pid --fork --kill-child --mount-proc -- \
  bash -c 'ip link set lo up && exec "$@"' isolated "$@"
