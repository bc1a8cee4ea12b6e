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
#                                         Debian's: busybox for the small tools, and the programs
#                                         upstream's Dockerfile installs from Alpine (dig, curl,
#                                         OpenBSD nc, ip and ss, bash) from Debian's packages, and
#                                         /bin/sh is Debian's dash; no iperf, ipcs or the fake
#                                         registry's content
#   registry.k8s.io/e2e-test-images/agnhost:2.55
#                                         the same agnhost: the suite's "previous" agnhost, which its
#                                         rolling updates replace with 2.63.0 (an older agnhost
#                                         would need an older Kubernetes module)
#   registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0
#                                         Debian's dig and getent (glibc) with busybox, as upstream's
#                                         (Debian with dnsutils)
#   registry.k8s.io/e2e-test-images/nginx:1.15-4, :1.27-0
#                                         Debian's nginx (1.22, downloaded by packages.sh, never
#                                         installed) serving /usr/share/nginx/html on port 80, with
#                                         busybox; upstream's are nginx 1.15 and 1.27 on Alpine
#   docker.io/rancher/mirrored-coredns-coredns:1.12.3
#                                         CoreDNS 1.12.3 (testenv/coredns: the plugins the operator's
#                                         Corefile names), the tenants' DNS as the syncer deploys it
#   registry.k8s.io/networking/kube-network-policies:v0.8.0
#                                         kube-network-policies v0.8.0 (testenv/netpol) at /bin/netpol,
#                                         as upstream's image has it; the real node's NetworkPolicy
#                                         enforcer
#   registry.k8s.io/e2e-test-images/nonewprivs:1.4
#                                         its nnp program at the pinned Kubernetes version, setuid
#                                         root at /usr/local/bin/nnp as upstream's; no Alpine under it
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-1, docker.io/library/busybox:latest, :1.35.0,
#   :1.37.0 (the syncer's /etc/hosts writer, HOSTS_IMAGE)
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
DIG=/usr/bin/dig
GETENT=/usr/bin/getent
[[ -x "$DIG" ]] || die "$DIG is missing: install Debian's bind9-dnsutils (testenv/packages.sh)"
DEBS="$CACHE_ROOT/testenv/debs"
newest() { find "$DEBS" -maxdepth 1 -name "$1" 2>/dev/null | sort -V | tail -1; }
NGINX_DEB="$(newest 'nginx_*.deb')"
NGINX_COMMON_DEB="$(newest 'nginx-common_*.deb')"
[[ -f "$NGINX_DEB" && -f "$NGINX_COMMON_DEB" ]] || die "Debian's nginx packages are not in $DEBS (testenv/packages.sh downloads them)"
KUBE_SRC="$(cd "$TESTENV_DIR/kube" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
KEY="$({
  cat "${BASH_SOURCE[0]}"
  printf 'busybox %s\n' "$BUSYBOX_VERSION"
  dpkg-query -W -f='${Version}\n' bind9-dnsutils libc-bin curl netcat-openbsd iproute2 bash dash
  basename "$NGINX_DEB"; basename "$NGINX_COMMON_DEB"
  for b in pause agnhost nnp coredns kube-network-policies; do printf '%s ' "$b"; sha256sum <"$BIN_DIR/$b"; done
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

# with_busybox DIR: Debian's static busybox with a link for every applet at its usual path and,
# as the busybox images upstream have them, in /bin (the suite runs /bin/sysctl, for one).
with_busybox() {
  local d="$1" applet
  mkdir -p "$d/bin" "$d/sbin" "$d/usr/bin" "$d/usr/sbin"
  cp "$BUSYBOX" "$d/bin/busybox"
  while IFS= read -r applet; do
    [[ "$applet" == bin/busybox ]] && continue
    ln -sf /bin/busybox "$d/$applet"
    [[ -e "$d/bin/${applet##*/}" ]] || ln -s /bin/busybox "$d/bin/${applet##*/}"
  done < <("$BUSYBOX" --list-full)
}

