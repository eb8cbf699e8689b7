//! The docs against the code, without running a sandbox.
//!
//! * The generated reference (docs/reference/) is what `runcell __reference` writes now.
//! * The guides (README.md, SECURITY.md, CHANGELOG.md, docs/**/*.md but docs/reference/)
//!   name only what exists: environment variables, the flags of `runcell SUBCOMMAND` command
//!   lines, HTTP routes (with their methods), error categories and metrics.
//! * And they name everything that matters: every route of the OpenAPI document, every error
//!   category, every metric family (the generated reference counts only for the settings).
//!
//! What exists comes from `runcell __reference names`, which reads the code (the settings
//! table, clap's commands, the OpenAPI document, the route tables, the error kinds, the
//! metrics registry). A failure names the item, the file and line, and what to do.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn reference(what: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_runcell"))
        .args(["__reference", what])
        .output()
        .expect("run runcell __reference");
    assert!(
        out.status.success(),
        "runcell __reference {what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn names() -> Value {
    serde_json::from_str(&reference("names")).expect("names is JSON")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// A Markdown file: its path from the repository's root and its text.
struct Doc {
    path: String,
    text: String,
}

impl Doc {
    fn lines(&self) -> impl Iterator<Item = (usize, &str)> {
        self.text.lines().enumerate().map(|(i, l)| (i + 1, l))
    }
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            markdown_under(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

fn read_doc(path: &Path) -> Doc {
    let rel = path
        .strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string();
    Doc {
        path: rel,
        text: std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    }
}

/// The guides: README.md, SECURITY.md, CHANGELOG.md (those present) and docs/**/*.md but the
/// generated reference.
fn guides() -> Vec<Doc> {
    let root = root();
    let mut paths: Vec<PathBuf> = ["README.md", "SECURITY.md", "CHANGELOG.md"]
        .iter()
        .map(|f| root.join(f))
        .filter(|p| p.exists())
        .collect();
    let mut docs = Vec::new();
    markdown_under(&root.join("docs"), &mut docs);
    docs.retain(|p| !p.starts_with(root.join("docs/reference")));
    docs.sort();
    paths.extend(docs);
    paths.iter().map(|p| read_doc(p)).collect()
}

/// The generated settings reference, which counts as a mention of a setting.
fn settings_reference() -> Doc {
    read_doc(&root().join("docs/reference/settings.md"))
}

/// Fail with every problem found, one a line.
fn report(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// Words of `[A-Za-z0-9_]` that start with `prefix`, with the line they are on.
fn tokens_with_prefix<'a>(doc: &'a Doc, prefix: &'a str) -> Vec<(usize, String, &'a str)> {
    let mut out = Vec::new();
    for (n, line) in doc.lines() {
        let bytes = line.as_bytes();
        let mut i = 0;
        while let Some(at) = line[i..].find(prefix) {
            let start = i + at;
            let boundary = start == 0 || {
                let c = bytes[start - 1];
                !(c.is_ascii_alphanumeric() || c == b'_')
            };
            let mut end = start + prefix.len();
            while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
                end += 1;
            }
            if boundary {
                out.push((n, line[start..end].to_string(), &line[end..]));
            }
            i = end.max(start + 1);
        }
    }
    out
}

#[test]
fn the_generated_reference_is_up_to_date() {
    let mut problems = Vec::new();
    for (what, file) in [
        ("settings", "docs/reference/settings.md"),
        ("openapi", "docs/reference/openapi.json"),
    ] {
        let want = reference(what);
        let have = std::fs::read_to_string(root().join(file)).unwrap_or_default();
        if have != want {
            let line = have
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .map_or_else(
                    || have.lines().count().min(want.lines().count()) + 1,
                    |i| i + 1,
                );
            problems.push(format!(
                "{file} differs from the code's (first at line {line}): regenerate it with \
                 `scripts/gen-reference.sh` (or `cargo run -p runcell -- __reference {what} > \
                 {file}`) and commit it"
            ));
        }
    }
    report("the generated reference is stale", &problems);
}

/// Variables only tests and scripts read: they are in the sources under crates/ and scripts/.
fn source_text() -> String {
    fn walk(dir: &Path, out: &mut String) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    walk(&p, out);
                }
            } else if let Ok(t) = std::fs::read_to_string(&p) {
                out.push_str(&t);
                out.push('\n');
            }
        }
    }
    let mut out = String::new();
    walk(&root().join("crates"), &mut out);
    walk(&root().join("scripts"), &mut out);
    out
}

