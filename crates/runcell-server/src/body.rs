//! The body of `POST /v1/execute` and its mapping onto the engine's request.

use runcell_core::limits::{LimitError, LimitOverrides, Policy};
use runcell_core::units::{parse_duration, parse_size};
use runcell_core::{ExecRequest, InputFile};
use runcell_runtimes::Language;
use serde::Deserialize;
use serde_json::Value;
use utoipa::openapi::Schema;
use utoipa::ToSchema;

use crate::error::ApiError;

/// `{"language", "code", "timeout", "memory", ...}`. Unknown fields are an error, so a typo
/// in a limit is never silently ignored. Limits left out get the operator's defaults; a limit
/// above the operator's maximum is refused (400), never lowered silently.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"language": "python", "code": "print(6 * 7)", "timeout": 10, "memory": "256M"}))]
pub struct ExecuteBody {
    /// python, node (or javascript), ruby, go or bash.
    pub language: String,
    /// The program's source.
    pub code: String,
    /// Wall-clock limit of the program: seconds (a number), or a string with a unit ("500ms",
    /// "2m").
    #[serde(default)]
    #[schema(schema_with = duration_schema)]
    pub timeout: Option<Value>,
    /// Wall-clock limit of the compile step (Go), like `timeout`.
    #[serde(default)]
    #[schema(schema_with = duration_schema)]
    pub compile_timeout: Option<Value>,
    /// Memory, swap included: bytes (a number), or a string with a unit ("256M", "1G").
    #[serde(default)]
    #[schema(schema_with = size_schema)]
    pub memory: Option<Value>,
    /// /tmp + /workspace + /dev/shm together, like `memory`.
    #[serde(default)]
    #[schema(schema_with = size_schema)]
    pub disk: Option<Value>,
    /// Cap of each of stdout and stderr, like `memory`.
    #[serde(default)]
    #[schema(schema_with = size_schema)]
    pub output: Option<Value>,
    /// CPU cores, may be fractional.
    #[serde(default)]
    #[schema(minimum = 0.001)]
    pub cpus: Option<f64>,
    /// Processes and threads.
    #[serde(default)]
    pub pids: Option<u64>,
    /// Open file descriptors per process.
    #[serde(default)]
    pub open_files: Option<u64>,
    /// Text fed to the program's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Files placed in /workspace (the working directory) before the program starts.
    #[serde(default)]
    pub files: Vec<InputFile>,
}

fn duration_schema() -> Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .minimum(Some(0)),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .examples(["500ms", "10s", "2m"]),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some("Seconds, or a string with a unit (ms, s, m, h)."))
        .into()
}

fn size_schema() -> Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0)),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .examples(["64K", "256M", "1G"]),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "Bytes, or a string with a unit (K, M, G: powers of 1024).",
        ))
        .into()
}

/// A count (pids, open_files) from a number or a numeric string.
fn count(field: &str, v: &Value) -> Result<Option<u64>, ApiError> {
    let bad = || ApiError::invalid(format!("{field} must be a whole number."));
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => n.as_u64().map(Some).ok_or_else(bad),
        Value::String(s) => s.trim().parse().map(Some).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

fn cpu_millis(cpus: Option<f64>) -> Result<Option<u64>, ApiError> {
    match cpus {
        None => Ok(None),
        Some(c) if c.is_finite() && c > 0.0 => Ok(Some((c * 1000.0).round().max(1.0) as u64)),
        Some(_) => Err(ApiError::invalid(
            "cpus must be a positive number of cores.",
        )),
    }
}

/// Limits named as in the request body (`timeout`, `memory`, `cpus`, ...) with values as a
/// request would give them, for the operator's configuration.
pub fn limit_overrides(pairs: &[(String, Value)]) -> Result<LimitOverrides, ApiError> {
    let mut o = LimitOverrides::default();
    for (name, v) in pairs {
        let v = Some(v.clone());
        match name.as_str() {
            "timeout" => o.timeout_ms = duration_ms(name, &v)?,
            "compile_timeout" => o.compile_timeout_ms = duration_ms(name, &v)?,
            "memory" => o.memory_bytes = size_bytes(name, &v)?,
            "disk" => o.disk_bytes = size_bytes(name, &v)?,
            "output" => o.output_bytes = size_bytes(name, &v)?,
            "pids" => o.pids = count(name, v.as_ref().unwrap_or(&Value::Null))?,
            "open_files" => o.open_files = count(name, v.as_ref().unwrap_or(&Value::Null))?,
            "cpus" => {
                let cores = match &v {
                    Some(Value::Number(n)) => n.as_f64(),
                    Some(Value::String(s)) => s.trim().parse().ok(),
                    _ => None,
                };
                o.cpu_millis = cpu_millis(Some(cores.unwrap_or(f64::NAN)))?;
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown limit '{other}'; the limits are: {LIMIT_NAMES}"
                )))
            }
        }
    }
    Ok(o)
}

