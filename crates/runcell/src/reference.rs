//! `runcell __reference`: the generated reference under docs/reference/, written from the code
//! itself so that it cannot drift: the settings table and the flags' help (`settings`), the
//! OpenAPI document `runcell serve` serves (`openapi`), and every name a guide may mention
//! (`names`: settings, flags, routes, error categories, metrics), which the docs test
//! (crates/runcell/tests/docs.rs) checks the guides against. Regenerate with
//! `scripts/gen-reference.sh`.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::Context;
use serde_json::{json, Value};

use crate::settings::{Setting, Shape, SETTINGS};

/// What to print.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Reference {
    /// docs/reference/settings.md: every setting, and the variables that are not settings.
    Settings,
    /// docs/reference/openapi.json: the served OpenAPI document, for a fixed reference host.
    Openapi,
    /// Every name the guides may mention, as JSON (for the docs test).
    Names,
}

/// The environment variable of the log filter (`runcell serve`, `runcell mcp`).
pub const LOG_ENV: &str = "RUNCELL_LOG";

/// What `RUNCELL_LOG` does, for the reference.
const LOG_ENV_HELP: &str = "The log filter of `runcell serve` and `runcell mcp` (their logs go \
    to stderr), in tracing's EnvFilter syntax: e.g. debug, runcell_server=debug [default: \
    runcell's own info and the libraries' warnings]. The libraries' debug and trace events are \
    never written, whatever it says (they would hold request bodies and headers). The audit log \
    is separate.";

/// The reference host of docs/reference/openapi.json: the served document's bounds depend on
/// the host (its memory and cores give the limits' maxima) and on the operator's policy, so
/// the reference is written for this one.
const REFERENCE_MEMORY: u64 = 8 << 30;
const REFERENCE_CORES: u64 = 4;
const REFERENCE_NET: &str = "api.example.com:443";

pub fn print(what: Reference) -> anyhow::Result<()> {
    let text = match what {
        Reference::Settings => {
            settings_markdown(SETTINGS, &<crate::Cli as clap::CommandFactory>::command())?
        }
        Reference::Openapi => serde_json::to_string_pretty(&openapi_reference()?)?,
        Reference::Names => serde_json::to_string_pretty(&names()?)?,
    };
    println!("{}", text.trim_end());
    Ok(())
}

/// The commands of the CLI that are shown (not the hidden helper roles), built so that the
/// global flags and `--help` are among each one's arguments.
fn visible_commands(root: &clap::Command) -> Vec<&clap::Command> {
    root.get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect()
}

/// A flag's spelling: `--long`.
fn long_of(arg: &clap::Arg) -> Option<String> {
    arg.get_long().map(|l| format!("--{l}"))
}

/// An argument's help: its long help, else its short one.
fn help_of(arg: &clap::Arg) -> Option<String> {
    arg.get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .filter(|h| !h.trim().is_empty())
}

/// The flags that set `setting` in each command: flag -> the commands that take it.
fn flags_of(setting: &Setting, root: &clap::Command) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let Some(id) = setting.arg else {
        return out;
    };
    for cmd in visible_commands(root) {
        for arg in cmd.get_arguments().filter(|a| a.get_id() == id) {
            if let Some(flag) = long_of(arg) {
                out.entry(flag)
                    .or_default()
                    .push(cmd.get_name().to_string());
            }
        }
    }
    out
}

/// The help of a setting's flag (serve's, which takes every flag, else the first command's).
fn flag_help(setting: &Setting, root: &clap::Command) -> Option<String> {
    let id = setting.arg?;
    let mut commands = visible_commands(root);
    commands.sort_by_key(|c| c.get_name() != "serve");
    commands
        .iter()
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_id() == id)
        .and_then(help_of)
}

/// A help text's `[default: ...]`, and the text without it.
fn split_default(help: &str) -> (Option<String>, String) {
    let Some(start) = help.find("[default: ") else {
        return (None, help.to_string());
    };
    let rest = &help[start + "[default: ".len()..];
    let Some(end) = rest.find(']') else {
        return (None, help.to_string());
    };
    let default = rest[..end].trim().to_string();
    let before = help[..start].trim_end();
    let after = &rest[end + 1..];
    (Some(default), format!("{before}{after}"))
}

