//! Output files: from what the sandbox collected to the verdict's `files`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use runcell_jail::CollectedFiles;

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
            }
        })
        .collect();
    (files, c.omitted, c.notes)
}

/// Write the returned files (those whose content came back) under `dir`, at their relative
/// paths. Paths are re-checked, and no existing symlink under `dir` is followed.
pub fn write_all(dir: &Path, files: &[OutputFile]) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for f in files {
        let Some(b64) = &f.content_base64 else {
            continue;
        };
        let rel = crate::request::workspace_path(&f.path).map_err(|e| e.to_string())?;
        let content = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("{}: {e}", f.path))?;
        let target = dir.join(&rel);
        let mut cur = dir.to_path_buf();
        let parts: Vec<&str> = rel.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            cur.push(part);
            match std::fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("{} exists and is not a directory", cur.display())),
                Err(_) => {
                    std::fs::create_dir_all(&cur).map_err(|e| format!("{}: {e}", cur.display()))?
                }
            }
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc_o_nofollow())
            .open(&target)
            .map_err(|e| format!("{}: {e}", target.display()))?;
        out.write_all(&content)
            .map_err(|e| format!("{}: {e}", target.display()))?;
        written.push(target);
    }
    Ok(written)
}

/// O_NOFOLLOW (this crate has no libc dependency; the value is the same on every Linux arch
/// runcell supports).
fn libc_o_nofollow() -> i32 {
    0o400000
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

    #[test]
    fn written_files_stay_under_the_directory_and_never_follow_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let f = |path: &str, content: Option<&str>| OutputFile {
            path: path.into(),
            size: 0,
            mime_type: String::new(),
            sha256: None,
            content_base64: content.map(|c| base64::engine::general_purpose::STANDARD.encode(c)),
            truncated: content.is_none(),
        };
        let written =
            write_all(d.path(), &[f("out/a.csv", Some("1,2")), f("big.bin", None)]).unwrap();
        assert_eq!(written, vec![d.path().join("out/a.csv")]);
        assert_eq!(
            std::fs::read_to_string(d.path().join("out/a.csv")).unwrap(),
            "1,2"
        );
        assert!(write_all(d.path(), &[f("../escape", Some("x"))]).is_err());
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path().join("t"), d.path().join("link")).unwrap();
        assert!(write_all(d.path(), &[f("link", Some("x"))]).is_err());
        assert!(!outside.path().join("t").exists());
        std::os::unix::fs::symlink(outside.path(), d.path().join("ldir")).unwrap();
        assert!(write_all(d.path(), &[f("ldir/t", Some("x"))]).is_err());
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
