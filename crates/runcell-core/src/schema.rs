//! Schemas of the wire types, written once as JSON Schema (2020-12, which OpenAPI 3.1 uses)
//! and handed both to schemars (MCP) and to utoipa (OpenAPI).

use schemars::generate::SchemaSettings;
use serde_json::Value;

/// A JSON Schema as an OpenAPI schema object.
pub fn openapi(schema: Value) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    match serde_json::from_value(schema) {
        Ok(s) => utoipa::openapi::RefOr::T(s),
        // The schemas are ours and tested (see the tests below and the OpenAPI tests of the
        // server); an empty schema accepts anything rather than breaking the document.
        Err(_) => utoipa::openapi::RefOr::T(Default::default()),
    }
}

/// The JSON Schema of `T` as a request would send it, every subschema inlined (no
/// `$defs`/`$ref`, which some tool-calling APIs do not resolve and which models read less
/// well), without the Rust type's name and doc comment.
pub fn inline_json_schema<T: schemars::JsonSchema>() -> Value {
    inline(SchemaSettings::draft2020_12().for_deserialize(), |g| {
        g.into_root_schema_for::<T>()
    })
}

/// The same for `T` as it is serialized (a response).
pub fn inline_output_schema<T: schemars::JsonSchema>() -> Value {
    inline(SchemaSettings::draft2020_12().for_serialize(), |g| {
        g.into_root_schema_for::<T>()
    })
}

fn inline(
    settings: SchemaSettings,
    root: impl FnOnce(schemars::SchemaGenerator) -> schemars::Schema,
) -> Value {
    let schema = root(
        settings
            .with(|s| s.inline_subschemas = true)
            .into_generator(),
    );
    let mut v = serde_json::to_value(schema).unwrap_or(Value::Null);
    if let Value::Object(o) = &mut v {
        o.remove("$schema");
        o.remove("title");
        o.remove("description");
    }
    standard_formats(&mut v);
    v
}

/// Only JSON Schema's own formats: schemars names Rust's number types (`uint64`, `double`,
/// ...), which no validator knows (the MCP TypeScript SDK and Inspector warn on each). Their
/// ranges go into `minimum` and `maximum` instead.
fn standard_formats(v: &mut Value) {
    match v {
        Value::Object(o) => {
            let numeric = o.get("format").and_then(Value::as_str).and_then(|f| {
                let (unsigned, max): (bool, Option<u64>) = match f {
                    "uint8" => (true, Some(u8::MAX as u64)),
                    "uint16" => (true, Some(u16::MAX as u64)),
                    "uint32" => (true, Some(u32::MAX as u64)),
                    "uint64" | "uint" => (true, None),
                    "int8" | "int16" | "int32" | "int64" | "int" | "float" | "double" => {
                        (false, None)
                    }
                    _ => return None,
                };
                Some((unsigned, max))
            });
            if let Some((unsigned, max)) = numeric {
                o.remove("format");
                if unsigned && !o.contains_key("minimum") && !o.contains_key("exclusiveMinimum") {
                    o.insert("minimum".into(), 0.into());
                }
                if let Some(m) = max.filter(|_| !o.contains_key("maximum")) {
                    o.insert("maximum".into(), m.into());
                }
            }
            for child in o.values_mut() {
                standard_formats(child);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(standard_formats),
        _ => {}
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn only_standard_formats_remain_with_ranges_instead() {
        let mut v = serde_json::json!({"type": "object", "properties": {
            "a": {"type": "integer", "format": "uint64", "minimum": 0},
            "b": {"type": ["integer", "null"], "format": "uint16"},
            "c": {"type": "number", "format": "double"},
            "d": {"type": "string", "format": "date-time"},
            "e": {"items": [{"type": "integer", "format": "int32"}]},
        }});
        super::standard_formats(&mut v);
        let p = &v["properties"];
        assert_eq!(p["a"], serde_json::json!({"type": "integer", "minimum": 0}));
        assert_eq!(
            p["b"],
            serde_json::json!({"type": ["integer", "null"], "minimum": 0, "maximum": 65535})
        );
        assert_eq!(p["c"], serde_json::json!({"type": "number"}));
        assert_eq!(p["d"]["format"], "date-time");
        assert!(p["e"]["items"][0].get("format").is_none());
        // What runcell serves to MCP clients has none left.
        let out = crate::schema::inline_output_schema::<crate::Verdict>().to_string();
        for f in ["uint64", "uint16", "int32", "double"] {
            assert!(!out.contains(&format!("\"{f}\"")), "{f} in {out}");
        }
    }

    /// A schema that utoipa could not read becomes the empty schema: none of ours may.
    #[test]
    fn our_schemas_are_valid_openapi_schemas() {
        for (name, s) in [
            ("request", crate::ExecRequest::schema()),
            ("limits", crate::limits::limits_output_schema()),
        ] {
            let parsed: Result<utoipa::openapi::schema::Schema, _> = serde_json::from_value(s);
            assert!(parsed.is_ok(), "{name}: {:?}", parsed.err());
        }
        let s = crate::ExecRequest::schema();
        assert!(s["properties"]["memory"]["oneOf"].is_array(), "{s}");
    }
}