/// A help text that ends a sentence (clap drops the full stop of a one-paragraph help).
fn full_stop(t: String) -> String {
    if t.trim_end().ends_with(['.', ':']) {
        t
    } else {
        format!("{}.", t.trim_end())
    }
}

/// A setting's description and default, or why it has none.
fn describe(setting: &Setting, root: &clap::Command) -> anyhow::Result<(String, String)> {
    let help = flag_help(setting, root).map(full_stop);
    let mut text = match (&help, setting.help) {
        (Some(h), Some(note)) => format!("{h}\n\n{note}"),
        (Some(h), None) => h.clone(),
        (None, Some(note)) => note.to_string(),
        (None, None) => anyhow::bail!(
            "the setting {} has no description: it has no flag, so give it a `help` in \
             SETTINGS (crates/runcell/src/settings.rs)",
            setting.key
        ),
    };
    let (default, rest) = split_default(&text);
    text = full_stop(rest);
    let default = match (default, setting.shape) {
        (Some(d), _) => d,
        (None, Shape::Bool) => "false".to_string(),
        // Not said: the description tells.
        (None, _) => "not set".to_string(),
    };
    Ok((text, default))
}

/// How a setting's value is written, in words.
fn shape_words(shape: Shape, flag: bool) -> String {
    let with_flag = |s: &str| if flag { s.to_string() } else { String::new() };
    match shape {
        Shape::One => "one value".to_string(),
        Shape::Bool => format!(
            "true or false ({}in the environment 0, false, no, off are off)",
            with_flag("the flag turns it on; ")
        ),
        Shape::List => format!(
            "a list: a TOML array; comma-separated in the environment{}",
            with_flag("; a repeated or comma-separated flag")
        ),
        Shape::Pairs => format!(
            "NAME=VALUE entries: a TOML table; comma-separated in the environment{}; merged \
             entry by entry",
            with_flag("; a repeated or comma-separated flag")
        ),
        Shape::PairsWhole => format!(
            "NAME=VALUE entries whose values may hold commas: a TOML table; one entry per {}; \
             merged entry by entry",
            if flag { "flag or variable" } else { "variable" }
        ),
    }
}

/// Markdown text that is not markup: `*` and `|` escaped, `<` as an entity.
fn md(text: &str) -> String {
    text.replace('*', "\\*")
        .replace('|', "\\|")
        .replace('<', "&lt;")
}

/// A help text as Markdown paragraphs: indented lines (the limits' table) as a code block.
fn md_paragraphs(text: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for line in text.lines() {
        let indented = line.starts_with("  ");
        if indented && !in_code {
            out.push_str("```text\n");
            in_code = true;
        } else if !indented && in_code {
            out.push_str("```\n");
            in_code = false;
        }
        if in_code {
            out.push_str(line.trim_end());
        } else {
            out.push_str(&md(line.trim_end()));
        }
        out.push('\n');
    }
    if in_code {
        out.push_str("```\n");
    }
    out
}

/// Where a key lives in the TOML file.
fn toml_place(key: &str) -> String {
    match key.rsplit_once('.') {
        Some((table, name)) => format!("`{name}` under `[{table}]`"),
        None => format!("`{key}` at the top level"),
    }
}

