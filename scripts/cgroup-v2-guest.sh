#!/usr/bin/env bash
# runcell's cgroup-dependent tests on a real cgroup v2 kernel, in a qemu guest.
#
# The hosts runcell is developed on are cgroup v1 and cannot switch, so the v2 code
# (crates/runcell-jail/src/cgroup/v2.rs) would otherwise only ever meet the fake tree of its
# unit tests. This script boots a Debian kernel under qemu (TCG: no KVM needed) with
# `cgroup_no_v1=all`, shows it the host's own root read-only over virtio-9p with a tmpfs
# overlay on top (so the tests, runcell, the runtimes in /usr and `runcell setup`'s state are
# the host's, and the guest may still write), mounts cgroup2 at /sys/fs/cgroup, and runs a
# selection of the test binaries built on the host: the memory, pids and CPU limits, OOM
# classification, cleanup and sweeping, the real-kernel v2 tests of runcell-jail, and a few
# isolation checks. Results come back through a second, writable 9p share.
#
#   scripts/cgroup-v2-guest.sh            build the tests if needed, boot, run, summarize
#   RUNCELL_SKIP_V2_GUEST=1 ...           skip (visibly), for local iteration
#   RUNCELL_V2_GUEST_TIMEOUT=SECS ...     bound on one boot (default 360)
#   RUNCELL_V2_GUEST_KERNEL=release ...   the release's own kernel (bookworm: 6.1) instead of
#                                         the backports one (6.12), to test older kernels
#
# Everything it fetches is cached under target/cgroup-v2-guest/cache (remove it to fetch
# again): the kernel (from <release>-backports when reachable, else the release's own), the
# modules the guest needs, and busybox. Logs (the console, each test binary's output, the
# guest's dmesg) are in target/cgroup-v2-guest/out. Needs root (qemu's 9p export of / as root,
# apt-get); installs qemu with apt when it is missing. Without root, or not on x86_64, it
# prints a SKIP line.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
script=$repo/scripts/$(basename "$0")
work=$repo/target/cgroup-v2-guest
cache=$work/cache
out=$work/out
# Where the guest mounts the results share (inside the guest's own tmpfs /run).
guest_out=/run/cgroup-v2-guest

say() { echo "cgroup-v2-guest: $*"; }
die() {
  say "ERROR: $*" >&2
  exit 1
}

