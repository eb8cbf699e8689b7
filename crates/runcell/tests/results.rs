//! Rich, notebook-like results of session calls (issue 22), through the real HTTP API: the
//! last expression's value and `display()` as MIME bundles, figures as PNG, an exception's
//! name, value and traceback, a flood of results bounded with a warning, per-call environment
//! variables undone after the call, and Node's last value. (MCP's image blocks are in
//! tests/mcp.rs.)

mod common;

use std::time::Duration;

use base64::Engine as _;
use common::ServeProcess;
use reqwest::blocking::Client;
use serde_json::{json, Value};

const KEY: &str = "results-key-0123456789abc";

fn server() -> ServeProcess {
    ServeProcess::start(&["--pool", "python=0", "--api-key", KEY], &[])
}

fn post(s: &ServeProcess, path: &str, body: Value) -> (u16, Value) {
    let res = Client::builder()
        .timeout(Duration::from_secs(180))
        .build()
        .unwrap()
        .post(s.url(path))
        .header("authorization", format!("Bearer {KEY}"))
        .json(&body)
        .send()
        .expect("request");
    let status = res.status().as_u16();
    let text = res.text().unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn create(s: &ServeProcess, body: Value) -> String {
    let (st, v) = post(s, "/v1/sessions", body);
    assert_eq!(st, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

fn exec(s: &ServeProcess, id: &str, body: Value) -> Value {
    let (st, v) = post(s, &format!("/v1/sessions/{id}/execute"), body);
    assert_eq!(st, 200, "{v}");
    v
}

fn code(s: &ServeProcess, id: &str, code: &str) -> Value {
    exec(s, id, json!({ "code": code }))
}

fn results(v: &Value) -> &Vec<Value> {
    v["results"].as_array().unwrap_or_else(|| panic!("{v}"))
}

fn has(lang: &str) -> bool {
    let language = runcell_runtimes::Language::parse(lang).unwrap();
    runcell_runtimes::locate(language, &runcell_runtimes::Host::default()).is_ok()
}

#[test]
fn python_cells_return_notebook_results() {
    let s = server();
    let id = create(&s, json!({"language": "python"}));

    // The last expression's value: the main result, and (as before) on stdout.
    let v = code(&s, &id, "x = 41\nx + 1");
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["stdout"], "42\n", "{v}");
    let r = results(&v);
    assert_eq!(r.len(), 1, "{v}");
    assert_eq!(r[0]["is_main_result"], true);
    assert_eq!(r[0]["data"]["text/plain"], "42");
    assert!(v.get("exception").is_none(), "{v}");

    // Nothing displayed: no results, and nothing of the previous call.
    let v = code(&s, &id, "y = 1");
    assert_eq!(results(&v).len(), 0, "{v}");

    // display() in order, with the objects' own MIME types; the value None is not shown.
    let v = code(
        &s,
        &id,
        "class Md:\n    def _repr_markdown_(self): return '**bold**'\n    def __repr__(self): return 'Md()'\n\
         class J:\n    def _repr_json_(self): return {'a': [1, 2]}\n\
         display('first')\ndisplay(Md(), J())\nNone",
    );
    let r = results(&v);
    assert_eq!(r.len(), 3, "{v}");
    assert_eq!(r[0]["data"]["text/plain"], "'first'");
    assert_eq!(r[1]["data"]["text/markdown"], "**bold**");
    assert_eq!(r[1]["data"]["text/plain"], "Md()");
    assert_eq!(r[2]["data"]["application/json"], json!({"a": [1, 2]}));
    assert!(r.iter().all(|x| x["is_main_result"] == false), "{v}");
    let v = code(
        &s,
        &id,
        "display({'text/html': '<i>x</i>', 'text/plain': 'x'}, {'text/markdown': '# t'}, raw=True)",
    );
    let r = results(&v);
    assert_eq!(
        r[0]["data"],
        json!({"text/html": "<i>x</i>", "text/plain": "x"}),
        "{v}"
    );
    assert_eq!(r[1]["data"]["text/markdown"], "# t", "{v}");
    assert!(r[1]["data"]["text/plain"].is_string(), "{v}");

    // A repr with a lone surrogate (not UTF-8) is still reported, the surrogate replaced.
    let v = code(
        &s,
        &id,
        "class S:\n    def __repr__(self): return 'a\\udcffb'\nS()",
    );
    assert_eq!(results(&v)[0]["data"]["text/plain"], "a?b", "{v}");

    // A DataFrame: HTML and plain text.
    let v = code(
        &s,
        &id,
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})",
    );
    let r = results(&v);
    assert_eq!(r.len(), 1, "{v}");
    assert_eq!(r[0]["is_main_result"], true);
    assert!(r[0]["data"]["text/html"]
        .as_str()
        .unwrap()
        .contains("<table"));
    assert!(r[0]["data"]["text/plain"]
        .as_str()
        .unwrap()
        .contains("a  b"));

    // A figure shown with plt.show(): a PNG that is not the main result; still saved as a file.
    let v = code(
        &s,
        &id,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
    );
    assert_eq!(v["exit_code"], 0, "{v}");
    let r = results(&v);
    assert_eq!(r.len(), 1, "{v}");
    assert_eq!(r[0]["is_main_result"], false);
    assert_eq!(
        r[0]["data"]["text/plain"],
        "<Figure size 640x480 with 1 Axes>"
    );
    let png = base64::engine::general_purpose::STANDARD
        .decode(r[0]["data"]["image/png"].as_str().unwrap())
        .unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"].as_str().unwrap().starts_with("figures/")),
        "{v}"
    );

    // A plot left open, and the plot call as the last expression: its value is the main
    // result, the figure (displayed at the cell's end) comes after it.
    let v = code(&s, &id, "plt.plot([1, 2])");
    let r = results(&v);
    assert_eq!(r.len(), 2, "{v}");
    assert_eq!(r[0]["is_main_result"], true, "{v}");
    assert!(r[0]["data"]["text/plain"]
        .as_str()
        .unwrap()
        .contains("Line2D"));
    assert_eq!(r[1]["is_main_result"], false, "{v}");
    assert!(r[1]["data"]["image/png"].is_string(), "{v}");

    // SVG, asked the matplotlib way.
    let v = code(
        &s,
        &id,
        "plt.rcParams['savefig.format'] = 'svg'\nfig = plt.figure()\nplt.plot([1, 2])\nfig",
    );
    let r = results(&v);
    assert_eq!(r.len(), 1, "figure shown once: {v}");
    assert_eq!(r[0]["is_main_result"], true);
    assert!(r[0]["data"]["image/svg+xml"]
        .as_str()
        .unwrap()
        .contains("<svg"));
}