# with_program DIR PROGRAM…: Debian's dynamically linked PROGRAMs and the libraries they load, at
# the paths they have on the machine, and glibc's name service configuration.
with_program() {
  local d="$1" program lib
  shift
  for program in "$@"; do
    mkdir -p "$d/$(dirname "$program")"
    # An applet's link there points at /bin/busybox: copying through it would write the machine's.
    rm -f "$d/$program"
    cp -L "$program" "$d/$program"
    while IFS= read -r lib; do
      mkdir -p "$d/$(dirname "$lib")"
      cp -Ln "$lib" "$d/$lib"
    done < <(ldd "$program" | grep -o '/[^ ]*')
  done
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$d/etc/nsswitch.conf"
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
image docker.io/library/busybox:1.37.0 "$d" --cmd sh

# agnhost: the binary, a second name for it, the porter's test certificate, an upload folder and
# the image-defined user the specs look for, as upstream's Dockerfile has them.
d="$TMP/agnhost"; rootfs_base "$d"; with_busybox "$d"
cp "$BIN_DIR/agnhost" "$d/agnhost"; ln -s agnhost "$d/agnhost-2"
cp "$KUBE_SRC/test/images/agnhost/porter/localhost.crt" "$KUBE_SRC/test/images/agnhost/porter/localhost.key" "$d/"
mkdir -p "$d/uploads"
printf 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n' >>"$d/etc/passwd"
printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$d/etc/group"
with_program "$d" "$DIG" "$GETENT" /usr/bin/curl /bin/nc.openbsd /usr/bin/bash /usr/bin/ss /usr/sbin/ip \
  /usr/bin/dash
# OpenBSD's nc under the name the specs call (busybox's has no -z, -u or -v). The shell is dash:
# Debian builds busybox to prefer its own applets over PATH, so its `sh -c "nc …"` would run
# busybox's nc whatever PATH says (Alpine's busybox, upstream's /bin/sh, looks PATH up).
ln -sf /bin/nc.openbsd "$d/bin/nc"; ln -sf /bin/nc.openbsd "$d/usr/bin/nc"; ln -sf /usr/bin/dash "$d/bin/sh"
ln -sf /usr/bin/bash "$d/bin/bash"; ln -sf /usr/sbin/ip "$d/sbin/ip"; ln -sf /usr/sbin/ip "$d/bin/ip"
image registry.k8s.io/e2e-test-images/agnhost:2.63.0 "$d" --entrypoint /agnhost --cmd pause
image registry.k8s.io/e2e-test-images/agnhost:2.55 "$d" --entrypoint /agnhost --cmd pause

# nonewprivs: one program that prints its effective uid, setuid root, run as the pod's user.
d="$TMP/nonewprivs"; rootfs_base "$d"; mkdir -p "$d/usr/local/bin"
cp "$BIN_DIR/nnp" "$d/usr/local/bin/nnp"; chmod 4755 "$d/usr/local/bin/nnp"
image registry.k8s.io/e2e-test-images/nonewprivs:1.4 "$d" --cmd /usr/local/bin/nnp

d="$TMP/glibc-dns-testing"; rootfs_base "$d"; with_busybox "$d"; with_program "$d" "$DIG" "$GETENT"
image registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0 "$d" --cmd sh

# nginx: Debian's, unpacked from its packages, in the foreground, logging to the container's
# output, its workers as nobody.
d="$TMP/nginx"; rootfs_base "$d"; with_busybox "$d"
dpkg-deb -x "$NGINX_DEB" "$TMP/nginx-deb"; dpkg-deb -x "$NGINX_COMMON_DEB" "$TMP/nginx-deb"
with_program "$d" "$TMP/nginx-deb/usr/sbin/nginx"
mkdir -p "$d/usr/sbin" "$d/etc/nginx" "$d/usr/share/nginx" "$d/var/lib/nginx" "$d/var/log/nginx" "$d/run"
mv "$d/$TMP/nginx-deb/usr/sbin/nginx" "$d/usr/sbin/nginx"; rm -rf "${d:?}/${TMP#/}"
cp "$TMP/nginx-deb/etc/nginx/mime.types" "$d/etc/nginx/"
cp -r "$TMP/nginx-deb/usr/share/nginx/html" "$d/usr/share/nginx/"
cat >"$d/etc/nginx/nginx.conf" <<'CONF'
user nobody nobody;
worker_processes 1;
error_log /dev/stderr;
pid /run/nginx.pid;
events { worker_connections 512; }
http {
    include /etc/nginx/mime.types;
    access_log /dev/stdout;
    server {
        listen 80;
        root /usr/share/nginx/html;
        index index.html;
    }
}
CONF
image registry.k8s.io/e2e-test-images/nginx:1.15-4 "$d" --entrypoint /usr/sbin/nginx "--cmd=-g,daemon off;"
image registry.k8s.io/e2e-test-images/nginx:1.27-0 "$d" --entrypoint /usr/sbin/nginx "--cmd=-g,daemon off;"

# CoreDNS: the binary alone, as upstream's image (which runs it as the pod says; ours as 65532).
d="$TMP/coredns"; rootfs_base "$d"; cp "$BIN_DIR/coredns" "$d/coredns"
image docker.io/rancher/mirrored-coredns-coredns:1.12.3 "$d" --entrypoint /coredns

# kube-network-policies: the binary alone at the path upstream's DaemonSet names as its command.
d="$TMP/netpol"; rootfs_base "$d"; mkdir -p "$d/bin"; cp "$BIN_DIR/kube-network-policies" "$d/bin/netpol"
image registry.k8s.io/networking/kube-network-policies:v0.8.0 "$d" --cmd /bin/netpol

touch "$LAYOUT/.complete" "$LAYOUT/.last-used"
chmod -R a+rX "$LAYOUT"
rm -rf "$OUT"
mv -T "$LAYOUT" "$OUT"
log "images ready: $OUT ($(du -sh "$OUT" | cut -f1))"
printf '%s\n' "$OUT"
