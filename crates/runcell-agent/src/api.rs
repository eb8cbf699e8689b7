//! The `/v1/agents` contract: a Chat Completions shaped request (messages, the code tools
//! with their `max_calls`, files, stream) and the `chat.completion` answer with runcell's
//! `runcell` extension (the steps, the counts). Parsing and validation are here, before
//! anything calls a model; so is the answer's shape, shared by the server and the CLI.

use std::collections::BTreeMap;

use runcell_core::InputFile;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::conversation::{Conversation, Item};
use crate::run::{Bounds, Outcome};

/// What the operator allows an agent request.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentPolicy {
    /// Defaults, and the maxima a request may ask for.
    pub defaults: Bounds,
    pub max_iterations: u32,
    pub max_calls: u32,
    pub max_code_retries: u32,
    /// Models a request may name; empty: any.
    pub allowed_models: Vec<String>,
    /// The model when a request names none.
    pub default_model: String,
}

impl Default for AgentPolicy {
    /// The server's defaults, without a model.
    fn default() -> Self {
        AgentPolicy {
            defaults: Bounds::default(),
            max_iterations: 30,
            max_calls: 30,
            max_code_retries: 10,
            allowed_models: Vec::new(),
            default_model: String::new(),
        }
    }
}

impl AgentPolicy {
    /// The operator's bounds for agent requests, as the settings give them.
    pub fn from_settings(s: &runcell_core::policy::AgentSettings) -> AgentPolicy {
        let defaults = AgentPolicy::default();
        let mut policy = AgentPolicy {
            max_iterations: s.max_iterations.unwrap_or(defaults.max_iterations),
            max_calls: s.max_calls.unwrap_or(defaults.max_calls),
            max_code_retries: s.max_code_retries.unwrap_or(defaults.max_code_retries),
            allowed_models: s.models.clone(),
            default_model: s.model.clone(),
            ..defaults
        };
        if let Some(t) = s.timeout {
            policy.defaults.deadline = t;
        }
        policy
    }
}

/// The model API client the settings describe (`None`: an upstream that is not
/// `anthropic` or `openai`; the settings model refuses those before this is called).
pub fn upstream_from_settings(s: &runcell_core::policy::AgentSettings) -> Option<crate::Upstream> {
    let wire = crate::Wire::parse(&s.upstream)?;
    Some(crate::Upstream::new(
        wire,
        s.base_url.as_deref(),
        s.api_key.clone(),
        s.model.clone(),
    ))
}

/// One tool of a request: `{"type": "runcell_tool" | "heroku_tool", "name": "code_exec_python",
/// "runtime_params": {"max_calls": 5}}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    #[serde(default)]
    pub runtime_params: RuntimeParams,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RuntimeParams {
    #[serde(default, deserialize_with = "whole")]
    pub max_calls: Option<u32>,
    // Other keys of hosted APIs' runtime params are accepted and ignored.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A whole number, also when written as a float (`30.0`: Python's `json.dumps` of a float,
/// and an integer to JSON Schema).
fn whole<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    n.as_u64()
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(f))
                .map(|f| f as u64)
        })
        .and_then(|v| u32::try_from(v).ok())
        .map(Some)
        .ok_or_else(|| {
            D::Error::custom(format!(
                "expected a whole number from 0 to {}, not {n}",
                u32::MAX
            ))
        })
}

/// A message of the request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RequestMessage {
    pub role: String,
    pub content: Value,
}

/// `POST /v1/agents`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRequest {
    pub model: Option<String>,
    pub messages: Vec<RequestMessage>,
    #[serde(default)]
    pub tools: Vec<RequestTool>,
    #[serde(default)]
    pub files: Vec<InputFile>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, deserialize_with = "whole")]
    pub max_iterations: Option<u32>,
    #[serde(default, deserialize_with = "whole")]
    pub max_code_retries: Option<u32>,
    // Chat Completions parameters that existing client code sends: the sampling ones are
    // passed to every model call, the others are accepted for what they mean here.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Output tokens per model call (`max_completion_tokens` is its newer name).
    #[serde(default, deserialize_with = "whole")]
    pub max_tokens: Option<u32>,
    #[serde(default, deserialize_with = "whole")]
    pub max_completion_tokens: Option<u32>,
    /// Only 1: the loop produces one answer.
    #[serde(default, deserialize_with = "whole")]
    pub n: Option<u32>,
    /// Only `auto` (or absent): the model decides when to run code.
    pub tool_choice: Option<Value>,
    /// Accepted: the last chunk of a stream always carries the usage.
    pub stream_options: Option<serde_json::Map<String, Value>>,
    /// Accepted: the loop runs one tool call after the other anyway.
    pub parallel_tool_calls: Option<bool>,
    /// Accepted and not passed on: the caller is known by its API key.
    pub user: Option<String>,
    pub metadata: Option<serde_json::Map<String, Value>>,
}