/// The limits' names, as requests and the configuration spell them.
pub const LIMIT_NAMES: &str =
    "timeout, compile_timeout, memory, cpus, pids, disk, output, open_files";

fn duration_ms(field: &str, v: &Option<Value>) -> Result<Option<u64>, ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "{field} must be a number of seconds (e.g. 10 or 0.5) or a string with a unit (e.g. \"500ms\", \"2m\")."
        ))
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let secs = n.as_f64().ok_or_else(bad)?;
            if !secs.is_finite() || secs < 0.0 {
                return Err(bad());
            }
            // `as` saturates: an absurd value becomes u64::MAX, which the policy rejects
            // naming the maximum.
            Ok(Some((secs * 1000.0).round() as u64))
        }
        Some(Value::String(s)) => parse_duration(s)
            .map(|d| Some(d.as_millis().min(u64::MAX as u128) as u64))
            .map_err(|e| ApiError::invalid(format!("{field}: {e}."))),
        Some(_) => Err(bad()),
    }
}

fn size_bytes(field: &str, v: &Option<Value>) -> Result<Option<u64>, ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "{field} must be a whole number of bytes or a string with a unit (e.g. \"256M\", \"1G\")."
        ))
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(bad),
        Some(Value::String(s)) => parse_size(s)
            .map(Some)
            .map_err(|e| ApiError::invalid(format!("{field}: {e}."))),
        Some(_) => Err(bad()),
    }
}

/// The request body's name of an engine limit.
pub fn api_name(limit: &str) -> &'static str {
    match limit {
        "timeout_ms" => "timeout",
        "compile_timeout_ms" => "compile_timeout",
        "memory_bytes" => "memory",
        "cpu_millis" => "cpus",
        "pids" => "pids",
        "disk_bytes" => "disk",
        "output_bytes" => "output",
        "open_files" => "open_files",
        _ => "limit",
    }
}

impl ExecuteBody {
    /// The engine's request. Errors are values that cannot be a limit at all (a negative
    /// timeout, "12 parsecs"); whether a limit is allowed is the policy's call.
    pub fn into_request(self) -> Result<ExecRequest, ApiError> {
        let cpu_millis = cpu_millis(self.cpus)?;
        Ok(ExecRequest {
            limits: LimitOverrides {
                timeout_ms: duration_ms("timeout", &self.timeout)?,
                compile_timeout_ms: duration_ms("compile_timeout", &self.compile_timeout)?,
                memory_bytes: size_bytes("memory", &self.memory)?,
                cpu_millis,
                pids: self.pids,
                disk_bytes: size_bytes("disk", &self.disk)?,
                output_bytes: size_bytes("output", &self.output)?,
                open_files: self.open_files,
            },
            language: self.language,
            code: self.code,
            stdin: self.stdin,
            files: self.files,
        })
    }
}

/// The checks of the engine's own validation that need nothing but the policy, done before
/// a request waits for a slot (and before a stream's 200 is sent). The engine checks again;
/// input files are checked by the engine only.
pub fn precheck(policy: &Policy, req: &ExecRequest) -> Result<(), ApiError> {
    if Language::parse(&req.language).is_none() {
        // Named back, but not at any length: the field can be as large as the body.
        let mut name: String = req.language.chars().take(64).collect();
        if name.len() < req.language.len() {
            name.push('…');
        }
        return Err(ApiError::invalid(format!(
            "Unknown language '{name}'. Use one of: {}.",
            Language::accepted_names()
        )));
    }
    if req.code.len() as u64 > policy.max_code_bytes {
        return Err(ApiError::invalid(format!(
            "The code is {} bytes, more than the {} byte limit. Send a shorter program.",
            req.code.len(),
            policy.max_code_bytes
        )));
    }
    if let Some(s) = &req.stdin {
        if s.len() as u64 > policy.max_stdin_bytes {
            return Err(ApiError::invalid(format!(
                "stdin is {} bytes, more than the {} byte limit.",
                s.len(),
                policy.max_stdin_bytes
            )));
        }
    }
    policy.resolve(&req.limits).map_err(limit_error)?;
    Ok(())
}

