//! Forking a session: what a new session needs to start as a copy of another one.
//!
//! The copy is by value, not a memory snapshot: the parent's /workspace (read through its
//! pid 1, within the input caps a creation has) and, for Python, its interpreter's globals,
//! dumped by an internal cell with a pickler extended to what plain pickle refuses (functions,
//! lambdas and closures defined in the session, its classes and their instances; modules by
//! name) and loaded by another internal cell in the new session's interpreter. What cannot be
//! copied (a generator, an open file, a thread, a lock; a file past the caps) is named in the
//! fork's answer, never dropped silently. The new session itself is created through the run
//! service like any other (admission, the memory ledger, the caps per key): see
//! `RunService::fork_session`.

use base64::Engine as _;
use runcell_jail::CollectLimits;
use runcell_runtimes::Language;

use super::sandbox::Session;
use crate::engine::{Engine, RunIn, NO_INTERPRETER};
use crate::error::{ErrorKind, RunError};
use crate::request::{ExecRequest, InputFile};

/// Where the dump cell leaves the pickled globals (in the parent's /tmp), and where the new
/// session finds them (in its /workspace, removed by the load cell).
pub const STATE_FILE: &str = ".runcell-fork-state";
/// Where the dump cell leaves what it copied and skipped (JSON, in the parent's /tmp).
const META_FILE: &str = ".runcell-fork-meta.json";
/// The metadata's size at most (a name list).
const META_CAP: u64 = 4 << 20;

/// The dump cell: everything in its own namespace (nothing is added to the session's), the
/// state and the metadata written to /tmp, nothing printed (the session's output cap does not
/// apply to what it copies).
const DUMP: &str = r#"exec(compile(r'''
import importlib, io, json, marshal, pickle, sys, types
M = sys.modules['__main__']
G = M.__dict__
MAIN = object()
class Refused(Exception):
    pass
class P(pickle.Pickler):
    # pickle extended as cloudpickle does it: what the session defined travels by value
    def reducer_override(self, o):
        if o is MAIN:
            return (vars, (M,))
        if o is types.FunctionType or o is types.CellType:
            # not found by name (builtins.function): by their place in `types`
            return (getattr, (types, 'CellType' if o is types.CellType else 'FunctionType'))
        if isinstance(o, types.ModuleType):
            if o.__name__ not in sys.modules:
                raise Refused('a module that cannot be imported by name')
            return (importlib.import_module, (o.__name__,))
        if isinstance(o, types.CodeType):
            return (marshal.loads, (marshal.dumps(o),))
        if isinstance(o, types.CellType):
            try:
                v = o.cell_contents
            except ValueError:
                return (types.CellType, ())
            return (types.CellType, (), (None, {'cell_contents': v}))
        if isinstance(o, types.FunctionType) and o.__module__ == '__main__':
            return (types.FunctionType, (o.__code__, MAIN, o.__name__, o.__defaults__, o.__closure__),
                    (o.__dict__ or None, {'__kwdefaults__': o.__kwdefaults__,
                     '__qualname__': o.__qualname__, '__module__': '__main__',
                     '__doc__': o.__doc__, '__annotations__': o.__annotations__}))
        if isinstance(o, type) and o.__module__ == '__main__':
            if type(o) is not type or '__slots__' in o.__dict__:
                raise Refused('a class with a metaclass or slots')
            ns = {k: v for k, v in o.__dict__.items() if k not in ('__dict__', '__weakref__')}
            ns['__qualname__'] = o.__qualname__
            return (type, (o.__name__, o.__bases__, {}), (None, ns))
        return NotImplemented
def dump(v, out):
    P(out, protocol=pickle.HIGHEST_PROTOCOL).dump(v)
copied, skipped = [], []
for k in list(G):
    if k.startswith('__') and k.endswith('__'):
        continue
    try:
        dump(G[k], io.BytesIO())
        copied.append(k)
    except BaseException:
        skipped.append(k)
with open('/tmp/.runcell-fork-state', 'wb') as f:
    dump({k: G[k] for k in copied}, f)
with open('/tmp/.runcell-fork-meta.json', 'w') as f:
    json.dump({'copied': copied, 'skipped': skipped}, f)
''', '<runcell fork>', 'exec'), {'__name__': '_runcell_fork'})
"#;

/// The load cell: the parent's globals into this interpreter's `__main__`, the file removed.
/// Nothing printed; a failure is its exit code and its stderr.
const LOAD: &str = r#"exec(compile(r'''
import os, pickle, sys
p = '/workspace/.runcell-fork-state'
try:
    with open(p, 'rb') as f:
        sys.modules['__main__'].__dict__.update(pickle.load(f))
