#!/usr/bin/env bash
# Build the test control plane binaries (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok) from the Go modules
# in this directory, with the machine's Go, into a content-addressed cache:
#
#   ${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}/testenv/<key>/bin/
#
# <key> is a short hash of every go.mod/go.sum here, this script and
# `go version`, so any change to them yields a fresh directory.  A complete
# directory is never rebuilt; a build happens in a temporary directory that is
# renamed into place only once every binary is there.
#
# Usage:
#   build.sh            build if needed; progress on stderr, bin dir on stdout
#   build.sh --bin-dir  print the bin dir (absolute) and exit; builds nothing
#
# GOCACHE and GOMODCACHE are Go's defaults (outside the checkout).
set -euo pipefail

TESTENV_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}"
HEARTBEAT_SECS="${TESTENV_HEARTBEAT_SECS:-30}"

# binary name | module dir | package
COMPONENTS=(
  "etcd|etcd|go.etcd.io/etcd/server/v3"
  "kube-apiserver|kube|k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager|kube|k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler|kube|k8s.io/kubernetes/cmd/kube-scheduler"
  "kubectl|kube|k8s.io/kubernetes/cmd/kubectl"
  "kwok|kwok|sigs.k8s.io/kwok/cmd/kwok"
)

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

compute_key() {
  {
    printf 'go-version %s\n' "$("$GO" version)"
    local f
    for f in build.sh etcd/go.mod etcd/go.sum kube/go.mod kube/go.sum kwok/go.mod kwok/go.sum; do
      printf 'file %s\n' "$f"
      cat "$TESTENV_DIR/$f"
    done
  } | sha256sum | cut -c1-16
}

KEY="$(compute_key)"
KEY_DIR="$CACHE_ROOT/testenv/$KEY"
BIN_DIR="$KEY_DIR/bin"

is_complete() {
  local dir="$1" c
  [[ -f "$dir/.complete" ]] || return 1
  for c in "${COMPONENTS[@]}"; do
    [[ -x "$dir/${c%%|*}" ]] || return 1
  done
}

case "${1:-}" in
  --bin-dir) printf '%s\n' "$BIN_DIR"; exit 0 ;;
  "") ;;
  -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument: $1 (try --help)" ;;
esac

if is_complete "$BIN_DIR"; then
  touch "$KEY_DIR/.last-used" 2>/dev/null || true
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
  if is_complete "$BIN_DIR"; then
    printf '%s\n' "$BIN_DIR"
    exit 0
  fi
fi

TMP_DIR="$(mktemp -d "$CACHE_ROOT/testenv/.tmp-$KEY.XXXXXX")"
chmod 755 "$TMP_DIR"
HEARTBEAT_PID=""
BUILD_PID=""
cleanup() {
  local p
  for p in "$BUILD_PID" "$HEARTBEAT_PID"; do
    if [[ -n "$p" ]]; then kill "$p" 2>/dev/null || true; fi
  done
  if [[ -n "$BUILD_PID" ]]; then wait "$BUILD_PID" 2>/dev/null || true; fi
  rm -rf "$TMP_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Version stamps for the Kubernetes binaries (otherwise v0.0.0-master).
KUBE_VERSION="$(cd "$TESTENV_DIR/kube" && "$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)"
[[ "$KUBE_VERSION" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "unexpected k8s.io/kubernetes version: $KUBE_VERSION"
KUBE_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  KUBE_LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION"
  KUBE_LDFLAGS+=" -X $pkg.gitMajor=${BASH_REMATCH[1]} -X $pkg.gitMinor=${BASH_REMATCH[2]}"
  KUBE_LDFLAGS+=" -X $pkg.gitTreeState=clean"
done

log "building into $BIN_DIR ($("$GO" version | cut -d' ' -f3), kubernetes $KUBE_VERSION)"
START=$SECONDS
total=${#COMPONENTS[@]}
i=0
for c in "${COMPONENTS[@]}"; do
  i=$((i + 1))
  IFS='|' read -r name moddir pkg <<<"$c"
  log "building $name ($i/$total)… [$((SECONDS - START))s elapsed]"
  ldflags="-s -w"
  [[ "$moddir" == kube ]] && ldflags+="$KUBE_LDFLAGS"
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
  (cd "$TESTENV_DIR/$moddir" && exec "$GO" build -trimpath -ldflags="$ldflags" -o "$TMP_DIR/bin/$name" "$pkg") &
  BUILD_PID=$!
  wait "$BUILD_PID" || die "go build of $name failed"
  BUILD_PID=""
  kill "$HEARTBEAT_PID" 2>/dev/null || true
  wait "$HEARTBEAT_PID" 2>/dev/null || true
  HEARTBEAT_PID=""
done

{
  printf 'key %s\n' "$KEY"
  printf 'go %s\n' "$("$GO" version)"
  printf 'kubernetes %s\n' "$KUBE_VERSION"
  printf 'built %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$TMP_DIR/bin/.complete"

# Atomic publish: rename the finished temp dir into place.
rm -rf "$KEY_DIR"
mv -T "$TMP_DIR" "$KEY_DIR"
touch "$KEY_DIR/.last-used"

# Prune other keys unused for 3 days and temp dirs of killed builds.
find "$CACHE_ROOT/testenv" -mindepth 1 -maxdepth 1 -type d -name '.tmp-*' -mmin +1440 \
  -exec rm -rf {} + 2>/dev/null || true
for d in "$CACHE_ROOT"/testenv/*/; do
  d="${d%/}"
  [[ "$d" == "$KEY_DIR" ]] && continue
  if [[ -z "$(find "$d" -maxdepth 1 -name .last-used -mmin -4320 2>/dev/null)" ]]; then
    log "pruning unused $d"
    rm -rf "$d"
  fi
done
log "done in $((SECONDS - START))s: $BIN_DIR ($(du -sh "$BIN_DIR" | cut -f1))"
printf '%s\n' "$BIN_DIR"
