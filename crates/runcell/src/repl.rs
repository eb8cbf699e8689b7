//! `runcell repl`: an interactive session in the terminal. Each input runs as a cell of a
//! session (the same sandbox and interpreter as `/v1/sessions`): state is kept between inputs,
//! Ctrl-C interrupts the running input (the session keeps its state where the interpreter
//! survives), Ctrl-D ends the session and tears its sandbox down.
//!
//! Input that continues on the next line: a line ending in `\`, open brackets, and for Python
//! a line ending in `:` (a block, ended by an empty line).

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runcell_core::limits::LimitOverrides;
use runcell_core::{
    Call, Caller, Engine, ExecRequest, KillSwitch, Language, RunError, RunService, ServiceConfig,
    SessionPolicy, Source, Target, Verdict,
};

/// How long a repl session may live (its interpreter's CPU time bound): a working day.
const REPL_LIFETIME: Duration = Duration::from_secs(12 * 3600);

pub struct ReplOptions {
    pub language: String,
    pub limits: LimitOverrides,
}

/// Run the repl until end of input. The exit status is 0, or 1 when the session could not
/// start.
pub fn repl(engine: &Engine, options: ReplOptions) -> ExitCode {
    let Some(language) = Language::parse(&options.language) else {
        eprintln!(
            "runcell repl: unknown language '{}'. Use one of: {}.",
            options.language,
            Language::accepted_names()
        );
        return ExitCode::from(2);
    };
    // One session, through the run service as every door's: the operator's own, living as
    // long as a working day.
    let sessions = SessionPolicy {
        default_ttl: REPL_LIFETIME,
        max_ttl: REPL_LIFETIME,
        max_lifetime: REPL_LIFETIME,
        ..SessionPolicy::default()
    };
    let service = RunService::new(
        engine.clone(),
        ServiceConfig {
            sessions,
            ..ServiceConfig::local()
        },
        std::sync::Arc::new(runcell_core::service::Quiet),
    );
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        eprintln!("runcell repl: cannot start the async runtime");
        return ExitCode::from(1);
    };
    let caller = Caller::local("cli");
    let mut req = ExecRequest {
        code: None,
        ..ExecRequest::new(language.name(), "")
    };
    req.limits = options.limits;
    let created = rt.block_on(async {
        let ticket = service.reserve(&caller)?;
        let call = Call::new(caller.clone(), Source::Operator, Target::CreateSession, req);
        service.admit(ticket, call).await?.create().await
    });
    let info = match created {
        Ok(info) => info,
        Err(e) if e.kind == runcell_core::ErrorKind::InvalidRequest => {
            eprintln!("runcell repl: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("runcell repl: the session could not start: {e}");
            return ExitCode::from(1);
        }
    };
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let limits = info.limits;
    if interactive {
        eprintln!(
            "runcell repl: {} in a sandbox ({} per input, {} of memory for the session). \
             State is kept between inputs; Ctrl-C interrupts, Ctrl-D ends.",
            language.name(),
            runcell_core::units::format_duration(limits.timeout()),
            runcell_core::units::format_size(limits.memory.0),
        );
    }
    // Ctrl-C interrupts the running input: the handler triggers its kill switch, which the
    // session turns into SIGINT for the interpreter (and a stop if it does not yield).
    let running: Arc<Mutex<Option<KillSwitch>>> = Arc::default();
    spawn_interrupter(running.clone(), interactive);

    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    while let Some(block) = read_block(&mut lines, language, interactive) {
        if block.trim().is_empty() {
            continue;
        }
        let call = ExecRequest {
            language: None,
            ..ExecRequest::new("", block)
        };
        let ran = rt.block_on(async {
            let ticket = service.reserve(&caller)?;
            let call = Call::new(
                caller.clone(),
                Source::Operator,
                Target::Session(info.id.clone()),
                call,
            );
            let admitted = service.admit(ticket, call).await?;
            *lock(&running) = Some(admitted.kill_switch());
            let v = admitted.run(Box::new(crate::Passthrough)).await;
            *lock(&running) = None;
            v
        });
        match ran {
            Ok(verdict) => report(&verdict),
            Err(RunError { message, .. }) => eprintln!("{message}"),
        }
    }
    if interactive {
        eprintln!();
    }
    let _ = rt.block_on(service.delete_session(&caller, info.id));
    ExitCode::SUCCESS
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A thread that waits for SIGINT and interrupts the running input (at the prompt it only
/// reminds how to leave).
fn spawn_interrupter(running: Arc<Mutex<Option<KillSwitch>>>, interactive: bool) {
    let _ = std::thread::Builder::new()
        .name("repl-interrupt".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                while tokio::signal::ctrl_c().await.is_ok() {
                    match &*lock(&running) {
                        Some(ks) => ks.trigger(),
                        None if interactive => eprint!("\n(Ctrl-D ends the session)\n>>> "),
                        None => {}
                    }
                }
            });
        });
}

