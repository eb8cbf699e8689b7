//! Output files: from what the sandbox collected to the verdict's `files`.

use std::collections::HashSet;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use runcell_jail::CollectedFiles;
use rustix::fs::{mkdirat, openat, unlinkat, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::verdict::OutputFile;

/// The MIME type of a file, from its name (`application/octet-stream` when unknown).
pub fn mime_type(path: &str) -> String {
    mime_guess::from_path(path)
        .first_raw()
        .unwrap_or("application/octet-stream")
        .to_string()
}

/// Convert collected files; returns them, the number left out, and why files were left out
/// beyond the caps (for the verdict's warnings).
pub fn to_verdict(c: CollectedFiles) -> (Vec<OutputFile>, u64, Vec<String>) {
    let files = c
        .files
        .into_iter()
        .map(|f| {
            let content = f.blob.and_then(|i| c.blobs.get(i));
            OutputFile {
                mime_type: mime_type(&f.path),
                path: f.path,
                size: f.size,
                sha256: f.sha256,
                content_base64: content
                    .map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
                truncated: content.is_none(),
                not_written: None,
            }
        })
        .collect();
    (files, c.omitted, c.notes)
}

/// Check, before anything runs, that `dir` can receive output files: it must not exist yet, or
/// be an empty directory. Output files never replace anything already on the host: with
/// `--output-dir .` inside a repository, a program could otherwise replace
/// `.git/hooks/pre-commit` (issue 10).
pub fn check_output_dir(dir: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("--output-dir {}: {e}.", dir.display())),
        Ok(_) => match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "--output-dir {} exists and is not empty; give a new or empty directory \
                 (runcell never writes output files over what is already there).",
                dir.display()
            )),
            Err(e) => Err(format!(
                "--output-dir {}: {e}; give a new or empty directory.",
                dir.display()
            )),
        },
    }
}

/// Write the returned files under `dir`, which must be new or empty (see
/// [`check_output_dir`]), at their relative paths. Returns the paths written; every file not
/// written gets the reason in `not_written`. `Err` when `dir` itself cannot be used (every
/// file is then marked not written).
///
/// What lands on the host is only what a sandboxed program chose, so nothing of it is trusted:
/// * nothing is replaced: files are created with `O_CREAT | O_EXCL`, directories with
///   `mkdirat`, and a directory is entered only if this call created it;
/// * nothing is followed: every step is relative to its parent's descriptor with
///   `O_NOFOLLOW`, and paths are re-checked (no `..`, no absolute path);
/// * nothing is executable: files are created 0644 and directories 0755 (less the umask),
///   whatever mode the file had in the sandbox;
/// * no hidden name: a path with a component that starts with '.' (`.git/hooks/...`,
///   `.ssh/authorized_keys`, `.bashrc`) is not written, so that a program can never plant
///   configuration that host tools read from the tree;
/// * a file whose content did not come back (over a cap) is not written, and a file that
///   fails half-way is removed.
pub fn write_all(dir: &Path, files: &mut [OutputFile]) -> Result<Vec<PathBuf>, String> {
    let top = match open_output_dir(dir) {
        Ok(fd) => fd,
        Err(reason) => {
            for f in files.iter_mut() {
                f.not_written = Some(reason.clone());
            }
            return Err(reason);
        }
    };
    let mut created = HashSet::new();
    let mut written = Vec::new();
    for f in files.iter_mut() {
        match write_one(&top, &mut created, f) {
            Ok(rel) => written.push(dir.join(rel)),
            Err(reason) => f.not_written = Some(reason),
        }
    }
    Ok(written)
}

/// Create `dir` (and its parents, which are the user's own path) or open it if it exists, and
/// check again that it is empty.
fn open_output_dir(dir: &Path) -> Result<OwnedFd, String> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    match rustix::fs::mkdir(dir, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    let entries = rustix::fs::Dir::read_from(&fd).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let name = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        if !matches!(name.file_name().to_bytes(), b"." | b"..") {
            return Err(format!(
                "{} is not empty (something was put there during the run); nothing written",
                dir.display()
            ));
        }
    }
    Ok(fd)
}

/// Write one file beneath `top`; returns its relative path, or why it was not written.
fn write_one(
    top: &OwnedFd,
    created: &mut HashSet<String>,
    f: &OutputFile,
) -> Result<String, String> {
    let Some(b64) = &f.content_base64 else {
        return Err("its content was over the size cap and did not come back".into());
    };
    let rel = crate::request::workspace_path(&f.path).map_err(|e| e.to_string())?;
    if let Some(hidden) = rel.split('/').find(|p| p.starts_with('.')) {
        return Err(format!(
            "'{hidden}' is a hidden name; runcell never writes names that start with '.' \
             (.git, .ssh, ...) to the host"
        ));
    }
    let content = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("bad content: {e}"))?;
    write_under(top, created, &rel, &content)
}

