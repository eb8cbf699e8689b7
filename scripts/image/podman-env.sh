# Sourced by the image scripts: podman's configuration and storage under target/podman, so
# nothing under /etc is edited and the suite's images stay out of the host's store.
#   - runc: crun 1.8 refuses this kind of host ("cgroups in hybrid mode not supported").
#   - default_ulimits: without CAP_SYS_RESOURCE (a sandboxed CI machine) podman's default
#     (the host's hard limits, raised) fails at setrlimit in every container.
#   - cgroupfs and file events: no systemd as PID 1 is needed.
# Needs REPO (the checkout's root).
podman_dir=$REPO/target/podman
mkdir -p "$podman_dir"
cat >"$podman_dir/containers.conf.new" <<CONF
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=8192:8192"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
cat >"$podman_dir/storage.conf.new" <<CONF
[storage]
driver = "overlay"
graphroot = "$podman_dir/storage"
runroot = "$podman_dir/run"
CONF
for f in containers.conf storage.conf; do
  cmp -s "$podman_dir/$f.new" "$podman_dir/$f" || mv "$podman_dir/$f.new" "$podman_dir/$f"
  rm -f "$podman_dir/$f.new"
done
export CONTAINERS_CONF=$podman_dir/containers.conf
export CONTAINERS_STORAGE_CONF=$podman_dir/storage.conf
