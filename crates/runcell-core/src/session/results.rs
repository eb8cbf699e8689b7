//! A session cell's rich results: what its interpreter displayed (MIME bundles, as a notebook
//! shows them) and the exception that ended it, reported by the interpreter in a file in the
//! sandbox's /tmp ([`RESULTS_FILE`]) and read by the host after the cell through pid 1.
//!
//! Why a file read through pid 1: pid 1 reads it beneath /tmp without following a link, only
//! a regular file (never a FIFO that would block it), and within a byte cap the host sets,
//! with the same code that returns a session's files; no new channel is opened between the
//! cell's code and the host. Everything in the file is hostile: the cell's code can write it
//! (it runs in the interpreter's process), so the report is parsed here with every size and
//! count bounded, MIME keys checked, values checked against their type, and anything wrong
//! dropped with a warning. Results never cross cells: the interpreter removes the file before
//! each cell, and the host reads it only after a cell that ended normally (its interpreter
//! alive); a session's sandbox is its own, so they never cross sessions.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use crate::verdict::{DisplayResult, ExceptionReport};

/// The file in the sandbox's /tmp where a session interpreter reports a cell's results.
pub const RESULTS_FILE: &str = ".runcell-results.json";

/// The most bytes a cell's results report may have (the runners stop adding results there,
/// and count what they left out): images and HTML tables fit; a report past it (one the cell
/// forged) is dropped whole, with a warning.
pub const MAX_RESULTS_BYTES: u64 = 8 << 20;
/// The most memory parsing a report may build ([`crate::request::json_parse_bytes`]): 8 MiB
/// of `[[],[],...]` would otherwise build about 12 times its size in the server, outside any
/// budget, on every call. Real reports are strings (text, HTML, base64 images) and a few
/// JSON values: far below it.
const MAX_RESULTS_PARSE_BYTES: u64 = 16 << 20;
/// The most results a cell may display.
pub const MAX_RESULTS: usize = 100;
/// The most MIME types in one result's bundle.
pub const MAX_MIME_TYPES: usize = 16;
/// The longest MIME type.
const MAX_MIME_LEN: usize = 127;
/// An exception's name and value, and its traceback, are cut at these many bytes.
const MAX_EXCEPTION_NAME: usize = 256;
const MAX_EXCEPTION_VALUE: usize = 64 << 10;
const MAX_TRACEBACK: usize = 256 << 10;

/// What a cell reported, validated, and what was dropped from it (warnings for the verdict).
#[derive(Debug, Default, PartialEq)]
pub struct CellResults {
    pub results: Vec<DisplayResult>,
    pub exception: Option<ExceptionReport>,
    pub warnings: Vec<String>,
}

/// The report's shape as the interpreter writes it. Unknown fields are ignored (a newer
/// runner may say more); every value is checked below.
#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    results: Vec<Value>,
    #[serde(default)]
    exception: Option<Value>,
    /// Results the interpreter itself left out (over its own cap).
    #[serde(default)]
    dropped: Option<Value>,
}

/// Parse a results report (`bytes`, already within the byte cap).
pub fn parse(bytes: &[u8]) -> CellResults {
    let mut out = CellResults::default();
    if crate::request::json_parse_bytes(bytes) > MAX_RESULTS_PARSE_BYTES {
        out.warnings.push(
            "The cell's displayed results were dropped: their report holds too many JSON \
             values."
                .into(),
        );
        return out;
    }
    let raw: Raw = match serde_json::from_slice(bytes) {
        Ok(r) => r,
        Err(e) => {
            out.warnings.push(format!(
                "The cell's displayed results were dropped: their report is not valid ({e})."
            ));
            return out;
        }
    };
    let mut invalid = 0usize;
    let offered = raw.results.len();
    for item in raw.results.into_iter().take(MAX_RESULTS) {
        match result(item) {
            Some(r) => out.results.push(r),
            None => invalid += 1,
        }
    }
    // At most one main result (the value of the last expression): the last that says so.
    // (Not necessarily the last result: figures still open are displayed after it.)
    let main = out.results.iter().rposition(|r| r.is_main_result);
    for (i, r) in out.results.iter_mut().enumerate() {
        r.is_main_result = Some(i) == main;
    }
    let dropped_by_runner = raw.dropped.as_ref().and_then(Value::as_u64).unwrap_or(0);
    if offered > MAX_RESULTS || dropped_by_runner > 0 {
        out.warnings.push(format!(
            "The cell displayed more than fits in a call's results ({MAX_RESULTS} results, \
             {MAX_RESULTS_BYTES} bytes): the rest were dropped. Save large outputs to files \
             in /workspace instead."
        ));
    }
    if invalid > 0 {
        out.warnings.push(format!(
            "{invalid} displayed result(s) were dropped: not a MIME bundle runcell accepts \
             (see docs/results.md)."
        ));
    }
    out.exception = raw.exception.and_then(|e| exception(e, &mut out.warnings));
    out
}

