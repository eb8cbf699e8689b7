//! How the C allocator treats the large, short-lived buffers of runcell's long-running
//! processes (`runcell serve`, `runcell mcp`).
//!
//! glibc's malloc serves a request of at least `M_MMAP_THRESHOLD` bytes (128 KiB at start)
//! with a mapping of its own, unmapped again by `free`. The threshold is dynamic, though: when
//! such a chunk is freed, glibc raises the threshold to its size (up to 32 MiB on 64-bit), so
//! from then on buffers of that size are carved from the heaps of the arenas (one per thread
//! that allocates, up to eight per core), and when freed they stay resident, fragmented among
//! small allocations that live longer. A server holds each run's output (up to the output cap,
//! as bytes, as text and as JSON) and its files for a moment and then frees them: its resident
//! memory grew from 16 to 84 MiB over 1,000 mixed requests, and went on growing, although
//! nothing leaked (found by the soak test, `scripts/soak.py`; with a fixed threshold it stayed
//! at 14-15 MiB). Setting the threshold explicitly turns the adjustment off (`mallopt(3)`):
//! large buffers are always mapped, and unmapped when freed.

/// The fixed threshold: glibc's own starting value. A buffer this large costs a mapping and
/// its page faults, which is small next to running a sandbox.
pub const MMAP_THRESHOLD: usize = 128 << 10;

/// Fix malloc's mmap threshold at [`MMAP_THRESHOLD`], so that large buffers go back to the
/// kernel when freed. Call it early, before other threads start. Returns whether the setting
/// took effect (false with another C library, where there is nothing to do).
pub fn pin_mmap_threshold() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes malloc's tunables; it takes the arena lock itself and
        // has no memory-safety preconditions.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Chunks glibc has mapped on their own (`mallinfo2().hblks`).
    fn mapped_chunks() -> usize {
        // SAFETY: mallinfo2 only reads malloc's statistics.
        unsafe { libc::mallinfo2() }.hblks
    }

    /// After a freed 4 MiB buffer, is a new 1 MiB buffer mapped on its own?
    fn large_buffer_is_mapped_after_a_larger_one_was_freed() -> bool {
        drop(std::hint::black_box(vec![1u8; 4 << 20]));
        let before = mapped_chunks();
        let buffer = std::hint::black_box(vec![1u8; 1 << 20]);
        let mapped = mapped_chunks() == before + 1;
        drop(buffer);
        mapped
    }

    /// The probe runs alone in a fresh process (this test binary, re-run for this one test):
    /// the test runner's other threads would disturb the count, and the setting is for the
    /// whole process.
    #[test]
    #[ignore = "run by the_mmap_threshold_no_longer_follows_freed_buffers in a child process"]
    fn mmap_threshold_probe() {
        let pin = std::env::var("RUNCELL_MALLOC_PROBE").unwrap();
        if pin == "pinned" {
            assert!(pin_mmap_threshold());
        }
        println!(
            "RESULT mapped={}",
            large_buffer_is_mapped_after_a_larger_one_was_freed()
        );
    }

    fn probe(mode: &str) -> bool {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "malloc::tests::mmap_threshold_probe",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RUNCELL_MALLOC_PROBE", mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "probe failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        match stdout
            .split("RESULT mapped=")
            .nth(1)
            .map(|s| s.trim_start())
        {
            Some(s) if s.starts_with("true") => true,
            Some(s) if s.starts_with("false") => false,
            _ => panic!("no result from the probe: {stdout}"),
        }
    }

    /// Regression test (the soak's growing server): with the threshold pinned, a large buffer
    /// is still mapped on its own after a larger one was freed, so freeing it returns it to
    /// the kernel. Without the pin glibc would have raised the threshold and served it from
    /// the heap, which the first half shows, so the test proves its own premise.
    #[test]
    fn the_mmap_threshold_no_longer_follows_freed_buffers() {
        assert!(
            !probe("default"),
            "glibc no longer raises its mmap threshold: the premise of pin_mmap_threshold changed"
        );
        assert!(probe("pinned"));
    }
}