# ---------------------------------------------------------------------------------------------
# What runs in the guest: test binary (cargo package, target kind, target name), then libtest's
# arguments. Each `--exact` name must run: a renamed or removed test fails the phase instead
# of silently leaving the selection. An entry starting with `landlock6` asserts Landlock ABI 6
# (`"landlock": "full"`): on an older kernel (RUNCELL_V2_GUEST_KERNEL=release) it is skipped,
# visibly. Left out on purpose: the test of the host's disk
# throttling (the guest's files are on 9p, not on a block device;
# real_v2_io_max_is_written_for_a_real_disk covers `io.max` against the guest's virtio disk);
# the two whose programs must start a daemon within a 1.5 s or 2 s timeout
# (a_daemon_left_running_is_killed_on_timeout, a_timeout_without_cgroups_leaves_no_process_behind:
# Python and bash start in about a second under TCG, so the daemon may never start, and the
# kill they test is the pid namespace's, not the cgroup's); output floods, languages and files
# (no cgroup in them); and the slow servers (http, mcp). Under TCG everything is several times
# slower than on the host (a sandbox takes seconds to build): a test in this list must not
# need anything to happen within a fixed short time (a session's TTL, a short timeout that the
# program must outlast its start-up in, a pause for something to end): it waits for the state
# it needs, or, where a timeout is what ends the program, retries with a longer one.
# ---------------------------------------------------------------------------------------------
selection=(
  # The real-kernel v2 tests (ignored on a v1 host: they need a cgroup v2 hierarchy).
  "runcell-jail lib runcell_jail --include-ignored --exact
    cgroup::real_v2_tests::real_v2_limits_stats_kill_and_destroy
    cgroup::real_v2_tests::real_v2_oom_kill_is_counted
    cgroup::real_v2_tests::real_v2_pids_limit_hits_are_counted
    cgroup::real_v2_tests::real_v2_sweep_removes_groups_of_dead_supervisors
    cgroup::real_v2_tests::real_v2_kill_all_stops_a_forking_tree
    cgroup::real_v2_tests::real_v2_peak_reset_is_per_descriptor
    cgroup::real_v2_tests::real_v2_io_max_is_written_for_a_real_disk"
  # runcell started from a shell in its own group (a container's, a delegated one).
  "runcell test cgroup_v2 --include-ignored --exact
    root_in_a_container_cgroup_namespace_with_its_shell_gets_v2_limits
    unprivileged_in_a_delegated_group_with_its_shell_gets_v2_limits"
  "landlock6 runcell test basics --exact python_prints_and_the_verdict_has_every_contract_field"
  "landlock6 runcell test cli --exact doctor_json_parses_and_reports_everything_available"
  "runcell test limits --exact
    a_busy_loop_is_stopped_at_the_timeout
    a_program_ignoring_sigterm_and_sigint_is_still_stopped
    a_daemon_left_running_is_killed_when_the_program_exits
    a_bash_background_job_is_killed_when_the_script_exits
    killing_the_supervisor_tears_the_sandbox_down
    python_memory_bomb_hits_the_memory_limit
    python_gradual_allocation_hits_the_memory_limit
    memory_of_child_processes_counts_too
    peak_memory_is_reported
    python_fork_bomb_is_reported_as_process_limit
    bash_fork_bomb_is_reported_as_process_limit
    the_process_count_is_capped_at_pids
    a_thread_bomb_cannot_exceed_pids
    orphans_are_reaped_so_they_do_not_use_up_pids
    filling_the_workspace_hits_the_disk_limit
    filling_dev_shm_hits_the_disk_limit
    rlimits_are_set_for_the_program
    cpu_bandwidth_is_capped_by_cpus
    all_runs_together_leave_the_host_a_reserve"
  "runcell test nocgroup --exact without_cgroups_the_verdict_says_what_is_missing_and_strict_refuses"
  "landlock6 runcell test rootless --exact rootless_run_works_and_says_cgroups_are_missing"
  "runcell test isolation --exact
    system_paths_and_proc_sys_are_read_only
    sensitive_proc_files_are_masked_or_absent
    proc_shows_only_the_sandbox_processes
    every_namespace_differs_from_the_host
    locks_on_shared_files_are_the_runs_own
    mountinfo_and_dev_name_no_host_path_device_or_size
    mounts_below_a_shown_host_directory_are_shown_read_only"
  "runcell test pool --exact
    a_warm_sandbox_serves_one_request_only
    warm_sandboxes_die_with_a_killed_server
    a_dead_warm_interpreter_is_never_handed_out"
  "runcell test sessions --exact
    a_memory_kill_restarts_the_interpreter_and_says_the_state_was_lost
    a_timeout_interrupts_the_call_and_keeps_the_state
    idle_sessions_expire_and_leave_nothing_behind
    an_idle_session_runs_nothing_between_calls
    a_thread_starts_no_process_between_calls
    a_process_whose_main_thread_ended_does_not_outlive_the_cell"
  "runcell test egress --exact
    an_allowed_host_is_reached_by_python_and_curl_and_recorded
    with_one_destination_allowed_the_attacks_still_find_no_way_out"
  "runcell test templates --exact
    two_forked_sandboxes_share_no_file_process_descriptor_environment_or_random_state
    a_run_cannot_reach_or_alter_the_template
    a_dead_template_is_replaced_and_runs_go_on
    with_templates_off_interpreters_start_as_before
    session_interpreters_are_forked_with_the_preloads_imported"
)

