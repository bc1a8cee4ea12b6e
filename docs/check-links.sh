#!/usr/bin/env bash
# Every relative link and #anchor in the README and the book resolves, or this fails naming the
# file, the line and the link. mdbook warns about none of these by itself, and CI has no network,
# so links with a scheme (https:, mailto:) are left alone. Anchors are the ids mdbook and GitHub
# give headings: lowercase, punctuation but - and _ dropped, spaces as -, repeats numbered -1, -2.
# Ours rather than a crate: it needs only bash and awk, which CI has, and nothing to build.
#
#   docs/check-links.sh [FILE.md ...]    (default: README.md docs/src/*.md, from the repo root)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
  set -- README.md docs/src/*.md
fi

read -r -d '' PROGRAM <<'AWK' || true
# The id a heading gets.
function heading_id(text,    i, c, out, punct) {
  punct = "!\"#$%&'()*+,./:;<=>?@[\\]^`{|}~"
  # A link in a heading counts by its text.
  while (match(text, /\[[^]]*\]\([^)]*\)/)) {
    inner = substr(text, RSTART + 1, RLENGTH - 2)
    sub(/\]\(.*$/, "", inner)
    text = substr(text, 1, RSTART - 1) inner substr(text, RSTART + RLENGTH)
  }
  text = tolower(text)
  out = ""
  for (i = 1; i <= length(text); i++) {
    c = substr(text, i, 1)
    if (c == " " || c == "\t") out = out "-"
    else if (index(punct, c) == 0) out = out c
  }
  return out
}

# Load the heading ids of `path` into ids[path, id] once.
function load_ids(path,    line, fence, h, id, seen, n) {
  if (path in loaded) return
  loaded[path] = 1
  fence = 0
  while ((getline line < path) > 0) {
    if (line ~ /^[ \t]*(```|~~~)/) { fence = !fence; continue }
    if (fence || line !~ /^#+[ \t]/) continue
    h = line
    sub(/^#+[ \t]+/, "", h)
    sub(/[ \t]+#+[ \t]*$/, "", h)
    sub(/[ \t]+$/, "", h)
    id = heading_id(h)
    n = seen[id]++
    if (n > 0) id = id "-" n
    ids[path, id] = 1
  }
  close(path)
}

function dirname(path) {
  if (path !~ /\//) return "."
  sub(/\/[^\/]*$/, "", path)
  return path
}

function exists(path) {
  gsub(/'/, "'\\''", path)
  return system("test -e '" path "'") == 0
}

function broken(why) {
  printf "%s:%d: broken link (%s): %s\n", FILENAME, FNR, target, why
  failures++
}

function check(    path, anchor, hash, file) {
  if (target ~ /^[a-zA-Z][a-zA-Z0-9+.-]*:/) return   # a scheme: not checked offline
  path = target
  anchor = ""
  hash = index(path, "#")
  if (hash > 0) {
    anchor = substr(path, hash + 1)
    path = substr(path, 1, hash - 1)
  }
  if (path == "") file = FILENAME
  else if (path ~ /^\//) { broken("absolute path; link relative to the file"); return }
  else file = dirname(FILENAME) "/" path
  if (path != "" && !exists(file)) { broken(file " does not exist"); return }
  if (anchor == "") return
  if (file !~ /\.md$/) { broken("an anchor into a file that is not Markdown"); return }
  load_ids(file)
  if (!((file, anchor) in ids)) broken("no heading in " file " has the id #" anchor)
}

FNR == 1 { fence = 0 }
/^[ \t]*(```|~~~)/ { fence = !fence; next }
fence { next }
{
  line = $0
  # Code spans are not links: `[Conformance]` and `x](y)` inside them stay as they are.
  gsub(/`[^`]*`/, "", line)
  # Inline links and images: [text](target "title").
  while (match(line, /\]\([^)]*\)/)) {
    target = substr(line, RSTART + 2, RLENGTH - 3)
    line = substr(line, RSTART + RLENGTH)
    sub(/^[ \t]*</, "", target); sub(/>[ \t]*$/, "", target)
    sub(/[ \t]+".*"$/, "", target)
    if (target != "") check()
  }
  # Reference definitions: [name]: target
  if ($0 ~ /^ *\[[^]]+\]:[ \t]+[^ \t]/) {
    target = $0
    sub(/^ *\[[^]]+\]:[ \t]+/, "", target)
    sub(/[ \t].*$/, "", target)
    check()
  }
}
END {
  if (failures > 0) { printf "docs: %d broken link(s)\n", failures; exit 1 }
}
AWK

LC_ALL=C awk "$PROGRAM" "$@"
echo "docs: every relative link and anchor in $# files resolves"
