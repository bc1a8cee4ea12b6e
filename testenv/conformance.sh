#!/usr/bin/env bash
# make conformance: the upstream Kubernetes conformance tests, against the dev cluster's host (on a
# real node: kubelet, containerd, runc, kube-proxy) and against a tenant of it, in the same run,
# and the table of both with the host's passes and the parity line `conformance parity: X/Y`
# (passed in the tenant of passed on the host).
#
# It builds the test control plane, e2e.test and ginkgo (testenv/build.sh --conformance; about
# 20 minutes on 2 cores the first time) and the tenantplane binary, then re-runs itself in
# network, mount and PID namespaces of its own (as testenv/isolated.sh) that have only loopback,
# and refuses to go on if that namespace has any other route or link (once the dev cluster runs,
# only its real node's bridge and the pods' veths are added): the suite makes the API servers and
# pods dial pod and Service addresses, and nothing may leave the machine. There it starts
# `tenantplane dev --nodes real` (CONFORMANCE_NODES=simulated: kwok's simulated node), a tenant
# `conformance/conf` with the IsolationProfile `conformance` (Pod Security privileged, no
# NetworkPolicy, no quota, and an `allow` that opens what the host's own test namespaces get)
# and the SyncPolicy `conformance` (every host node shown, so the suite finds schedulable
# Nodes), and runs the suite on both at once.
#
# Settings (environment):
#   CONFORMANCE_FOCUS    regexp of specs (default: [Conformance] of sig-api-machinery, apps,
#                        node, network, scheduling)
#   CONFORMANCE_SKIP     regexp of specs left out (default: [Serial], [Disruptive]). The specs whose
#                        pods take a fixed host port (NODE_PORT_SPECS below) run after the rest,
#                        each side alone: the two sides share one real node.
#   CONFORMANCE_PROCS    parallel ginkgo processes per side (default 20: most specs wait on
#                        timers, so the machine idles at 6; each process takes about 150 MB)
#   CONFORMANCE_TIMEOUT  the time bound of each side's run (default 45m); what it leaves is
#                        reported as not run
#   CONFORMANCE_OUT      where the logs, reports and table go (default: .tenantplane/conformance)
#   CONFORMANCE_NODES    real (default) or simulated: what runs the pods
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TENANTPLANE_CACHE="${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$TENANTPLANE_CACHE/target}"
FOCUS="${CONFORMANCE_FOCUS:-\[sig-(api-machinery|apps|node|network|scheduling)\].*\[Conformance\]}"
SKIP="${CONFORMANCE_SKIP:-\[Serial\]|\[Disruptive\]}"
PROCS="${CONFORMANCE_PROCS:-20}"
TIMEOUT="${CONFORMANCE_TIMEOUT:-45m}"
OUT="${CONFORMANCE_OUT:-$ROOT/.tenantplane/conformance}"
HEARTBEAT_SECS="${CONFORMANCE_HEARTBEAT_SECS:-30}"
NODES="${CONFORMANCE_NODES:-real}"
# Specs whose pods take a fixed port on the node (hostPort): the host's and the tenant's runs
# share one real node, so these run after the rest, each side alone.
NODE_PORT_SPECS='HostPort validates that there is no conflict|Should recreate evicted statefulset'
# The simulated node's taint once a real node is there (only the local runtime's control-plane
# pods go to it): the suite is told it does not make the node unfit for its tests.
SIMULATED_TAINT=tenantplane.io/simulated