# ---------------------------------------------------------------------------------------------
# Stage 2, in the guest: pid 1 after switch_root, on the overlay of the host's root.
# ---------------------------------------------------------------------------------------------
guest_main() {
  # Whatever fails, the guest must reach the exit marker and power off.
  set +e
  export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  export HOME=/root LANG=C.UTF-8
  unset RUNCELL_SKIP_V2_GUEST
  cd /
  local results=$guest_out
  read -r boot_s _ </proc/uptime
  echo "$boot_s" >"$results/booted"
  # The kernel's OOM reports would drown the test output on the console; they are kept in
  # the dmesg copied to the results at the end.
  dmesg -n 1 2>/dev/null || true
  echo cgroup-v2-guest >/proc/sys/kernel/hostname
  local status=0
  guest_checks >"$results/checks.log" 2>&1 || status=$?
  cat "$results/checks.log"
  if [ $status -eq 0 ]; then
    local name bin dir needs line code landlock
    landlock=$(sed -n 's/.*"landlock": *"\([a-z]*\)".*/\1/p' "$results/checks.log")
    while IFS=$'\t' read -r name bin dir needs line; do
      if [ "$needs" = landlock6 ] && [ "$landlock" != full ]; then
        say "SKIP $name: it expects Landlock ABI 6; this kernel's is older (landlock: $landlock)"
        echo "landlock: $landlock" >"$results/$name.skipped"
        continue
      fi
      say "running $name: $line"
      code=0
      # stdin is /dev/null: the loop reads the plan from it. pipefail makes the pipeline's
      # status the tests' own.
      # shellcheck disable=SC2086 # the libtest arguments are words
      (cd "$dir" && timeout -k 10 300 "$bin" --test-threads=2 $line) </dev/null 2>&1 |
        tee "$results/$name.log" || code=$?
      echo "$code" >"$results/$name.code"
      [ "$code" -eq 0 ] || status=1
    done <"$results/plan"
  fi
  read -r end_s _ </proc/uptime
  echo "$end_s" >"$results/finished"
  dmesg >"$results/dmesg.log" 2>&1 || true
  echo "$status" >"$results/exit"
  sync
  echo o >/proc/sysrq-trigger
  sleep 10
}

# The guest really is what the tests are meant to meet: cgroup2 at /sys/fs/cgroup, no v1
# hierarchy, and runcell itself says it enforced its limits with v2.
guest_checks() {
  local fstype verdict runcell
  ip link set lo up || {
    echo "check: could not bring lo up"
    return 1
  }
  fstype=$(stat -f -c %T /sys/fs/cgroup)
  [ "$fstype" = cgroup2fs ] || {
    echo "check: /sys/fs/cgroup is $fstype, not cgroup2"
    return 1
  }
  if awk '$3 == "cgroup"' /proc/mounts | grep -q .; then
    echo "check: a cgroup v1 hierarchy is mounted"
    return 1
  fi
  echo "check: /sys/fs/cgroup is cgroup2 (controllers: $(cat /sys/fs/cgroup/cgroup.controllers))"
  runcell=$(head -n1 "$guest_out/runcell")
  verdict=$("$runcell" run --json -c 'print(1)') || {
    echo "check: runcell run failed: $verdict"
    return 1
  }
  if ! echo "$verdict" | grep -q '"cgroup": *"v2"'; then
    echo "check: runcell did not enforce with cgroup v2: $verdict"
    return 1
  fi
  echo "check: runcell reports \"cgroup\": \"v2\": $(echo "$verdict" | grep -o '"enforcement":{[^}]*}')"
}

if [ "${1:-}" = --guest ]; then
  guest_main
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# On the host.
# ---------------------------------------------------------------------------------------------
if [ "${RUNCELL_SKIP_V2_GUEST:-}" = 1 ]; then
  say "SKIP: RUNCELL_SKIP_V2_GUEST=1 (the cgroup v2 tests did not run)"
  exit 0
fi
if [ "$(uname -m)" != x86_64 ] || [ "$(id -u)" != 0 ]; then
  say "SKIP: needs root on x86_64 (the cgroup v2 tests did not run)"
  exit 0
fi
if ! command -v qemu-system-x86_64 >/dev/null; then
  command -v apt-get >/dev/null ||
    { say "SKIP: no qemu-system-x86_64 and no apt-get to install it (the cgroup v2 tests did not run)"; exit 0; }
  say "installing qemu-system-x86"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
fi
mkdir -p "$cache"

# apt-get download as root writes where _apt may not: say it is fine to run unsandboxed.
apt_dl=(-o APT::Sandbox::User=root)

# busybox-static, unpacked into the cache (not installed: it would replace a host's busybox).
busybox=$cache/busybox/bin/busybox
if [ ! -x "$busybox" ]; then
  say "fetching busybox-static"
  rm -rf "$cache/busybox" "$cache/dl"
  mkdir -p "$cache/dl"
  (cd "$cache/dl" && { apt-get "${apt_dl[@]}" -qq download busybox-static 2>/dev/null ||
    { apt-get update -qq && apt-get "${apt_dl[@]}" -qq download busybox-static; }; })
  dpkg-deb -x "$cache"/dl/busybox-static_*.deb "$cache/busybox"
  rm -rf "$cache/dl"
fi

