//! Tidying the JSON schemas that schemars derives, so every MCP host reads
//! them without warnings.
//!
//! schemars describes Rust types exactly: a `u32` gets `"format": "uint32"`
//! and an `Option<String>` gets `"type": ["string", "null"]`. Neither helps a
//! client here: the `format` values are not among JSON Schema's, and
//! TypeScript SDK hosts warn about them on every listing; and an optional
//! property that may be left out means the same as one that may be null
//! (the tools treat both alike, and results leave absent values out). So
//! [`tidy`] drops the non-standard formats (keeping `minimum`, which says
//! the same in standard words) and turns an optional property's nullable
//! type into the plain type.

use serde_json::{Map, Value};

/// The `format` values JSON Schema 2020-12 defines; any other is dropped.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Tidy a schema in place (see the module docs).
pub fn tidy(schema: &mut Map<String, Value>) {
    if let Some(Value::String(f)) = schema.get("format") {
        if !STANDARD_FORMATS.contains(&f.as_str()) {
            schema.remove("format");
        }
    }
    let required: Vec<String> = match schema.get("required") {
        Some(Value::Array(r)) => r
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        for (name, prop) in props.iter_mut() {
            if let Value::Object(p) = prop {
                if !required.contains(name) {
                    drop_null(p);
                }
            }
        }
    }
    for (_, v) in schema.iter_mut() {
        walk(v);
    }
}

fn walk(v: &mut Value) {
    match v {
        Value::Object(m) => tidy(m),
        Value::Array(a) => a.iter_mut().for_each(walk),
        _ => {}
    }
}

/// An optional property's `null` alternative, removed: `["X", "null"]`
/// becomes `"X"`, and `anyOf: [S, {"type": "null"}]` becomes `S` (with the
/// property's own description kept).
fn drop_null(p: &mut Map<String, Value>) {
    if let Some(Value::Array(types)) = p.get("type") {
        let rest: Vec<Value> = types
            .iter()
            .filter(|t| t.as_str() != Some("null"))
            .cloned()
            .collect();
        if rest.len() < types.len() {
            let t = if rest.len() == 1 {
                rest.into_iter().next().unwrap_or_default()
            } else {
                Value::Array(rest)
            };
            p.insert("type".into(), t);
        }
    }
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(alts)) = p.get(key) else {
            continue;
        };
        let is_null = |a: &Value| a.get("type").and_then(Value::as_str) == Some("null");
        if alts.len() == 2 && alts.iter().any(is_null) {
            let Some(Value::Object(other)) = alts.iter().find(|a| !is_null(a)).cloned() else {
                continue;
            };
            p.remove(key);
            for (k, v) in other {
                p.entry(k).or_insert(v);
            }
        }
    }
    // A `null` default says "absent": leave it out.
    if p.get("default") == Some(&Value::Null) {
        p.remove("default");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tidied(v: Value) -> Value {
        let mut m = v.as_object().cloned().unwrap();
        tidy(&mut m);
        Value::Object(m)
    }

    #[test]
    fn non_standard_formats_go_and_standard_ones_stay() {
        let v = tidied(json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "format": "uint32", "minimum": 0},
                "m": {"type": "integer", "format": "int64"},
                "t": {"type": "string", "format": "date-time"},
                "deep": {"type": "array", "items": {"type": "integer", "format": "uint64"}}
            },
            "required": ["n", "m", "t", "deep"]
        }));
        assert_eq!(
            v["properties"]["n"],
            json!({"type": "integer", "minimum": 0})
        );
        assert_eq!(v["properties"]["m"], json!({"type": "integer"}));
        assert_eq!(v["properties"]["t"]["format"], "date-time");
        assert_eq!(v["properties"]["deep"]["items"], json!({"type": "integer"}));
    }

    #[test]
    fn optional_properties_lose_their_null_alternative_and_required_ones_keep_it() {
        let v = tidied(json!({
            "type": "object",
            "properties": {
                "opt": {"type": ["string", "null"], "default": null},
                "req": {"type": ["integer", "null"]},
                "e": {"anyOf": [{"$ref": "#/$defs/Encoding"}, {"type": "null"}], "description": "d"},
                "many": {"type": ["string", "integer", "null"]}
            },
            "required": ["req"],
            "$defs": {"Inner": {"type": "object", "properties": {"x": {"type": ["boolean", "null"]}}}}
        }));
        assert_eq!(v["properties"]["opt"], json!({"type": "string"}));
        assert_eq!(v["properties"]["req"]["type"], json!(["integer", "null"]));
        assert_eq!(
            v["properties"]["e"],
            json!({"$ref": "#/$defs/Encoding", "description": "d"})
        );
        assert_eq!(
            v["properties"]["many"]["type"],
            json!(["string", "integer"])
        );
        assert_eq!(
            v["$defs"]["Inner"]["properties"]["x"],
            json!({"type": "boolean"})
        );
    }
}