log() { printf 'conformance: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# All in one function, and the last line exits, so that bash has read the whole script before it
# runs any of it and reads nothing after (an edit to the file during a run changes nothing).
main() {
if [[ "${TENANTPLANE_CONFORMANCE_INSIDE:-}" != 1 ]]; then
  # Outside the namespace: everything that may need the package registries.
  log "building the test control plane (testenv/build.sh)"
  BIN="$(bash "$ROOT/testenv/build.sh")"
  log "building the images (testenv/images.sh)"
  bash "$ROOT/testenv/images.sh" "$BIN" >/dev/null
  log "building e2e.test and ginkgo (testenv/build.sh --conformance)"
  E2E_BIN="$(bash "$ROOT/testenv/build.sh" --conformance)"
  log "building tenantplane and conformance-report"
  cargo build -q --locked -p tenantplane -p tenantplane-testenv --bin tenantplane --bin conformance-report
  [[ "$NODES" == real || "$NODES" == simulated ]] || die "CONFORMANCE_NODES is real or simulated, not '$NODES'"
  command -v unshare >/dev/null || die "unshare (util-linux) is needed for the namespaces"
  command -v ip >/dev/null || die "ip (iproute2) is needed to bring up loopback in the namespace"
  if [[ "$(id -u)" != 0 ]]; then
    [[ "$NODES" == simulated ]] || die "a real node needs root (CONFORMANCE_NODES=simulated runs without)"
    user_ns=(--map-root-user)
  else
    user_ns=()
  fi
  log "entering network, mount and PID namespaces with only loopback"
  exec unshare --net --mount --pid --fork --kill-child --mount-proc "${user_ns[@]}" \
    env TENANTPLANE_CONFORMANCE_INSIDE=1 CONFORMANCE_BIN="$BIN" CONFORMANCE_E2E_BIN="$E2E_BIN" \
    bash "${BASH_SOURCE[0]}" "$@"
fi

BIN="${CONFORMANCE_BIN:?}"
E2E_BIN="${CONFORMANCE_E2E_BIN:?}"
ip link set lo up
# The real node's pods' network namespaces are named in a /run/netns of this mount namespace's
# own, so none is left on the machine however the run ends.
if [[ "$(id -u)" == 0 ]] && mkdir -p /run/netns 2>/dev/null; then
  mount -t tmpfs -o mode=0755 netns /run/netns
fi
# check_isolated [DEVICE_REGEXP]: refuse to go on if this namespace has a route or link other
# than loopback's and those of the devices named (the real node's bridge and the pods' veths,
# once the dev cluster runs), or any default route.
check_isolated() {
  local own="lo${1:+|$1}" routes links
  routes="$( (ip -4 route show table all; ip -6 route show table all) | grep -Ev " dev ($own)( |$)" || true)
$( (ip -4 route show table all; ip -6 route show table all) | grep -E '^default' || true)"
  routes="$(printf '%s\n' "$routes" | sed '/^$/d')"
  links="$(ip -o link show 2>/dev/null | grep -Ev "^[0-9]+: ($own)(@[^:]*)?:" || true)"
  if [[ -n "$routes" || -n "$links" ]]; then
    die "this network namespace reaches beyond its own devices; refusing to run:
$routes$links"
  fi
}
check_isolated
log "network namespace: loopback only"

export PATH="$BIN:$PATH"
TP="$CARGO_TARGET_DIR/debug/tenantplane"
REPORT="$CARGO_TARGET_DIR/debug/conformance-report"
rm -rf "$OUT"
mkdir -p "$OUT"
DEV_PID=""
RUN_PIDS=()
cleanup() {
  local p i
  # ginkgo interrupts its specs on SIGINT and still writes its report; its processes get a
  # minute for their clean-up, then go.
  for p in "${RUN_PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${RUN_PIDS[@]}"; do
    for ((i = 0; i < 60; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
    pkill -KILL -P "$p" 2>/dev/null || true
    kill -KILL "$p" 2>/dev/null || true
  done
  if [[ -n "$DEV_PID" ]]; then
    kill -INT "$DEV_PID" 2>/dev/null || true
    wait "$DEV_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

START=$SECONDS
elapsed() { printf '%ss' "$((SECONDS - START))"; }

log "starting the dev cluster, $NODES nodes (log: $OUT/dev.log)"
"$TP" dev --nodes "$NODES" --state-dir "$OUT/dev" >"$OUT/dev.log" 2>&1 &
DEV_PID=$!
shown=0
until grep -q "The dev cluster is ready" "$OUT/dev.log" 2>/dev/null; do
  kill -0 "$DEV_PID" 2>/dev/null || die "the dev cluster stopped: $(tail -5 "$OUT/dev.log")"
  # Pass its progress lines on.
  total="$(grep -c '^dev: \|^testenv: ' "$OUT/dev.log" || true)"
  if ((total > shown)); then
    grep '^dev: \|^testenv: ' "$OUT/dev.log" | sed -n "$((shown + 1)),${total}p" | sed 's/^/  /' >&2
    shown=$total
  fi
  sleep 1
done
export KUBECONFIG="$OUT/dev/kubeconfig"
check_isolated 'tp-node0|veth[^:@ ]*'
log "network namespace: loopback, the real node's bridge and its pods' veths only"

log "creating the tenant conformance/conf [$(elapsed)]"
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: tenantplane.io/v1alpha1
kind: IsolationProfile
metadata:
  name: conformance
spec:
  podSecurity: privileged
  networkPolicy:
    enabled: false
  resourceQuota:
    enforce: false
  # What the host's own test namespaces may do, the tenant may ask of the host too.
  allow:
    privileged: true
    hostNetwork: true
    hostPID: true
    hostIPC: true
    hostPath: true
    hostPorts: true
    capabilities: [NET_ADMIN, NET_RAW, SYS_ADMIN, SYS_PTRACE, NET_BIND_SERVICE, SYS_TIME]
    loadBalancers: true
    nodePorts: true
    # The suite dials node ports and host ports at a node's InternalIP.
    nodeAddresses: true
    externalNames: ["*.com", "*.org", "*.local", "*.io", "*.net"]
    endpointCIDRs: [0.0.0.0/0, "::/0"]
    annotations:
      pods: ["*"]
      services: ["*"]
    # The suite's RuntimeClasses name the handler a conformant cluster has set up
    # (test-handler); the tenant's run under the host's class of that handler.
    runtimeClasses: [conformance-test-handler]
    # The suite's Services keep the addresses their API server gave them, as on the host.
    chosenClusterIPs: true
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: conformance-test-handler
handler: test-handler
---
apiVersion: tenantplane.io/v1alpha1
kind: SyncPolicy
metadata:
  name: conformance
spec:
  toHost:
    pods: {enabled: true}
    services: {enabled: true}
    endpoints: {enabled: true}
    configMaps: {enabled: true, all: false}
    secrets: {enabled: true, all: false}
    persistentVolumeClaims: {enabled: true}
  fromHost:
    nodes: {enabled: true, mode: all}
    events: {enabled: true}
---
apiVersion: v1
kind: Namespace
metadata:
  name: conformance
---
apiVersion: tenantplane.io/v1alpha1
kind: TenantCluster
metadata:
  name: conf
  namespace: conformance
spec:
  mode: shared
  kubernetesVersion: v1.30.4
  isolationProfileRef:
    name: conformance
  syncPolicyRef:
    name: conformance
  controlPlane:
    replicas: 1
    datastore:
      type: sqlite
  networking:
    egressPolicy: allow-all
EOF
phase=""
deadline=$((SECONDS + 300))
while [[ "$phase" != Ready ]]; do
  ((SECONDS < deadline)) || die "tenant conformance/conf is not Ready after 300s: $(kubectl get tenantcluster conf -n conformance -o jsonpath='{.status.conditions}')"
  sleep 2
  now="$(kubectl get tenantcluster conf -n conformance -o jsonpath='{.status.phase}' 2>/dev/null || true)"
  if [[ "$now" != "$phase" ]]; then log "  tenant phase: ${now:-none} [$(elapsed)]"; phase="$now"; fi
done
"$TP" kubeconfig conf -n conformance >"$OUT/tenant.kubeconfig"

# One side's run, in the background, of the specs FOCUS and SKIP select (default: the
# selection, less the node-port specs); its ginkgo's pid goes into RUN_PIDS.
run_side() {
  local side="$1" kubeconfig="$2" focus="${3:-$FOCUS}" skip="${4:-$SKIP|$NODE_PORT_SPECS}"
  mkdir -p "$OUT/$side"
  "$E2E_BIN/ginkgo" --procs="$PROCS" --timeout="$TIMEOUT" --no-color --silence-skips \
    --focus="$focus" --skip="$skip" --json-report="$OUT/$side.json" \
    "$E2E_BIN/e2e.test" -- --kubeconfig="$kubeconfig" --provider=skeleton \
    --non-blocking-taints="node-role.kubernetes.io/control-plane,$SIMULATED_TAINT" \
    --report-dir="$OUT/$side" --e2e-output-dir="$OUT/$side" \
    >"$OUT/$side.log" 2>&1 &
  RUN_PIDS+=($!)
}

# count FOCUS SKIP: how many specs the two select.
count() {
  "$E2E_BIN/e2e.test" --ginkgo.dry-run --ginkgo.no-color --ginkgo.focus="$1" --ginkgo.skip="$2" \
    2>/dev/null | sed -n 's/^Ran \([0-9]*\) of.*/\1/p' | tail -1
}
all_selected="$(count "$FOCUS" "$SKIP")"
selected="$(count "$FOCUS" "$SKIP|$NODE_PORT_SPECS")"
node_ports=$(( ${all_selected:-0} - ${selected:-0} ))
log "running ${selected:-?} specs on the host and in the tenant, $PROCS processes each, at most $TIMEOUT each, then $node_ports node-port specs on each alone [$(elapsed)]"
log "  logs: $OUT/host.log, $OUT/tenant.log"
run_side host "$KUBECONFIG"
run_side tenant "$OUT/tenant.kubeconfig"
done_count() {
  # ginkgo prints a bullet for every spec it finished (passed or failed; skips are silenced).
  grep -ao '•' "$OUT/$1.log" 2>/dev/null | wc -l
}
failed_count() {
  grep -ac '^• \[FAILED\]\|^• \[TIMEDOUT\]\|^• \[PANICKED\]' "$OUT/$1.log" 2>/dev/null || true
}
while kill -0 "${RUN_PIDS[0]}" 2>/dev/null || kill -0 "${RUN_PIDS[1]}" 2>/dev/null; do
  for ((i = 0; i < HEARTBEAT_SECS; i++)); do
    kill -0 "${RUN_PIDS[0]}" 2>/dev/null || kill -0 "${RUN_PIDS[1]}" 2>/dev/null || break
    sleep 1
  done
  log "  host $(done_count host)/${selected:-?} done ($(failed_count host) failed), tenant $(done_count tenant)/${selected:-?} done ($(failed_count tenant) failed) [$(elapsed)]"
done
wait "${RUN_PIDS[@]}" 2>/dev/null || true
RUN_PIDS=()
# The specs that take a fixed port on the one real node, each side alone, one after the other:
# run beside each other, the two sides' pods would take each other's port.
host_reports="$OUT/host.json"
tenant_reports="$OUT/tenant.json"
for side in host tenant; do
  ((node_ports > 0)) || break
  kubeconfig="$KUBECONFIG"
  [[ "$side" == tenant ]] && kubeconfig="$OUT/tenant.kubeconfig"
  log "running the node-port specs on the $side alone [$(elapsed)]"
  run_side "$side-node-ports" "$kubeconfig" "($NODE_PORT_SPECS).*\[Conformance\]" "$SKIP"
  while kill -0 "${RUN_PIDS[0]}" 2>/dev/null; do
    for ((i = 0; i < HEARTBEAT_SECS; i++)); do
      kill -0 "${RUN_PIDS[0]}" 2>/dev/null || break
      sleep 1
    done
    log "  $side: $(done_count "$side-node-ports") node-port specs done ($(failed_count "$side-node-ports") failed) [$(elapsed)]"
  done
  wait "${RUN_PIDS[@]}" 2>/dev/null || true
  RUN_PIDS=()
  [[ "$side" == host ]] && host_reports+=",$OUT/host-node-ports.json"
  [[ "$side" == tenant ]] && tenant_reports+=",$OUT/tenant-node-ports.json"
done
for report in ${host_reports//,/ } ${tenant_reports//,/ }; do
  [[ -s "$report" ]] || die "no report $report: $(tail -20 "${report%.json}.log")"
done
"$REPORT" "$host_reports" "$tenant_reports" | tee "$OUT/report.md"
log "done in $(elapsed): table in $OUT/report.md, the suite's logs in $OUT/host.log and $OUT/tenant.log"
}

main "$@"; exit $?