/// What a request asks of every model call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<u32>,
}

/// A request that passed validation: the conversation, the tool names, the bounds, the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidAgentRequest {
    pub conversation: Conversation,
    pub tools: Vec<String>,
    pub bounds: Bounds,
    pub model: String,
    pub files: Vec<InputFile>,
    pub stream: bool,
    pub sampling: Sampling,
}

/// The text of a message's content: a string, or the text parts of a list of parts.
fn content_text(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err("only text parts are accepted in message content".into()),
                }
            }
            Ok(out)
        }
        _ => Err("a message's content must be a string or a list of text parts".into()),
    }
}

impl AgentRequest {
    /// Check the request against the policy: roles, tools (code tools only, each once),
    /// bounds within the maxima, an allowed model.
    pub fn validate(&self, policy: &AgentPolicy) -> Result<ValidAgentRequest, String> {
        let mut conv = Conversation::default();
        for m in &self.messages {
            let text = content_text(&m.content)?;
            match m.role.as_str() {
                "system" | "developer" => {
                    conv.system = Some(match conv.system.take() {
                        Some(s) => format!("{s}\n\n{text}"),
                        None => text,
                    })
                }
                "user" => conv.items.push(Item::User(text)),
                "assistant" => conv.items.push(Item::Assistant {
                    text: Some(text),
                    calls: Vec::new(),
                }),
                other => {
                    return Err(format!(
                    "messages: role {other:?} is not accepted (system, developer, user, assistant)"
                ))
                }
            }
        }
        if !conv.items.iter().any(|i| matches!(i, Item::User(_))) {
            return Err("messages: at least one user message is needed".into());
        }
        let mut bounds = policy.defaults.clone();
        let mut tools = Vec::new();
        for t in &self.tools {
            if t.kind != "runcell_tool" && t.kind != "heroku_tool" {
                return Err(format!(
                    "tools: type {:?} is not accepted; use \"runcell_tool\" (or \"heroku_tool\")",
                    t.kind
                ));
            }
            if !t.name.starts_with("code_exec_") {
                return Err(format!("tools: {:?} is not a code_exec_* tool", t.name));
            }
            if tools.contains(&t.name) {
                return Err(format!("tools: {} is listed twice", t.name));
            }
            if let Some(n) = t.runtime_params.max_calls {
                if n == 0 || n > policy.max_calls {
                    return Err(format!(
                        "tools: max_calls of {} is {n}; it must be between 1 and {}",
                        t.name, policy.max_calls
                    ));
                }
                bounds.max_calls.insert(t.name.clone(), n);
            }
            tools.push(t.name.clone());
        }
        if tools.is_empty() {
            return Err("tools: list at least one code tool, e.g. {\"type\": \"runcell_tool\", \"name\": \"code_exec_python\"}".into());
        }
        if let Some(n) = self.max_iterations {
            if n == 0 || n > policy.max_iterations {
                return Err(format!(
                    "max_iterations is {n}; it must be between 1 and {}",
                    policy.max_iterations
                ));
            }
            bounds.max_iterations = n;
        }
        if let Some(n) = self.max_code_retries {
            if n == 0 || n > policy.max_code_retries {
                return Err(format!(
                    "max_code_retries is {n}; it must be between 1 and {}",
                    policy.max_code_retries
                ));
            }
            bounds.max_code_retries = n;
        }
        if let Some(t) = self.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
            return Err(format!("temperature is {t}; it must be between 0 and 2"));
        }
        if let Some(p) = self.top_p.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(format!("top_p is {p}; it must be between 0 and 1"));
        }
        let max_tokens = match (self.max_tokens, self.max_completion_tokens) {
            (Some(a), Some(b)) if a != b => {
                return Err("max_tokens and max_completion_tokens differ; send one".into())
            }
            (Some(0), _) | (_, Some(0)) => {
                return Err("max_tokens must be at least 1".into());
            }
            (a, b) => a.or(b),
        };
        if self.n.is_some_and(|n| n != 1) {
            return Err("n: the agent loop gives one answer; n must be 1".into());
        }
        match &self.tool_choice {
            None => {}
            Some(Value::String(s)) if s == "auto" => {}
            Some(other) => {
                return Err(format!(
                    "tool_choice {other}: only \"auto\" is accepted (the model decides when to run code)"
                ))
            }
        }
        let model = match &self.model {
            Some(m) if !policy.allowed_models.is_empty() && !policy.allowed_models.contains(m) => {
                return Err(format!(
                    "model {m:?} is not allowed here; the models are: {}",
                    policy.allowed_models.join(", ")
                ))
            }
            Some(m) => m.clone(),
            None => policy.default_model.clone(),
        };
        // The conversation is the loop's memory: it starts within the request's bound, or the
        // request is refused before any model is asked (a message of megabytes would be held
        // and sent on with every model call).
        let held = conv.approx_bytes();
        if held > bounds.max_conversation_bytes {
            return Err(format!(
                "messages: the conversation holds {held} bytes, more than the {} an agent \
                 request's conversation may hold; send data as files (they go to the sandbox, \
                 not to the model)",
                bounds.max_conversation_bytes
            ));
        }
        Ok(ValidAgentRequest {
            conversation: conv,
            tools,
            bounds,
            model,
            files: self.files.clone(),
            stream: self.stream,
            sampling: Sampling {
                temperature: self.temperature,
                top_p: self.top_p,
                max_tokens,
            },
        })
    }
}

