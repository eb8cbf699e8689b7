//! A verdict as an MCP tool result:
//!
//! * one text block a model reads first: exit code, stdout and stderr (trimmed to a readable
//!   size, the cut said in place), and on failure the error category, its message and whether
//!   changing the code can help;
//! * an image block for each PNG or JPEG the program wrote (plots);
//! * a session call's displayed results (docs/results.md): PNG and JPEG as image blocks (a
//!   figure that is also a returned file is shown once), every other result as a text block
//!   in the form a model reads best, `text/markdown` where offered, else `text/plain` (never
//!   HTML), each bounded; the full bundles are in `structuredContent.results`;
//! * the other files as embedded resources (small ones) or resource links (large ones, or
//!   those over the content cap);
//! * `structuredContent`: the whole verdict, as the tool's `outputSchema` declares it;
//! * `isError: true` for every verdict with an error: a non-zero exit, a limit, an invalid
//!   request. These are results the model can act on, never protocol errors.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock, Resource, ResourceContents};
use runcell_core::units::format_size;
use runcell_core::verdict::{ErrorCategory, OutputFile};
use runcell_core::Verdict;

use crate::context::Rejection;

/// How much of stdout the text block shows: the start and, mostly, the end (where results
/// and errors are).
const STDOUT_HEAD: usize = 2 * 1024;
const STDOUT_TAIL: usize = 6 * 1024;
/// The same for stderr, where the end matters even more (the traceback's last line).
const STDERR_HEAD: usize = 1024;
const STDERR_TAIL: usize = 3 * 1024;
/// Files up to this size are embedded; larger ones are linked (their content stays in
/// `structuredContent`).
const EMBED_MAX_BYTES: u64 = 1 << 20;

/// How much of one displayed result's text a block shows (head and tail), and how many
/// results get a block of their own (the rest are in structuredContent.results).
const RESULT_HEAD: usize = 2 * 1024;
const RESULT_TAIL: usize = 2 * 1024;
const RESULT_BLOCKS_MAX: usize = 20;

/// Where a file of the run is said to be. Not a `file:` URI: the file is not on the client's
/// machine, it came back from the sandbox.
pub fn file_uri(path: &str) -> String {
    let mut uri = String::from("runcell:///workspace/");
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                uri.push(b as char)
            }
            _ => uri.push_str(&format!("%{b:02X}")),
        }
    }
    uri
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// `text` cut to its first `head` and last `tail` bytes (at character boundaries, at line
/// boundaries when one is near), with a note in the middle of how much was left out.
pub fn trim_middle(text: &str, head: usize, tail: usize, field: &str) -> String {
    // Not worth cutting for less than a line or so.
    if text.len() <= head + tail + 256 {
        return text.to_string();
    }
    let mut h = floor_boundary(text, head);
    if let Some(nl) = text[..h].rfind('\n') {
        if h - nl < 200 {
            h = nl + 1;
        }
    }
    let mut t = ceil_boundary(text, text.len() - tail);
    if let Some(nl) = text[t..].find('\n') {
        if nl < 200 {
            t += nl + 1;
        }
    }
    let cut = t - h;
    let mut out = String::with_capacity(h + (text.len() - t) + 120);
    out.push_str(&text[..h]);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "[... {} ({cut} bytes) cut here; the full {field} is in structuredContent.{field} ...]\n",
        format_size(cut as u64)
    ));
    out.push_str(&text[t..]);
    out
}

fn is_image(f: &OutputFile) -> bool {
    matches!(f.mime_type.as_str(), "image/png" | "image/jpeg")
}

fn is_text_mime(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/xml"
                | "application/javascript"
                | "application/x-sh"
                | "application/toml"
                | "application/yaml"
                | "application/x-yaml"
        )
}