/// Write `content` at `rel` beneath `top`, creating its directories (each recorded in
/// `created`, and entered only if this writer created it), with the guarantees of
/// [`write_all`] but for hidden names, which are the caller's to refuse: never through a
/// symlink, never over anything, 0644 files and 0755 directories. Returns the normal form of
/// `rel`. Also used for package layers, which are written beneath their own new directory.
pub(crate) fn write_under(
    top: &OwnedFd,
    created: &mut HashSet<String>,
    rel: &str,
    content: &[u8],
) -> Result<String, String> {
    let rel = crate::request::workspace_path(rel).map_err(|e| e.to_string())?;
    let parts: Vec<&str> = rel.split('/').collect();
    let (name, dirs) = parts.split_last().ok_or("empty path")?;
    let mut cur: Option<OwnedFd> = None;
    let mut prefix = String::new();
    for d in dirs {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(d);
        let base = cur.as_ref().unwrap_or(top);
        if !created.contains(&prefix) {
            mkdirat(base, *d, Mode::from_raw_mode(0o755)).map_err(|e| match e {
                Errno::EXIST => format!("{prefix} already exists and was not created by this run"),
                e => format!("cannot create directory {prefix}: {e}"),
            })?;
            created.insert(prefix.clone());
        }
        let next = openat(
            base,
            *d,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open directory {prefix}: {e}"))?;
        cur = Some(next);
    }
    let base = cur.as_ref().unwrap_or(top);
    let fd = openat(
        base,
        *name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| match e {
        Errno::EXIST => format!("{rel} already exists; it was not replaced"),
        e => format!("cannot create {rel}: {e}"),
    })?;
    let mut file = std::fs::File::from(fd);
    if let Err(e) = file.write_all(content) {
        drop(file);
        let _ = unlinkat(base, *name, AtFlags::empty());
        return Err(format!("cannot write {rel}: {e}"));
    }
    Ok(rel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_jail::CollectedFile;

    #[test]
    fn mime_types_come_from_the_name() {
        assert_eq!(mime_type("out/report.csv"), "text/csv");
        assert_eq!(mime_type("figures/figure-1.png"), "image/png");
        assert_eq!(mime_type("data.json"), "application/json");
        assert_eq!(mime_type("noext"), "application/octet-stream");
    }

    fn out(path: &str, content: Option<&str>) -> OutputFile {
        OutputFile {
            path: path.into(),
            size: 0,
            mime_type: String::new(),
            sha256: None,
            content_base64: content.map(|c| base64::engine::general_purpose::STANDARD.encode(c)),
            truncated: content.is_none(),
            not_written: None,
        }
    }

    #[test]
    fn written_files_stay_under_the_directory_and_are_never_executable() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("new/out");
        check_output_dir(&dir).unwrap();
        let mut files = [
            out("out/a.csv", Some("1,2")),
            out("big.bin", None),
            out("run.sh", Some("#!/bin/sh")),
            out("../escape", Some("x")),
        ];
        let written = write_all(&dir, &mut files).unwrap();
        assert_eq!(
            written,
            vec![dir.join("out/a.csv"), dir.join("run.sh")],
            "{files:?}"
        );
        assert_eq!(fs_read(&dir.join("out/a.csv")), "1,2");
        assert!(files[1]
            .not_written
            .as_deref()
            .unwrap()
            .contains("size cap"));
        assert!(files[3].not_written.is_some());
        assert!(!d.path().join("new/escape").exists());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir.join("run.sh")) & 0o111, 0, "never executable");
        assert_eq!(mode(&dir.join("run.sh")) & !0o644, 0);
        assert_eq!(mode(&dir.join("out")) & !0o755, 0);
    }

    fn fs_read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap()
    }

    /// Issue 10: with `--output-dir .` in a repository, a program's `.git/hooks/pre-commit`
    /// replaced the host's in place and kept its exec bit. A directory with anything in it is
    /// refused before the run, and again at writing time; nothing in it is touched.
    #[test]
    fn a_directory_that_is_not_empty_is_refused_and_left_untouched() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let hooks = d.path().join(".git/hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        std::fs::write(hooks.join("pre-commit"), "host hook").unwrap();
        std::fs::set_permissions(
            hooks.join("pre-commit"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let err = check_output_dir(d.path()).unwrap_err();
        assert!(err.contains("exists and is not empty"), "{err}");
        let mut files = [
            out(".git/hooks/pre-commit", Some("evil")),
            out("a.txt", Some("A")),
        ];
        let err = write_all(d.path(), &mut files).unwrap_err();
        assert!(err.contains("not empty"), "{err}");
        assert!(files.iter().all(|f| f.not_written.is_some()));
        assert_eq!(fs_read(&hooks.join("pre-commit")), "host hook");
        assert!(!d.path().join("a.txt").exists());
        // A file in the way, and a symlink to an empty directory elsewhere: refused too.
        let f = d.path().join("file");
        std::fs::write(&f, "").unwrap();
        assert!(check_output_dir(&f).is_err());
        assert!(write_all(&f, &mut [out("a", Some("x"))]).is_err());
        assert!(check_output_dir(&d.path().join("absent")).is_ok());
    }

    #[test]
    fn hidden_names_are_never_written() {
        let d = tempfile::tempdir().unwrap();
        let mut files = [
            out(".git/hooks/pre-commit", Some("evil")),
            out("sub/.ssh/authorized_keys", Some("key")),
            out(".bashrc", Some("x")),
            out("ok/file.txt", Some("fine")),
        ];
        let written = write_all(d.path(), &mut files).unwrap();
        assert_eq!(written, vec![d.path().join("ok/file.txt")]);
        for f in &files[..3] {
            assert!(
                f.not_written.as_deref().unwrap().contains("hidden name"),
                "{f:?}"
            );
        }
        let mut left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["ok"], "no .git, no sub/ created for a refused file");
    }

    #[test]
    fn nothing_is_followed_or_replaced_even_when_the_tree_changes_under_the_writer() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let top = open_output_dir(d.path()).unwrap();
        // Someone else puts a symlink and a file in the directory after it was checked.
        std::os::unix::fs::symlink(outside.path(), d.path().join("ldir")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("t"), d.path().join("link")).unwrap();
        std::fs::write(d.path().join("taken"), "host").unwrap();
        let mut created = HashSet::new();
        assert!(write_one(&top, &mut created, &out("ldir/t", Some("x"))).is_err());
        assert!(write_one(&top, &mut created, &out("link", Some("x"))).is_err());
        let e = write_one(&top, &mut created, &out("taken", Some("x"))).unwrap_err();
        assert!(e.contains("already exists"), "{e}");
        assert_eq!(fs_read(&d.path().join("taken")), "host");
        assert!(!outside.path().join("t").exists());
    }

    #[test]
    fn files_without_content_are_flagged_truncated() {
        let c = CollectedFiles {
            files: vec![
                CollectedFile {
                    path: "a.txt".into(),
                    size: 2,
                    sha256: Some("x".into()),
                    blob: Some(0),
                },
                CollectedFile {
                    path: "big.bin".into(),
                    size: 99,
                    sha256: None,
                    blob: None,
                },
            ],
            blobs: vec![b"hi".to_vec()],
            omitted: 3,
            notes: vec!["1 output file(s) left out: their paths are not valid UTF-8".into()],
        };
        let (files, omitted, notes) = to_verdict(c);
        assert_eq!(notes.len(), 1);
        assert_eq!(omitted, 3);
        assert_eq!(files[0].content_base64.as_deref(), Some("aGk="));
        assert!(!files[0].truncated);
        assert_eq!(files[1].content_base64, None);
        assert!(files[1].truncated);
    }
}