/// docs/reference/settings.md.
pub fn settings_markdown(settings: &[Setting], root: &clap::Command) -> anyhow::Result<String> {
    let mut root = root.clone();
    root.build();
    let mut out = String::new();
    out.push_str(
        "<!-- Generated by `runcell __reference settings` (scripts/gen-reference.sh): do not \
         edit. -->\n\n# Settings reference\n\n",
    );
    out.push_str(
        "Every setting of runcell, generated from the settings table and the flags' help. A \
         setting's value comes from its default, then the TOML file (`--config FILE` or \
         `RUNCELL_CONFIG`), then its environment variable, then its flag: each over the one \
         before (`NAME=VALUE` entries, such as the limits, entry by entry). The file uses the \
         keys below (`sessions.max` is `max` under `[sessions]`). The file and the \
         environment apply to every command (`serve`, `mcp`, `tools`, `run`, `repl`, \
         `agent`); a flag, to the commands that take it. An invalid setting is refused, \
         naming it and where its value came from. The guide is [serve.md](../serve.md).\n\n",
    );
    out.push_str("| Setting (TOML key) | Flag | Environment | Default |\n|---|---|---|---|\n");
    let mut sections = String::new();
    for s in settings {
        let (text, default) = describe(s, &root)?;
        let flags = flags_of(s, &root);
        let flag_cell = if flags.is_empty() {
            "(none)".to_string()
        } else {
            flags
                .keys()
                .map(|f| format!("`{f}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let env = s.env.map_or("(none)".to_string(), |e| format!("`{e}`"));
        let _ = writeln!(
            out,
            "| `{}` | {flag_cell} | {env} | {} |",
            s.key,
            md(&default)
        );
        let _ = writeln!(sections, "### `{}`\n", s.key);
        let _ = writeln!(sections, "- File: {}", toml_place(s.key));
        if flags.is_empty() {
            let _ = writeln!(sections, "- Flag: none (the file or the environment only)");
        } else {
            let list: Vec<String> = flags
                .iter()
                .map(|(f, cmds)| format!("`{f}` ({})", cmds.join(", ")))
                .collect();
            let _ = writeln!(sections, "- Flag: {}", list.join("; "));
        }
        let _ = writeln!(
            sections,
            "- Environment: {}",
            s.env.map_or("none".to_string(), |e| format!("`{e}`"))
        );
        let _ = writeln!(
            sections,
            "- Value: {}",
            shape_words(s.shape, !flags.is_empty())
        );
        let _ = writeln!(sections, "- Default: {}\n", md(&default));
        sections.push_str(&md_paragraphs(&text));
        sections.push('\n');
    }
    out.push_str("\n## Settings\n\n");
    out.push_str(&sections);
    out.push_str(
        "## Not settings: global flags and variables\n\nThese are read by every command (or, \
         for the log filter, by the servers) but are not part of the settings model: they \
         are not keys of the file.\n\n| Flag | Environment | What |\n|---|---|---|\n",
    );
    for arg in root.get_arguments() {
        let (Some(flag), Some(env)) = (long_of(arg), arg.get_env()) else {
            continue;
        };
        let help = full_stop(help_of(arg).unwrap_or_default()).replace('\n', " ");
        let _ = writeln!(
            out,
            "| `{flag}` | `{}` | {} |",
            env.to_string_lossy(),
            md(&help)
        );
    }
    let _ = writeln!(out, "| (none) | `{LOG_ENV}` | {} |", md(LOG_ENV_HELP));
    Ok(out)
}

/// The engine of the reference host: its limits policy, network and packages as a server
/// with `--allow-net api.example.com:443 --allow-package '*'` on 4 cores and 8 GiB has them.
fn reference_engine() -> anyhow::Result<runcell_core::EngineConfig> {
    let mut engine = runcell_core::EngineConfig::for_host();
    engine.policy = runcell_core::limits::LimitPolicy::for_host(REFERENCE_MEMORY, REFERENCE_CORES);
    engine.all_runs_memory_bytes = Some(REFERENCE_MEMORY);
    engine.network = Default::default();
    engine.network.allow = runcell_proxy::parse_rules(&[REFERENCE_NET.to_string()])
        .map_err(|e| anyhow::anyhow!("the reference network rule: {e}"))?;
    engine.packages = Default::default();
    engine.packages.allow_any = true;
    Ok(engine)
}

/// docs/reference/openapi.json: the document `GET /openapi.json` answers, for the reference
/// host.
pub fn openapi_reference() -> anyhow::Result<Value> {
    let engine = reference_engine()?;
    let sessions = runcell_core::SessionPolicy::default();
    let mut doc = runcell_server::openapi::served(&engine, &sessions, None);
    let note = format!(
        "\n\nThis copy is docs/reference/openapi.json, generated by `runcell __reference \
         openapi` for a reference host: {REFERENCE_CORES} cores and {} GiB for runs, the \
         default settings, and `--allow-net {REFERENCE_NET} --allow-package '*'` (so that the \
         request bodies show `network` and `packages`). A server's own GET /openapi.json \
         gives its limits' maxima, its network and its packages.",
        REFERENCE_MEMORY >> 30
    );
    let description = doc
        .pointer("/info/description")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    doc["info"]["description"] = json!(format!("{description}{note}"));
    Ok(doc)
}

/// Every name the guides may mention.
pub fn names() -> anyhow::Result<Value> {
    let mut root = <crate::Cli as clap::CommandFactory>::command();
    root.build();
    let settings: Vec<Value> = SETTINGS
        .iter()
        .map(|s| {
            json!({
                "key": s.key,
                "env": s.env,
                "flags": flags_of(s, &root),
            })
        })
        .collect();
    let mut commands = BTreeMap::new();
    for cmd in visible_commands(&root) {
        let mut flags: Vec<String> = Vec::new();
        for arg in cmd.get_arguments() {
            flags.extend(long_of(arg));
            flags.extend(arg.get_short().map(|c| format!("-{c}")));
        }
        flags.sort();
        flags.dedup();
        commands.insert(cmd.get_name().to_string(), flags);
    }
    let mut global: Vec<String> = root.get_arguments().filter_map(long_of).collect();
    global.sort();
    let mut environment: Vec<String> = SETTINGS
        .iter()
        .filter_map(|s| s.env.map(str::to_string))
        .chain(
            root.get_arguments()
                .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned())),
        )
        .chain([LOG_ENV.to_string()])
        .collect();
    environment.sort();
    environment.dedup();

    let doc = openapi_reference()?;
    let mut routes: Vec<Value> = Vec::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            let mut methods: Vec<String> = item
                .as_object()
                .map(|o| {
                    o.keys()
                        .filter(|k| {
                            matches!(
                                k.as_str(),
                                "get" | "put" | "post" | "delete" | "patch" | "head" | "options"
                            )
                        })
                        .map(|k| k.to_ascii_uppercase())
                        .collect()
                })
                .unwrap_or_default();
            methods.sort();
            routes.push(json!({"path": path, "methods": methods, "door": "api"}));
        }
    }
    for path in runcell_server::console::routes() {
        routes.push(json!({"path": path, "methods": ["GET"], "door": "console"}));
    }
    for (path, methods) in runcell_server::e2b::routes() {
        routes.push(json!({"path": path, "methods": methods, "door": "e2b"}));
    }
    for (path, method) in runcell_server::agent_sandbox::routes() {
        routes.push(json!({"path": path, "methods": [method], "door": "agent_sandbox"}));
    }
    let verdict_categories = doc
        .pointer("/components/schemas/ErrorCategory/enum")
        .cloned()
        .context("the OpenAPI document has no ErrorCategory enum")?;
    Ok(json!({
        "settings": settings,
        "environment": environment,
        "global_flags": global,
        "commands": commands,
        "routes": routes,
        "verdict_categories": verdict_categories,
        "api_categories": runcell_server::error::categories(),
        "metrics": runcell_server::metrics::family_names(),
        "rejection_reasons": runcell_server::metrics::rejection_reasons(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_has_a_description() {
        let md =
            settings_markdown(SETTINGS, &<crate::Cli as clap::CommandFactory>::command()).unwrap();
        for s in SETTINGS {
            assert!(md.contains(&format!("### `{}`", s.key)), "{}", s.key);
        }
    }

    #[test]
    fn a_setting_without_a_flag_or_a_help_fails_the_generator() {
        let bare = Setting {
            key: "nowhere.thing",
            arg: None,
            env: Some("RUNCELL_NOWHERE"),
            shape: Shape::One,
            help: None,
        };
        let e = settings_markdown(&[bare], &<crate::Cli as clap::CommandFactory>::command())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nowhere.thing") && e.contains("help"), "{e}");
    }

    #[test]
    fn defaults_come_out_of_the_help() {
        assert_eq!(
            split_default("Idle time [default: 10m]. More."),
            (Some("10m".into()), "Idle time. More.".into())
        );
        assert_eq!(split_default("No default."), (None, "No default.".into()));
    }
}