finally:
    os.unlink(p)
''', '<runcell fork>', 'exec'), {'__name__': '_runcell_fork'})
"#;

/// Removes the dump's files from the parent's /tmp.
const CLEAN: &str = r#"exec("import os\nfor p in ('/tmp/.runcell-fork-state', '/tmp/.runcell-fork-meta.json'):\n    try:\n        os.unlink(p)\n    except FileNotFoundError:\n        pass\n", {})
"#;

/// What a fork copies out of its parent.
#[derive(Debug, Clone)]
pub struct ForkSource {
    /// The new session's creation request: the parent's language, limits, network, packages
    /// and environment, its workspace's files (and the state file).
    pub request: ExecRequest,
    /// The pickled globals' size (0: no state copied).
    pub state_bytes: u64,
    /// Whether the new session has state to load (Python).
    pub has_state: bool,
    /// The globals copied.
    pub copied: Vec<String>,
    /// Names and files that could not be copied (`/workspace/...` for a file).
    pub skipped: Vec<String>,
    /// The workspace files copied.
    pub workspace_files: u64,
}

#[derive(serde::Deserialize)]
struct Meta {
    copied: Vec<String>,
    skipped: Vec<String>,
}

fn lost() -> RunError {
    RunError::new(
        ErrorKind::Conflict,
        "The session's interpreter is gone (it ended and was not restarted yet): its state \
         cannot be copied. Run a call in it first (its state is lost), then fork it.",
    )
}

impl Session {
    /// Run one of runcell's own Python cells in the session's interpreter: not counted as a
    /// call, its output discarded. `Err` with the cell's stderr when it fails.
    fn internal_cell(&mut self, engine: &Engine, code: &str) -> Result<(), RunError> {
        let request = ExecRequest {
            language: Some("python".into()),
            code: Some(code.to_string()),
            stdin: None,
            files: Vec::new(),
            limits: crate::limits::LimitOverrides::default(),
            network: None,
            packages: Vec::new(),
            ttl: None,
            env: Default::default(),
        };
        let v = engine.validate(&request).map_err(RunError::from)?;
        self.cells += 1;
        let n = self.cells;
        let runtime = self.runtime.clone();
        if !self.sandbox.as_mut().is_some_and(|s| s.is_ready()) {
            return Err(lost());
        }
        let Some(sandbox) = self.sandbox.as_mut() else {
            return Err(lost());
        };
        let (verdict, outcome) = engine.run_in(
            sandbox,
            RunIn::SessionCell(n),
            &v,
            &runtime,
            &mut runcell_jail::NoSink,
            None,
        );
        if verdict
            .error
            .as_ref()
            .is_some_and(|e| e.message == NO_INTERPRETER)
        {
            return Err(lost());
        }
        if outcome.as_ref().is_some_and(|o| !o.interpreter_alive) {
            // It died in runcell's own cell: the next call restarts it (and says so).
            self.pending = Some(super::sandbox::Lost::State);
            return Err(lost());
        }
        match (verdict.exit_code, verdict.error) {
            (Some(0), None) => Ok(()),
            (_, error) => Err(RunError::new(
                ErrorKind::Conflict,
                format!(
                    "The session's state could not be copied: {}",
                    error
                        .map(|e| e.message)
                        .unwrap_or_else(
                            || crate::request::prefix(verdict.stderr.trim(), 500).to_string()
                        )
                ),
            )),
        }
    }

    /// What a fork of this session copies: its workspace, within the caps of a creation's
    /// input files, and (Python) its interpreter's globals. `settings` are the session's
    /// own (its creation's).
    pub(super) fn fork_source(
        &mut self,
        engine: &Engine,
        settings: &crate::intake::SessionSettings,
    ) -> Result<ForkSource, RunError> {
        let policy = engine.policy();
        let file_cap = policy.max_input_file_bytes.min(self.limits().disk.0);
        let total_cap = policy.max_input_total_bytes.min(self.limits().disk.0);
        let mut skipped = Vec::new();
        let mut copied = Vec::new();
        let mut state = None;
        if self.language() == Language::Python {
            self.ensure_sandbox(engine)?;
            self.internal_cell(engine, DUMP)?;
            let meta = self.read_tmp(META_FILE, META_CAP)?;
            let meta: Meta = serde_json::from_slice(&meta.unwrap_or_default()).map_err(|e| {
                RunError::new(
                    ErrorKind::Conflict,
                    format!("The session's state could not be copied: {e}"),
                )
            })?;
            let bytes = self.read_tmp(STATE_FILE, file_cap);
            let _ = self.internal_cell(engine, CLEAN);
            match bytes? {
                Some(b) => {
                    state = Some(b);
                    copied = meta.copied;
                    skipped = meta.skipped;
                }
                None => {
                    return Err(RunError::new(
                        ErrorKind::Conflict,
                        format!(
                            "The session's state is larger than the {file_cap} bytes a fork \
                             may copy (the cap on one input file): delete large variables \
                             (or save them to /workspace files) and fork again."
                        ),
                    ))
                }
            }
        }
        let state_bytes = state.as_ref().map_or(0, |s| s.len() as u64);
        // The workspace: each file whole, within the caps left after the state.
        let limits = CollectLimits {
            max_files: policy.max_input_files.saturating_sub(1),
            max_file_bytes: file_cap,
            max_total_bytes: total_cap.saturating_sub(state_bytes),
            max_entries: 100_000,
            max_read_bytes: total_cap.saturating_sub(state_bytes),
            deadline_ms: 30_000,
        };
        let sandbox = self.ensure_sandbox(engine)?;
        let mut c = sandbox.browse(&limits, None).map_err(|e| {
            super::sandbox::failure(crate::engine::sandbox_failure(
                "could not read its files",
                &e,
            ))
        })?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut files = Vec::new();
        for f in &c.files {
            if f.path == self.language().source_file() {
                // Where a call's code is written: not an input file (the next call writes its
                // own), and the creation would refuse it.
                skipped.push(format!(
                    "/workspace/{} (where a call's code is written)",
                    f.path
                ));
                continue;
            }
            if state.is_some() && f.path == STATE_FILE {
                // The name the state travels under: the user's file cannot take it too.
                skipped.push(format!(
                    "/workspace/{STATE_FILE} (the name of the fork's state)"
                ));
                continue;
            }
            match f.blob {
                Some(i) if i < c.blobs.len() => files.push(InputFile {
                    path: f.path.clone(),
                    content: None,
                    content_base64: Some(b64.encode(std::mem::take(&mut c.blobs[i]))),
                }),
                _ => skipped.push(format!("/workspace/{}", f.path)),
            }
        }
        if c.omitted > 0 {
            skipped.push(format!(
                "/workspace: {} more files (past the caps on a creation's input files)",
                c.omitted
            ));
        }
        let workspace_files = files.len() as u64;
        if let Some(s) = &state {
            files.push(InputFile {
                path: STATE_FILE.into(),
                content: None,
                content_base64: Some(b64.encode(s)),
            });
        }
        let request = ExecRequest {
            language: Some(settings.language.name().to_string()),
            code: Some(String::new()),
            files,
            stdin: None,
            limits: settings.overrides,
            network: (!settings.network.is_empty()).then(|| crate::request::NetworkRequest {
                allow: settings.network.clone(),
            }),
            packages: settings.packages.clone(),
            ttl: None,
            env: self.env.iter().cloned().collect(),
        };
        Ok(ForkSource {
            request,
            state_bytes,
            has_state: state.is_some(),
            copied,
            skipped,
            workspace_files,
        })
    }

    /// Load the state a fork copied (in the new session's /workspace) into its interpreter.
    pub(super) fn load_fork_state(&mut self, engine: &Engine) -> Result<(), RunError> {
        self.internal_cell(engine, LOAD)
    }

    /// One file of /tmp, within `cap` (`Ok(None)`: larger than that).
    fn read_tmp(&mut self, name: &str, cap: u64) -> Result<Option<Vec<u8>>, RunError> {
        let limits = CollectLimits {
            max_files: 1,
            max_file_bytes: cap,
            max_total_bytes: cap,
            max_entries: 1,
            max_read_bytes: cap,
            deadline_ms: 30_000,
        };
        let Some(sandbox) = self.sandbox.as_mut() else {
            return Err(lost());
        };
        let mut c = sandbox.read_tmp_file(&limits, name).map_err(|e| {
            super::sandbox::failure(crate::engine::sandbox_failure(
                "could not read the session's copied state",
                &e,
            ))
        })?;
        let Some(f) = c.files.first() else {
            return Err(RunError::new(
                ErrorKind::Conflict,
                "The session's state could not be copied: its dump left nothing.",
            ));
        };
        Ok(match f.blob {
            Some(i) if i < c.blobs.len() => Some(c.blobs.swap_remove(i)),
            _ => None,
        })
    }
}