impl AgentRequest {
    /// The JSON Schema of a request within `policy` (its bounds and models), as
    /// [`AgentRequest::validate`] checks it. Two rules are said more strictly than they are
    /// checked: `max_tokens` and `max_completion_tokens` are not both sent (equal values are
    /// accepted), and a tool is listed once (`maxContains`).
    pub fn schema(policy: &AgentPolicy) -> Value {
        let tool_names: Vec<String> = runcell_core::Language::ALL
            .iter()
            .map(|l| format!("code_exec_{}", l.name()))
            .collect();
        let text = json!({"type": "string"});
        let content = json!({
            "description": "A string, or a list of text parts.",
            "oneOf": [
                text,
                {"type": "array", "items": {
                    "type": "object",
                    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                    "required": ["type", "text"],
                }},
            ],
        });
        let count = |max: u32, description: &str| json!({"type": ["integer", "null"], "minimum": 1, "maximum": max, "description": description});
        let about_model = match policy.default_model.as_str() {
            "" => "The model (default: the server's).".to_string(),
            m => format!("The model (default {m})."),
        };
        let model = if policy.allowed_models.is_empty() {
            json!({"type": ["string", "null"], "description": about_model})
        } else {
            let mut models: Vec<Value> = policy.allowed_models.iter().map(|m| json!(m)).collect();
            models.push(Value::Null);
            json!({"enum": models, "description": about_model})
        };
        let once: Vec<Value> = tool_names
            .iter()
            .map(|n| json!({"contains": {"type": "object", "properties": {"name": {"const": n}}, "required": ["name"]}, "minContains": 0, "maxContains": 1}))
            .collect();
        json!({
            "type": "object",
            "description": "Chat Completions shaped: the conversation, the code tools the model may \
                use (with their `max_calls`), optional files for /workspace and the loop's bounds.",
            "properties": {
                "model": model,
                "messages": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "role": {"enum": ["system", "developer", "user", "assistant"]},
                            "content": content,
                        },
                        "required": ["role", "content"],
                    },
                    "contains": {"type": "object", "properties": {"role": {"const": "user"}}, "required": ["role"]},
                    "description": "The conversation; at least one user message.",
                },
                "tools": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "type": {"enum": ["runcell_tool", "heroku_tool"]},
                            "name": {"enum": tool_names},
                            "runtime_params": {
                                "type": "object",
                                "properties": {"max_calls": count(policy.max_calls, "Runs of this tool at most.")},
                                "description": "Other keys of hosted APIs' runtime params are accepted and ignored.",
                            },
                        },
                        "required": ["type", "name"],
                        "additionalProperties": false,
                    },
                    "allOf": once,
                    "description": "The code tools the model may use, each once.",
                },
                "files": {
                    "type": "array",
                    "items": runcell_core::InputFile::schema_value(),
                    "description": "Files placed in /workspace of every run.",
                },
                "stream": {"type": "boolean", "description": "Answer as server-sent chat.completion.chunk events."},
                "max_iterations": count(policy.max_iterations, "Model calls at most."),
                "max_code_retries": count(policy.max_code_retries, "Consecutive failed runs after which the model is told to answer."),
                "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
                "top_p": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "max_tokens": count(u32::MAX, "Output tokens per model call."),
                "max_completion_tokens": count(u32::MAX, "The newer name of max_tokens."),
                "n": {"enum": [1, null], "description": "Only 1: the loop gives one answer."},
                "tool_choice": {"enum": ["auto", null], "description": "Only auto: the model decides when to run code."},
                "stream_options": {"type": ["object", "null"], "description": "Accepted: the last chunk of a stream always carries the usage."},
                "parallel_tool_calls": {"type": ["boolean", "null"]},
                "user": {"type": ["string", "null"], "description": "Accepted and not passed on."},
                "metadata": {"type": ["object", "null"], "description": "Accepted and not passed on."},
            },
            "required": ["messages", "tools"],
            "not": {"required": ["max_tokens", "max_completion_tokens"]},
            "additionalProperties": false,
        })
    }
}

