#!/usr/bin/env bash
# End-to-end smoke test of the test control plane, using only the binaries
# built by build.sh: PKI (openssl) -> etcd -> kube-apiserver ->
# kube-controller-manager + kube-scheduler + kwok -> fake node ->
# StatefulSet pod Running/Ready -> kwok pod deletion -> runtime=local pods
# ignored by kwok -> garbage collection of a dependent ConfigMap.
#
# Everything listens on 127.0.0.1 on free ports outside the ephemeral range.
# All state lives in a temp dir removed on exit (KEEP_WORKDIR=1 keeps it;
# on failure the component logs are tailed first).
set -euo pipefail

TESTENV_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SMOKE_TIMEOUT="${SMOKE_TIMEOUT:-120}" # seconds, per wait step

START=$SECONDS
log() { printf 'smoke: [%3ds] %s\n' "$((SECONDS - START))" "$*" >&2; }

PASSED=0
pass() { PASSED=$((PASSED + 1)); log "PASS: $*"; }

BIN_DIR="$("$TESTENV_DIR/build.sh")"
export PATH="$BIN_DIR:$PATH"
log "binaries: $BIN_DIR"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/tenantplane-smoke.XXXXXX")"
PKI="$WORK/pki"
LOGS="$WORK/logs"
mkdir -p "$PKI" "$LOGS"

