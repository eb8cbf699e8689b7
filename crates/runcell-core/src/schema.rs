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
    v
}

#[cfg(test)]
mod tests {
    use utoipa::PartialSchema;

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
        let s = serde_json::to_value(<crate::ExecRequest as PartialSchema>::schema()).unwrap();
        assert!(s["properties"]["memory"]["oneOf"].is_array(), "{s}");
    }
}