#[test]
fn an_exception_is_reported_by_name_value_and_traceback() {
    let s = server();
    let id = create(&s, json!({"language": "python"}));
    let v = code(&s, &id, "display(1)\ndef f():\n    return 1 / 0\nf()");
    assert_eq!(v["exit_code"], 1, "{v}");
    let e = &v["exception"];
    assert_eq!(e["name"], "ZeroDivisionError", "{v}");
    assert_eq!(e["value"], "division by zero");
    let tb = e["traceback"].as_str().unwrap();
    assert!(tb.starts_with("Traceback (most recent call last):"), "{tb}");
    assert!(tb.contains("<cell 1>") && tb.contains("in f"), "{tb}");
    // Without the runner's frames, as printed on stderr.
    assert!(!tb.contains("runcell"), "{tb}");
    assert!(v["stderr"].as_str().unwrap().contains("ZeroDivisionError"));
    // What was displayed before the exception is kept.
    assert_eq!(results(&v).len(), 1, "{v}");
    // The next call has none.
    let v = code(&s, &id, "1");
    assert!(v.get("exception").is_none(), "{v}");
    // A timeout interrupts the cell: KeyboardInterrupt, and what it displayed before.
    let v = exec(
        &s,
        &id,
        json!({"code": "display('before')\nwhile True: pass", "timeout": 1}),
    );
    assert_eq!(v["error"]["category"], "timeout", "{v}");
    assert_eq!(v["exception"]["name"], "KeyboardInterrupt", "{v}");
    assert_eq!(results(&v)[0]["data"]["text/plain"], "'before'", "{v}");
    assert_eq!(v["state_lost"], false, "{v}");
}

#[test]
fn a_flood_of_results_is_bounded_with_a_warning() {
    let s = server();
    let id = create(&s, json!({"language": "python"}));
    // Many small results, then big ones past the byte cap.
    let v = code(
        &s,
        &id,
        "for i in range(300): display(i)\nfor i in range(20): display('x' * (1 << 20))",
    );
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(results(&v).len(), 100);
    assert!(
        v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("dropped")),
        "{}",
        v["warnings"]
    );
    // The cap is the results' own: a call's small output limit (stdout, stderr) does not cut
    // them.
    let v = exec(
        &s,
        &id,
        json!({"code": "display('y' * 300000)", "output": "100KB"}),
    );
    assert_eq!(results(&v).len(), 1, "{v}");
}

#[test]
fn per_call_env_is_set_for_that_call_only() {
    let s = server();
    for (lang, read) in [
        ("python", "import os\nprint(os.environ.get('GREETING', 'unset'), os.environ.get('KEEP'))"),
        ("node", "console.log(process.env.GREETING ?? 'unset', process.env.KEEP)"),
        ("ruby", "puts \"#{ENV['GREETING'] || 'unset'} #{ENV['KEEP']}\""),
        ("bash", "echo \"${GREETING:-unset} $KEEP\""),
        ("go", "package main\nimport (\"fmt\"; \"os\")\nfunc main() { g := os.Getenv(\"GREETING\"); if g == \"\" { g = \"unset\" }; fmt.Println(g, os.Getenv(\"KEEP\")) }"),
    ] {
        if !has(lang) {
            eprintln!("skipping {lang}: not installed");
            continue;
        }
        let id = create(&s, json!({"language": lang, "env": {"KEEP": "session"}}));
        let v = exec(
            &s,
            &id,
            json!({"code": read, "env": {"GREETING": "hello", "KEEP": "call"}}),
        );
        assert_eq!(v["stdout"], "hello call\n", "{lang}: {v}");
        let v = exec(&s, &id, json!({ "code": read }));
        assert_eq!(v["stdout"], "unset session\n", "{lang}: {v}");
        // Validated as at creation.
        let (st, v) = post(
            &s,
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": read, "env": {"PATH": "/evil"}}),
        );
        assert_eq!(st, 400, "{lang}: {v}");
        let (st, v) = post(
            &s,
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": read, "env": {"1BAD": "x"}}),
        );
        assert_eq!(st, 400, "{lang}: {v}");
    }
}