#[test]
fn every_runcell_variable_the_docs_name_exists() {
    let names = names();
    let known: BTreeSet<String> = strings(&names["environment"]).into_iter().collect();
    let sources = source_text();
    let mut problems = Vec::new();
    for doc in guides() {
        for (n, var, _) in tokens_with_prefix(&doc, "RUNCELL_") {
            if var == "RUNCELL_" {
                continue;
            }
            // `RUNCELL_AGENT_*`: a family of variables.
            let ok = if var.ends_with('_') {
                known.iter().any(|k| k.starts_with(&var))
            } else {
                known.contains(&var) || sources.contains(&var)
            };
            if !ok {
                problems.push(format!(
                    "{}:{n}: {var} is no setting's variable, no global one, and appears in no \
                     source under crates/ or scripts/: fix the name in the guide (the \
                     variables are in docs/reference/settings.md)",
                    doc.path
                ));
            }
        }
    }
    report("unknown environment variables in the docs", &problems);
}

#[test]
fn every_setting_is_in_the_docs() {
    let names = names();
    let mut docs = guides();
    docs.push(settings_reference());
    let all: String = docs.iter().map(|d| d.text.as_str()).collect();
    let mut problems = Vec::new();
    for s in names["settings"].as_array().unwrap() {
        let key = s["key"].as_str().unwrap();
        let mut wanted = vec![format!("`{key}`")];
        if let Some(env) = s["env"].as_str() {
            wanted.push(env.to_string());
        }
        if let Some(flags) = s["flags"].as_object() {
            wanted.extend(flags.keys().cloned());
        }
        for w in wanted {
            if !all.contains(&w) {
                problems.push(format!(
                    "the setting {key}: {w} is in no guide and not in \
                     docs/reference/settings.md: regenerate the reference \
                     (scripts/gen-reference.sh) or document it"
                ));
            }
        }
    }
    report("settings missing from the docs", &problems);
}

/// The shell words of a command line: quotes group (and are dropped), a backslash-newline
/// continues the line; `|`, `;`, `&&`, `||`, `>`, `<`, `#` and `)` end the command.
fn shell_words(line: &str) -> Vec<(String, bool)> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                quoted = true;
                any = true;
                for d in chars.by_ref() {
                    if d == c {
                        break;
                    }
                    cur.push(d);
                }
            }
            c if c.is_whitespace() => {
                if any {
                    words.push((std::mem::take(&mut cur), quoted));
                    quoted = false;
                    any = false;
                }
            }
            '|' | ';' | '&' | '>' | '<' | ')' | '`' => {
                if any {
                    words.push((std::mem::take(&mut cur), quoted));
                }
                words.push((c.to_string(), false));
                quoted = false;
                any = false;
            }
            '#' if !any => break,
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push((cur, quoted));
    }
    words
}

/// The command lines of a guide, with the line each starts on: the lines of code blocks
/// (backslash continuations joined) and inline code spans.
fn command_lines(doc: &Doc) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in doc.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_block = !in_block;
            if let Some(p) = pending.take() {
                out.push(p);
            }
            continue;
        }
        if in_block {
            let (start, mut text) = pending.take().unwrap_or((n, String::new()));
            match line.trim_end().strip_suffix('\\') {
                Some(head) => {
                    text.push_str(head);
                    text.push(' ');
                    pending = Some((start, text));
                }
                None => {
                    text.push_str(line);
                    out.push((start, text));
                }
            }
        } else {
            // Inline code spans.
            let mut parts = line.split('`');
            parts.next();
            while let Some(code) = parts.next() {
                out.push((n, code.to_string()));
                parts.next();
            }
        }
    }
    out
}