PIDS=()
NAMES=()
OK=0
cleanup() {
  local rc=$?
  set +e
  if ((OK == 0)); then
    log "FAILED (exit $rc); last log lines:"
    local f
    for f in "$LOGS"/*.log; do
      [[ -f "$f" ]] || continue
      printf '%s\n' "----- $(basename "$f")" >&2
      tail -n 25 "$f" >&2
    done
    printf 'smoke: %d passed, 1 failed\n' "$PASSED"
  fi
  # Stop in reverse start order, one tier at a time: the clients of the
  # apiserver (kwok, scheduler, controller-manager), then the apiserver, then
  # etcd last (an apiserver whose etcd is gone hangs in shutdown).
  local i tier
  for tier in client kube-apiserver etcd; do
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
      case "${NAMES[i]}" in etcd | kube-apiserver) [[ "${NAMES[i]}" == "$tier" ]] || continue ;; *) [[ "$tier" == client ]] || continue ;; esac
      kill -TERM "${PIDS[i]}" 2>/dev/null
    done
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
      case "${NAMES[i]}" in etcd | kube-apiserver) [[ "${NAMES[i]}" == "$tier" ]] || continue ;; *) [[ "$tier" == client ]] || continue ;; esac
      local n=0
      while kill -0 "${PIDS[i]}" 2>/dev/null && ((n < 100)); do
        sleep 0.1
        n=$((n + 1))
      done
      if kill -0 "${PIDS[i]}" 2>/dev/null; then
        log "${NAMES[i]} did not stop in 10s; killing"
        kill -KILL "${PIDS[i]}" 2>/dev/null
      fi
      wait "${PIDS[i]}" 2>/dev/null
      log "stopped ${NAMES[i]} (exit $?)"
    done
  done
  ((OK == 1)) && log "stopped all components [$((SECONDS - START))s]"
  if [[ "${KEEP_WORKDIR:-0}" == 1 ]]; then
    log "work dir kept: $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start() { # name cmd...
  local name="$1"
  shift
  "$@" >"$LOGS/$name.log" 2>&1 &
  PIDS+=("$!")
  NAMES+=("$name")
  log "started $name (pid $!)"
}

# wait_for description command... : retry every 0.5 s up to SMOKE_TIMEOUT,
# failing early if a started component died.
wait_for() {
  local what="$1"
  shift
  local deadline=$((SECONDS + SMOKE_TIMEOUT)) i
  until "$@" >/dev/null 2>&1; do
    for i in "${!PIDS[@]}"; do
      kill -0 "${PIDS[i]}" 2>/dev/null || { log "${NAMES[i]} exited"; return 1; }
    done
    if ((SECONDS >= deadline)); then
      log "timed out after ${SMOKE_TIMEOUT}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
  log "ready: $what"
}

# --- ports ------------------------------------------------------------------
# Random free ports below the kernel's ephemeral range (so no outgoing
# connection can grab them between now and the listener starting).
read -r EPHEMERAL_LOW _ </proc/sys/net/ipv4/ip_local_port_range
CHOSEN_PORTS=" "
port_in_use() {
  if command -v ss >/dev/null 2>&1; then
    [[ -n "$(ss -Htan "( sport = :$1 )" 2>/dev/null)" ]]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % (EPHEMERAL_LOW - 20000)))
    [[ "$CHOSEN_PORTS" == *" $p "* ]] && continue
    port_in_use "$p" && continue
    CHOSEN_PORTS+="$p "
    echo "$p"
    return
  done
}
ETCD_PORT=$(free_port)
ETCD_PEER_PORT=$(free_port)
API_PORT=$(free_port)
KCM_PORT=$(free_port)
SCHED_PORT=$(free_port)
KWOK_PORT=$(free_port)
log "ports: etcd=$ETCD_PORT etcd-peer=$ETCD_PEER_PORT apiserver=$API_PORT kcm=$KCM_PORT scheduler=$SCHED_PORT kwok=$KWOK_PORT"

# --- PKI --------------------------------------------------------------------
ossl() { openssl "$@" 2>>"$LOGS/openssl.log"; }
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -sha256 \
  -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -subj "/CN=tenantplane-test-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"

# cert name subject extendedKeyUsage [subjectAltName]
cert() {
  local name="$1" subj="$2" eku="$3" san="${4:-}" ca="${CERT_CA:-ca}"
  local ext="$PKI/$name.ext"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    if [[ -n "$san" ]]; then echo "subjectAltName=$san"; fi
  } >"$ext"
  ossl req -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -out "$PKI/$name.csr" -subj "$subj"
  ossl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -CAcreateserial \
    -days 2 -sha256 -extfile "$ext" -out "$PKI/$name.crt"
  rm -f "$PKI/$name.csr" "$ext"
}
# Aggregation-layer / request-header PKI: a separate CA whose client cert
# (CN front-proxy-client) the apiserver presents to aggregated APIs.  Without
# --requestheader-client-ca-file the controller-manager and scheduler log
# "missing content for CA bundle" errors forever.
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -sha256 \
  -keyout "$PKI/front-proxy-ca.key" -out "$PKI/front-proxy-ca.crt" -subj "/CN=tenantplane-front-proxy-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
cert apiserver "/CN=kube-apiserver" serverAuth \
  "IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert admin "/O=system:masters/CN=tenantplane-admin" clientAuth
cert kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
cert kube-scheduler "/CN=system:kube-scheduler" clientAuth
cert kwok "/O=system:masters/CN=kwok" clientAuth
CERT_CA=front-proxy-ca cert front-proxy-client "/CN=front-proxy-client" clientAuth
# Service-account token signing key pair.
ossl genrsa -out "$PKI/sa.key" 2048
ossl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
log "PKI generated"

kubeconfig() { # name -> $WORK/<name>.kubeconfig using $PKI/<name>.{crt,key}
  cat >"$WORK/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tenantplane
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $1
  user:
    client-certificate: $PKI/$1.crt
    client-key: $PKI/$1.key
contexts:
- name: default
  context:
    cluster: tenantplane
    user: $1
current-context: default
EOF
}
for n in admin kube-controller-manager kube-scheduler kwok; do kubeconfig "$n"; done
export KUBECONFIG="$WORK/admin.kubeconfig"

# --- etcd -------------------------------------------------------------------
start etcd etcd \
  --name=tenantplane \
  --data-dir="$WORK/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="tenantplane=http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster-state=new \
  --unsafe-no-fsync=true \
  --log-level=warn
wait_for "etcd /health" curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

# --- kube-apiserver ---------------------------------------------------------
start kube-apiserver kube-apiserver \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 \
  --secure-port="$API_PORT" \
  --tls-cert-file="$PKI/apiserver.crt" \
  --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --authorization-mode=Node,RBAC \
  --service-cluster-ip-range=10.96.0.0/16 \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" \
  --service-account-signing-key-file="$PKI/sa.key" \
  --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
  --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User \
  --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
  --proxy-client-key-file="$PKI/front-proxy-client.key" \
  --endpoint-reconciler-type=none \
  --allow-privileged=true \
  --profiling=false
wait_for "kube-apiserver /readyz" curl -fsS --cacert "$PKI/ca.crt" \
  --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$API_PORT/readyz"
# RBAC bootstrap policy must be in place before the controllers start.
wait_for "RBAC bootstrap roles" kubectl get clusterrolebinding system:kube-controller-manager

# --- controllers ------------------------------------------------------------
KCM_KC="$WORK/kube-controller-manager.kubeconfig"
start kube-controller-manager kube-controller-manager \
  --kubeconfig="$KCM_KC" \
  --authentication-kubeconfig="$KCM_KC" \
  --authorization-kubeconfig="$KCM_KC" \
  --bind-address=127.0.0.1 \
  --secure-port="$KCM_PORT" \
  --leader-elect=false \
  --controllers='*' \
  --use-service-account-credentials=true \
  --service-account-private-key-file="$PKI/sa.key" \
  --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" \
  --cluster-signing-key-file="$PKI/ca.key" \
  --profiling=false

SCHED_KC="$WORK/kube-scheduler.kubeconfig"
start kube-scheduler kube-scheduler \
  --kubeconfig="$SCHED_KC" \
  --authentication-kubeconfig="$SCHED_KC" \
  --authorization-kubeconfig="$SCHED_KC" \
  --bind-address=127.0.0.1 \
  --secure-port="$SCHED_PORT" \
  --leader-elect=false \
  --profiling=false

STAGES=()
for f in "$TESTENV_DIR"/kwok/stages/*.yaml; do STAGES+=("--config=$f"); done
# KWOK_WORKDIR: keep kwok away from ~/.kwok (it would load ~/.kwok/kwok.yaml).
start kwok env KWOK_WORKDIR="$WORK/kwok" kwok \
  --kubeconfig="$WORK/kwok.kubeconfig" \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-ip=127.0.0.1 \
  --node-port="$KWOK_PORT" \
  --server-address="127.0.0.1:$KWOK_PORT" \
  --node-lease-duration-seconds=40 \
  --cidr=10.244.0.0/16 \
  "${STAGES[@]}"

healthz() { curl -fsSk "https://127.0.0.1:$1/healthz"; }
wait_for "kube-controller-manager /healthz" healthz "$KCM_PORT"
wait_for "kube-scheduler /healthz" healthz "$SCHED_PORT"
wait_for "kwok /healthz" curl -fsS "http://127.0.0.1:$KWOK_PORT/healthz"
pass "control plane up"

# --- fake node --------------------------------------------------------------
kubectl apply -f "$TESTENV_DIR/kwok/node.yaml" >/dev/null
node_ready() {
  [[ "$(kubectl get node kwok-node-0 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}
wait_for "node kwok-node-0 Ready" node_ready
log "node: $(kubectl get node kwok-node-0 -o jsonpath='cpu={.status.allocatable.cpu} memory={.status.allocatable.memory} pods={.status.allocatable.pods} ip={.status.addresses[0].address}')"
wait_for "node lease kube-node-lease/kwok-node-0" kubectl -n kube-node-lease get lease kwok-node-0
pass "kwok node Ready"

# --- StatefulSet ------------------------------------------------------------
kubectl create namespace smoke >/dev/null
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: smoke
spec:
  clusterIP: None
  selector:
    app: web
  ports:
  - name: http
    port: 80
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: smoke
spec:
  serviceName: web
  replicas: 1
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: registry.k8s.io/pause:3.10
        ports:
        - containerPort: 80
          name: http
EOF
pod_ready() { # ns name [uid-to-differ-from]
  local out
  out="$(kubectl -n "$1" get pod "$2" -o jsonpath='{.metadata.uid} {.status.phase} {.status.conditions[?(@.type=="Ready")].status} {.status.podIP}')" || return 1
  read -r uid phase ready ip <<<"$out"
  [[ "$phase" == Running && "$ready" == True && -n "$ip" && "$uid" != "${3:-}" ]]
}
wait_for "pod smoke/web-0 Running+Ready" pod_ready smoke web-0
sts_ready() { [[ "$(kubectl -n smoke get sts web -o jsonpath='{.status.readyReplicas}')" == 1 ]]; }
wait_for "statefulset smoke/web readyReplicas=1" sts_ready
log "pod: $(kubectl -n smoke get pod web-0 -o jsonpath='node={.spec.nodeName} podIP={.status.podIP} hostIP={.status.hostIP} containers-ready={.status.containerStatuses[0].ready}')"
pass "StatefulSet pod Running and Ready"

# Deleting the pod: kwok's pod-delete stage removes it, the StatefulSet
# controller recreates it, kwok makes the new one Ready.
OLD_UID="$(kubectl -n smoke get pod web-0 -o jsonpath='{.metadata.uid}')"
kubectl -n smoke delete pod web-0 --wait=false >/dev/null
wait_for "recreated pod smoke/web-0 Running+Ready" pod_ready smoke web-0 "$OLD_UID"
pass "pod deletion handled and pod recreated"

# --- Job pods complete (pod-complete stage) ----------------------------------
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: batch/v1
kind: Job
metadata:
  name: once
  namespace: smoke
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: registry.k8s.io/pause:3.10
EOF
job_done() { [[ "$(kubectl -n smoke get job once -o jsonpath='{.status.succeeded}')" == 1 ]]; }
wait_for "job smoke/once succeeded" job_done
pass "Job pod completed"

# --- runtime=local pods are not driven by kwok -------------------------------
kubectl apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Pod
metadata:
  name: local-runtime
  namespace: smoke
  labels:
    tenantplane.io/runtime: local
spec:
  nodeName: kwok-node-0
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
---
apiVersion: v1
kind: Pod
metadata:
  name: control
  namespace: smoke
spec:
  nodeName: kwok-node-0
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
EOF
wait_for "control pod smoke/control Running+Ready" pod_ready smoke control
sleep 3
phase="$(kubectl -n smoke get pod local-runtime -o jsonpath='{.status.phase}|{.status.podIP}')"
[[ "$phase" == "Pending|" ]] || { log "runtime=local pod was touched by kwok: $phase"; exit 1; }
kubectl -n smoke delete pod local-runtime --wait=false >/dev/null
sleep 3
kubectl -n smoke get pod local-runtime -o jsonpath='{.metadata.deletionTimestamp}' | grep -q . \
  || { log "runtime=local pod was removed by kwok"; exit 1; }
kubectl -n smoke delete pod local-runtime --grace-period=0 --force >/dev/null 2>&1
pass "runtime=local pod left Pending and not finalized by kwok"

# --- garbage collection -------------------------------------------------------
kubectl -n smoke create configmap owner --from-literal=k=v >/dev/null
OWNER_UID="$(kubectl -n smoke get configmap owner -o jsonpath='{.metadata.uid}')"
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: dependent
  namespace: smoke
  ownerReferences:
  - apiVersion: v1
    kind: ConfigMap
    name: owner
    uid: $OWNER_UID
data:
  k: v
EOF
kubectl -n smoke get configmap dependent >/dev/null
kubectl -n smoke delete configmap owner >/dev/null
gone() { ! kubectl -n smoke get configmap dependent >/dev/null 2>&1; }
wait_for "garbage collector to delete smoke/dependent" gone
pass "garbage collector deleted the dependent ConfigMap"

# SMOKE_HOLD=<seconds>: keep running that long, then check that kwok kept
# the node alive (heartbeat stage + lease renewal).
if ((${SMOKE_HOLD:-0} > 0)); then
  hb() { kubectl get node kwok-node-0 -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}'; }
  lease() { kubectl -n kube-node-lease get lease kwok-node-0 -o jsonpath='{.spec.renewTime}'; }
  HB0="$(hb)" LEASE0="$(lease)"
  log "holding ${SMOKE_HOLD}s (heartbeat $HB0, lease renewed $LEASE0)"
  sleep "$SMOKE_HOLD"
  HB1="$(hb)" LEASE1="$(lease)"
  log "after hold: heartbeat $HB1, lease renewed $LEASE1, taints: $(kubectl get node kwok-node-0 -o jsonpath='{.spec.taints}')"
  [[ "$HB1" != "$HB0" && "$LEASE1" != "$LEASE0" ]] && node_ready || { log "node heartbeat did not advance"; exit 1; }
  pass "node heartbeat and lease kept up for ${SMOKE_HOLD}s"
fi

OK=1
log "all checks passed in $((SECONDS - START))s"
printf 'smoke: %d passed, 0 failed\n' "$PASSED"
