#!/usr/bin/env bash
# Build the test binaries (etcd, kine, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok, helm, coredns, SeaweedFS's weed (the S3 store of snapshot
# tests and the dev cluster), and the previous minor release's
# kube-apiserver and kube-controller-manager as kube-apiserver-previous and
# kube-controller-manager-previous) from the Go modules in this directory, with
# the machine's Go, into a content-addressed cache:
#
#   ${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}/testenv/<key>/bin/
#
# With --conformance it builds instead the Kubernetes end-to-end test binary
# (e2e.test, at the version kube/ pins) and ginkgo, from e2e/, into
# .../testenv/conformance-<key>/bin/ (about 20 minutes on 2 cores the first time).
#
# Each module (etcd/, kine/, kube/, kube-previous/, kwok/, helm/, coredns/, e2e/, …) is built into
# a folder of its own, mod-<module>-<module key>, where the module key hashes that module's go.mod,
# go.sum and Go files, its components, the build recipe below and `go version`; so a
# change to one module rebuilds only that module. <key> hashes the module
# keys; its bin/ holds hard links to every binary. A complete folder is never
# rebuilt; builds happen in temporary folders renamed into place only once
# every binary is there.
#
# Usage:
#   build.sh                build if needed; progress on stderr, bin dir on stdout
#   build.sh --bin-dir      print the bin dir (absolute) and exit; builds nothing
#   build.sh --conformance  the same for e2e.test and ginkgo
#
# GOCACHE and GOMODCACHE are Go's defaults (outside the checkout).
set -euo pipefail

TESTENV_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}"
HEARTBEAT_SECS="${TESTENV_HEARTBEAT_SECS:-30}"

# binary | module dir | package (a test binary when the name ends in .test)
ALL_COMPONENTS=(
  "etcd|etcd|go.etcd.io/etcd/server/v3"
  "kine|kine|github.com/k3s-io/kine"
  "kube-apiserver|kube|k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager|kube|k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-apiserver-previous|kube-previous|k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager-previous|kube-previous|k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler|kube|k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl|kube|k8s.io/kubernetes/cmd/kubectl"
  "kwok|kwok|sigs.k8s.io/kwok/cmd/kwok"
  "helm|helm|helm.sh/helm/v3/cmd/helm"
  "coredns|coredns|tenantplane.local/testenv/coredns"
  "kubelet|kube|k8s.io/kubernetes/cmd/kubelet"
  "kube-proxy|kube|k8s.io/kubernetes/cmd/kube-proxy"
  "agnhost|kube|k8s.io/kubernetes/test/images/agnhost"
  "nnp|kube|k8s.io/kubernetes/test/images/nonewprivs"
  "pause|kube|c:k8s.io/kubernetes:build/pause/linux/pause.c"
  "containerd|containerd|github.com/containerd/containerd/v2/cmd/containerd"
  "containerd-shim-runc-v2|containerd|github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
  "runc|runc|github.com/opencontainers/runc"
  "bridge|cni|github.com/containernetworking/plugins/plugins/main/bridge"
  "host-local|cni|github.com/containernetworking/plugins/plugins/ipam/host-local"
  "loopback|cni|github.com/containernetworking/plugins/plugins/main/loopback"
  "portmap|cni|github.com/containernetworking/plugins/plugins/meta/portmap"
  "registry|registry|tenantplane.local/testenv/registry"
  "kube-network-policies|netpol|sigs.k8s.io/kube-network-policies/cmd"
  "weed|seaweedfs|github.com/seaweedfs/seaweedfs/weed"
  "e2e.test|e2e|k8s.io/kubernetes/test/e2e"
  "ginkgo|e2e|github.com/onsi/ginkgo/v2/ginkgo"
)
MODULES=(etcd kine kube kube-previous kwok helm coredns containerd runc cni registry netpol seaweedfs)
KEY_PREFIX=""
if [[ "${1:-}" == "--conformance" ]]; then
  MODULES=(e2e)
  KEY_PREFIX="conformance-"
  shift
fi
COMPONENTS=()
for c in "${ALL_COMPONENTS[@]}"; do
  IFS='|' read -r _ m _ <<<"$c"
  for wanted in "${MODULES[@]}"; do
    if [[ "$m" == "$wanted" ]]; then COMPONENTS+=("$c"); fi
  done
