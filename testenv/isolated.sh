#!/usr/bin/env bash
# Run a command in network, mount and PID namespaces of its own: only loopback (up), no route out,
# mounts that never reach the machine's, and every process it leaves killed with it. `make test`
# and `make conformance` run the tests this way, so a real node's pods can dial what they like
# and no packet leaves the machine.
#
# The network namespaces the real nodes' pods get are named in a /run/netns of the command's own
# (a tmpfs in its mount namespace), so none is left on the machine however the command ends. Once
# the command has ended, the cgroups of real nodes nobody runs any more are removed (their lock in
# $TMPDIR/tenantplane-nodes is free), and what the command left behind is counted and printed:
# processes and cgroups of those nodes, and network namespaces on the machine that were not there
# before. Anything left fails the run (exit 1) when the command itself passed.
#
# Usage: isolated.sh COMMAND [ARG…]
set -euo pipefail
(($# > 0)) || { echo "usage: isolated.sh COMMAND [ARG…]" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "isolated.sh: needs root (network namespaces)" >&2; exit 1; }

locks="${TMPDIR:-/tmp}/tenantplane-nodes"

# The cgroup folders of node ID in every hierarchy (v1 controllers, and v2 or its hybrid `unified`).
node_cgroups() {
  local h
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [[ -d $h/tenantplane/$1 ]] && echo "$h/tenantplane/$1"
  done
  return 0
}

# The nodes nobody runs: those whose lock is free, and cgroups with no lock at all (a node takes
# its lock before it makes its cgroups, and drops it only once they are gone).
free_nodes() {
  local id
  for id in $( (ls "$locks" 2>/dev/null | sed -n 's/\.lock$//p'
    ls /sys/fs/cgroup/tenantplane /sys/fs/cgroup/*/tenantplane 2>/dev/null | grep '^node-') | sort -u); do
    if [[ ! -e $locks/$id.lock ]] || flock -n "$locks/$id.lock" true; then
      echo "$id"
    fi
  done
}

# Remove the cgroups of every node nobody runs, deepest first, and its lock once they are gone. A
# cgroup with a process in it stays, and is counted below.
reap_nodes() {
  local id dir
  for id in $(free_nodes); do
    while IFS= read -r dir; do
      find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done < <(node_cgroups "$id")
    [[ -z "$(node_cgroups "$id")" ]] && rm -f "$locks/$id.lock"
  done
  for dir in /sys/fs/cgroup/tenantplane /sys/fs/cgroup/*/tenantplane; do
    [[ -d $dir ]] && rmdir "$dir" 2>/dev/null || true
  done
}

# What the command left: "PROCESSES CGROUPS NETNS": in the cgroups of nodes nobody runs, and the
# network namespaces named on the machine that were not there before it.
count_left() {
  local before="$1" processes=0 cgroups=0 netns=0 id dir
  for id in $(free_nodes); do
    while IFS= read -r dir; do
      cgroups=$((cgroups + $(find "$dir" -type d | wc -l)))
      processes=$((processes + $(find "$dir" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | wc -l)))
    done < <(node_cgroups "$id")
  done
  netns=$(comm -13 <(echo "$before") <(ls /run/netns 2>/dev/null | sort) | grep -c . || true)
  echo "$processes $cgroups $netns"
}

netns_before="$(ls /run/netns 2>/dev/null | sort)"
rc=0
# The command runs under a bash that stays the namespace's first process (no `exec`): it reaps what
# the command's processes leave to it (the shims of a real node's pods), so the CPU time of all of
# them reaches whoever waits for this script (`xtask suite` shows it per test binary).
unshare --net --mount --pid --fork --kill-child --mount-proc -- \
  bash -c 'ip link set lo up && mkdir -p /run/netns && mount -t tmpfs -o mode=0755 netns /run/netns || exit
    "$@"; exit $?' \
  isolated "$@" || rc=$?

# The processes of the PID namespace die with it; one in the middle of a mount can take a moment.
left=""
for _ in $(seq 30); do
  reap_nodes
  left="$(count_left "$netns_before")"
  [[ $left == "0 0 0" ]] && break
  sleep 1
done
read -r processes cgroups netns <<<"$left"
echo "left behind: $processes processes, $cgroups cgroups, $netns network namespaces"
if [[ $left != "0 0 0" && $rc == 0 ]]; then
  echo "isolated.sh: the run left the above behind; it must leave nothing" >&2
  rc=1
fi
exit "$rc"
