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
    /// `[{"type": "function", "name", "description", "parameters", "strict": false}]`
    /// (Responses API `tools`).
    OpenAiResponses,
    /// Chat Completions with `"strict": true`: the schema follows OpenAI's strict rules
    /// (every property required, optional ones nullable, no `default`, no unsupported
    /// keywords).
    OpenAiStrict,
    /// The Responses API with `"strict": true`.
    OpenAiResponsesStrict,
}

/// `schema` as OpenAI's strict mode requires it: every object closed
/// (`additionalProperties: false`) with every property required, a property that was
/// optional made nullable instead, and no keyword strict mode refuses (`default`, `examples`,
/// `oneOf`, `not`, string lengths, `uniqueItems`).
pub fn strict_schema(schema: &Value) -> Value {
    let Value::Object(o) = schema else {
        return schema.clone();
    };
    let mut out = serde_json::Map::new();
    for (k, v) in o {
        match k.as_str() {
            "default" | "examples" | "oneOf" | "not" | "minLength" | "maxLength"
            | "uniqueItems" | "$schema" => {}
            "properties" => {}
            "items" => {
                out.insert(k.clone(), strict_schema(v));
            }
            "anyOf" => {
                out.insert(
                    k.clone(),
                    Value::Array(
                        v.as_array()
                            .into_iter()
                            .flatten()
                            .map(strict_schema)
                            .collect(),
                    ),
                );
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(Value::Object(props)) = o.get("properties") {
        let required: Vec<&str> = o
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut strict_props = serde_json::Map::new();
        for (name, p) in props {
            let mut p = strict_schema(p);
            if !required.contains(&name.as_str()) {
                nullable(&mut p);
            }
            strict_props.insert(name.clone(), p);
        }
        out.insert(
            "required".into(),
            Value::Array(strict_props.keys().map(|k| json!(k)).collect()),
        );
        out.insert("properties".into(), Value::Object(strict_props));
        out.insert("additionalProperties".into(), json!(false));
    }
    Value::Object(out)
}

/// `null` allowed too (how strict mode says "optional").
fn nullable(p: &mut Value) {
    let Value::Object(o) = p else { return };
    match o.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = t.clone();
            o.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(types)) if !types.contains(&json!("null")) => types.push(json!("null")),
        Some(_) => {}
        None => {
            if let Some(Value::Array(any)) = o.get_mut("anyOf") {
                if !any.contains(&json!({"type": "null"})) {
                    any.push(json!({"type": "null"}));
                }
            }
        }
    }
    if let Some(Value::Array(values)) = o.get_mut("enum") {
        if !values.contains(&Value::Null) {
            values.push(Value::Null);
        }
    }
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
        Format::OpenAiStrict => tools
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": strict_schema(&Value::Object((*t.input_schema).clone())),
                        "strict": true,
                    },
                })
            })
            .collect(),
        Format::OpenAiResponses | Format::OpenAiResponsesStrict => tools
            .map(|t| {
                let strict = format == Format::OpenAiResponsesStrict;
                let schema = Value::Object((*t.input_schema).clone());
                json!({
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": if strict { strict_schema(&schema) } else { schema },
                    "strict": strict,
                })
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(policy: LimitPolicy) -> runcell_core::EngineConfig {
        let mut c = runcell_core::EngineConfig::for_host();
        c.policy = policy;
        c.network = Default::default();
        c.packages = Default::default();
        c
    }
    use crate::catalog::RuntimeInfo;
    use runcell_core::{Language, LimitPolicy};

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
        let c = Catalog::new(&config(LimitPolicy::for_host(1 << 30, 1)), &rts);
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

    #[test]
    fn strict_schemas_close_every_object_and_make_optional_nullable() {
        let catalog = Catalog::new(
            &config(LimitPolicy::for_host(8 << 30, 2)),
            &[RuntimeInfo {
                language: Language::Python,
                version: Some("3.11".into()),
                packages: None,
                unavailable: None,
            }],
        );
        let tools = render(&catalog, Format::OpenAiStrict);
        let params = &tools[0]["function"]["parameters"];
        assert_eq!(tools[0]["function"]["strict"], true);
        fn check(v: &Value, path: &str) {
            if let Some(props) = v.get("properties").and_then(Value::as_object) {
                assert_eq!(v["additionalProperties"], false, "{path}");
                let req: Vec<&str> = v["required"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_str().unwrap())
                    .collect();
                let keys: Vec<&str> = props.keys().map(String::as_str).collect();
                assert_eq!(req, keys, "{path}");
                for (k, p) in props {
                    check(p, &format!("{path}.{k}"));
                }
            }
            if let Some(items) = v.get("items") {
                check(items, &format!("{path}[]"));
            }
            for bad in [
                "default",
                "oneOf",
                "not",
                "examples",
                "minLength",
                "maxLength",
            ] {
                assert!(v.get(bad).is_none(), "{bad} at {path}");
            }
        }
        check(params, "parameters");
        // code was required: not nullable; timeout was optional: nullable.
        assert_eq!(params["properties"]["code"]["type"], "string");
        assert_eq!(
            params["properties"]["timeout"]["type"],
            json!(["number", "null"])
        );
        let r = render(&catalog, Format::OpenAiResponses);
        assert_eq!(r[0]["type"], "function");
        assert_eq!(r[0]["name"], "code_exec_python");
        assert_eq!(r[0]["strict"], false);
        assert!(r[0]["parameters"]["properties"]["code"].is_object());
        let r = render(&catalog, Format::OpenAiResponsesStrict);
        assert_eq!(r[0]["strict"], true);
        assert_eq!(r[0]["parameters"]["additionalProperties"], false);
    }
}