/// What the model should take from an error: can a changed program succeed?
fn advice(category: ErrorCategory) -> &'static str {
    match category {
        ErrorCategory::InvalidRequest => "Fix the tool arguments and call again.",
        ErrorCategory::RuntimeUnavailable | ErrorCategory::SandboxFailure => {
            "Changing the code will not help: this is a problem with the server, not with the \
             program."
        }
        ErrorCategory::Timeout => {
            "Changing the code can help: make it faster, or ask for a longer `timeout`."
        }
        _ => "Changing the code can help.",
    }
}

/// The text block: what happened, in a few hundred lines at most.
pub fn summary(v: &Verdict) -> String {
    let mut s = String::new();
    if let Some(id) = &v.session_id {
        s.push_str(&format!(
            "session_id: {id} (call {}; pass this session_id to run more code with this \
             state{})\n",
            v.execution_count.unwrap_or(0),
            if v.state_lost == Some(true) {
                "; NOTE: the session's earlier state was lost, see the warnings"
            } else {
                ""
            }
        ));
    }
    match (v.exit_code, &v.error) {
        (Some(code), _) => {
            s.push_str(&format!("exit code {code}, {:.3} s", v.execution_time));
            if let Some(c) = v.compile_time {
                s.push_str(&format!(" (compiled in {c:.3} s)"));
            }
            s.push('\n');
        }
        (None, _) => s.push_str("the program did not run\n"),
    }
    if let Some(e) = &v.error {
        s.push_str(&format!(
            "error: {}: {}\n{}\n",
            e.category.as_str(),
            e.message,
            advice(e.category)
        ));
    }
    let stream = |s: &mut String, name: &str, text: &str, truncated: bool, head, tail| {
        if text.is_empty() && !truncated {
            return;
        }
        s.push_str(&format!("--- {name} ---\n"));
        s.push_str(&trim_middle(text, head, tail, name));
        if !text.ends_with('\n') && !text.is_empty() {
            s.push('\n');
        }
        if truncated {
            s.push_str(&format!(
                "[{name} went past the output cap; what came after it was discarded]\n"
            ));
        }
    };
    stream(
        &mut s,
        "stdout",
        &v.stdout,
        v.stdout_truncated,
        STDOUT_HEAD,
        STDOUT_TAIL,
    );
    stream(
        &mut s,
        "stderr",
        &v.stderr,
        v.stderr_truncated,
        STDERR_HEAD,
        STDERR_TAIL,
    );
    if v.exit_code.is_some() && v.stdout.is_empty() && v.stderr.is_empty() {
        s.push_str("(no output)\n");
    }
    if !v.files.is_empty() || v.files_omitted > 0 {
        s.push_str("--- files in /workspace ---\n");
        for f in &v.files {
            let how = match (&f.content_base64, is_image(f)) {
                (None, _) => ", content not returned: over the size cap",
                (Some(_), true) => ", shown as an image",
                (Some(_), false) if f.size <= EMBED_MAX_BYTES => ", attached",
                (Some(_), false) => ", content in structuredContent.files[].content_base64",
            };
            s.push_str(&format!(
                "{} ({}, {}{how})\n",
                f.path,
                f.mime_type,
                format_size(f.size)
            ));
        }
        if v.files_omitted > 0 {
            s.push_str(&format!(
                "{} more file(s) not returned: over the file-count cap, or a path that cannot be \
                 returned as it is (not UTF-8, over 1024 bytes)\n",
                v.files_omitted
            ));
        }
    }
    if let Some(e) = &v.exception {
        s.push_str(&format!(
            "--- exception ---\n{}: {}\n",
            e.name,
            trim_middle(&e.value, STDERR_HEAD, STDERR_HEAD, "exception.value")
        ));
    }
    if let Some(results) = v.results.as_ref().filter(|r| !r.is_empty()) {
        s.push_str(&format!(
            "--- results: {} displayed{} ---\n",
            results.len(),
            if results.len() > RESULT_BLOCKS_MAX {
                format!(
                    "; the first {RESULT_BLOCKS_MAX} follow, all are in \
                     structuredContent.results"
                )
            } else {
                String::new()
            }
        ));
    }
    if !v.warnings.is_empty() {
        s.push_str("--- warnings ---\n");
        for w in &v.warnings {
            s.push_str(&format!("{w}\n"));
        }
    }
    s.truncate(s.trim_end().len());
    s
}