/// What a finished input says beyond its own output: why it failed (when that is not its
/// own traceback), a lost state, the files it wrote.
fn report(v: &Verdict) {
    if let Some(e) = &v.error {
        let own = e.category == runcell_core::ErrorCategory::RuntimeError && !v.stderr.is_empty();
        if !own {
            eprintln!("[{}] {}", e.category.as_str(), e.message);
        }
    }
    for w in &v.warnings {
        eprintln!("[warning] {w}");
    }
    if !v.files.is_empty() {
        let names: Vec<&str> = v.files.iter().map(|f| f.path.as_str()).collect();
        eprintln!("[files in /workspace] {}", names.join(", "));
    }
}

/// Read one input: a line, or several while the input continues. `None` at end of input.
fn read_block(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    language: Language,
    interactive: bool,
) -> Option<String> {
    let mut block = String::new();
    let mut in_python_block = false;
    loop {
        if interactive {
            eprint!("{}", if block.is_empty() { ">>> " } else { "... " });
            let _ = std::io::stderr().flush();
        }
        let line = match lines.next() {
            Some(Ok(l)) => l,
            // End of input (Ctrl-D) or unreadable input: what was typed so far still runs.
            _ => return (!block.is_empty()).then_some(block),
        };
        if in_python_block && line.trim().is_empty() {
            return Some(block);
        }
        block.push_str(&line);
        block.push('\n');
        if language == Language::Python && line.trim_end().ends_with(':') && !in_python_block {
            in_python_block = true;
        }
        if in_python_block || continues(&block) {
            continue;
        }
        return Some(block);
    }
}

/// Whether `text` needs more lines: a trailing backslash, or brackets still open (outside
/// string literals and comments, roughly).
fn continues(text: &str) -> bool {
    if text.trim_end_matches('\n').ends_with('\\') {
        return true;
    }
    let mut depth = 0i64;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    for c in text.chars() {
        if comment {
            if c == '\n' {
                comment = false;
            }
            continue;
        }
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '\'' | '"' | '`' => quote = Some(c),
            '#' => comment = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
    }
    depth > 0 || quote.is_some_and(|q| q == '`')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(input: &str, language: Language) -> Vec<String> {
        let mut lines = input.lines().map(|l| Ok(l.to_string()));
        std::iter::from_fn(|| read_block(&mut lines, language, false)).collect()
    }

    #[test]
    fn inputs_continue_over_open_brackets_backslashes_and_python_blocks() {
        assert_eq!(
            blocks("x = 1\nprint(x)", Language::Python),
            ["x = 1\n", "print(x)\n"]
        );
        assert_eq!(
            blocks("def f():\n    return 1\n\nf()", Language::Python),
            ["def f():\n    return 1\n", "f()\n"]
        );
        assert_eq!(
            blocks("function f() {\n  return 1\n}\nf()", Language::Node),
            ["function f() {\n  return 1\n}\n", "f()\n"]
        );
        assert_eq!(blocks("echo a \\\n b", Language::Bash), ["echo a \\\n b\n"]);
        // Brackets in strings and comments do not count.
        assert_eq!(
            blocks("print('(')\nx = 1 # (", Language::Python),
            ["print('(')\n", "x = 1 # (\n"]
        );
        // End of input inside a block still runs what was typed.
        assert_eq!(
            blocks("if True:\n    print(1)", Language::Python),
            ["if True:\n    print(1)\n"]
        );
    }
}
