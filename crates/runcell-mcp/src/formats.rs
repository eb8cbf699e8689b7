//! The same tools for agents that do not speak MCP: Anthropic tool-use definitions and OpenAI
//! function-calling definitions, ready for an agent loop that posts each call's input, plus
//! `"language"`, to `POST /v1/execute`. The input schemas are the MCP ones, unchanged.

use serde_json::{json, Value};

use crate::catalog::Catalog;

/// The formats `runcell tools --format` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `[{"name", "description", "input_schema"}]` (Messages API `tools`).
    Anthropic,
    /// `[{"type": "function", "function": {"name", "description", "parameters"}}]` (Chat
    /// Completions `tools`).
    OpenAi,
    /// The MCP `tools/list` entries.
    Mcp,
}

/// The tool list in `format`, as a JSON array.
pub fn render(catalog: &Catalog, format: Format) -> Value {
    let tools = catalog.tools().iter();
    match format {
        Format::Anthropic => tools
            .map(|t| {
                json!({
                    "name": t.name,
                    "description": t.description,
                    "input_schema": *t.input_schema,
                })
            })
            .collect(),
        Format::OpenAi => tools
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": *t.input_schema,
                    },
                })
            })
            .collect(),
        Format::Mcp => serde_json::to_value(catalog.mcp_tools()).unwrap_or(Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::RuntimeInfo;
    use runcell_core::{Language, Policy};

    #[test]
    fn every_format_carries_the_mcp_input_schema() {
        let rts: Vec<RuntimeInfo> = Language::ALL
            .iter()
            .map(|&language| RuntimeInfo {
                language,
                version: Some("1.0".into()),
                packages: None,
                unavailable: None,
            })
            .collect();
        let c = Catalog::new(&Policy::for_host(1 << 30, 1), &rts);
        let mcp = render(&c, Format::Mcp);
        let anthropic = render(&c, Format::Anthropic);
        let openai = render(&c, Format::OpenAi);
        assert_eq!(mcp.as_array().unwrap().len(), 5);
        for i in 0..5 {
            let m = &mcp[i];
            assert_eq!(anthropic[i]["name"], m["name"]);
            assert_eq!(anthropic[i]["description"], m["description"]);
            assert_eq!(anthropic[i]["input_schema"], m["inputSchema"]);
            assert_eq!(openai[i]["type"], "function");
            assert_eq!(openai[i]["function"]["name"], m["name"]);
            assert_eq!(openai[i]["function"]["parameters"], m["inputSchema"]);
            assert!(m["outputSchema"].is_object());
        }
    }
}
