#!/usr/bin/env bash
# The container phase of scripts/test.sh: install podman and runc when missing, check that
# podman can start a container on this machine, then build the image from the debug build
# and run the permission matrix. Skips visibly, with the reason, where podman cannot run.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
skip() { echo "SKIP container matrix: $*"; exit 0; }
[ "${RUNCELL_SKIP_CONTAINER:-}" = 1 ] && skip "RUNCELL_SKIP_CONTAINER=1"
# The root filesystem (about 1.2 GiB) is copied into podman's storage as a layer and again as
# a container: with less room than this the build fails half-way with ENOSPC.
mkdir -p target
free_kib=$(df -Pk target | awk 'NR == 2 { print $4 }')
[ "${free_kib:-0}" -ge $((8 * 1024 * 1024)) ] ||
  skip "only $((free_kib / 1024)) MiB free under target/ (the image needs about 8 GiB)"
[ "$(id -u)" = 0 ] || skip "needs root"
command -v dpkg-query >/dev/null || skip "the image is assembled from a Debian host's packages"
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || skip "could not install ${need[*]} with apt"
fi
# shellcheck source=podman-env.sh
. scripts/image/podman-env.sh
# A container that only exits: podman, runc, storage and the ulimits work here.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
mkdir -p "$probe/ctx/bin"
cp /usr/bin/true "$probe/ctx/bin/true"
for lib in $(ldd /usr/bin/true | awk '/=> \//{print $3} /^\t\//{print $1}'); do
  mkdir -p "$probe/ctx/$(dirname "$lib")"
  cp -L "$lib" "$probe/ctx/$lib"
done
printf 'FROM scratch\nCOPY . /\n' >"$probe/Containerfile"
if ! out=$(podman build -q --network=none --pull=never -f "$probe/Containerfile" -t localhost/runcell-probe "$probe/ctx" 2>&1 \
  && podman run --rm --network=none localhost/runcell-probe /bin/true 2>&1); then
  podman rmi -f localhost/runcell-probe >/dev/null 2>&1 || true
  skip "podman cannot run a container here: $(echo "$out" | tail -1)"
fi
podman rmi -f localhost/runcell-probe >/dev/null 2>&1 || true
[ -x target/debug/runcell ] || cargo build -q -p runcell
RUNCELL_IMAGE_BINARY=target/debug/runcell scripts/image/build.sh
RUNCELL_MATRIX_NO_BUILD=1 scripts/image/container-matrix.sh
