#!/usr/bin/env bash
# Build the operator's own image from a tenantplane binary, for the real node: the snapshot agent in
# a `kubernetes` tenant's control-plane pod runs from it, pulled by the kubelet like any image.
#
#   ${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}/testenv/agent-image-<key>/
#
# where <key> hashes this script, the image library, the binary and the name. Each build of the
# binary gives a new layout; the three most recently used are kept.
#
# Usage: agent-image.sh BIN_DIR PROGRAM NAME    builds if needed; prints the layout folder on stdout
#
# The image, NAME (the operator's, tenantplane/tenantplane:<version>), as the project's Dockerfile
# lays it out: PROGRAM, stripped, at /usr/local/bin/tenantplane, user 65532:65532, entrypoint the
# program, command `controller`. It differs from the Dockerfile's in what is under the program: the
# libraries it loads copied from this machine instead of Debian slim, no CA bundle, and a binary
# built with the `dev` feature (the tests' and `make demo`'s) instead of the release build without it.
set -euo pipefail
BIN_DIR="${1:?usage: agent-image.sh BIN_DIR PROGRAM NAME}"
PROGRAM="${2:?usage: agent-image.sh BIN_DIR PROGRAM NAME}"
NAME="${3:?usage: agent-image.sh BIN_DIR PROGRAM NAME}"
TESTENV_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}"
log() { printf 'testenv: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The name in full, as containerd resolves it (tenantplane/tenantplane:v is Docker Hub's).
FIRST="${NAME%%/*}"
if [[ "$NAME" != */* ]]; then
  NAME="docker.io/library/$NAME"
elif [[ "$FIRST" != *.* && "$FIRST" != *:* && "$FIRST" != localhost ]]; then
  NAME="docker.io/$NAME"
fi
[[ -x "$PROGRAM" ]] || die "$PROGRAM is not an executable (build the tenantplane binary first)"
REGISTRY="$BIN_DIR/registry"
[[ -x "$REGISTRY" ]] || die "$REGISTRY is missing: run testenv/build.sh"
KEY="$({
  cat "${BASH_SOURCE[0]}" "$TESTENV_DIR/image-lib.sh"
  printf 'name %s\n' "$NAME"
  sha256sum <"$PROGRAM"
} | sha256sum | cut -c1-16)"
mkdir -p "$CACHE_ROOT/testenv"
OUT="$CACHE_ROOT/testenv/agent-image-$KEY"
if [[ ! -f "$OUT/.complete" ]]; then
  TMP="$(mktemp -d "$CACHE_ROOT/testenv/.tmp-agent-image.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  LAYOUT="$TMP/layout"
  source "$TESTENV_DIR/image-lib.sh"
  d="$TMP/rootfs"; rootfs_base "$d"; mkdir -p "$d/usr/local/bin"
  # Stripped: line tables are most of a test build's weight, and a pod has no use for them.
  strip -o "$d/usr/local/bin/tenantplane" "$PROGRAM"
  with_libs "$d" "$PROGRAM"
  image "$NAME" "$d" --entrypoint /usr/local/bin/tenantplane --cmd controller --user 65532:65532
  touch "$LAYOUT/.complete"
  chmod -R a+rX "$LAYOUT"
  rm -rf "$OUT"
  mv -T "$LAYOUT" "$OUT"
  log "agent image ready: $NAME ($(du -sh "$OUT" | cut -f1))"
fi
touch "$OUT/.last-used"
# Older builds' layouts: all but the three most recently used go.
ls -1td "$CACHE_ROOT"/testenv/agent-image-*/.last-used 2>/dev/null | tail -n +4 |
  while IFS= read -r used; do rm -rf "$(dirname "$used")"; done
printf '%s\n' "$OUT"
