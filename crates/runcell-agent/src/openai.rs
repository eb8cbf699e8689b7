//! OpenAI Chat Completions (`POST {base}/chat/completions`, `Authorization: Bearer`), which
//! also serves compatible servers (vLLM, Ollama, LM Studio): the request a conversation
//! becomes, and the turn an answer is.

use serde_json::{json, Map, Value};

use crate::conversation::{Conversation, Item, StopReason, ToolCall, ToolSpec, Turn, Usage};

/// The public API's base URL, as the official SDK has it.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The body of a Chat Completions request.
pub fn request_body(model: &str, conv: &Conversation, tools: &[ToolSpec]) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = &conv.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for item in &conv.items {
        messages.push(match item {
            Item::User(text) => json!({"role": "user", "content": text}),
            Item::Assistant { text, calls } => {
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                m.insert(
                    "content".into(),
                    text.as_ref().map_or(Value::Null, |t| json!(t)),
                );
                if !calls.is_empty() {
                    let calls: Vec<Value> = calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments.to_string()},
                            })
                        })
                        .collect();
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                Value::Object(m)
            }
            // Chat Completions has no error flag on a tool message: the content says it.
            Item::ToolResult {
                call_id,
                content,
                is_error,
            } => json!({
                "role": "tool",
                "tool_call_id": call_id,
                "content": if *is_error { format!("ERROR\n{content}") } else { content.clone() },
            }),
        });
    }
    let mut body = json!({"model": model, "messages": messages});
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema}})
            })
            .collect();
    }
    body
}

/// What is wrong with an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the upstream's answer is not a Chat Completions response: {0}")]
pub struct WireError(pub String);

/// The turn of a Chat Completions response.
pub fn parse_response(v: &Value) -> Result<Turn, WireError> {
    let bad = |m: &str| WireError(m.to_string());
    let choice = v["choices"]
        .as_array()
        .and_then(|c| c.first())
        .ok_or_else(|| bad("no choices"))?;
    let message = choice["message"]
        .as_object()
        .ok_or_else(|| bad("choices[0] has no message"))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("message.content is not a string")),
    };
    let mut calls = Vec::new();
    if let Some(list) = message.get("tool_calls").filter(|v| !v.is_null()) {
        for c in list
            .as_array()
            .ok_or_else(|| bad("tool_calls is not a list"))?
        {
            let id = c["id"]
                .as_str()
                .ok_or_else(|| bad("a tool call has no id"))?;
            let name = c["function"]["name"]
                .as_str()
                .ok_or_else(|| bad("a tool call has no function name"))?;
            // Arguments are a JSON text; a model may write invalid JSON: it is kept as a
            // string, and the loop answers the model that the arguments are invalid.
            let raw = c["function"]["arguments"].as_str().unwrap_or("{}");
            let arguments = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.into()));
            calls.push(ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments,
            });
        }
    }
    let stop = match choice["finish_reason"].as_str() {
        Some("stop") | None => StopReason::EndTurn,
        Some("tool_calls") | Some("function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_string()),
    };
    let usage = Usage {
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
    };
    Ok(Turn {
        text,
        calls,
        stop,
        usage,
        model: v["model"].as_str().map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_becomes_messages_and_tools() {
        let conv = Conversation {
            system: Some("be brief".into()),
            items: vec![
                Item::User("std of [1,2]?".into()),
                Item::Assistant {
                    text: None,
                    calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "code_exec_python".into(),
                        arguments: json!({"code": "import scipy"}),
                    }],
                },
                Item::ToolResult {
                    call_id: "call_1".into(),
                    content: "ModuleNotFoundError".into(),
                    is_error: true,
                },
            ],
        };
        let tools = [ToolSpec {
            name: "code_exec_python".into(),
            description: "Run Python".into(),
            input_schema: json!({"type": "object"}),
        }];
        let b = request_body("gpt-x", &conv, &tools);
        assert_eq!(
            b["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(
            b["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{\"code\":\"import scipy\"}"
        );
        assert_eq!(b["messages"][2]["content"], Value::Null);
        assert_eq!(b["messages"][3]["role"], "tool");
        assert!(b["messages"][3]["content"]
            .as_str()
            .unwrap()
            .starts_with("ERROR\n"));
        assert_eq!(
            b["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
    }

    #[test]
    fn answers_become_turns() {
        let t = parse_response(&json!({
            "id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "code_exec_python", "arguments": "{\"code\": \"print(1)\"}"}}]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        }))
        .unwrap();
        assert_eq!(t.stop, StopReason::ToolUse);
        assert_eq!(t.calls[0].arguments, json!({"code": "print(1)"}));
        assert_eq!(t.usage.total(), 15);
        let t = parse_response(&json!({"choices": [{"finish_reason": "stop",
            "message": {"role": "assistant", "content": "42"}}]}))
        .unwrap();
        assert_eq!(
            (t.text.as_deref(), t.stop),
            (Some("42"), StopReason::EndTurn)
        );
        // Invalid JSON arguments are kept, for the loop to answer.
        let t = parse_response(
            &json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "n", "arguments": "{oops"}}]}}]}),
        )
        .unwrap();
        assert_eq!(t.calls[0].arguments, json!("{oops"));
        for garbage in [
            json!({}),
            json!({"choices": []}),
            json!({"choices": [{"message": {"content": 3}}]}),
        ] {
            assert!(parse_response(&garbage).is_err(), "{garbage}");
        }
    }
}