done

log() { printf 'testenv: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

if command -v go >/dev/null 2>&1; then
  GO=go
elif [[ -x /usr/local/go/bin/go ]]; then
  GO=/usr/local/go/bin/go
else
  die "go not found on PATH (nor /usr/local/go/bin/go)"
fi
export GOTOOLCHAIN=local   # never download another toolchain
export GOFLAGS=-mod=readonly
export CGO_ENABLED=0
GO_VERSION="$("$GO" version)"

# The build recipe: the link flags of one module's binaries. Its text is part of every module
# key, so a change here rebuilds everything; a change elsewhere in this script rebuilds nothing.
module_ldflags() {
  local moddir="$1" version pkg
  local flags="-s -w"
  case "$moddir" in
    kube)
      # Version stamps for the Kubernetes binaries (otherwise v0.0.0-master).
      version="$(cd "$TESTENV_DIR/kube" && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)"
      [[ "$version" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "unexpected k8s.io/kubernetes version: $version"
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$version"
        flags+=" -X $pkg.gitMajor=${BASH_REMATCH[1]} -X $pkg.gitMinor=${BASH_REMATCH[2]}"
        flags+=" -X $pkg.gitTreeState=clean"
      done
      ;;
    helm)
      version="$(cd "$TESTENV_DIR/helm" && "$GO" list -m -f '{{.Version}}' helm.sh/helm/v3)"
      flags+=" -X helm.sh/helm/v3/internal/version.version=$version"
      ;;
    containerd)
      version="$(cd "$TESTENV_DIR/containerd" && "$GO" list -m -f '{{.Version}}' github.com/containerd/containerd/v2)"
      flags+=" -X github.com/containerd/containerd/v2/version.Version=$version"
      ;;
    runc)
      version="$(cd "$TESTENV_DIR/runc" && "$GO" list -m -f '{{.Version}}' github.com/opencontainers/runc)"
      flags+=" -X main.version=${version#v}"
      ;;
    kine)
      # As kine's own release build (scripts/build): cgo sqlite, linked statically.
      version="$(cd "$TESTENV_DIR/kine" && "$GO" list -m -f '{{.Version}}' github.com/k3s-io/kine)"
      flags+=" -X github.com/k3s-io/kine/pkg/version.Version=$version -extldflags -static"
      ;;
  esac
  printf '%s' "$flags"
}

# The rest of the recipe: cgo and build tags per module. runc needs cgo (its nsenter is C, run
# before the Go runtime starts) and libseccomp (Debian's libseccomp-dev, see packages.sh) for
# seccomp profiles; kine is built as its release is, with cgo sqlite (mattn/go-sqlite3) and its
# release's tags, so the image named rancher/kine runs the same database code as upstream's;
# everything else is pure Go. C components (the pause container's one C file,
# from the pinned Kubernetes source) are built with the flags upstream's Makefile uses.
module_cgo() {
  case "$1" in
    runc | kine) printf '1' ;;
    *) printf '0' ;;
  esac
}
module_tags() {
  case "$1" in
    runc) printf 'seccomp urfave_cli_no_docs' ;;
    containerd) printf 'no_btrfs no_devmapper no_zfs' ;;
    kine) printf 'nats sqlite_unlock_notify sqlite_vtable sqlite_stat4 sqlite_preupdate_hook sqlite_math_functions sqlite_dbstat sqlite_column_metadata' ;;
    *) printf '' ;;
  esac
}
c_cflags() { printf '%s' "-Os -Wall -Werror -static"; }
# The C flags of a cgo module's C code, empty for Go's default (-O2 -g): kine's are the SQLite
# feature flags of its release build (scripts/build) for the sqlite it links (mattn/go-sqlite3's
# copy), so the image named rancher/kine runs the sqlite upstream's does; -O2 stays.
module_cgo_cflags() {
  case "$1" in
    kine)
      printf '%s' "-O2 -DSQLITE_DEFAULT_MEMSTATUS=0 -DSQLITE_DISABLE_INTRINSIC -DSQLITE_ENABLE_COLUMN_METADATA \
-DSQLITE_ENABLE_DBPAGE_VTAB -DSQLITE_ENABLE_DBSTAT_VTAB -DSQLITE_ENABLE_MATH_FUNCTIONS \
-DSQLITE_ENABLE_MEMORY_MANAGEMENT -DSQLITE_ENABLE_OFFSET_SQL_FUNC -DSQLITE_ENABLE_PREUPDATE_HOOK \
-DSQLITE_ENABLE_RBU -DSQLITE_ENABLE_RTREE -DSQLITE_ENABLE_SESSION -DSQLITE_ENABLE_SNAPSHOT \
-DSQLITE_ENABLE_STAT4 -DSQLITE_ENABLE_UNLOCK_NOTIFY -DSQLITE_LIKE_DOESNT_MATCH_BLOBS \
-DSQLITE_THREADSAFE=1 -DSQLITE_WITHOUT_ZONEMALLOC"
      ;;
    *) printf '' ;;
  esac
}

