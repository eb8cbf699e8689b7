//! Phase one: the install. A sandbox of its own (the same isolation as any run), network by
//! permission to the index and its file hosts only, pip with binary wheels only into
//! /workspace/site; then what pip wrote there is copied out into a new layer.
//!
//! Bounded in time by the request: the install's wall clock is what is left of the request's
//! timeout (or the operator's `install_timeout`, when that is less); the copy stops at the
//! same deadline and at the request's kill switch. An install that does not finish leaves
//! nothing behind.
//!
//! Bounded in memory: the files are listed first (names and sizes), then fetched and written
//! one at a time, so the server holds one file of the layer at most, never the whole layer.

use std::time::{Duration, Instant};

use runcell_jail::{CollectLimits, CollectedFile, InputFile, KillSwitch, NoSink, Sandbox};
use runcell_runtimes::Language;

use super::cache::{self, Cache, CacheError, Lease};
use super::{failed, install_script, Requirement};
use crate::engine::{sandbox_failure, sandbox_files, sandbox_spec, Engine};
use crate::limits::LimitOverrides;
use crate::units::{format_duration, format_size};
use crate::verdict::{classify, ErrorCategory, Phase, Verdict};

/// Files an install may keep, and entries its collection may visit.
const MAX_FILES: u64 = 50_000;
const MAX_ENTRIES: u64 = 100_000;
/// The longest one collection step (the listing, one file) may take, within the deadline.
const STEP_MS: u64 = 60_000;

/// One install of one requirement set.
pub(super) struct Job<'a> {
    pub engine: &'a Engine,
    pub cache: &'a Cache,
    pub key: &'a str,
    pub reqs: &'a [Requirement],
    pub deadline: Instant,
    pub cancel: Option<&'a KillSwitch>,
}

/// Which bound an install's time had.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// What was left of the request's timeout.
    Request,
    /// The operator's install timeout (or the longest timeout of the policy).
    Operator(Duration),
}