/// "memory_bytes is 64 GiB, above the maximum of 8 GiB" → the same with the body's name.
fn limit_error(e: LimitError) -> ApiError {
    let name = api_name(e.limit);
    let message = match e.message.strip_prefix(e.limit) {
        Some(rest) => format!("Invalid limit: {name}{rest}."),
        None => format!("Invalid limit: {}.", e.message),
    };
    ApiError {
        limit: Some(name),
        ..ApiError::invalid(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ExecRequest, String> {
        let b: ExecuteBody = serde_json::from_str(json).map_err(|e| e.to_string())?;
        b.into_request().map_err(|e| e.message)
    }

    #[test]
    fn limits_map_onto_overrides() {
        let r = parse(
            r#"{"language":"python","code":"print(1)","timeout":2.5,"memory":"128M","disk":1048576,
               "output":"1K","cpus":0.5,"pids":8,"open_files":64,"compile_timeout":"90s",
               "stdin":"x","files":[{"path":"a.txt","content":"hi"}]}"#,
        )
        .unwrap();
        let l = r.limits;
        assert_eq!(l.timeout_ms, Some(2500));
        assert_eq!(l.compile_timeout_ms, Some(90_000));
        assert_eq!(l.memory_bytes, Some(128 << 20));
        assert_eq!(l.disk_bytes, Some(1 << 20));
        assert_eq!(l.output_bytes, Some(1024));
        assert_eq!(l.cpu_millis, Some(500));
        assert_eq!(l.pids, Some(8));
        assert_eq!(l.open_files, Some(64));
        assert_eq!(r.stdin.as_deref(), Some("x"));
        assert_eq!(r.files, vec![InputFile::text("a.txt", "hi")]);
        let r = parse(r#"{"language":"bash","code":"true"}"#).unwrap();
        assert_eq!(r.limits, LimitOverrides::default());
    }

    #[test]
    fn bad_values_are_refused() {
        for body in [
            r#"{"language":"python"}"#,
            r#"{"language":"python","code":"","timeot":5}"#,
            r#"{"language":"python","code":"","timeout":-1}"#,
            r#"{"language":"python","code":"","timeout":"soon"}"#,
            r#"{"language":"python","code":"","timeout":[1]}"#,
            r#"{"language":"python","code":"","memory":"12 parsecs"}"#,
            r#"{"language":"python","code":"","memory":1.5}"#,
            r#"{"language":"python","code":"","memory":-5}"#,
            r#"{"language":"python","code":"","cpus":0}"#,
            r#"{"language":"python","code":"","cpus":"2"}"#,
            r#"{"language":"python","code":"","pids":-1}"#,
            r#"{"language":1,"code":""}"#,
            r#"{"language":"python","code":"","files":[{"path":"a","contents":"x"}]}"#,
        ] {
            assert!(parse(body).is_err(), "{body} must be refused");
        }
    }

    #[test]
    fn precheck_names_the_limit_and_the_maximum() {
        let policy = Policy::for_host(8 << 30, 2);
        let req = parse(r#"{"language":"python","code":"","memory":"1T"}"#).unwrap();
        let e = precheck(&policy, &req).unwrap_err();
        assert_eq!(e.limit, Some("memory"));
        assert!(
            e.message
                .contains("memory is 1 TiB, above the maximum of 8 GiB"),
            "{}",
            e.message
        );
        let req = parse(r#"{"language":"python","code":"","timeout":1e12}"#).unwrap();
        let e = precheck(&policy, &req).unwrap_err();
        assert_eq!(e.limit, Some("timeout"));
        let req = parse(r#"{"language":"cobol","code":""}"#).unwrap();
        assert!(precheck(&policy, &req)
            .unwrap_err()
            .message
            .contains("Unknown language 'cobol'"));
        let long = format!(r#"{{"language":"{}","code":""}}"#, "é".repeat(100_000));
        let e = precheck(&policy, &parse(&long).unwrap()).unwrap_err();
        assert!(e.message.len() < 1000, "{}", e.message.len());
        let req = parse(r#"{"language":"python","code":"print(1)","timeout":5}"#).unwrap();
        precheck(&policy, &req).unwrap();
    }
}