# The link flags of e2e/: the same version stamps as kube/ (the suite reports them), from e2e's
# own pin, which matches kube's. Part of that module's key only, with its test build.
e2e_ldflags() {
  local kube e2e
  kube="$(cd "$TESTENV_DIR/kube" && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)"
  e2e="$(cd "$TESTENV_DIR/e2e" && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)"
  [[ "$kube" == "$e2e" ]] || die "e2e/go.mod pins k8s.io/kubernetes $e2e but kube/go.mod pins $kube; make them match"
  module_ldflags kube
}

# The link flags of kube-previous/ (the previous minor release's kube-apiserver and
# kube-controller-manager, for the images of the operator's `kubernetes` distribution): kube's
# version stamps, from kube-previous's own pin, which must be one minor release behind kube's.
# Part of that module's key only, so that adding it rebuilt no other module.
kube_previous_ldflags() {
  local kube version pkg flags="-s -w"
  kube="$(cd "$TESTENV_DIR/kube" && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)"
  version="$(cd "$TESTENV_DIR/kube-previous" && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)"
  [[ "$kube" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "unexpected k8s.io/kubernetes version: $kube"
  local want="v${BASH_REMATCH[1]}.$((BASH_REMATCH[2] - 1))."
  [[ "$version" == "$want"* ]] ||
    die "kube-previous/go.mod pins k8s.io/kubernetes $version but kube/go.mod pins $kube; pin the newest ${want}N"
  [[ "$version" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "unexpected k8s.io/kubernetes version: $version"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$version"
    flags+=" -X $pkg.gitMajor=${BASH_REMATCH[1]} -X $pkg.gitMinor=${BASH_REMATCH[2]}"
    flags+=" -X $pkg.gitTreeState=clean"
  done
  printf '%s' "$flags"
}

ldflags_for() {
  case "$1" in
    e2e) e2e_ldflags ;;
    kube-previous) kube_previous_ldflags ;;
    *) module_ldflags "$1" ;;
  esac
}

module_components() {
  local c m
  for c in "${COMPONENTS[@]}"; do
    IFS='|' read -r _ m _ <<<"$c"
    if [[ "$m" == "$1" ]]; then printf '%s\n' "$c"; fi
  done
}

module_key() {
  local moddir="$1"
  {
    printf 'go-version %s\n' "$GO_VERSION"
    printf 'env CGO_ENABLED=%s GOFLAGS=%s\n' "$CGO_ENABLED" "$GOFLAGS"
    printf 'go build -trimpath\n'
    declare -f module_ldflags module_cgo module_tags c_cflags module_cgo_cflags
    if [[ "$(module_cgo "$moddir")" == 1 ]] || module_components "$moddir" | grep -q '|c:'; then
      printf 'cc %s\n' "$(cc --version 2>/dev/null | head -1)"
    fi
    if [[ "$moddir" == e2e ]]; then
      declare -f e2e_ldflags
      printf 'go test -c -trimpath for a .test\n'
    fi
    if [[ "$moddir" == kube-previous ]]; then declare -f kube_previous_ldflags; fi
    module_components "$moddir"
    printf 'file go.mod\n'
    cat "$TESTENV_DIR/$moddir/go.mod"
    printf 'file go.sum\n'
    cat "$TESTENV_DIR/$moddir/go.sum"
    # A module's own Go files (coredns/main.go names its plugins), when it has any.
    for f in "$TESTENV_DIR/$moddir"/*.go; do
      if [[ -f "$f" ]]; then printf 'file %s\n' "${f##*/}"; cat "$f"; fi
    done
  } | sha256sum | cut -c1-16
}