impl Job<'_> {
    /// Install, copy out, keep: the layer, held; or the verdict of why not.
    pub(super) fn run(&self) -> Result<Lease, Box<Verdict>> {
        let config = self.engine.config();
        let policy = &config.packages;
        let destinations = policy.destinations().map_err(|e| {
            failed(
                ErrorCategory::RuntimeUnavailable,
                format!("Installing packages: {e}."),
            )
        })?;
        let bash = self
            .engine
            .locate(Language::Bash)
            .map_err(|e| failed(ErrorCategory::RuntimeUnavailable, e.to_string()))?;
        let p = &config.policy;
        let mut limits = p
            .resolve(&LimitOverrides::default())
            .map_err(|e| failed(ErrorCategory::SandboxFailure, e.to_string()))?;
        let operator = policy.install_timeout.min(p.max.timeout());
        let left = self.left();
        let (wall, bound) = if left < operator {
            (left, Bound::Request)
        } else {
            (operator, Bound::Operator(operator))
        };
        if wall < Duration::from_millis(1) {
            return Err(self.not_finished(bound, "did not start"));
        }
        limits.timeout.0 = wall.as_millis() as u64;
        limits.disk = p.max.disk;
        limits.memory = p
            .max
            .memory
            .min(limits.memory.max(crate::limits::Bytes(1 << 30)));

        let runtime = bash.with_proxy(runcell_proxy::SANDBOX_PROXY_PORT);
        let mut spec = sandbox_spec(config, &limits, &runtime);
        spec.proxy_port = Some(runcell_proxy::SANDBOX_PROXY_PORT);
        // An installer's sandbox never gets a forked interpreter.
        spec.templated = false;
        let mut sandbox = Sandbox::create(&spec)
            .map_err(|e| Box::new(sandbox_failure("could not be set up", &e)))?;
        if let Some(refused) = self.engine.strict_refusal(&sandbox) {
            return Err(Box::new(refused));
        }
        let mut permit = config.network.permit(&destinations);
        // The operator's entries for the index, not the network policy's: an index on a
        // private or loopback address works when it is configured literally.
        permit.policy = destinations;
        let proxy = match sandbox
            .take_proxy_listener()
            .map(|l| runcell_proxy::start(l, permit))
        {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                let e = runcell_jail::SandboxError::Protocol(format!(
                    "the egress proxy did not start: {e}"
                ));
                return Err(Box::new(sandbox_failure("could not be set up", &e)));
            }
            None => {
                let e = runcell_jail::SandboxError::Protocol(
                    "no listening socket for the egress proxy".into(),
                );
                return Err(Box::new(sandbox_failure("could not be set up", &e)));
            }
        };
        let plan = runtime.plan();
        let mut files = vec![InputFile {
            path: plan.source_path.clone(),
            mode: 0o644,
            content: install_script(self.reqs, policy).into_bytes(),
        }];
        files.extend(sandbox_files(&runtime));
        let enforcement = sandbox.enforcement().clone();
        let program = Engine::program(
            &plan.run,
            &limits,
            wall,
            &runtime,
            &enforcement,
            files,
            None,
        );
        let ran = sandbox.run(&program, &mut NoSink, self.cancel);
        // Every connection is cut now: a slow index learns that nobody waits any more.
        drop(proxy.finish());
        let outcome =
            ran.map_err(|e| Box::new(sandbox_failure("failed while installing the packages", &e)))?;
        let (code, error) = classify(&outcome, &limits, Phase::Run);
        match error.as_ref().map(|e| e.category) {
            Some(ErrorCategory::Timeout) => return Err(self.not_finished(bound, "did not finish")),
            Some(ErrorCategory::Cancelled) => return Err(cancelled()),
            _ => {}
        }
        let said = || {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&outcome.stdout),
                String::from_utf8_lossy(&outcome.stderr)
            );
            let tail: Vec<&str> = text.lines().rev().take(12).collect();
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        };
        match code {
            0 => {}
            3 => {
                return Err(failed(
                    ErrorCategory::RuntimeUnavailable,
                    format!(
                        "Installing packages is not possible on this host: {}",
                        said()
                    ),
                ))
            }
            _ => {
                let why = match &error {
                    Some(e) if e.category != ErrorCategory::RuntimeError => e.message.clone(),
                    _ => said(),
                };
                return Err(failed(
                    ErrorCategory::InvalidRequest,
                    format!(
                        "Installing {} failed (binary wheels only, from {}): {why}",
                        self.texts(),
                        policy.index_url
                    ),
                ));
            }
        }
        let staging = self.copy_out(&mut sandbox, bound)?;
        if let Err(e) = sandbox.destroy() {
            tracing::warn!(error = %crate::error::chain(&e), "install sandbox teardown failed");
        }
        let texts: Vec<String> = self.reqs.iter().map(|r| r.text.clone()).collect();
        self.cache
            .commit(staging, self.key, &texts)
            .map_err(|e| self.not_kept(e))
    }

    /// Copy what pip wrote under /workspace/site into a new layer, one file at a time. Only
    /// `site/` is kept (what runs import), without bytecode.
    fn copy_out(
        &self,
        sandbox: &mut Sandbox,
        bound: Bound,
    ) -> Result<cache::Staging, Box<Verdict>> {
        let list_limits = CollectLimits {
            max_files: MAX_FILES,
            // Names and sizes only: nothing read, nothing returned.
            max_file_bytes: 0,
            max_total_bytes: 0,
            max_entries: MAX_ENTRIES,
            max_read_bytes: 0,
            deadline_ms: self.step_ms(),
        };
        let listed = sandbox.collect(&list_limits).map_err(|e| {
            Box::new(sandbox_failure(
                "could not list the installed packages' files",
                &e,
            ))
        })?;
        if listed.omitted > 0 {
            return Err(failed(
                ErrorCategory::InvalidRequest,
                format!(
                    "The packages {} are more files than an install may keep (at most {MAX_FILES}).",
                    self.texts()
                ),
            ));
        }
        let wanted: Vec<&CollectedFile> = listed.files.iter().filter(|f| kept(&f.path)).collect();
        // Refused before anything is copied when the files alone are more than the cache.
        let at_least: u64 = wanted.iter().map(|f| cache::blocks(f.size)).sum();
        if at_least > self.cache.max_bytes() {
            return Err(self.not_kept(CacheError::TooLarge {
                bytes: at_least,
                max: self.cache.max_bytes(),
            }));
        }
        let mut staging = self.cache.stage().map_err(|e| self.not_kept(e))?;
        for f in wanted {
            if Instant::now() >= self.deadline {
                return Err(
                    self.not_finished(bound, "did not finish (while its files were copied)")
                );
            }
            if self.cancel.is_some_and(KillSwitch::is_triggered) {
                return Err(cancelled());
            }
            let one = CollectLimits {
                max_files: 1,
                max_file_bytes: f.size,
                max_total_bytes: f.size,
                max_entries: 1,
                max_read_bytes: f.size,
                deadline_ms: self.step_ms(),
            };
            let got = sandbox.browse(&one, Some(&f.path)).map_err(|e| {
                Box::new(sandbox_failure(
                    "could not return an installed package's file",
                    &e,
                ))
            })?;
            let content = got
                .files
                .first()
                .filter(|g| g.path == f.path)
                .and_then(|g| g.blob)
                .and_then(|i| got.blobs.get(i))
                .ok_or_else(|| {
                    failed(
                        ErrorCategory::SandboxFailure,
                        format!(
                            "Keeping the packages: {} ({}) did not come back from the install \
                             sandbox.",
                            f.path,
                            format_size(f.size)
                        ),
                    )
                })?;
            staging
                .write(&f.path, content)
                .map_err(|e| self.not_kept(e))?;
            if staging.bytes() > self.cache.max_bytes() {
                return Err(self.not_kept(CacheError::TooLarge {
                    bytes: staging.bytes(),
                    max: self.cache.max_bytes(),
                }));
            }
        }
        Ok(staging)
    }

    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn step_ms(&self) -> u64 {
        (self.left().as_millis() as u64).clamp(1, STEP_MS)
    }

    fn texts(&self) -> String {
        self.reqs
            .iter()
            .map(|r| r.text.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The verdict of an install that ran out of time; nothing of it is kept.
    fn not_finished(&self, bound: Bound, what: &str) -> Box<Verdict> {
        let message = match bound {
            Bound::Request => format!(
                "The install of the packages {} {what} within the request's timeout, so the \
                 program did not run; nothing of the install was kept. Ask for a longer \
                 timeout (the install counts against it; a layer installed once is reused \
                 from the cache).",
                self.texts()
            ),
            Bound::Operator(t) => format!(
                "The install of the packages {} {what} within the {} this server allows an \
                 install, so the program did not run; nothing of the install was kept.",
                self.texts(),
                format_duration(t)
            ),
        };
        failed(ErrorCategory::Timeout, message)
    }

    fn not_kept(&self, e: CacheError) -> Box<Verdict> {
        let category = match e {
            CacheError::TooLarge { .. } => ErrorCategory::InvalidRequest,
            CacheError::Full { .. } => ErrorCategory::RuntimeUnavailable,
            CacheError::Io { .. } | CacheError::Write(_) => {
                tracing::warn!(error = %e, "keeping a package layer failed");
                ErrorCategory::SandboxFailure
            }
        };
        failed(
            category,
            format!("The packages {} cannot be kept: {e}.", self.texts()),
        )
    }
}

fn cancelled() -> Box<Verdict> {
    failed(
        ErrorCategory::Cancelled,
        "The run was cancelled while its packages were being installed; nothing of the \
         install was kept.",
    )
}

/// Whether a file pip wrote goes into the layer: what is under `site/` but bytecode (stale
/// once copied, see [`super::install_script`]).
fn kept(path: &str) -> bool {
    path.strip_prefix("site/").is_some_and(|rel| {
        !rel.is_empty() && !rel.ends_with(".pyc") && !rel.split('/').any(|c| c == "__pycache__")
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_site_without_bytecode_is_kept() {
        for (p, k) in [
            ("site/tabulate/__init__.py", true),
            ("site/pkg/.libs/libx.so", true),
            ("site/bin/tabulate", true),
            ("site/tabulate/__pycache__/__init__.cpython-311.pyc", false),
            ("site/x.pyc", false),
            ("main.sh", false),
            ("other/file", false),
            ("sitex/file", false),
        ] {
            assert_eq!(super::kept(p), k, "{p}");
        }
    }
}
