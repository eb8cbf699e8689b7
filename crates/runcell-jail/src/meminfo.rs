//! The host's memory, from `/proc/meminfo` (the path is a parameter, for tests).

use std::io;
use std::path::Path;

/// The totals of a meminfo file that runcell uses. A field the file lacks is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`: physical memory usable by the kernel.
    pub total_bytes: Option<u64>,
    /// `SwapTotal`: swap space (a memory limit without swap accounting leaks into it).
    pub swap_total_bytes: Option<u64>,
}

impl MemInfo {
    /// Read a meminfo file (normally `/proc/meminfo`).
    pub fn read(path: &Path) -> io::Result<MemInfo> {
        Ok(MemInfo::parse(&std::fs::read_to_string(path)?))
    }

    /// Parse the text of a meminfo file: `Name:   <value> kB` lines.
    pub fn parse(text: &str) -> MemInfo {
        let kib = |name: &str| {
            let line = text.lines().find(|l| l.split(':').next() == Some(name))?;
            let value: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(value.saturating_mul(1024))
        };
        MemInfo {
            total_bytes: kib("MemTotal"),
            swap_total_bytes: kib("SwapTotal"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_from_a_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("meminfo");
        std::fs::write(
            &p,
            "MemTotal:       24571604 kB\nMemFree: 1 kB\nSwapCached: 5 kB\nSwapTotal:     2048 kB\n",
        )
        .unwrap();
        let m = MemInfo::read(&p).unwrap();
        assert_eq!(m.total_bytes, Some(24571604 * 1024));
        assert_eq!(m.swap_total_bytes, Some(2048 * 1024));
        assert!(MemInfo::read(&d.path().join("none")).is_err());
        assert_eq!(MemInfo::parse("MemFree: 1 kB\n"), MemInfo::default());
        assert_eq!(MemInfo::parse("MemTotal: lots kB\n").total_bytes, None);
    }
}