declare -A MOD_DIR
KEY_INPUT=""
for m in "${MODULES[@]}"; do
  k="$(module_key "$m")"
  MOD_DIR[$m]="$CACHE_ROOT/testenv/mod-$m-$k"
  KEY_INPUT+="$m $k"$'\n'
done
KEY="$(printf '%s' "$KEY_INPUT" | sha256sum | cut -c1-16)"
KEY_DIR="$CACHE_ROOT/testenv/$KEY_PREFIX$KEY"
BIN_DIR="$KEY_DIR/bin"

# has_all DIR [MODULE]: DIR holds .complete and every binary (of MODULE, or of all).
has_all() {
  local dir="$1" moddir="${2:-}" c name m
  [[ -f "$dir/.complete" ]] || return 1
  for c in "${COMPONENTS[@]}"; do
    IFS='|' read -r name m _ <<<"$c"
    if [[ -n "$moddir" && "$m" != "$moddir" ]]; then continue; fi
    [[ -x "$dir/$name" ]] || return 1
  done
}

case "${1:-}" in
  --bin-dir) printf '%s\n' "$BIN_DIR"; exit 0 ;;
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument: $1 (try --help)" ;;
esac

touch_used() {
  local m
  touch "$KEY_DIR/.last-used" 2>/dev/null || true
  for m in "${MODULES[@]}"; do touch "${MOD_DIR[$m]}/.last-used" 2>/dev/null || true; done
}

bash "$TESTENV_DIR/packages.sh" || die "the Debian packages above are needed"

if has_all "$BIN_DIR"; then
  touch_used
  printf '%s\n' "$BIN_DIR"
  exit 0
fi

mkdir -p "$CACHE_ROOT/testenv"
# Serialise concurrent builds of the same cache root.
exec 9>"$CACHE_ROOT/testenv/.build.lock"
if command -v flock >/dev/null 2>&1; then
  if ! flock -n 9; then
    log "another build holds $CACHE_ROOT/testenv/.build.lock; waiting"
    flock 9
  fi
  if has_all "$BIN_DIR"; then
    printf '%s\n' "$BIN_DIR"
    exit 0
  fi
fi