#[test]
fn every_flag_of_a_runcell_command_line_exists() {
    let names = names();
    let global: BTreeSet<String> = strings(&names["global_flags"]).into_iter().collect();
    let commands: BTreeMap<String, BTreeSet<String>> = names["commands"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(c, f)| (c.clone(), strings(f).into_iter().collect()))
        .collect();
    let mut problems = Vec::new();
    for doc in guides() {
        problems.extend(flag_problems(&doc, &commands, &global));
    }
    report("unknown flags in runcell command lines", &problems);
}

/// The flags of a guide's `runcell` command lines that its command does not take.
fn flag_problems(
    doc: &Doc,
    commands: &BTreeMap<String, BTreeSet<String>>,
    global: &BTreeSet<String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    {
        for (n, line) in command_lines(doc) {
            let words = shell_words(&line);
            let mut i = 0;
            while i < words.len() {
                let (w, quoted) = &words[i];
                i += 1;
                // The binary, or a container image of it (`localhost/runcell:dev run ...`).
                let program = w.split(':').next().unwrap_or_default();
                if *quoted || !(program == "runcell" || program.ends_with("/runcell")) {
                    continue;
                }
                // The value of another program's flag (`podman run --name runcell ...`).
                if w == "runcell" && i >= 2 && words[i - 2].0.starts_with("--") {
                    continue;
                }
                // `cargo run -p runcell -- serve ...`.
                if words.get(i).is_some_and(|(w, _)| w == "--") {
                    i += 1;
                }
                let Some((next, _)) = words.get(i) else {
                    continue;
                };
                let (command, flags) = match commands.get(next) {
                    Some(flags) => {
                        i += 1;
                        (Some(next.clone()), Some(flags))
                    }
                    None if next.starts_with("--") => (None, None),
                    // Prose, a file name, a hidden role: not a command line.
                    None => continue,
                };
                while let Some((w, quoted)) = words.get(i) {
                    if !*quoted && w.len() == 1 && "|;&><)`".contains(w.as_str()) {
                        break;
                    }
                    i += 1;
                    if *quoted || !w.starts_with("--") || w == "--" {
                        continue;
                    }
                    let flag = w.split('=').next().unwrap_or_default().to_string();
                    // A placeholder such as `--flag ...` or `--FLAG`.
                    if !flag[2..]
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    {
                        continue;
                    }
                    let ok = global.contains(&flag) || flags.is_some_and(|f| f.contains(&flag));
                    if !ok {
                        let what = command
                            .as_deref()
                            .map_or("runcell".to_string(), |c| format!("runcell {c}"));
                        problems.push(format!(
                            "{}:{n}: `{what}` has no flag {flag}: fix the command line (`{what} \
                             --help` lists the flags)",
                            doc.path
                        ));
                    }
                }
            }
        }
    }
    problems
}

/// A route of the code: its path template's segments, methods and door.
struct Route {
    path: String,
    segments: Vec<String>,
    methods: Vec<String>,
    door: String,
}

