#!/usr/bin/env bash
# Start-up cost of one sandboxed run, per language, measured in one run against two baselines:
# the bare runtime on the host (no isolation) and bubblewrap with a comparable namespace
# sandbox (no cgroups, no seccomp, no Landlock: bwrap has none of them by default).
# Prints mean wall times and the ratios. Usage: benches/startup.sh [runs]
#
# BASELINE=REV (a commit, tag or branch) adds runcell built at REV as a fourth contender, in the
# same run, so a change's start-up cost is measured against what it changes:
#   BASELINE=origin/main benches/startup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
baseline=${BASELINE:-}
for tool in hyperfine bwrap; do
  command -v "$tool" >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool/bwrap/bubblewrap}" >/dev/null; }
done
cargo build --release -q
rc=target/release/runcell
base_rc=
if [ -n "$baseline" ]; then
  # The baseline is built in its own worktree and target dir (kept under target/, reused).
  wt=target/bench-baseline
  rev=$(git rev-parse --verify "$baseline^{commit}")
  if [ ! -d "$wt" ]; then git worktree add -q --detach "$wt" "$rev"; fi
  git -C "$wt" checkout -q --detach "$rev"
  (cd "$wt" && cargo build --release -q)
  base_rc=$wt/target/release/runcell
  echo "baseline: runcell at ${rev:0:12} ($baseline)"
fi
bw="bwrap --unshare-all --die-with-parent --new-session --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin --ro-bind /etc/ld.so.cache /etc/ld.so.cache --ro-bind /etc/alternatives /etc/alternatives --proc /proc --dev /dev --tmpfs /tmp --tmpfs /workspace --chdir /workspace"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# All three get the same small, clean environment (runcell gives the sandbox one anyway): the
# host's variables can change a runtime's start-up a lot (NODE_EXTRA_CA_CERTS makes Node load
# a CA bundle, for one).
clean="env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8"
bench() { # name, bare command, runcell language, code
  local name=$1 bare=$2 lang=$3 code=$4
  local extra=()
  if [ -n "$base_rc" ]; then
    extra=(-n baseline "$clean $base_rc run --json --lang $lang -c '$code'")
  fi
  hyperfine -N -w 3 -r "$runs" --export-json "$out/$name.json" \
    -n bare "$clean $bare" -n bwrap "$clean $bw $bare" \
    -n runcell "$clean $rc run --json --lang $lang -c '$code'" "${extra[@]}" >/dev/null
}
bench bash "/usr/bin/bash -c true" bash "true"
bench python "/usr/bin/python3 -c pass" python "pass"
bench node "/usr/bin/node -e 0" node "0"
bench ruby "/usr/bin/ruby -e 0" ruby "0"

python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = {}
for name in ["bash", "python", "node", "ruby"]:
    rows[name] = {x["command"]: x for x in json.load(open(os.path.join(d, name + ".json")))["results"]}
has_base = "baseline" in rows["bash"]
head = f"{'language':10} {'bare ms':>9} {'bwrap ms':>9} {'runcell ms':>11} {'runcell-bare':>13} {'runcell/bwrap':>14}"
if has_base:
    head += f" {'baseline ms':>12} {'runcell/baseline':>17}"
print(head)
for name, r in rows.items():
    b, w, c = (r[k]["mean"] * 1000 for k in ("bare", "bwrap", "runcell"))
    line = f"{name:10} {b:9.1f} {w:9.1f} {c:11.1f} {c - b:12.1f}ms {c / w:13.2f}x"
    if has_base:
        base = r["baseline"]["mean"] * 1000
        line += f" {base:12.1f} {c / base:16.2f}x"
    print(line)
PY