# The kernel: from <release>-backports when the release has one (bookworm: 6.12, whose
# Landlock ABI 6 the isolation tests expect), else the release's own. A private apt state
# under the cache reads the backports index without adding it to the host's sources. Cached
# in kernel-backports or kernel-release, whichever it came from (so a run that could not
# reach backports tries again next time).
fetch_kernel() {
  local apt=$cache/apt codename mirror keyring pkg="" opts from=release
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null |
    awk -v r="$codename" '$2 == r { print $1; exit }')
  rm -rf "$apt" "$cache/dl"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$cache/dl"
  if [ "$1" = backports ] && [ -n "$codename" ] && [ -n "$mirror" ]; then
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    if [ -f $keyring ]; then keyring="[signed-by=$keyring] "; else keyring=""; fi
    echo "deb $keyring$mirror $codename-backports main" >"$apt/sources.list"
    opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
      -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
    if apt-get "${opts[@]}" -qq update 2>/dev/null; then
      pkg=$(apt-cache "${opts[@]}" depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-/ { print $2; exit }')
      if [ -n "$pkg" ]; then
        say "fetching $pkg from $codename-backports"
        (cd "$cache/dl" && apt-get "${opts[@]}" "${apt_dl[@]}" -qq download "$pkg") || pkg=""
        [ -z "$pkg" ] || from=backports
      fi
    fi
  fi
  if [ -z "$pkg" ]; then
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }')
    [ -n "$pkg" ] || { apt-get update -qq &&
      pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ { print $2; exit }'); }
    [ -n "$pkg" ] || die "no linux-image-amd64 in apt's sources"
    if [ "$1" = backports ]; then
      say "fetching $pkg ($codename-backports not reachable: the guest runs the release's kernel)"
    else
      say "fetching $pkg"
    fi
    (cd "$cache/dl" && apt-get "${apt_dl[@]}" -qq download "$pkg")
  fi
  local unpacked=$cache/dl/unpacked kdir=$cache/kernel.new mdir d version
  dpkg-deb -x "$cache"/dl/linux-image-*.deb "$unpacked"
  mdir=""
  for d in "$unpacked"/lib/modules/* "$unpacked"/usr/lib/modules/*; do
    [ -d "$d/kernel" ] && mdir=$d && break
  done
  [ -n "$mdir" ] || die "no modules in $pkg"
  version=$(basename "$mdir")
  rm -rf "$kdir"
  mkdir -p "$kdir/modules"
  cp "$unpacked/boot/vmlinuz-$version" "$kdir/vmlinuz"
  # The modules /init loads, dependencies first, decompressed here (busybox insmod takes a
  # plain .ko); those built into the kernel are skipped.
  local -a order=()
  add_module() {
    local name=$1 file dep
    name=${name//-/_}
    [[ " ${order[*]} " == *" $name "* ]] && return
    grep -q "/${name}.ko\$\|/${name//_/-}.ko\$" "$mdir/modules.builtin" && return
    file=$(find "$mdir/kernel" -name "$name.ko*" -o -name "${name//_/-}.ko*" | head -n1)
    [ -n "$file" ] || die "module $name is neither in $pkg nor built in"
    case $file in
    *.ko.xz) "$busybox" unxz -c "$file" >"$kdir/modules/$name.ko" ;;
    *.ko.gz) "$busybox" gunzip -c "$file" >"$kdir/modules/$name.ko" ;;
    *.ko.zst) zstd -qdc "$file" >"$kdir/modules/$name.ko" ;;
    *.ko) cp "$file" "$kdir/modules/$name.ko" ;;
    esac
    for dep in $(tr '\0' '\n' <"$kdir/modules/$name.ko" | sed -n 's/^depends=//p' | tr ',' ' '); do
      add_module "$dep"
    done
    order+=("$name")
  }
  for m in virtio_pci virtio_blk virtio_rng 9pnet_virtio 9p overlay; do add_module "$m"; done
  printf '%s\n' "${order[@]}" >"$kdir/modules.load"
  echo "$pkg $version" >"$kdir/release"
  rm -rf "$cache/kernel-$from" "$cache/dl"
  mv "$kdir" "$cache/kernel-$from"
  kernel=$cache/kernel-$from
}
kernel_from=${RUNCELL_V2_GUEST_KERNEL:-backports}
case $kernel_from in backports | release) ;; *) die "RUNCELL_V2_GUEST_KERNEL: backports or release" ;; esac
kernel=$cache/kernel-$kernel_from
if [ ! -f "$kernel/release" ]; then
  fetch_kernel "$kernel_from"
fi
read -r kernel_pkg kernel_version <"$kernel/release"

# The initramfs: busybox, the modules, and /init (rebuilt every run: it takes a moment, and
# /init names this checkout's script).
build_initramfs() {
  local root=$work/initramfs
  rm -rf "$root"
  mkdir -p "$root"/{bin,dev,proc,sys,lower,rw,newroot,lib/modules}
  cp "$busybox" "$root/bin/busybox"
  cp "$kernel/modules/"*.ko "$kernel/modules.load" "$root/lib/modules/"
  cat >"$root/init" <<EOF
#!/bin/busybox sh
# pid 1 of the guest in the initramfs: load 9p and overlay, build the root (the host's /,
# read-only, under a tmpfs overlay), mount cgroup2, and switch_root into it. switch_root, not
# chroot: in a chroot the kernel refuses to create user namespaces, which every sandbox needs.
/bin/busybox --install -s /bin
export PATH=/bin
fail() {
  echo "cgroup-v2-guest init: \$*"
  echo o >/proc/sysrq-trigger
  sleep 10
  exit 1
}
mount -t proc proc /proc
mount -t devtmpfs dev /dev
for m in \$(cat /lib/modules/modules.load); do
  insmod /lib/modules/\$m.ko || fail "insmod \$m"
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower ||
  fail "mount the host's root (9p)"
mount -t tmpfs -o mode=0755 rw /rw && mkdir /rw/upper /rw/work || fail "tmpfs for the overlay"
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot ||
  fail "mount the overlay"
mount -t proc proc /newroot/proc || fail "mount proc"
mount -t sysfs sys /newroot/sys || fail "mount sysfs"
mount -t devtmpfs dev /newroot/dev || fail "mount devtmpfs"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o mode=620,ptmxmode=666 devpts /newroot/dev/pts || fail "mount devpts"
mount -t tmpfs -o mode=1777 shm /newroot/dev/shm || fail "mount /dev/shm"
# /tmp stays the host's, through the overlay (writes go to the tmpfs upper layer): the checkout
# under test, and so the test binaries and this script, may live there.
mount -t tmpfs -o mode=0755 run /newroot/run || fail "mount /run"
mkdir -p /newroot$guest_out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results /newroot$guest_out ||
  fail "mount the results share"
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup || fail "mount cgroup2"
echo "+memory +pids +cpu +io" >/newroot/sys/fs/cgroup/cgroup.subtree_control ||
  fail "enable the controllers"
exec switch_root /newroot /bin/bash $script --guest
EOF
  chmod 755 "$root/init"
  (cd "$root" && find . | "$busybox" cpio -o -H newc 2>/dev/null | gzip -1) >"$work/initramfs.cpio.gz"
  rm -rf "$root"
}

# The test binaries, built (or found fresh) on the host; their paths (and the runcell binary
# compiled into them) are the same in the guest.
say "building the tests"
cargo test -q --workspace --no-run --message-format=json-render-diagnostics >"$work/artifacts.json"
runcell_bin=$repo/target/debug/runcell
[ -x "$runcell_bin" ] || die "no $runcell_bin"
rm -rf "$out"
mkdir -p "$out"
echo "$runcell_bin" >"$out/runcell"
plan_line() {
  local needs=- pkg kind name found
  if [ "$1" = landlock6 ]; then
    needs=$1
    shift
  fi
  pkg=$1 kind=$2 name=$3
  shift 3
  found=$(python3 - "$work/artifacts.json" "$pkg" "$kind" "$name" <<'PY'
import json, os, sys
path, pkg, kind, name = sys.argv[1:]
for line in open(path):
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    if not m["profile"]["test"] or t["name"] != name or kind not in t["kind"]:
        continue
    # "path+file:///.../crates/runcell#0.1.0", or "...#name@0.1.0" when the names differ.
    source, _, version = m["package_id"].partition("#")
    if not (version.startswith(pkg + "@") or ("@" not in version and source.endswith("/" + pkg))):
        continue
    print(m["executable"] + "\t" + os.path.dirname(m["manifest_path"]))
    break
PY
)
  [ -n "$found" ] || die "no test binary for $pkg $kind $name"
  printf '%s\t%s\t%s\t%s\n' "$pkg-$name" "$found" "$needs" "$*"
}
for entry in "${selection[@]}"; do
  # shellcheck disable=SC2086 # one entry is words
  plan_line $entry
done >"$out/plan"

build_initramfs
dd if=/dev/zero of="$work/disk.img" bs=1M count=0 seek=16 status=none

limit=${RUNCELL_V2_GUEST_TIMEOUT:-360}
# The exit marker is missing when the guest crashed (about 1 boot in 20 dies early under
# multi-threaded TCG) or hung: boot again, up to 3 times, unless the tests themselves hung.
qemu_status=0
start=$(date +%s.%N)
for attempt in 1 2 3; do
  say "booting $kernel_pkg ($kernel_version) under qemu TCG, attempt $attempt (bound ${limit}s)"
  find "$out" -mindepth 1 -maxdepth 1 ! -name plan ! -name runcell -exec rm -rf {} +
  attempt_start=$(date +%s.%N)
  qemu_status=0
  timeout -k 10 "$limit" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp 2 -m 4G \
    -nodefaults -no-user-config -display none -serial stdio -no-reboot \
    -kernel "$kernel/vmlinuz" -initrd "$work/initramfs.cpio.gz" \
    -append "console=ttyS0 cgroup_no_v1=all panic=-1 quiet mitigations=off rdinit=/init" \
    -fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap" \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev "local,id=results,path=$out,security_model=none" \
    -device virtio-9p-pci,fsdev=results,mount_tag=results \
    -drive "file=$work/disk.img,if=virtio,format=raw" \
    -device virtio-rng-pci \
    </dev/null 2>&1 | tee "$out/console.log" || qemu_status=$?
  [ -f "$out/exit" ] && break
  if [ "$qemu_status" = 124 ] && [ -f "$out/booted" ]; then
    say "the guest booted but did not finish within ${limit}s (qemu killed); not retrying"
    break
  fi
  say "no exit marker (qemu exit $qemu_status): the guest died before its tests"
done
end=$(date +%s.%N)

# ---------------------------------------------------------------------------------------------
# Summary.
# ---------------------------------------------------------------------------------------------
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1fs", b - a }'; }
echo
say "summary (kernel $kernel_version, logs in ${out#"$repo"/})"
if [ ! -f "$out/exit" ]; then
  say "FAILED: the guest produced no exit marker after $attempt attempt(s)"
  exit 1
fi
read -r booted <"$out/booted"
read -r finished <"$out/finished"
failed=0
skipped=0
while IFS=$'\t' read -r name bin dir needs args; do
  log=$out/$name.log
  if [ -f "$out/$name.skipped" ]; then
    printf '  %-28s SKIPPED: needs Landlock ABI 6 (%s)\n' "$name" "$(cat "$out/$name.skipped")"
    skipped=1
    continue
  fi
  if [ ! -f "$log" ]; then
    printf '  %-28s did not run\n' "$name"
    failed=1
    continue
  fi
  counts=$(awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d %d %d", p, f, i }' "$log")
  read -r p f i <<<"$counts"
  missing=()
  if [[ " $args " == *" --exact "* ]]; then
    for t in $args; do
      [[ $t == -* ]] && continue
      grep -q "^test $t \.\.\. " "$log" || missing+=("$t")
    done
  fi
  code=$(cat "$out/$name.code" 2>/dev/null || echo 1)
  line=$(printf '  %-28s %3d passed, %d failed, %d ignored' "$name" "$p" "$f" "$i")
  [ "$code" = 0 ] || line+=" (exit $code)"
  [ ${#missing[@]} -eq 0 ] || line+=" (selected but absent: ${missing[*]})"
  echo "$line"
  if [ "$code" != 0 ] || [ "$f" != 0 ] || [ ${#missing[@]} -ne 0 ] || [ "$p" = 0 ]; then
    failed=1
  fi
done <"$out/plan"
read -r guest_status <"$out/exit"
[ "$guest_status" = 0 ] || failed=1
say "timings: boot to tests $(secs 0 "$booted"), tests $(secs "$booted" "$finished"), total $(secs "$start" "$end") ($attempt boot(s))"
if [ "$failed" != 0 ]; then
  grep -h "^check:" "$out/checks.log" 2>/dev/null | sed 's/^/  /'
  say "FAILED"
  exit 1
fi
if [ "$skipped" != 0 ]; then
  say "the selected tests passed on cgroup v2, some SKIPPED on kernel $kernel_version"
else
  say "all selected tests passed on cgroup v2"
fi