/// One result, or `None` when nothing of it is valid. Invalid MIME entries are left out.
fn result(item: Value) -> Option<DisplayResult> {
    let Value::Object(mut obj) = item else {
        return None;
    };
    let is_main_result = matches!(obj.get("is_main_result"), Some(Value::Bool(true)));
    let Some(Value::Object(data)) = obj.remove("data") else {
        return None;
    };
    let mut bundle = BTreeMap::new();
    for (mime, value) in data {
        if bundle.len() >= MAX_MIME_TYPES {
            break;
        }
        if !is_mime_type(&mime) {
            continue;
        }
        if let Some(v) = checked_value(&mime, value) {
            bundle.insert(mime, v);
        }
    }
    (!bundle.is_empty()).then_some(DisplayResult {
        is_main_result,
        data: bundle,
    })
}

/// `type/subtype` in lower case, as IANA spells them (`image/svg+xml`,
/// `application/vnd.plotly.v1+json`).
pub fn is_mime_type(s: &str) -> bool {
    fn token(t: &str) -> bool {
        !t.is_empty()
            && t.as_bytes()[0].is_ascii_alphanumeric()
            && t.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'+' | b'-')
            })
    }
    s.len() <= MAX_MIME_LEN
        && s.split_once('/')
            .is_some_and(|(t, sub)| token(t) && token(sub))
}

/// Whether a MIME type's content is JSON itself rather than text.
fn is_json_type(mime: &str) -> bool {
    mime == "application/json" || mime.ends_with("+json")
}

/// A bundle entry's value if it has the type its MIME type needs: JSON for JSON types, base64
/// text for binary images, text for everything else.
fn checked_value(mime: &str, value: Value) -> Option<Value> {
    if is_json_type(mime) {
        return Some(value);
    }
    let Value::String(text) = value else {
        return None;
    };
    if matches!(
        mime,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    ) {
        // Binary content travels as base64; what does not decode is not an image.
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .ok()?;
    }
    Some(Value::String(text))
}