TMP_DIR=""
HEARTBEAT_PID=""
BUILD_PID=""
cleanup() {
  local p
  for p in "$BUILD_PID" "$HEARTBEAT_PID"; do
    if [[ -n "$p" ]]; then kill "$p" 2>/dev/null || true; fi
  done
  if [[ -n "$BUILD_PID" ]]; then wait "$BUILD_PID" 2>/dev/null || true; fi
  if [[ -n "$TMP_DIR" ]]; then rm -rf "$TMP_DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# What is missing: the components of every module whose folder is not complete.
TODO=()
for m in "${MODULES[@]}"; do
  if ! has_all "${MOD_DIR[$m]}" "$m"; then
    while IFS= read -r c; do TODO+=("$c"); done < <(module_components "$m")
  fi
done

START=$SECONDS
log "building into $BIN_DIR ($(printf '%s' "$GO_VERSION" | cut -d' ' -f3); ${#TODO[@]} of ${#COMPONENTS[@]} binaries to build)"
total=${#TODO[@]}
i=0
for m in "${MODULES[@]}"; do
  if has_all "${MOD_DIR[$m]}" "$m"; then
    log "module $m is cached: ${MOD_DIR[$m]}"
    continue
  fi
  TMP_DIR="$(mktemp -d "$CACHE_ROOT/testenv/.tmp-mod-$m.XXXXXX")"
  chmod 755 "$TMP_DIR"
  ldflags="$(ldflags_for "$m")"
  while IFS='|' read -r name moddir pkg; do
    i=$((i + 1))
    log "building $name ($i/$total)… [$((SECONDS - START))s elapsed]"
    (
      exec 9>&- # do not hold the build lock
      n=0
      while sleep 1; do
        n=$((n + 1))
        if ((n % HEARTBEAT_SECS == 0)); then
          log "  still building $name ($i/$total)… [$((SECONDS - START))s elapsed]"
        fi
      done
    ) &
    HEARTBEAT_PID=$!
    # In the background so that a signal to this script is handled at once
    # (bash defers traps until a foreground child exits); cleanup kills it.
    tags="$(module_tags "$moddir")"
    if [[ "$pkg" == c:* ]]; then
      # c:<module>:<file>: one C file from the pinned module's source, linked statically.
      IFS=':' read -r _ cmod cfile <<<"$pkg"
      (
        cd "$TESTENV_DIR/$moddir"
        src="$("$GO" list -m -f '{{.Dir}}' "$cmod")/$cfile"
        ver="$("$GO" list -m -f '{{.Version}}' "$cmod")"
        # shellcheck disable=SC2046 # c_cflags is a word list
        exec cc $(c_cflags) -DVERSION="$ver" -o "$TMP_DIR/$name" "$src"
      ) &
    elif [[ "$name" == *.test ]]; then
      (cd "$TESTENV_DIR/$moddir" && exec "$GO" test -c -trimpath -ldflags="$ldflags" -o "$TMP_DIR/$name" "$pkg") &
    else
      (cd "$TESTENV_DIR/$moddir" && CGO_ENABLED="$(module_cgo "$moddir")" CGO_CFLAGS="$(module_cgo_cflags "$moddir")" exec "$GO" build -trimpath -tags="$tags" -ldflags="$ldflags" -o "$TMP_DIR/$name" "$pkg") &
    fi
    BUILD_PID=$!
    wait "$BUILD_PID" || die "go build of $name failed"
    BUILD_PID=""
    kill "$HEARTBEAT_PID" 2>/dev/null || true
    wait "$HEARTBEAT_PID" 2>/dev/null || true
    HEARTBEAT_PID=""
  done < <(module_components "$m")
  {
    printf 'module %s\n' "$m"
    printf 'go %s\n' "$GO_VERSION"
    printf 'ldflags %s\n' "$ldflags"
    printf 'built %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$TMP_DIR/.complete"
  # Atomic publish: rename the finished temp dir into place.
  rm -rf "${MOD_DIR[$m]}"
  mv -T "$TMP_DIR" "${MOD_DIR[$m]}"
  TMP_DIR=""
done

# The bin dir: hard links to every module's binaries (copies across file systems).
TMP_DIR="$(mktemp -d "$CACHE_ROOT/testenv/.tmp-$KEY.XXXXXX")"
chmod 755 "$TMP_DIR"
mkdir "$TMP_DIR/bin"
for c in "${COMPONENTS[@]}"; do
  IFS='|' read -r name m _ <<<"$c"
  ln "${MOD_DIR[$m]}/$name" "$TMP_DIR/bin/$name" 2>/dev/null ||
    cp "${MOD_DIR[$m]}/$name" "$TMP_DIR/bin/$name"
done
{
  printf 'key %s\n' "$KEY"
  printf '%s' "$KEY_INPUT" | sed 's/^/module /'
  printf 'go %s\n' "$GO_VERSION"
  printf 'built %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$TMP_DIR/bin/.complete"
rm -rf "$KEY_DIR"
mv -T "$TMP_DIR" "$KEY_DIR"
TMP_DIR=""
touch_used

# Prune folders unused for 3 days and temp dirs of killed builds.
find "$CACHE_ROOT/testenv" -mindepth 1 -maxdepth 1 -type d -name '.tmp-*' -mmin +1440 \
  -exec rm -rf {} + 2>/dev/null || true
for d in "$CACHE_ROOT"/testenv/*/; do
  d="${d%/}"
  [[ -n "$(find "$d" -maxdepth 1 -name .last-used -mmin -4320 2>/dev/null)" ]] && continue
  log "pruning unused $d"
  rm -rf "$d"
done
log "done in $((SECONDS - START))s: $BIN_DIR ($(du -sh "$BIN_DIR" | cut -f1))"
printf '%s\n' "$BIN_DIR"
