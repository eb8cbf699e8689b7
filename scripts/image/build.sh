#!/usr/bin/env bash
# Build runcell's container image offline: a release build of this checkout, the root
# filesystem from this host (scripts/image/rootfs.sh), then `podman build --network=none` of
# deploy/container/Containerfile, tagged localhost/runcell:dev. Prints the image's size.
#
#   scripts/image/build.sh [--force]
#
# The image carries the hash of its inputs (every file's path, type, mode, owner, size, and
# the time or target; runcell's and the generated files' content; the Containerfile) as the
# label io.runcell.rootfs-hash; an image with the same hash is kept, not rebuilt (--force
# rebuilds). Otherwise podman's layer cache still reuses the big rootfs layer when only the
# binary changed. Needs root and podman.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
force=0
[ "${1:-}" = --force ] && force=1
image=localhost/runcell:dev
# shellcheck source=podman-env.sh
. scripts/image/podman-env.sh

t0=$(date +%s.%N)
elapsed() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1fs", b - a }'; }
if [ -z "${RUNCELL_IMAGE_BINARY:-}" ]; then
  CARGO_INCREMENTAL=0 cargo build -q --release -p runcell
fi
bin=${RUNCELL_IMAGE_BINARY:-target/release/runcell}
ctx=target/image
mkdir -p "$ctx"
scripts/image/rootfs.sh "$ctx" "$bin"
echo "build.sh: root filesystem assembled ($(elapsed))"

hash=$( {
  sha256sum deploy/container/Containerfile
  # The files rootfs.sh writes (their mtime is fixed): by content.
  sha256sum "$ctx/runcell"
  (cd "$ctx/rootfs" && sha256sum etc/ld.so.cache etc/passwd etc/group)
  (cd "$ctx/rootfs" && find . \( -type f -printf 'f %p %m %U %G %s %T@\n' \) -o \( -type l -printf 'l %p %l\n' \) -o -printf '%y %p %m %U %G\n' | LC_ALL=C sort)
} | sha256sum | cut -c1-16)
have=$(podman image inspect "$image" --format '{{index .Labels "io.runcell.rootfs-hash"}}' 2>/dev/null || true)
if [ "$force" = 0 ] && [ "$have" = "$hash" ]; then
  echo "build.sh: $image is up to date (inputs $hash), not rebuilt"
else
  podman build -q --network=none --pull=never --label "io.runcell.rootfs-hash=$hash" \
    -f deploy/container/Containerfile -t "$image" "$ctx" >/dev/null
  # The image it replaced (now untagged) would hold its layers' disk for nothing.
  podman image prune -f >/dev/null
  echo "build.sh: built $image (inputs $hash) ($(elapsed))"
fi
size=$(podman image inspect "$image" --format '{{.Size}}')
echo "build.sh: $image is $((size / 1024 / 1024)) MiB ($(elapsed) in all)"
