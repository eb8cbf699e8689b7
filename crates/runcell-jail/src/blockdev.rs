//! The block device the host's files live on, for I/O limits: cgroups throttle a disk by its
//! `major:minor`, and a partition's reads are the whole disk's (v1 and v2 both refuse a
//! partition's number), so a partition is resolved to its disk through sysfs.

use std::path::Path;

/// A disk, and whether it spins (its defaults differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockDevice {
    pub major: u32,
    pub minor: u32,
    pub rotational: bool,
}

/// The disk that holds `path`, from `sys_dev_block` (normally `/sys/dev/block`). `None` when
/// the path is on no block device (tmpfs, overlay of one, a network filesystem).
pub fn block_device_of(path: &Path, sys_dev_block: &Path) -> Option<BlockDevice> {
    let st = rustix::fs::stat(path).ok()?;
    let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    disk_of(major, minor, sys_dev_block)
}

/// Resolve `major:minor` (a disk or a partition) to its disk.
fn disk_of(major: u32, minor: u32, sys_dev_block: &Path) -> Option<BlockDevice> {
    // Major 0 is the anonymous devices of virtual filesystems.
    if major == 0 {
        return None;
    }
    let dir = sys_dev_block.join(format!("{major}:{minor}"));
    // A partition's directory sits inside its disk's (`.../vda/vda1`).
    let disk = if dir.join("partition").exists() {
        dir.join("..")
    } else {
        dir
    };
    let dev = std::fs::read_to_string(disk.join("dev")).ok()?;
    let (ma, mi) = dev.trim().split_once(':')?;
    let rotational = std::fs::read_to_string(disk.join("queue/rotational"))
        .map(|r| r.trim() == "1")
        .unwrap_or(false);
    Some(BlockDevice {
        major: ma.parse().ok()?,
        minor: mi.parse().ok()?,
        rotational,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// A sysfs tree like the kernel's: `/sys/dev/block/M:m` are links into the device tree,
    /// where a partition's directory is inside its disk's.
    #[test]
    fn partitions_resolve_to_their_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let devices = tmp.path().join("devices/virtio1/block/vda");
        write(&devices.join("dev"), "254:0\n");
        write(&devices.join("queue/rotational"), "0\n");
        write(&devices.join("vda1/dev"), "254:1\n");
        write(&devices.join("vda1/partition"), "1\n");
        let hdd = tmp.path().join("devices/ata1/block/sda");
        write(&hdd.join("dev"), "8:0\n");
        write(&hdd.join("queue/rotational"), "1\n");
        let by_number = tmp.path().join("dev/block");
        std::fs::create_dir_all(&by_number).unwrap();
        std::os::unix::fs::symlink(&devices, by_number.join("254:0")).unwrap();
        std::os::unix::fs::symlink(devices.join("vda1"), by_number.join("254:1")).unwrap();
        std::os::unix::fs::symlink(&hdd, by_number.join("8:0")).unwrap();

        let vda = BlockDevice {
            major: 254,
            minor: 0,
            rotational: false,
        };
        assert_eq!(disk_of(254, 0, &by_number), Some(vda));
        assert_eq!(disk_of(254, 1, &by_number), Some(vda));
        assert!(disk_of(8, 0, &by_number).unwrap().rotational);
        assert_eq!(disk_of(0, 42, &by_number), None, "tmpfs and the like");
        assert_eq!(disk_of(9, 9, &by_number), None, "unknown");
    }

    /// On the real host: /usr on a block device (a non-zero major) is found, as a disk (no
    /// partition file); on a virtual filesystem it is `None`.
    #[test]
    fn this_hosts_usr_is_found_as_a_disk() {
        let st = rustix::fs::stat("/usr").unwrap();
        let found = block_device_of("/usr".as_ref(), "/sys/dev/block".as_ref());
        if rustix::fs::major(st.st_dev) == 0 {
            assert_eq!(found, None);
            return;
        }
        let d = found.expect("/usr is on a block device");
        let dir = Path::new("/sys/dev/block").join(format!("{}:{}", d.major, d.minor));
        assert!(dir.join("dev").exists(), "{dir:?}");
        assert!(!dir.join("partition").exists(), "{dir:?} is a partition");
    }
}
