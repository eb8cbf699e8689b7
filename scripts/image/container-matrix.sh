#!/usr/bin/env bash
# Run runcell's image in each permission shape a container or a pod can give it (the matrix of
# docs/container.md) and check what runcell says about each: `print(1)` with the expected
# `enforcement`, or a `sandbox_failure` naming what is missing. Also `runcell doctor`'s advice
# in a failing shape, and /readyz where the server has it. Prints a table; exits non-zero on
# any row that differs from its expectation.
#
#   scripts/image/container-matrix.sh [ROW...]     # e.g. M' C; default: every row
#
# Needs root, podman and runc (scripts/test.sh installs them). Builds the image first
# (scripts/image/build.sh, which keeps an up-to-date image). RUNCELL_MATRIX_NO_BUILD=1 uses
# the image as it is.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
[ "$(id -u)" = 0 ] || { echo "container-matrix.sh: needs root (podman with runc, user namespaces)" >&2; exit 1; }
# shellcheck source=podman-env.sh
. scripts/image/podman-env.sh
[ "${RUNCELL_MATRIX_NO_BUILD:-}" = 1 ] || scripts/image/build.sh

# "RuntimeDefault": what containerd, CRI-O and Docker give a pod or container by default,
# made from podman's profile the way Docker's is written: the namespace and mount syscalls
# only with CAP_SYS_ADMIN (clone only without namespace flags otherwise, clone3 ENOSYS),
# and no rule at all for pivot_root.
python3 - /usr/share/containers/seccomp.json "$podman_dir/runtime-default.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
gated = {"clone", "clone3", "unshare", "mount", "umount", "umount2", "fsopen", "fsconfig",
         "fsmount", "fspick", "open_tree", "move_mount", "mount_setattr", "pivot_root"}
for s in p["syscalls"]:
    if not s.get("includes") and not s.get("excludes") and s["action"] == "SCMP_ACT_ALLOW":
        s["names"] = [n for n in s["names"] if n not in gated]
admin = sorted(gated - {"pivot_root", "clone"})
p["syscalls"] += [
    {"names": admin, "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
    {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
    # CLONE_NEWNS|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWCGROUP = 0x7E020000
    {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_SYS_ADMIN"]},
     "args": [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
    {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38,
     "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
]
json.dump(p, open(sys.argv[2], "w"), indent=1)
PY
exec python3 scripts/image/matrix.py --image localhost/runcell:dev \
  --runtime-default "$podman_dir/runtime-default.json" \
  --runcell-profile "$REPO/deploy/k8s/seccomp/runcell.json" "$@"