fn routes(names: &Value) -> Vec<Route> {
    names["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let path = r["path"].as_str().unwrap().to_string();
            Route {
                segments: path
                    .split('/')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
                path,
                methods: strings(&r["methods"]),
                door: r["door"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

/// Whether a path as a guide writes it (`/v1/sessions/$ID/files/a.txt`) is `route`'s: a
/// parameter of the route takes any segment (`{*path}` the rest), and a guide's `...` or `*`
/// stands for the rest.
fn route_matches(route: &Route, written: &[&str]) -> bool {
    let mut i = 0;
    for seg in &route.segments {
        if seg.starts_with("{*") {
            return true;
        }
        let Some(w) = written.get(i) else {
            return false;
        };
        if *w == "..." || *w == "*" {
            return true;
        }
        if !(seg.starts_with('{') || seg == w) {
            return false;
        }
        i += 1;
    }
    i == written.len() || written[i..] == ["..."] || written[i..] == ["*"]
}

/// Paths of the model APIs runcell talks to (upstreams), not runcell's own.
const UPSTREAM_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/models",
    "/v1/responses",
];

/// The prefixes of runcell's routes that a guide's path is checked for.
const ROUTE_PREFIXES: &[&str] = &[
    "/v1/",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/mcp",
    "/console",
    "/e2b/",
];

/// The routes a guide names: (line, method if one is written before it, path segments).
fn routes_named(doc: &Doc) -> Vec<(usize, Option<String>, String)> {
    let mut out = Vec::new();
    for (n, line) in doc.lines() {
        let bytes = line.as_bytes();
        for prefix in ROUTE_PREFIXES {
            let mut from = 0;
            while let Some(at) = line[from..].find(prefix) {
                let start = from + at;
                from = start + 1;
                // The word the path ends: a path of its own, a URL or a variable's value
                // (`http://localhost:8080/v1/execute`, `$RUNCELL/v1/execute`), or part of
                // something else (docs/mcp.md, ../metrics.md, https://api.openai.com/v1/x).
                let word_start = line[..start]
                    .rfind(|c: char| c.is_whitespace() || "`'\"(<[=".contains(c))
                    .map_or(0, |i| i + 1);
                let head = &line[word_start..start];
                if !head.is_empty() && !head.starts_with('$') && !head.starts_with('{') {
                    let local = head.split_once("://").is_some_and(|(_, host)| {
                        ["localhost", "127.0.0.1", "0.0.0.0", "[::1]", "$", "runcell"]
                            .iter()
                            .any(|h| host.starts_with(h))
                    });
                    if !local {
                        continue;
                    }
                }
                let mut end = start;
                while end < bytes.len()
                    && !bytes[end].is_ascii_whitespace()
                    && !b"`'\"),;|[]".contains(&bytes[end])
                {
                    end += 1;
                }
                let mut path = &line[start..end];
                path = path.split(['?', '#']).next().unwrap_or_default();
                path = path.trim_end_matches(['.', ':', '!']);
                let before = &line[..start];
                if UPSTREAM_PATHS.contains(&path) || path.ends_with(".md") {
                    continue;
                }
                let method = before
                    .trim_end()
                    .rsplit(|c: char| !c.is_ascii_uppercase())
                    .next()
                    .filter(|m| ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"].contains(m))
                    .map(str::to_string);
                out.push((n, method, path.to_string()));
            }
        }
    }
    out
}

fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

#[test]
fn every_route_the_docs_name_exists_and_every_api_route_is_named() {
    let names = names();
    let routes = routes(&names);
    let mut problems = Vec::new();
    let mut named: BTreeSet<String> = BTreeSet::new();
    for doc in guides() {
        for (n, method, path) in routes_named(&doc) {
            let written = segments(&path);
            // A prefix alone (`/v1/`, `/e2b/`), as in "the /v1/ routes".
            if written.len() <= 1 && path.ends_with('/') {
                continue;
            }
            let matching: Vec<&Route> = routes
                .iter()
                .filter(|r| r.door != "agent_sandbox" && route_matches(r, &written))
                .collect();
            if matching.is_empty() {
                problems.push(format!(
                    "{}:{n}: {path} is no route of runcell: fix the path in the guide (the \
                     routes are in docs/reference/openapi.json, and the E2B door's under /e2b)",
                    doc.path
                ));
                continue;
            }
            named.extend(matching.iter().map(|r| r.path.clone()));
            if let Some(m) = method {
                if !matching.iter().any(|r| r.methods.contains(&m)) {
                    let allowed: BTreeSet<&String> =
                        matching.iter().flat_map(|r| &r.methods).collect();
                    problems.push(format!(
                        "{}:{n}: {m} {path}: the route takes {allowed:?}, not {m}: fix the \
                         method in the guide",
                        doc.path
                    ));
                }
            }
        }
    }
    for r in routes.iter().filter(|r| r.door == "api") {
        if !named.contains(&r.path) {
            problems.push(format!(
                "the route {} {} is in the OpenAPI document but no guide names it: document \
                 it (docs/http-api.md, docs/serve.md, ...)",
                r.methods.join(","),
                r.path
            ));
        }
    }
    report("routes in the docs", &problems);
}

/// Categories a guide may show beside the error categories: `ok`, the outcome of a run or
/// request that did not fail (metrics labels, the audit log).
const NOT_AN_ERROR: &[&str] = &["ok"];

#[test]
fn every_error_category_is_in_the_guides_and_every_one_they_show_exists() {
    let names = names();
    let verdict: Vec<String> = strings(&names["verdict_categories"]);
    let api: Vec<String> = strings(&names["api_categories"]);
    let guides = guides();
    let all: String = guides.iter().map(|d| d.text.as_str()).collect();
    let mut problems = Vec::new();
    for (kind, list) in [("verdict", &verdict), ("API error", &api)] {
        for c in list {
            if !all.contains(&format!("`{c}`")) && !all.contains(&format!("\"{c}\"")) {
                problems.push(format!(
                    "the {kind} category {c} is in no guide (as `{c}` or \"{c}\"): document \
                     it (docs/results.md for verdicts, docs/http-api.md for API errors)"
                ));
            }
        }
    }
    let known: BTreeSet<&str> = verdict
        .iter()
        .chain(&api)
        .map(String::as_str)
        .chain(NOT_AN_ERROR.iter().copied())
        .collect();
    let reasons: BTreeSet<String> = strings(&names["rejection_reasons"]).into_iter().collect();
    for doc in &guides {
        for (n, line) in doc.lines() {
            for pattern in [
                "\"category\": \"",
                "\"category\":\"",
                "category=\"",
                "reason=\"",
            ] {
                let known_here = |v: &str| {
                    if pattern == "reason=\"" {
                        reasons.contains(v)
                    } else {
                        known.contains(v)
                    }
                };
                let mut from = 0;
                while let Some(at) = line[from..].find(pattern) {
                    let start = from + at + pattern.len();
                    from = start;
                    let value: String = line[start..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !value.is_empty() && !known_here(&value) {
                        problems.push(format!(
                            "{}:{n}: the {} {value:?} does not exist: fix it in the guide \
                             (`runcell __reference names` lists them)",
                            doc.path,
                            if pattern == "reason=\"" {
                                "rejection reason"
                            } else {
                                "category"
                            }
                        ));
                    }
                }
            }
        }
    }
    report("error categories in the docs", &problems);
}

/// `runcell_...` words of the guides that are not metrics, each with the reason.
const NOT_METRICS: &[(&str, &str)] = &[
    ("runcell_tool", "the agent API's tool type"),
    (
        "runcell_runner",
        "the interpreter's file, runcell_runner.py",
    ),
    ("runcell_plots", "the Python helper module for figures"),
    ("runcell_network_approval", "the MCP elicitation's key"),
    (
        "runcell_saturation",
        "the HPA's External metric, derived by the adapter rule in deploy/k8s",
    ),
];

/// Prometheus' names of a family's samples.
const SAMPLE_SUFFIXES: &[&str] = &["", "_total", "_bucket", "_sum", "_count", "_created"];

#[test]
fn every_metric_is_in_the_guides_and_every_one_they_name_exists() {
    let names = names();
    let families: Vec<String> = strings(&names["metrics"]);
    // The workspace's crates (`runcell_core::Verdict`, `RUNCELL_LOG=runcell_server=debug`).
    let crates: Vec<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().replace('-', "_"))
        .collect();
    let guides = guides();
    let mut problems = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for doc in &guides {
        for prefix in ["runcell_", "process_"] {
            for (n, word, _) in tokens_with_prefix(doc, prefix) {
                let family = families
                    .iter()
                    .find(|f| SAMPLE_SUFFIXES.iter().any(|s| word == format!("{f}{s}")));
                match family {
                    Some(f) => {
                        seen.insert(f.clone());
                    }
                    None if prefix == "process_" => {}
                    None if crates.contains(&word)
                        || NOT_METRICS.iter().any(|(w, _)| *w == word) => {}
                    None => problems.push(format!(
                        "{}:{n}: {word} is no metric of the server: fix the name in the guide \
                         (GET /metrics lists them), or, if it is not meant as a metric, add it \
                         to NOT_METRICS in crates/runcell/tests/docs.rs with the reason",
                        doc.path
                    )),
                }
            }
        }
    }
    for f in &families {
        if !seen.contains(f) {
            problems.push(format!(
                "the metric {f} is in no guide: document it in docs/serve.md's list of metrics"
            ));
        }
    }
    report("metrics in the docs", &problems);
}

#[test]
fn the_checks_read_command_lines_and_routes_as_meant() {
    let words: Vec<String> = shell_words("runcell run -c 'ls --color' --json | jq . # --nope")
        .into_iter()
        .map(|(w, _)| w)
        .collect();
    assert_eq!(
        words,
        [
            "runcell",
            "run",
            "-c",
            "ls --color",
            "--json",
            "|",
            "jq",
            "."
        ]
    );
    let doc = Doc {
        path: "x.md".into(),
        text: "```sh\nruncell serve \\\n  --listen :8080\n```\nSee `runcell doctor --json`.".into(),
    };
    let lines: Vec<String> = command_lines(&doc).into_iter().map(|(_, l)| l).collect();
    let commands = BTreeMap::from([("run".to_string(), BTreeSet::from(["--json".to_string()]))]);
    let global = BTreeSet::from(["--config".to_string()]);
    let flags = Doc {
        path: "y.md".into(),
        text: "```sh\npodman run --name runcell --privileged localhost/runcell:dev run \
               --json \\\n  --nope\n```\n`runcell --config x run --bad`"
            .into(),
    };
    let found = flag_problems(&flags, &commands, &global);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("y.md:2: `runcell run` has no flag --nope"),
        "{found:?}"
    );
    assert!(found[1].contains("--bad"), "{found:?}");
    assert!(lines
        .iter()
        .any(|l| l.contains("runcell serve") && l.contains("--listen")));
    assert!(lines.contains(&"runcell doctor --json".to_string()));
    let doc = Doc {
        path: "x.md".into(),
        text: "POST /v1/sessions/$ID/execute, docs/mcp.md, https://api.openai.com/v1/x, \
               curl http://localhost:8080/healthz?x=1"
            .into(),
    };
    let named: Vec<(Option<String>, String)> = routes_named(&doc)
        .into_iter()
        .map(|(_, m, p)| (m, p))
        .collect();
    assert_eq!(
        named,
        [
            (Some("POST".into()), "/v1/sessions/$ID/execute".into()),
            (None, "/healthz".into())
        ]
    );
    let route = Route {
        path: "/v1/sessions/{id}/files/{path}".into(),
        segments: ["v1", "sessions", "{id}", "files", "{path}"]
            .map(String::from)
            .to_vec(),
        methods: vec![],
        door: "api".into(),
    };
    assert!(route_matches(
        &route,
        &segments("/v1/sessions/ses_1/files/a.txt")
    ));
    assert!(!route_matches(
        &route,
        &segments("/v1/sessions/ses_1/file/a.txt")
    ));
    assert!(route_matches(&route, &segments("/v1/sessions/...")));
}
