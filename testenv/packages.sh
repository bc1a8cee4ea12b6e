#!/usr/bin/env bash
# Install the Debian packages the test world needs, when missing (as root; otherwise say which
# are missing and stop). Prints nothing when all are there.
#
#   nftables          nft, which kube-proxy's nftables mode and kube-network-policies drive
#   iptables          the kubelet's and the CNI plugins' fallbacks look for it
#   conntrack         kube-proxy clears stale UDP flows with it
#   libseccomp-dev    runc's seccomp support (cgo), at build time; pulls in libseccomp2
#   pkg-config        finds libseccomp for runc's build
#   busybox-static    the busybox images (one static binary, Debian's build of busybox)
#   iproute2          ip: network namespaces, bridges and veths for the real node
#   bind9-dnsutils    dig, in the images the conformance suite's DNS specs look names up with
#   curl, netcat-openbsd, bash
#                     the agnhost image's userland as upstream's Dockerfile installs it (the
#                     suite's Service specs run `curl`, `nc -z -w` and `bash -c` in agnhost pods)
#   binutils          strip, for the operator's image testenv/agent-image.sh packs
#
# Downloaded, never installed (installing would start a web server on the machine), unpacked by
# testenv/images.sh into the nginx images: nginx, nginx-common (into the cache's testenv/debs).
set -euo pipefail
PACKAGES=(nftables iptables conntrack libseccomp-dev pkg-config busybox-static iproute2 bind9-dnsutils curl netcat-openbsd bash binutils)
DOWNLOADED=(nginx nginx-common)

# The downloaded ones first: they need no root.
DEBS="${TENANTPLANE_CACHE:-$HOME/.cache/tenantplane}/testenv/debs"
mkdir -p "$DEBS"
for p in "${DOWNLOADED[@]}"; do
  version="$(apt-cache show --no-all-versions "$p" 2>/dev/null | sed -n 's/^Version: //p' | head -1)"
  [[ -n "$version" ]] || { echo "testenv: Debian has no package $p (apt-get update?)" >&2; exit 1; }
  if ! compgen -G "$DEBS/${p}_${version//:/%3a}_*.deb" >/dev/null; then
    echo "testenv: downloading Debian's $p $version" >&2
    (cd "$DEBS" && apt-get download -q "$p=$version" >/dev/null 2>&1) ||
      { echo "testenv: apt-get download $p=$version failed" >&2; exit 1; }
  fi
done
# build.sh prunes cache folders not used for three days.
touch "$DEBS/.last-used"
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
if [[ "$(id -u)" != 0 ]]; then
  echo "testenv: missing Debian packages: ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "testenv: installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; then
  echo "testenv: apt-get install failed; updating the package lists and trying again" >&2
  apt-get update >/dev/null
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