#[test]
fn node_cells_return_their_last_value() {
    if !has("node") {
        eprintln!("skipping: node is not installed");
        return;
    }
    let s = server();
    let id = create(&s, json!({"language": "node"}));
    let v = code(&s, &id, "const o = {a: 1, b: [1, 2]};\no");
    let r = results(&v);
    assert_eq!(r.len(), 1, "{v}");
    assert_eq!(r[0]["is_main_result"], true);
    assert_eq!(r[0]["data"]["text/plain"], "{ a: 1, b: [ 1, 2 ] }");
    let v = code(&s, &id, "let z = 1;");
    assert_eq!(results(&v).len(), 0, "{v}");
    let v = code(&s, &id, "null.x");
    assert_eq!(v["exception"]["name"], "TypeError", "{v}");
}

#[test]
fn ruby_cells_return_their_last_value() {
    if !has("ruby") {
        eprintln!("skipping: ruby is not installed");
        return;
    }
    let s = server();
    let id = create(&s, json!({"language": "ruby"}));
    let v = code(&s, &id, "h = {a: 1}\nh");
    let r = results(&v);
    assert_eq!(r.len(), 1, "{v}");
    assert_eq!(r[0]["is_main_result"], true);
    assert!(
        ["{:a=>1}", "{a: 1}"].contains(&r[0]["data"]["text/plain"].as_str().unwrap()),
        "{v}"
    );
    // nil (what `puts` returns) is not shown.
    let v = code(&s, &id, "puts 1");
    assert_eq!(results(&v).len(), 0, "{v}");
    let v = code(&s, &id, "raise ArgumentError, 'no'");
    assert_eq!(v["exception"]["name"], "ArgumentError", "{v}");
    assert_eq!(v["exception"]["value"], "no", "{v}");
    assert!(
        v["exception"]["traceback"]
            .as_str()
            .unwrap()
            .contains("<cell 3>"),
        "{v}"
    );
}

/// The report is written by code the cell controls (the runner's own functions are within its
/// reach): a link planted in its place is never followed by the host, a FIFO never blocks it,
/// an oversized or malformed one is dropped with a warning, and none of it harms the session.
#[test]
fn a_forged_report_is_never_trusted() {
    let s = server();
    // The cell replaces the runner's writer of the report with its own.
    let forge = |how: &str| {
        format!(
            "import os\n\
             open('/workspace/secret.json', 'w').write('{{\"results\": [{{\"data\": {{\"text/plain\": \"leaked\"}}}}]}}')\n\
             def forged(self, path):\n    os.unlink(path) if os.path.lexists(path) else None\n    {how}\n\
             display.__func__.__globals__['_Shown'].write = forged\n"
        )
    };
    let cases = [
        (
            "a link",
            forge("os.symlink('/workspace/secret.json', path)"),
            None,
        ),
        ("a fifo", forge("os.mkfifo(path)"), None),
        (
            "too large",
            forge("open(path, 'w').write(' ' * (9 << 20))"),
            Some("results were dropped"),
        ),
        (
            "not json",
            forge("open(path, 'w').write('{\"results\": [')"),
            Some("not valid"),
        ),
        (
            "bad bundles",
            forge("open(path, 'w').write('{\"results\": [{\"data\": {\"Bad Key\": 1}}, 7]}')"),
            Some("2 displayed result(s) were dropped"),
        ),
    ];
    for (name, cell, warning) in cases {
        let id = create(&s, json!({"language": "python"}));
        let v = code(&s, &id, &cell);
        assert_eq!(v["exit_code"], 0, "{name}: {v}");
        // The cell after the one that replaced the writer reports through it.
        let v = code(&s, &id, "display('shown')\n1");
        assert_eq!(v["exit_code"], 0, "{name}: {v}");
        assert!(!v.to_string().contains("leaked"), "{name}: {v}");
        assert!(
            v.get("results").is_none_or(|r| r == &json!([])),
            "{name}: {v}"
        );
        let warnings = v["warnings"].as_array().cloned().unwrap_or_default();
        match warning {
            Some(w) => assert!(
                warnings.iter().any(|x| x.as_str().unwrap().contains(w)),
                "{name}: {v}"
            ),
            None => assert!(warnings.is_empty(), "{name}: {v}"),
        }
        // The session is unharmed.
        let v = code(&s, &id, "print(2)");
        assert_eq!(v["stdout"], "2\n", "{name}: {v}");
        assert_eq!(v["state_lost"], false, "{name}: {v}");
    }
}