/// Property tests: output paths are chosen by the sandboxed program; whatever they are,
/// writing them never panics, never lands outside the directory, and never puts two files
/// at one path (one would overwrite the other).
#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    fn path() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("/"),
            Just("."),
            Just(".."),
            Just("a"),
            Just("b"),
            Just("é"),
            Just("\u{fffd}"),
            Just(".git"),
            Just("\0"),
        ];
        prop_oneof![
            6 => prop::collection::vec(piece, 1..7).prop_map(|v| v.concat()),
            1 => any::<String>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn distinct_output_files_never_share_a_path(paths in prop::collection::vec(path(), 0..10)) {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join("out");
            let mut files: Vec<OutputFile> = paths
                .iter()
                .map(|p| OutputFile {
                    path: p.clone(),
                    size: p.len() as u64,
                    mime_type: mime_type(p),
                    sha256: None,
                    content_base64: Some(base64::engine::general_purpose::STANDARD.encode(p)),
                    truncated: false,
                    not_written: None,
                })
                .collect();
            let written = write_all(&dir, &mut files).unwrap();
            let mut seen = HashSet::new();
            for w in &written {
                prop_assert!(seen.insert(w.clone()), "{w:?} written twice");
                prop_assert!(w.starts_with(&dir));
            }
            let mut it = written.iter();
            for f in &files {
                if f.not_written.is_some() {
                    continue;
                }
                // Written: at its normal path, no hidden component, with its own content.
                let rel = crate::request::workspace_path(&f.path).unwrap();
                prop_assert!(rel.split('/').all(|c| !c.starts_with('.')), "{rel:?}");
                let w = it.next().unwrap();
                prop_assert_eq!(w, &dir.join(&rel));
                prop_assert_eq!(std::fs::read(w).unwrap(), f.path.as_bytes());
            }
            prop_assert!(it.next().is_none(), "every written file is one not marked not written");
        }
    }
}
