//! Anthropic Messages (`POST {base}/v1/messages`, `x-api-key`, `anthropic-version`): the
//! request a conversation becomes (tool calls as `tool_use` blocks, results as `tool_result`
//! blocks with `is_error`), and the turn an answer is.

use serde_json::{json, Value};

use crate::conversation::{Conversation, Item, StopReason, ToolCall, ToolSpec, Turn, Usage};

/// The public API's base URL, as the official SDK has it.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The API version sent with every request.
pub const API_VERSION: &str = "2023-06-01";

/// The body of a Messages request. Consecutive user-side items (tool results, then text) go
/// into one user message, as the API requires alternating roles.
pub fn request_body(
    model: &str,
    max_tokens: u32,
    conv: &Conversation,
    tools: &[ToolSpec],
) -> Value {
    let mut messages: Vec<Value> = Vec::new();
    let mut push = |role: &str, block: Value| {
        if let Some(last) = messages.last_mut().filter(|m| m["role"] == role) {
            if let Some(blocks) = last["content"].as_array_mut() {
                blocks.push(block);
                return;
            }
        }
        messages.push(json!({"role": role, "content": [block]}));
    };
    for item in &conv.items {
        match item {
            Item::User(text) => push("user", json!({"type": "text", "text": text})),
            Item::Assistant { text, calls } => {
                if let Some(t) = text.as_ref().filter(|t| !t.is_empty()) {
                    push("assistant", json!({"type": "text", "text": t}));
                }
                for c in calls {
                    let input = if c.arguments.is_object() {
                        c.arguments.clone()
                    } else {
                        json!({})
                    };
                    push(
                        "assistant",
                        json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}),
                    );
                }
            }
            Item::ToolResult {
                call_id,
                content,
                is_error,
            } => push(
                "user",
                json!({"type": "tool_result", "tool_use_id": call_id, "content": content,
                       "is_error": is_error}),
            ),
        }
    }
    let mut body = json!({"model": model, "max_tokens": max_tokens, "messages": messages});
    if let Some(system) = &conv.system {
        body["system"] = json!(system);
    }
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
    }
    body
}

/// What is wrong with an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the upstream's answer is not a Messages response: {0}")]
pub struct WireError(pub String);

/// The turn of a Messages response.
pub fn parse_response(v: &Value) -> Result<Turn, WireError> {
    let bad = |m: &str| WireError(m.to_string());
    let blocks = v["content"]
        .as_array()
        .ok_or_else(|| bad("no content list"))?;
    let mut text = String::new();
    let mut calls = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => text.push_str(
                b["text"]
                    .as_str()
                    .ok_or_else(|| bad("a text block has no text"))?,
            ),
            Some("tool_use") => calls.push(ToolCall {
                id: b["id"]
                    .as_str()
                    .ok_or_else(|| bad("a tool_use block has no id"))?
                    .to_string(),
                name: b["name"]
                    .as_str()
                    .ok_or_else(|| bad("a tool_use block has no name"))?
                    .to_string(),
                arguments: b["input"].clone(),
            }),
            // Thinking and other blocks carry nothing the loop uses.
            Some(_) => {}
            None => return Err(bad("a content block has no type")),
        }
    }
    let stop = match v["stop_reason"].as_str() {
        Some("end_turn") | Some("stop_sequence") | None => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
    };
    Ok(Turn {
        text: (!text.is_empty()).then_some(text),
        calls,
        stop,
        usage: Usage {
            prompt_tokens: v["usage"]["input_tokens"].as_u64().unwrap_or(0),
            completion_tokens: v["usage"]["output_tokens"].as_u64().unwrap_or(0),
        },
        model: v["model"].as_str().map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_and_text_share_a_user_message_and_errors_are_flagged() {
        let conv = Conversation {
            system: Some("sys".into()),
            items: vec![
                Item::User("q".into()),
                Item::Assistant {
                    text: Some("let me run it".into()),
                    calls: vec![ToolCall {
                        id: "toolu_1".into(),
                        name: "code_exec_python".into(),
                        arguments: json!({"code": "1/0"}),
                    }],
                },
                Item::ToolResult {
                    call_id: "toolu_1".into(),
                    content: "ZeroDivisionError".into(),
                    is_error: true,
                },
                Item::User("and now?".into()),
            ],
        };
        let b = request_body("claude-x", 1024, &conv, &[]);
        assert_eq!(b["system"], "sys");
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[1]["content"][1]["type"], "tool_use");
        assert_eq!(m[2]["content"][0]["is_error"], true);
        assert_eq!(m[2]["content"][1]["text"], "and now?");
        assert!(b.get("tools").is_none());
    }

    #[test]
    fn answers_become_turns() {
        let t = parse_response(&json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "Running it."},
                        {"type": "tool_use", "id": "toolu_1", "name": "code_exec_python", "input": {"code": "print(1)"}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 7, "output_tokens": 3}
        }))
        .unwrap();
        assert_eq!(t.stop, StopReason::ToolUse);
        assert_eq!(t.calls[0].arguments["code"], "print(1)");
        assert_eq!(t.text.as_deref(), Some("Running it."));
        assert_eq!(t.usage.total(), 10);
        assert!(parse_response(&json!({"content": "no"})).is_err());
        assert!(parse_response(&json!({"content": [{"text": "x"}]})).is_err());
    }
}
