#!/usr/bin/env bash
# Build the container images of the test world into one OCI layout, from binaries testenv built
# (build.sh) or Debian ships, each under the exact name its workloads use:
#
#   ${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}/testenv/images-<key>/
#
# where <key> hashes this script, the binaries it packs and Debian's busybox version. The real
# node's registry (registry serve --layout) loads them at start, so a kubelet's pull is a real pull.
#
# Usage: images.sh BIN_DIR    builds if needed; prints the layout folder on stdout
#
# What each image is, and how it differs from the upstream image of that name:
#   registry.k8s.io/pause:3.10.2          Kubernetes' pause.c at the pinned version, static (as upstream)
#   registry.k8s.io/e2e-test-images/agnhost:2.63.0
#                                         agnhost at the pinned Kubernetes version; its userland is
#                                         Debian's busybox (sh, nslookup, wget, nc…), not Alpine's
#                                         packages (no bash, dig or curl)
#   docker.io/rancher/mirrored-coredns-coredns:1.12.3
#                                         CoreDNS 1.12.3 (testenv/coredns: the plugins the operator's
#                                         Corefile names), the tenants' DNS as the syncer deploys it
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-1, docker.io/library/busybox:latest, :1.35.0
#                                         Debian's busybox-static (1.35.0), every applet linked
# An image that cannot be built from the real software is left out (see testenv/README.md).
set -euo pipefail
BIN_DIR="${1:?usage: images.sh BIN_DIR}"
TESTENV_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}"
BUSYBOX=/bin/busybox
log() { printf 'testenv: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -x "$BUSYBOX" ]] || die "$BUSYBOX is missing: install Debian's busybox-static (testenv/packages.sh)"
BUSYBOX_VERSION="$(dpkg-query -W -f='${Version}' busybox-static)"
KUBE_SRC="$(cd "$TESTENV_DIR/kube" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
KEY="$({
  cat "${BASH_SOURCE[0]}"
  printf 'busybox %s\n' "$BUSYBOX_VERSION"
  for b in pause agnhost coredns; do printf '%s ' "$b"; sha256sum <"$BIN_DIR/$b"; done
} | sha256sum | cut -c1-16)"
OUT="$CACHE_ROOT/testenv/images-$KEY"
if [[ -f "$OUT/.complete" ]]; then
  touch "$OUT/.last-used"
  printf '%s\n' "$OUT"
  exit 0
fi

TMP="$(mktemp -d "$CACHE_ROOT/testenv/.tmp-images.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
LAYOUT="$TMP/layout"
REGISTRY="$BIN_DIR/registry"

# rootfs_base DIR: the folders and files every image here has.
rootfs_base() {
  local d="$1"
  mkdir -p "$d/etc" "$d/tmp" "$d/root" "$d/var" "$d/proc" "$d/sys" "$d/dev"
  chmod 1777 "$d/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$d/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$d/etc/group"
}

# with_busybox DIR: Debian's static busybox with a link for every applet.
with_busybox() {
  local d="$1" applet
  mkdir -p "$d/bin" "$d/sbin" "$d/usr/bin" "$d/usr/sbin"
  cp "$BUSYBOX" "$d/bin/busybox"
  while IFS= read -r applet; do
    [[ "$applet" == bin/busybox ]] && continue
    ln -sf /bin/busybox "$d/$applet"
  done < <("$BUSYBOX" --list-full)
}

# image NAME DIR [registry build flags…]: pack DIR as one layer and add it to the layout.
image() {
  local name="$1" dir="$2"
  shift 2
  log "image $name"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir" -cf "$TMP/layer.tar" .
  "$REGISTRY" build --layout "$LAYOUT" --name "$name" --layer "$TMP/layer.tar" "$@"
  rm -f "$TMP/layer.tar"
}

# pause: the sandbox every pod has; runs as 65535 as upstream's does.
d="$TMP/pause"; rootfs_base "$d"; cp "$BIN_DIR/pause" "$d/pause"
image registry.k8s.io/pause:3.10.2 "$d" --entrypoint /pause --user 65535:65535

d="$TMP/busybox"; rootfs_base "$d"; with_busybox "$d"
image registry.k8s.io/e2e-test-images/busybox:1.37.0-1 "$d" --cmd sh
image docker.io/library/busybox:latest "$d" --cmd sh
image docker.io/library/busybox:1.35.0 "$d" --cmd sh

# agnhost: the binary, a second name for it, the porter's test certificate, an upload folder and
# the image-defined user the specs look for, as upstream's Dockerfile has them.
d="$TMP/agnhost"; rootfs_base "$d"; with_busybox "$d"
cp "$BIN_DIR/agnhost" "$d/agnhost"; ln -s agnhost "$d/agnhost-2"
cp "$KUBE_SRC/test/images/agnhost/porter/localhost.crt" "$KUBE_SRC/test/images/agnhost/porter/localhost.key" "$d/"
mkdir -p "$d/uploads"
printf 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n' >>"$d/etc/passwd"
printf 'user-defined-in-image:x:1000:\n' >>"$d/etc/group"
image registry.k8s.io/e2e-test-images/agnhost:2.63.0 "$d" --entrypoint /agnhost --cmd pause

# CoreDNS: the binary alone, as upstream's image (which runs it as the pod says; ours as 65532).
d="$TMP/coredns"; rootfs_base "$d"; cp "$BIN_DIR/coredns" "$d/coredns"
image docker.io/rancher/mirrored-coredns-coredns:1.12.3 "$d" --entrypoint /coredns

touch "$LAYOUT/.complete" "$LAYOUT/.last-used"
chmod -R a+rX "$LAYOUT"
rm -rf "$OUT"
mv -T "$LAYOUT" "$OUT"
log "images ready: $OUT ($(du -sh "$OUT" | cut -f1))"
printf '%s\n' "$OUT"
