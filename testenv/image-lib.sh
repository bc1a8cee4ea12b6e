# Shared by images.sh and agent-image.sh: how an image of the test world is put together. The
# caller sets BUSYBOX (for with_busybox), TMP (scratch), LAYOUT (the OCI layout being written) and
# REGISTRY (testenv's registry program), and defines log and die.

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

# with_libs DIR PROGRAM: the libraries PROGRAM loads, at the paths they have on the machine; none
# when it is static (ldd: "not a dynamic executable").
with_libs() {
  local d="$1" lib
  ldd "$2" >/dev/null 2>&1 || return 0
  while IFS= read -r lib; do
    mkdir -p "$d/$(dirname "$lib")"
    cp -Ln "$lib" "$d/$lib"
  done < <(ldd "$2" | grep -o '/[^ ]*')
}

# with_program DIR PROGRAM…: Debian's dynamically linked PROGRAMs and the libraries they load, at
# the paths they have on the machine, and glibc's name service configuration.
with_program() {
  local d="$1" program
  shift
  for program in "$@"; do
    mkdir -p "$d/$(dirname "$program")"
    # An applet's link there points at /bin/busybox: copying through it would write the machine's.
    rm -f "$d/$program"
    cp -L "$program" "$d/$program"
    with_libs "$d" "$program"
  done
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$d/etc/nsswitch.conf"
}

# image NAME DIR [--owned=PATH=UID:GID…] [registry build flags…]: pack DIR as one layer and add it
# to the layout. Its files are root's, but each --owned PATH (a file or an empty folder, relative to
# DIR) is UID:GID's, appended after the rest (the machine's owners never reach the layer).
image() {
  local name="$1" dir="$2" owned=() o path ids
  shift 2
  while [[ "${1:-}" == --owned=* ]]; do owned+=("${1#--owned=}"); shift; done
  log "image $name"
  local excludes=(--anchored)
  for o in "${owned[@]}"; do excludes+=("--exclude=./${o%%=*}"); done
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner "${excludes[@]}" -C "$dir" -cf "$TMP/layer.tar" .
  for o in "${owned[@]}"; do
    path="${o%%=*}" ids="${o#*=}"
    [[ -f "$dir/$path" || ( -d "$dir/$path" && -z "$(ls -A "$dir/$path")" ) ]] ||
      die "image $name: --owned $path must be a file or an empty folder"
    tar --mtime=@0 --owner="${ids%%:*}" --group="${ids#*:}" --numeric-owner --no-recursion \
      -C "$dir" -rf "$TMP/layer.tar" "./$path"
  done
  "$REGISTRY" build --layout "$LAYOUT" --name "$name" --layer "$TMP/layer.tar" "$@"
  rm -f "$TMP/layer.tar"
}
