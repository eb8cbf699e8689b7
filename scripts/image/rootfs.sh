#!/usr/bin/env bash
# Assemble the container image's root filesystem from this host (Debian), with no registry:
# the runcell binary, the runtimes runcell finds on the host (Python with the data stack that
# `runcell setup` prepared, Node.js, Ruby, Go, bash) as the Debian packages that provide them
# plus their installed dependencies, the shared-library closure of every ELF file (the wheels'
# extension modules too), the loader cache, /etc/passwd and /etc/group with the `runcell` user
# (uid 1000) and the CA certificates. The result is a directory that
# deploy/container/Containerfile copies into a FROM-scratch image.
#
#   scripts/image/rootfs.sh OUT_DIR [RUNCELL_BINARY]
#
# OUT_DIR/rootfs is replaced. Files are hard-linked from the host where OUT_DIR is on the same
# filesystem (no copy, no extra disk), copied otherwise; nothing is ever written through a link.
# Generated files carry a fixed mtime, so two runs over an unchanged host give the same tree
# (scripts/image/build.sh hashes it to skip an unchanged build).
#
# RUNCELL_IMAGE_LANGUAGES (default "python node ruby go") chooses the runtimes besides bash;
# a runtime that is not installed on the host is left out with a note.
set -euo pipefail

out=${1:?usage: rootfs.sh OUT_DIR [RUNCELL_BINARY]}
bin=${2:-target/release/runcell}
data_dir=${RUNCELL_DATA_DIR:-/var/lib/runcell}
languages=${RUNCELL_IMAGE_LANGUAGES:-python node ruby go}
[ -x "$bin" ] || { echo "rootfs.sh: no runcell binary at $bin (cargo build --release -p runcell)" >&2; exit 1; }
command -v dpkg-query >/dev/null || { echo "rootfs.sh: needs a Debian-based host (dpkg-query)" >&2; exit 1; }

root=$out/rootfs
# Everything the tree is made of, cheaply: this script, the choice of runtimes, the installed
# packages' versions, the prepared runtimes' files, the /etc entries copied, the binary. An
# unchanged key keeps the tree as it is (assembling it takes minutes on a busy machine).
key=$( {
  sha256sum "$0" "$bin"
  echo "$languages"
  dpkg-query -W -f='${Package} ${Version} ${db:Status-Status}\n'
  find "$data_dir" /etc/alternatives /etc/fonts /etc/ld.so.conf.d /etc/ssl/certs/ca-certificates.crt \
    -printf '%p %s %T@ %l\n' 2>/dev/null | LC_ALL=C sort
} | sha256sum | cut -c1-32)
if [ -d "$root" ] && [ -f "$out/runcell" ] && [ "$(cat "$out/inputs.key" 2>/dev/null)" = "$key" ]; then
  echo "rootfs.sh: $root is up to date (inputs $key)"
  exit 0
fi
rm -rf "$root" "$out/inputs.key"
mkdir -p "$root"

# --- which Debian packages -------------------------------------------------------------
# Roots per runtime; their Pre-Depends/Depends are followed through installed packages.
roots=(bash coreutils base-files ca-certificates)
for l in $languages; do
  case $l in
    python) pkgs=(python3-minimal python3.11-minimal libpython3.11-stdlib libpython3.11) ;;
    node) pkgs=(nodejs) ;;
    ruby) pkgs=(ruby) ;;
    go) pkgs=(golang-go) ;;
    *) echo "rootfs.sh: unknown language $l" >&2; exit 1 ;;
  esac
  if [ "$(dpkg-query -W -f='${db:Status-Status}' "${pkgs[0]}" 2>/dev/null)" = installed ]; then
    roots+=("${pkgs[@]}")
  else
    echo "rootfs.sh: $l is not installed here (${pkgs[0]}): left out of the image"
  fi
