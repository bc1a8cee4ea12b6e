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
# The images of the operator's `kubernetes` distribution (its control-plane pod's three containers),
# their tags from the pins in testenv/kube, kube-previous and kine:
#   registry.k8s.io/kube-apiserver:v1.36.3, registry.k8s.io/kube-controller-manager:v1.36.3
#                                         kube's binaries (static, no cgo) at /usr/local/bin/<name>,
#                                         as upstream's; upstream's base is go-runner on distroless
#                                         static (ENTRYPOINT /go-runner, CA bundle, tzdata), ours has
#                                         neither and no entrypoint: the pod names the command, as
#                                         kubeadm's manifests do
#   registry.k8s.io/kube-apiserver:v1.35.8, registry.k8s.io/kube-controller-manager:v1.35.8
#                                         the same for the previous minor release (testenv/kube-previous,
#                                         its newest patch on the module proxy)
#   docker.io/rancher/kine:v0.17.5        kine (testenv/kine) at /bin/kine, ENTRYPOINT /bin/kine, /db
#                                         owned by nobody (65534, group root), USER nobody, as upstream's
#                                         Dockerfile; Debian's busybox where upstream has Alpine (a shell
#                                         and mkdir, which the operator's init container uses); kine is
#                                         built as its release is (cgo sqlite, its tags and SQLite
#                                         flags, its version stamp), linked statically against glibc
#                                         where upstream's links musl; no CA bundle, VOLUME or EXPOSE
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
# pinned MODULE_DIR MODULE: the version testenv/MODULE_DIR/go.mod pins for MODULE.
pinned() { (cd "$TESTENV_DIR/$1" && GOFLAGS=-mod=readonly go list -m -f '{{.Version}}' "$2"); }
KUBE_VERSION="$(pinned kube k8s.io/kubernetes)"
KUBE_PREVIOUS_VERSION="$(pinned kube-previous k8s.io/kubernetes)"
KINE_VERSION="$(pinned kine github.com/k3s-io/kine)"
[[ "$KUBE_VERSION" =~ ^v([0-9]+)\.([0-9]+)\. && "$KUBE_PREVIOUS_VERSION" == "v${BASH_REMATCH[1]}.$((BASH_REMATCH[2] - 1))."* ]] ||
  die "testenv/kube-previous pins Kubernetes $KUBE_PREVIOUS_VERSION, not the minor release before kube's $KUBE_VERSION"
KEY="$({
  cat "${BASH_SOURCE[0]}" "$TESTENV_DIR/image-lib.sh"
  printf 'busybox %s\n' "$BUSYBOX_VERSION"
  dpkg-query -W -f='${Version}\n' bind9-dnsutils libc-bin curl netcat-openbsd iproute2 bash dash
  basename "$NGINX_DEB"; basename "$NGINX_COMMON_DEB"
  printf 'tags %s %s %s\n' "$KUBE_VERSION" "$KUBE_PREVIOUS_VERSION" "$KINE_VERSION"
  for b in pause agnhost nnp coredns kube-network-policies kube-apiserver kube-controller-manager \
    kube-apiserver-previous kube-controller-manager-previous kine; do
    printf '%s ' "$b"; sha256sum <"$BIN_DIR/$b"
  done
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

# rootfs_base, with_busybox, with_libs, with_program and image.
source "$TESTENV_DIR/image-lib.sh"

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

# kube-apiserver and kube-controller-manager, this release's and the previous minor's: the binary
# alone at upstream's path; no entrypoint (upstream's is go-runner, which the pod's command replaces).
kube_image() {
  local cmd="$1" tag="$2" bin="$3" d="$TMP/$1-$2"
  rootfs_base "$d"; mkdir -p "$d/usr/local/bin"
  cp "$BIN_DIR/$bin" "$d/usr/local/bin/$cmd"; with_libs "$d" "$BIN_DIR/$bin"
  image "registry.k8s.io/$cmd:$tag" "$d"
}
kube_image kube-apiserver "$KUBE_VERSION" kube-apiserver
kube_image kube-controller-manager "$KUBE_VERSION" kube-controller-manager
kube_image kube-apiserver "$KUBE_PREVIOUS_VERSION" kube-apiserver-previous
kube_image kube-controller-manager "$KUBE_PREVIOUS_VERSION" kube-controller-manager-previous

# kine: as upstream's Dockerfile (COPY kine /bin/kine; mkdir /db && chown nobody /db; USER nobody;
# ENTRYPOINT /bin/kine), whose default sqlite database, ./db/state.db, is then in /db.
# Upstream's is Alpine, whose busybox gives it a shell and mkdir (the operator's pod makes the
# database's folder on a new claim with them): Debian's busybox here.
d="$TMP/kine"; rootfs_base "$d"; with_busybox "$d"; mkdir -p "$d/bin" "$d/db"; chmod 755 "$d/db"
cp "$BIN_DIR/kine" "$d/bin/kine"; with_libs "$d" "$BIN_DIR/kine"
image "docker.io/rancher/kine:$KINE_VERSION" "$d" --owned=db=65534:0 --entrypoint /bin/kine --user nobody

touch "$LAYOUT/.complete" "$LAYOUT/.last-used"
chmod -R a+rX "$LAYOUT"
rm -rf "$OUT"
mv -T "$LAYOUT" "$OUT"
log "images ready: $OUT ($(du -sh "$OUT" | cut -f1))"
printf '%s\n' "$OUT"