/// The JSON Schema of the `chat.completion` answer ([`completion`]).
pub fn completion_schema() -> Value {
    let count = json!({"type": "integer", "minimum": 0});
    json!({
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "chat.completion"},
            "created": count,
            "model": {"type": "string"},
            "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
                "type": "object",
                "properties": {
                    "index": count,
                    "message": {"type": "object", "properties": {
                        "role": {"const": "assistant"},
                        "content": {"type": ["string", "null"]},
                    }, "required": ["role", "content"]},
                    "finish_reason": {"type": "string"},
                },
                "required": ["index", "message", "finish_reason"],
            }},
            "usage": {"type": "object", "properties": {
                "prompt_tokens": count, "completion_tokens": count, "total_tokens": count,
            }, "required": ["prompt_tokens", "completion_tokens", "total_tokens"]},
            "runcell": {"type": "object", "properties": {
                "steps": {"type": "array", "items": {"type": "object"}},
                "code_attempts": count,
                "model_calls": count,
            }, "required": ["steps", "code_attempts", "model_calls"],
            "description": "runcell's extension: the loop's steps and counts."},
        },
        "required": ["id", "object", "created", "model", "choices", "usage", "runcell"],
    })
}

/// The `chat.completion` answer, with the `runcell` extension.
pub fn completion(id: &str, created: u64, model: &str, o: &Outcome) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": o.model.as_deref().unwrap_or(model),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": o.answer},
            "finish_reason": o.finish_reason,
        }],
        "usage": {
            "prompt_tokens": o.usage.prompt_tokens,
            "completion_tokens": o.usage.completion_tokens,
            "total_tokens": o.usage.total(),
        },
        "runcell": {
            "steps": o.steps,
            "code_attempts": o.code_attempts,
            "model_calls": o.model_calls,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Usage;

    fn policy() -> AgentPolicy {
        AgentPolicy {
            defaults: Bounds::default(),
            max_iterations: 20,
            max_calls: 20,
            max_code_retries: 5,
            allowed_models: Vec::new(),
            default_model: "default-model".into(),
        }
    }

    fn parse(v: Value) -> Result<ValidAgentRequest, String> {
        let r: AgentRequest = serde_json::from_value(v).map_err(|e| e.to_string())?;
        r.validate(&policy())
    }

    #[test]
    fn the_hosted_shape_is_accepted() {
        let v = parse(json!({
            "messages": [{"role": "system", "content": "be exact"},
                         {"role": "user", "content": [{"type": "text", "text": "std of [1, 2]?"}]}],
            "tools": [{"type": "heroku_tool", "name": "code_exec_python", "runtime_params": {"max_calls": 5, "target_app_name": "x"}}],
        }))
        .unwrap();
        assert_eq!(v.model, "default-model");
        assert_eq!(v.bounds.max_calls["code_exec_python"], 5);
        assert_eq!(v.conversation.system.as_deref(), Some("be exact"));
        assert_eq!(
            v.conversation.items,
            vec![Item::User("std of [1, 2]?".into())]
        );
        assert!(!v.stream);
        assert_eq!(v.sampling, Sampling::default());
    }

    #[test]
    fn whole_numbers_may_be_floats_and_objects_must_be_objects() {
        let base = || {
            json!({"messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "runcell_tool", "name": "code_exec_python", "runtime_params": {"max_calls": 4.0}}]})
        };
        let mut r = base();
        r["max_iterations"] = json!(3.0);
        r["max_tokens"] = json!(100.0);
        let v = parse(r).unwrap();
        assert_eq!(v.bounds.max_iterations, 3);
        assert_eq!(v.bounds.max_calls["code_exec_python"], 4);
        assert_eq!(v.sampling.max_tokens, Some(100));
        for (k, bad) in [
            ("max_iterations", json!(2.5)),
            ("max_tokens", json!(-1)),
            ("n", json!(1e12)),
            ("stream_options", json!([null])),
            ("metadata", json!("x")),
        ] {
            let mut r = base();
            r[k] = bad.clone();
            assert!(parse(r).is_err(), "{k}: {bad}");
        }
    }

    #[test]
    fn what_chat_completions_clients_send_is_accepted() {
        let v = parse(json!({
            "model": "m", "messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "runcell_tool", "name": "code_exec_python"}],
            "temperature": 0.2, "top_p": 0.9, "max_completion_tokens": 300, "n": 1,
            "tool_choice": "auto", "stream": true, "stream_options": {"include_usage": true},
            "parallel_tool_calls": false, "user": "u-1", "metadata": {"k": "v"},
        }))
        .unwrap();
        assert_eq!(
            v.sampling,
            Sampling {
                temperature: Some(0.2),
                top_p: Some(0.9),
                max_tokens: Some(300)
            }
        );
        assert!(v.stream);
        assert!(parse(json!({"messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "runcell_tool", "name": "code_exec_python"}], "logit_bias": {}}))
        .unwrap_err()
        .contains("logit_bias"));
    }

    #[test]
    fn what_is_refused_says_why() {
        for (req, says) in [
            (
                json!({"messages": [], "tools": [{"type": "runcell_tool", "name": "code_exec_python"}]}),
                "user message",
            ),
            (
                json!({"messages": [{"role": "user", "content": "q"}]}),
                "at least one code tool",
            ),
            (
                json!({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function", "name": "code_exec_python"}]}),
                "not accepted",
            ),
            (
                json!({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "runcell_tool", "name": "code_exec_python", "runtime_params": {"max_calls": 99}}]}),
                "between 1 and 20",
            ),
            (
                json!({"messages": [{"role": "tool", "content": "q"}], "tools": [{"type": "runcell_tool", "name": "code_exec_python"}]}),
                "role",
            ),
            (
                json!({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "runcell_tool", "name": "code_exec_python"}], "max_iterations": 0}),
                "max_iterations",
            ),
            (
                json!({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "runcell_tool", "name": "code_exec_python"}], "n": 2}),
                "n must be 1",
            ),
            (
                json!({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "runcell_tool", "name": "code_exec_python"}], "temperature": 3.0}),
                "temperature",
            ),
            (
                json!({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "runcell_tool", "name": "code_exec_python"}], "tool_choice": "none"}),
                "tool_choice",
            ),
            (
                json!({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "runcell_tool", "name": "code_exec_python"}], "max_tokens": 5, "max_completion_tokens": 6}),
                "differ",
            ),
        ] {
            let e = parse(req.clone()).unwrap_err();
            assert!(e.contains(says), "{req}: {e}");
        }
        let mut p = policy();
        p.allowed_models = vec!["a".into()];
        let r: AgentRequest = serde_json::from_value(
            json!({"model": "b", "messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "runcell_tool", "name": "code_exec_python"}]}),
        )
        .unwrap();
        assert!(r.validate(&p).unwrap_err().contains("not allowed"));
    }

    #[test]
    fn the_answer_is_a_chat_completion_with_the_runcell_extension() {
        let o = Outcome {
            answer: "28.64".into(),
            finish_reason: "stop",
            usage: Usage {
                prompt_tokens: 30,
                completion_tokens: 4,
            },
            steps: Vec::new(),
            code_attempts: 2,
            model_calls: 3,
            model: None,
        };
        let v = completion("agt_1", 7, "m", &o);
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], "28.64");
        assert_eq!(v["usage"]["total_tokens"], 34);
        assert_eq!(v["runcell"]["model_calls"], 3);
    }
}