done
# Packages that only maintain a Debian system (package manager, maintainer scripts); the image
# is never upgraded in place, it is rebuilt.
skip=" dpkg debconf perl-base perl init-system-helpers install-info ucf sensible-utils lsb-base debianutils "

# The closure over installed packages, from one dump of the package database (a dpkg-query
# per package would take a minute on a busy machine).
mapfile -t packages < <(dpkg-query -W -f='${Package}\t${db:Status-Status}\t${Pre-Depends}, ${Depends}\n' \
  | python3 -c '
import sys
skip = set(sys.argv[1].split())
deps = {}
for line in sys.stdin:
    name, status, d = line.rstrip("\n").split("\t")
    if status == "installed":
        deps[name.split(":")[0]] = d
chosen, queue = set(), sys.argv[2:]
while queue:
    p = queue.pop().split(":")[0]
    if p in chosen or p in skip or p not in deps:
        continue
    chosen.add(p)
    for alternatives in deps[p].split(","):
        for o in alternatives.split("|"):
            n = o.split()[0].split(":")[0] if o.split() else ""
            if n in deps:
                queue.append(n)
                break
print("\n".join(sorted(chosen)))
' "$skip" "${roots[@]}")

# --- copying ---------------------------------------------------------------------------
link=1
[ "$(stat -c %d /usr)" = "$(stat -c %d "$out")" ] || link=0
# Debian's merged /usr: /bin, /lib, /lib64, /sbin are symlinks into /usr on this host.
for top in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$top" ]; then ln -s "$(readlink "/$top")" "$root/$top"; fi
done
# Copy host paths (NUL-separated on stdin) with their parent directories into the root: each
# non-directory once, a path through a top-level symlink (/lib/x86_64-linux-gnu/...) at its
# /usr place, a symlink with the chain of links it goes through. Regular files are hard-linked
# when LINK=1 (copied otherwise), symlinks are made anew, directories get the host's mode and
# owner. One pass in Python: a process per file would take minutes.
copy_paths() {
  LINK=$link python3 -c '
import os, shutil, sys
root = sys.argv[1]
link = os.environ["LINK"] == "1"
seen = set()
def mkparents(d):
    if d == "/" or os.path.isdir(root + d):
        return
    mkparents(os.path.dirname(d))
    st = os.stat(d)
    os.mkdir(root + d)
    os.chown(root + d, st.st_uid, st.st_gid)
    os.chmod(root + d, st.st_mode & 0o7777)
def place(p):
    if os.path.lexists(root + p):
        return
    mkparents(os.path.dirname(p))
    if os.path.islink(p):
        os.symlink(os.readlink(p), root + p)
        os.lchown(root + p, 0, 0)
    elif link:
        os.link(p, root + p)
    else:
        shutil.copy2(p, root + p)
        st = os.stat(p)
        os.chown(root + p, st.st_uid, st.st_gid)
real_root = os.path.realpath(root) + "/"
def add(p):
    p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
    # A library found through an $ORIGIN run path inside the root is already there.
    if p.startswith(real_root):
        return
    while p not in seen:
        seen.add(p)
        if not os.path.lexists(p) or (os.path.isdir(p) and not os.path.islink(p)):
            return
        place(p)
        if not os.path.islink(p):
            return
        t = os.path.join(os.path.dirname(p), os.readlink(p))
        p = os.path.join(os.path.realpath(os.path.dirname(t)), os.path.basename(t))
for raw in sys.stdin.buffer.read().split(b"\0"):
    if raw.startswith(b"/"):
        add(os.fsdecode(raw))
' "$root"
}
# Every file of the chosen packages except documentation (man pages, docs, info, lintian).
dpkg-query -L "${packages[@]}" \
  | grep -Ev '^/usr/share/(doc|man|info|lintian|bug)(/|$)' \
  | tr '\n' '\0' | copy_paths

# runcell itself goes beside the root, as OUT/runcell: the Containerfile copies it in a layer
# of its own, so a new binary rebuilds only that layer. Without its debug sections (a debug
# build's are most of its size); symbols stay.
rm -f "$out/runcell"
cp "$bin" "$out/runcell"
if command -v strip >/dev/null; then strip --strip-debug "$out/runcell"; fi
chmod 0755 "$out/runcell"
touch -d @0 "$out/runcell"
# The prepared runtimes: the Python data stack, Go's build cache.
if [ -d "$data_dir" ]; then
  mkdir -p "$root/var/lib/runcell"
  for d in python go; do
    if [ -d "$data_dir/$d" ]; then
      if [ $link = 1 ]; then cp -a -l "$data_dir/$d" "$root/var/lib/runcell/"; else cp -a "$data_dir/$d" "$root/var/lib/runcell/"; fi
    fi
  done
else
  echo "rootfs.sh: no prepared runtimes in $data_dir (run \`runcell setup\`): the image has none"
fi
# The alternatives symlinks (/usr/bin entries point into /etc/alternatives) and fontconfig's
# configuration, which runcell binds into every sandbox as it does on a host.
for e in /etc/alternatives /etc/fonts; do
  if [ -d "$e" ]; then cp -a -n "$e" "$root/etc/"; fi
done
# Every ELF file's shared-library closure (the runtimes', runcell's, the wheels' extension
# modules'), resolved on this host by its loader, with the symlink chain to each library.
{
  echo "$out/runcell"
  python3 -c '
import os, sys
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(d, f)
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        try:
            with open(p, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    print(p)
        except OSError:
            pass
' "$root"
} | { xargs -r -d '\n' -n 400 ldd 2>/dev/null || true; } \
  | awk '/=> \//{print $3} /^\t\/(usr|lib)/{print $1}' | sort -u | tr '\n' '\0' | copy_paths
# Each file generated below replaces what the packages brought (a hard link to the host's
# file, which must never be written through).
for f in etc/passwd etc/group etc/nsswitch.conf etc/ld.so.conf etc/ld.so.cache \
  etc/ssl/certs/ca-certificates.crt; do
  rm -f "$root/$f"
done
# The runcell user: uid/gid 1000, home in /tmp (the image's only writable place besides the
# package cache volume), no login shell.
mkdir -p "$root/etc" "$root/tmp" "$root/var/tmp" "$root/var/lib/runcell/packages" "$root/run" \
  "$root/proc" "$root/sys" "$root/dev" "$root/workspace"
chmod 1777 "$root/tmp" "$root/var/tmp"
chown 1000:1000 "$root/var/lib/runcell/packages"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nruncell:x:1000:1000:runcell:/tmp:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nruncell:x:1000:\nnogroup:x:65534:\n' >"$root/etc/group"
# Name resolution: files, then DNS (the runtime writes resolv.conf and hosts at run time).
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
# The loader cache of the image's own libraries.
: >"$root/etc/ld.so.conf"
[ -d /etc/ld.so.conf.d ] && cp -a -n /etc/ld.so.conf.d "$root/etc/" && printf 'include /etc/ld.so.conf.d/*.conf\n' >"$root/etc/ld.so.conf"
ldconfig -r "$root"
# The CA bundle: /etc/ssl/certs is generated on the host by update-ca-certificates.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$root/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi
# A fixed mtime on each file generated here, for a reproducible tree (linked host files keep
# theirs; directories and symlinks are not part of build.sh's hash by time).
for f in etc/passwd etc/group etc/nsswitch.conf etc/ld.so.conf etc/ld.so.cache \
  etc/ssl/certs/ca-certificates.crt; do
  if [ -f "$root/$f" ] && [ ! -L "$root/$f" ]; then touch -d @0 "$root/$f"; fi
done

printf '%s\n' "${packages[@]}" >"$out/packages.txt"
echo "$key" >"$out/inputs.key"
echo "rootfs.sh: $(wc -l <"$out/packages.txt") Debian packages, $(du -sh --apparent-size "$root" | cut -f1) in $root"