fn file_block(f: &OutputFile) -> Option<ContentBlock> {
    let uri = file_uri(&f.path);
    let link = |description: &str| {
        ContentBlock::resource_link(
            Resource::new(uri.clone(), f.path.clone())
                .with_mime_type(f.mime_type.clone())
                .with_size(f.size)
                .with_description(description.to_string()),
        )
    };
    let Some(b64) = &f.content_base64 else {
        return Some(link(
            "A file the program wrote; its content was over the size cap and was not returned.",
        ));
    };
    if is_image(f) {
        return Some(ContentBlock::image(b64.clone(), f.mime_type.clone()));
    }
    if f.size > EMBED_MAX_BYTES {
        return Some(link(
            "A file the program wrote; its content is in structuredContent.files[].content_base64.",
        ));
    }
    if is_text_mime(&f.mime_type) {
        if let Some(text) = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
        {
            return Some(ContentBlock::resource(
                ResourceContents::text(text, uri).with_mime_type(f.mime_type.clone()),
            ));
        }
    }
    Some(ContentBlock::resource(
        ResourceContents::blob(b64.clone(), uri).with_mime_type(f.mime_type.clone()),
    ))
}

/// The blocks of a session call's displayed results: an image block for a PNG or JPEG (unless
/// the same image is a returned file, shown already), a text block otherwise.
fn result_blocks(v: &Verdict) -> Vec<ContentBlock> {
    let Some(results) = &v.results else {
        return Vec::new();
    };
    let shown_files: Vec<&str> = v
        .files
        .iter()
        .filter(|f| is_image(f))
        .filter_map(|f| f.content_base64.as_deref())
        .collect();
    let mut blocks = Vec::new();
    for (i, r) in results.iter().take(RESULT_BLOCKS_MAX).enumerate() {
        let label = if r.is_main_result {
            format!("result {} (the value of the last expression)", i + 1)
        } else {
            format!("result {} (displayed)", i + 1)
        };
        let image = ["image/png", "image/jpeg"]
            .iter()
            .find_map(|m| r.data.get(*m).and_then(|d| d.as_str()).map(|d| (*m, d)));
        if let Some((mime, data)) = image {
            if !shown_files.contains(&data) {
                blocks.push(ContentBlock::image(data.to_string(), mime.to_string()));
            }
            continue;
        }
        let text = ["text/markdown", "text/plain"]
            .iter()
            .find_map(|m| r.data.get(*m).and_then(|d| d.as_str()));
        let text = match text {
            Some(t) => trim_middle(t, RESULT_HEAD, RESULT_TAIL, "results"),
            None => format!(
                "(only {} offered; see structuredContent.results)",
                r.data.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        };
        blocks.push(ContentBlock::text(format!("{label}:\n{text}")));
    }
    blocks
}

/// The summary followed by the text of the call's displayed results (an image is named, not
/// shown): for a reader of text alone, such as the agent loop's model.
pub fn summary_with_results(v: &Verdict) -> String {
    let mut s = summary(v);
    let Some(results) = &v.results else {
        return s;
    };
    let images = results
        .iter()
        .take(RESULT_BLOCKS_MAX)
        .filter(|r| r.data.contains_key("image/png") || r.data.contains_key("image/jpeg"))
        .count();
    for block in result_blocks(v) {
        if let Some(t) = block.as_text() {
            s.push('\n');
            s.push_str(&t.text);
        }
    }
    if images > 0 {
        s.push_str(&format!(
            "\n({images} image result(s), such as figures, are not shown in this text.)"
        ));
    }
    s
}

/// The tool result of a verdict.
pub fn verdict_result(v: &Verdict) -> CallToolResult {
    let mut content = vec![ContentBlock::text(summary(v))];
    content.extend(v.files.iter().filter_map(file_block));
    content.extend(result_blocks(v));
    let mut result = if v.error.is_some() {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    // A verdict always serialises; should it not, the text block still says everything.
    result.structured_content = serde_json::to_value(v).ok();
    result
}

/// An `invalid_request` result for a call whose arguments could not be used.
pub fn invalid_request(language: &str, message: String) -> CallToolResult {
    let mut v = Verdict::failed(ErrorCategory::InvalidRequest, message);
    v.language = Some(language.to_string());
    verdict_result(&v)
}

/// The tool result of a call the executor refused. A policy refusal is an `invalid_request`
/// verdict like any other; a busy or stopping server has no verdict to give, so its result is
/// the text alone.
pub fn rejection_result(language: &str, r: &Rejection) -> CallToolResult {
    if r.category == ErrorCategory::InvalidRequest.as_str() {
        return invalid_request(language, r.message.clone());
    }
    let advice = match r.category.as_str() {
        "rate_limited" | "unavailable" => {
            "Nothing ran. The code is not the problem: call again with the same arguments in a \
             few seconds."
        }
        "not_found" => {
            "Nothing ran. The session is gone (it expired after its idle time, was ended, or \
             belongs to another key): start a new one with session_id \"new\" and run the \
             setup code again."
        }
        "session_lost" => {
            "Nothing ran. The session's server restarted and its state (variables, files) is \
             gone: start a new one with session_id \"new\" and run the setup code again."
        }
        "peer_unavailable" => {
            "Nothing ran. The server holding the session cannot be reached: call again in a \
             few seconds; if it stays unreachable, the session is lost: start a new one with \
             session_id \"new\"."
        }
        "session_busy" => {
            "Nothing ran. The session is still running an earlier call: wait for its result, \
             then call again."
        }
        _ => "Nothing ran. Changing the code will not help: this is a problem with the server.",
    };
    CallToolResult::error(vec![ContentBlock::text(format!(
        "the program did not run\nerror: {}: {}\n{advice}",
        r.category, r.message
    ))])
}

/// The result of a call cancelled by the client (it is not sent: a cancelled request gets no
/// response).
/// The tool result of a call whose network access the user did not approve.
pub fn approval_refused(language: &str, message: String) -> CallToolResult {
    let mut v = Verdict::failed(ErrorCategory::InvalidRequest, message);
    v.language = Some(language.to_string());
    if let Some(e) = v.error.as_mut() {
        // Changing the code does not help; asking again with the same access does not either.
        e.retryable = false;
    }
    verdict_result(&v)
}

pub fn cancelled_result() -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(
        "The call was cancelled and its sandbox killed.",
    )])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(stdout: &str) -> Verdict {
        let mut v = Verdict::failed(ErrorCategory::RuntimeError, "");
        v.error = None;
        v.exit_code = Some(0);
        v.stdout = stdout.to_string();
        v
    }

    fn text_of(r: &CallToolResult) -> String {
        r.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default()
    }

    #[test]
    fn success_is_not_an_error_and_carries_the_verdict() {
        let v = ok("42\n");
        let r = verdict_result(&v);
        assert_eq!(r.is_error, Some(false));
        let t = text_of(&r);
        assert!(
            t.starts_with("exit code 0") && t.contains("--- stdout ---\n42"),
            "{t}"
        );
        assert_eq!(
            r.structured_content,
            Some(serde_json::to_value(&v).unwrap())
        );
    }

    /// Issue 10: the text block left out the verdict's warnings (an output name left out, a
    /// limit enforced only per process), which a client reading only the text never saw.
    #[test]
    fn warnings_are_in_the_text() {
        let mut v = ok("1\n");
        v.warnings = vec!["1 output file left out: its name is not valid UTF-8".into()];
        let t = text_of(&verdict_result(&v));
        assert!(
            t.ends_with("--- warnings ---\n1 output file left out: its name is not valid UTF-8"),
            "{t}"
        );
        assert!(!text_of(&verdict_result(&ok("1\n"))).contains("warnings"));
    }

    #[test]
    fn failures_say_the_category_and_whether_code_changes_help() {
        let mut v = ok("");
        v.exit_code = Some(1);
        v.stderr = "NameError: name 'x' is not defined\n".into();
        v.error = Some(runcell_core::VerdictError::new(
            ErrorCategory::RuntimeError,
            "The program exited with code 1: NameError.",
        ));
        let r = verdict_result(&v);
        assert_eq!(r.is_error, Some(true));
        let t = text_of(&r);
        assert!(
            t.contains("error: runtime_error: The program exited"),
            "{t}"
        );
        assert!(t.contains("Changing the code can help"), "{t}");
        assert!(t.contains("--- stderr ---\nNameError"), "{t}");

        let r = rejection_result("python", &Rejection::new("rate_limited", "busy"));
        assert_eq!(r.is_error, Some(true));
        assert!(r.structured_content.is_none());
        assert!(text_of(&r).contains("rate_limited: busy"));

        let r = rejection_result("python", &Rejection::new("invalid_request", "too big"));
        let s = r.structured_content.unwrap();
        assert_eq!(s["error"]["category"], "invalid_request");
        assert_eq!(s["language"], "python");

        let r = invalid_request("go", "bad".into());
        assert!(text_of(&r).contains("Fix the tool arguments"));
    }

    #[test]
    fn long_output_is_trimmed_tail_first_with_a_note() {
        let lines: String = (0..5000).map(|i| format!("line {i}\n")).collect();
        let t = trim_middle(&lines, STDOUT_HEAD, STDOUT_TAIL, "stdout");
        assert!(t.len() < STDOUT_HEAD + STDOUT_TAIL + 200, "{}", t.len());
        assert!(t.starts_with("line 0\n"));
        assert!(t.ends_with("line 4999\n"));
        assert!(t.contains("cut here; the full stdout is in structuredContent.stdout"));
        // Cuts fall on line boundaries.
        for l in t.lines().filter(|l| !l.starts_with('[')) {
            assert!(l.starts_with("line "), "{l:?}");
        }
        // Multi-byte characters are never split, whatever the cut points.
        let wide = "é".repeat(10_000);
        let t = trim_middle(&wide, 1001, 3001, "stderr");
        assert!(t.contains("cut here"));
        assert_eq!(trim_middle("short", 10, 10, "stdout"), "short");
    }

    #[test]
    fn files_become_images_resources_and_links() {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let file = |path: &str, mime: &str, content: Option<&[u8]>, size: u64| OutputFile {
            path: path.into(),
            size,
            mime_type: mime.into(),
            sha256: None,
            content_base64: content.map(b64),
            truncated: content.is_none(),
            not_written: None,
        };
        let mut v = ok("");
        v.files = vec![
            file("figures/figure-1.png", "image/png", Some(b"\x89PNG"), 4),
            file("out.csv", "text/csv", Some(b"a,b\n1,2\n"), 8),
            file("data.bin", "application/octet-stream", Some(&[0, 1, 2]), 3),
            file("huge.bin", "application/octet-stream", None, 1 << 30),
            file("my file.txt", "text/plain", Some(b"\xff"), 1),
        ];
        let r = verdict_result(&v);
        let blocks = serde_json::to_value(&r.content).unwrap();
        assert_eq!(blocks[1]["type"], "image");
        assert_eq!(blocks[1]["mimeType"], "image/png");
        assert_eq!(blocks[2]["type"], "resource");
        assert_eq!(
            blocks[2]["resource"],
            json!({"uri": "runcell:///workspace/out.csv", "mimeType": "text/csv", "text": "a,b\n1,2\n"})
        );
        assert_eq!(blocks[3]["resource"]["blob"], b64(&[0, 1, 2]));
        assert_eq!(blocks[4]["type"], "resource_link");
        assert_eq!(blocks[4]["size"], 1u64 << 30);
        // Not UTF-8 despite its type: sent as a blob; the URI is escaped.
        assert_eq!(
            blocks[5]["resource"]["uri"],
            "runcell:///workspace/my%20file.txt"
        );
        assert!(blocks[5]["resource"]["blob"].is_string());
        let t = text_of(&r);
        assert!(
            t.contains("figures/figure-1.png (image/png, 4 bytes, shown as an image)"),
            "{t}"
        );
        assert!(
            t.contains("huge.bin (application/octet-stream, 1 GiB, content not returned"),
            "{t}"
        );
    }

    #[test]
    fn displayed_results_become_image_and_text_blocks() {
        use runcell_core::verdict::{DisplayResult, ExceptionReport};
        let bundle = |main: bool, pairs: &[(&str, serde_json::Value)]| DisplayResult {
            is_main_result: main,
            data: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        };
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fig");
        let mut v = ok("");
        v.session_id = Some("ses_1".into());
        v.results = Some(vec![
            bundle(
                false,
                &[
                    ("text/plain", json!("<Figure size 640x480 with 1 Axes>")),
                    ("image/png", json!(png)),
                ],
            ),
            bundle(
                false,
                &[
                    ("text/plain", json!("Md()")),
                    ("text/markdown", json!("**b**")),
                ],
            ),
            bundle(
                true,
                &[
                    ("text/plain", json!("   a\n0  1")),
                    ("text/html", json!("<table></table>")),
                    ("text/x-long", json!("x".repeat(100_000))),
                ],
            ),
            bundle(false, &[("application/json", json!({"a": 1}))]),
        ]);
        v.exception = Some(ExceptionReport {
            name: "ValueError".into(),
            value: "bad".into(),
            traceback: "Traceback...".into(),
        });
        let r = verdict_result(&v);
        let blocks = serde_json::to_value(&r.content).unwrap();
        assert_eq!(blocks[1]["type"], "image");
        assert_eq!(blocks[1]["mimeType"], "image/png");
        assert_eq!(blocks[1]["data"], png);
        // Markdown first, then plain text, never HTML.
        assert_eq!(blocks[2]["text"], "result 2 (displayed):\n**b**");
        assert_eq!(
            blocks[3]["text"],
            "result 3 (the value of the last expression):\n   a\n0  1"
        );
        assert!(blocks[4]["text"]
            .as_str()
            .unwrap()
            .contains("application/json"));
        let t = text_of(&r);
        assert!(t.contains("--- exception ---\nValueError: bad"), "{t}");
        assert!(t.contains("--- results: 4 displayed ---"), "{t}");
        // For a reader of text alone: the texts, and the images named.
        let t = summary_with_results(&v);
        assert!(t.contains("result 2 (displayed):\n**b**"), "{t}");
        assert!(t.contains("1 image result(s)"), "{t}");

        // A figure that is also a returned file is shown once; long text is bounded.
        v.files = vec![OutputFile {
            path: "figures/figure-1.png".into(),
            size: 8,
            mime_type: "image/png".into(),
            sha256: None,
            content_base64: Some(png.clone()),
            truncated: false,
            not_written: None,
        }];
        v.results.as_mut().unwrap()[1] =
            bundle(false, &[("text/plain", json!("y".repeat(1 << 20)))]);
        let r = verdict_result(&v);
        let blocks = serde_json::to_value(&r.content).unwrap();
        let images = blocks
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == "image")
            .count();
        assert_eq!(images, 1, "{blocks}");
        assert!(blocks[2]["text"].as_str().unwrap().len() < 8 * 1024);
    }
}