fn exception(v: Value, warnings: &mut Vec<String>) -> Option<ExceptionReport> {
    let Value::Object(obj) = v else {
        if !v.is_null() {
            warnings.push("The cell's exception report was dropped: not valid.".into());
        }
        return None;
    };
    let text = |key: &str, max: usize| -> Option<String> {
        match obj.get(key) {
            Some(Value::String(s)) => Some(crate::request::prefix(s, max).to_string()),
            _ => None,
        }
    };
    match (
        text("name", MAX_EXCEPTION_NAME),
        text("value", MAX_EXCEPTION_VALUE),
        text("traceback", MAX_TRACEBACK),
    ) {
        (Some(name), Some(value), Some(traceback)) if !name.is_empty() => Some(ExceptionReport {
            name,
            value,
            traceback,
        }),
        _ => {
            warnings.push("The cell's exception report was dropped: not valid.".into());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse_json(v: Value) -> CellResults {
        parse(&serde_json::to_vec(&v).unwrap())
    }

    /// Regression (review): a forged report of 8 MiB of `[[],[],...]` was parsed whole into
    /// a tree about 12 times its size, on the server, on every call.
    #[test]
    fn a_report_of_too_many_values_is_dropped_unparsed() {
        let mut forged = b"{\"results\":[".to_vec();
        forged.extend(b"[],".repeat(((8 << 20) - 32) / 3));
        forged.extend(b"[]]}");
        assert!(forged.len() as u64 <= MAX_RESULTS_BYTES + 16);
        let r = parse(&forged);
        assert!(r.results.is_empty());
        assert!(r.warnings[0].contains("too many JSON values"), "{r:?}");
    }

    #[test]
    fn a_valid_report_is_kept_in_order() {
        let r = parse_json(json!({
            "results": [
                {"is_main_result": false, "data": {"text/plain": "a"}},
                {"is_main_result": false, "data": {"text/plain": "<Figure>", "image/png": "iVBORw0KGgo="}},
                {"is_main_result": true, "data": {"text/plain": "b", "text/html": "<b>b</b>",
                                                   "application/json": {"x": [1, 2]}}},
            ],
            "exception": null,
        }));
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert_eq!(r.results.len(), 3);
        assert_eq!(r.results[0].data["text/plain"], "a");
        assert!(r.results[2].is_main_result);
        assert_eq!(r.results[2].data["application/json"], json!({"x": [1, 2]}));
        assert_eq!(r.exception, None);
    }

    #[test]
    fn not_json_or_not_an_object_is_dropped_with_a_warning() {
        for bad in [&b"not json"[..], b"[1,2]", b"{\"results\": 3}", b"\xff\xfe"] {
            let r = parse(bad);
            assert!(r.results.is_empty());
            assert_eq!(r.warnings.len(), 1, "{bad:?}");
        }
    }

    #[test]
    fn at_most_one_result_is_main() {
        let r = parse_json(json!({"results": [
            {"is_main_result": true, "data": {"text/plain": "a"}},
            {"is_main_result": true, "data": {"text/plain": "b"}},
            {"is_main_result": false, "data": {"text/plain": "<Figure>"}},
        ]}));
        assert!(!r.results[0].is_main_result);
        assert!(r.results[1].is_main_result);
        assert!(!r.results[2].is_main_result);
        // A truthy non-boolean is not true.
        let r =
            parse_json(json!({"results": [{"is_main_result": 1, "data": {"text/plain": "a"}}]}));
        assert!(!r.results[0].is_main_result);
    }

    #[test]
    fn mime_keys_are_checked() {
        for ok in [
            "text/plain",
            "image/svg+xml",
            "application/vnd.plotly.v1+json",
        ] {
            assert!(is_mime_type(ok), "{ok}");
        }
        for bad in [
            "",
            "text",
            "text/",
            "/plain",
            "Text/Plain",
            "text/plain; charset=utf-8",
            "text/pl ain",
            "a/b/c",
            "../etc",
            "-x/y",
            &format!("text/{}", "a".repeat(200)),
        ] {
            assert!(!is_mime_type(bad), "{bad}");
        }
        let r = parse_json(json!({"results": [
            {"data": {"Text/Plain": "x", "text/plain": "y", "bad key": "z"}},
        ]}));
        assert_eq!(r.results[0].data.len(), 1);
        assert_eq!(r.results[0].data["text/plain"], "y");
    }

    #[test]
    fn values_must_have_their_types() {
        let r = parse_json(json!({"results": [
            {"data": {"text/plain": 3, "text/html": ["x"], "image/png": "not base64!"}},
            {"data": {"text/plain": "ok", "image/png": "iVBORw0KGgo="}},
        ]}));
        // The first has nothing valid: dropped, and counted.
        assert_eq!(r.results.len(), 1);
        assert_eq!(r.results[0].data.len(), 2);
        assert_eq!(r.warnings.len(), 1);
    }

    #[test]
    fn counts_are_bounded() {
        let many: Vec<Value> = (0..MAX_RESULTS + 50)
            .map(|i| json!({"data": {"text/plain": i.to_string()}}))
            .collect();
        let r = parse_json(json!({ "results": many }));
        assert_eq!(r.results.len(), MAX_RESULTS);
        assert!(r.warnings.iter().any(|w| w.contains("dropped")));

        let mut bundle = serde_json::Map::new();
        for i in 0..100 {
            bundle.insert(format!("text/x{i}"), json!("v"));
        }
        let r = parse_json(json!({"results": [{"data": bundle}]}));
        assert_eq!(r.results[0].data.len(), MAX_MIME_TYPES);
    }

    #[test]
    fn the_runner_s_own_drops_are_warned() {
        let r = parse_json(json!({"results": [], "dropped": 3}));
        assert_eq!(r.warnings.len(), 1);
    }

    #[test]
    fn deep_json_is_refused_not_overflowed() {
        let deep = format!(
            "{{\"results\": [{{\"data\": {{\"application/json\": {}1{}}}}}]}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let r = parse(deep.as_bytes());
        assert!(r.results.is_empty());
        assert_eq!(r.warnings.len(), 1);
    }

    #[test]
    fn exceptions_are_checked_and_cut() {
        let r = parse_json(json!({"exception": {
            "name": "ZeroDivisionError", "value": "division by zero",
            "traceback": "Traceback (most recent call last):\n..."}}));
        assert_eq!(r.exception.unwrap().name, "ZeroDivisionError");
        let r = parse_json(json!({"exception": {"name": 1, "value": "", "traceback": ""}}));
        assert_eq!(r.exception, None);
        assert_eq!(r.warnings.len(), 1);
        let r = parse_json(json!({"exception": {
            "name": "E".repeat(10_000), "value": "v".repeat(1 << 20), "traceback": ""}}));
        let e = r.exception.unwrap();
        assert!(e.name.len() <= MAX_EXCEPTION_NAME);
        assert!(e.value.len() <= MAX_EXCEPTION_VALUE);
    }

    mod proptests {
        use super::*;
        use proptest::prelude::*;

        /// JSON values of a few levels, with the keys a report has among others.
        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                ".{0,20}".prop_map(Value::String),
                Just(json!("iVBORw0KGgo=")),
            ];
            leaf.prop_recursive(4, 64, 8, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                    prop::collection::btree_map(
                        prop_oneof![
                            Just("results".to_string()),
                            Just("data".to_string()),
                            Just("is_main_result".to_string()),
                            Just("exception".to_string()),
                            Just("name".to_string()),
                            Just("text/plain".to_string()),
                            Just("image/png".to_string()),
                            ".{0,12}",
                        ],
                        inner,
                        0..8,
                    )
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn assert_bounded(r: &CellResults) {
            assert!(r.results.len() <= MAX_RESULTS);
            assert!(r.results.iter().filter(|x| x.is_main_result).count() <= 1);
            for x in &r.results {
                assert!(!x.data.is_empty() && x.data.len() <= MAX_MIME_TYPES);
                assert!(x.data.keys().all(|k| is_mime_type(k)));
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]

            #[test]
            fn any_bytes_are_parsed_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
                assert_bounded(&parse(&bytes));
            }

            #[test]
            fn any_json_gives_bounded_valid_results(v in json_value()) {
                assert_bounded(&parse_json(json!({"results": [v.clone()], "exception": v.clone()})));
                assert_bounded(&parse_json(v));
            }
        }
    }
}
