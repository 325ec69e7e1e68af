//! Argument parsing and JSON schemas shared by every tool.
//!
//! Tool schemas are written in the plain subset of JSON Schema that every MCP client can
//! map onto its own dialect (Gemini function declarations, OpenAPI 3.0): each property has
//! one `type` string, an optional argument is simply not `required` (never a `null` type),
//! enumerations are `enum` lists of strings, nothing is referenced (`$ref`, `$defs`) or
//! composed (`oneOf`, `anyOf`, `allOf`, `const`), integers carry no `format`, objects say
//! `additionalProperties: false`, and descriptions are single paragraphs.
//!
//! Arguments are serde types with schemas from schemars and `deny_unknown_fields`, all parsed by
//! `parse_args`, whose errors name the field path (`timeout_ms`, `a.b[2]`) and which refuses a
//! field the tool's published schema does not offer, listing the ones it does. `schema_of` rewrites
//! schemars' output into the subset above; `tests/cli/schemas.rs` walks every embedded
//! composition's tools.

use conch_seams::{Error, Result};
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// The JSON schema of an argument type, in the plain subset described in the module docs.
pub fn schema_of<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = true;
        })
        .into_generator();
    let mut schema =
        serde_json::to_value(generator.into_root_schema_for::<T>()).unwrap_or(Value::Null);
    plain(&mut schema);
    schema
}

/// Rewrites one (sub)schema into the plain subset, children first.
fn plain(schema: &mut Value) {
    let Value::Object(obj) = schema else { return };
    obj.remove("$schema");
    obj.remove("$defs");
    // Integer formats (`uint64`, `uint`) are not OpenAPI 3.0 formats; `minimum` says
    // what matters.
    obj.remove("format");
    // `Option` fields default to null, which no plain type admits; absent says the same.
    if obj.get("default").is_some_and(Value::is_null) {
        obj.remove("default");
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        let Some(Value::Array(options)) = obj.remove(key) else { continue };
        let options: Vec<Value> = options.into_iter().filter(|o| !is_null_schema(o)).collect();
        let consts: Option<Vec<Value>> = options
            .iter()
            .map(|o| o.get("const").or_else(|| single_enum(o)).filter(|c| c.is_string()).cloned())
            .collect();
        match (consts, options.len()) {
            // A unit-variant enum whose variants carry docs: its values, as an `enum`.
            (Some(values), n) if n > 0 => {
                obj.insert("type".into(), "string".into());
                obj.insert("enum".into(), Value::Array(values));
            }
            // `Option<Struct>` and friends: the one remaining option is the schema.
            (_, 1) => {
                if let Some(Value::Object(only)) = options.into_iter().next() {
                    for (k, v) in only {
                        // The field's own description wins over the type's.
                        obj.entry(k).or_insert(v);
                    }
                }
            }
            (_, _) => {
                obj.insert(key.into(), Value::Array(options));
            }
        }
    }
    if let Some(c) = obj.remove("const") {
        obj.insert("enum".into(), Value::Array(vec![c]));
    }
    if let Some(Value::Array(types)) = obj.get("type") {
        let kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        if kept.len() == 1 {
            obj.insert("type".into(), kept.into_iter().next().unwrap_or(Value::Null));
        } else {
            obj.insert("type".into(), Value::Array(kept));
        }
    }
    if let Some(Value::Array(values)) = obj.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    if let Some(Value::String(d)) = obj.get_mut("description") {
        *d = one_paragraph(d);
    }
    if let Some(Value::Object(props)) = obj.get_mut("properties") {
        for p in props.values_mut() {
            plain(p);
        }
    }
    if let Some(items) = obj.get_mut("items") {
        plain(items);
    }
    if obj.get("type").and_then(Value::as_str) == Some("object") {
        obj.entry("additionalProperties").or_insert(Value::Bool(false));
        obj.entry("properties").or_insert_with(|| Value::Object(Map::new()));
    }
}

fn is_null_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null")
}

fn single_enum(v: &Value) -> Option<&Value> {
    match v.get("enum") {
        Some(Value::Array(values)) if values.len() == 1 => values.first(),
        _ => None,
    }
}

/// A doc comment's text as one paragraph: its hard line breaks become spaces.
fn one_paragraph(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The names of the properties `schema` offers, in its order.
fn offered(schema: &Value) -> Vec<&str> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Parses tool arguments against the tool's published `schema`, turning serde's message
/// into an `invalid_argument` that names the tool and the field path (`timeout_ms`,
/// `a.b[2]`), so a model can tell which argument to fix. A top-level field the schema does
/// not offer is refused with the list of fields it does offer (a tool may withhold fields
/// its type knows, such as `sandbox_permissions` outside a sandbox).
///
/// # Errors
/// `invalid_argument`.
pub fn parse_args<T: DeserializeOwned>(tool: &str, args: Value, schema: &Value) -> Result<T> {
    let args = if args.is_null() { Value::Object(Map::new()) } else { args };
    let Some(obj) = args.as_object() else {
        return Err(Error::invalid(format!(
            "invalid arguments for `{tool}`: expected a JSON object"
        )));
    };
    let fields = offered(schema);
    if let Some(unknown) = obj.keys().find(|k| !fields.contains(&k.as_str())) {
        let expected = match fields.as_slice() {
            [] => "there are none".to_string(),
            [one] => format!("expected `{one}`"),
            many => format!(
                "expected one of {}",
                many.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
            ),
        };
        return Err(Error::invalid(format!(
            "invalid arguments for `{tool}`: unknown field `{unknown}`, {expected}"
        )));
    }
    // serde's own messages say what was expected but not where; serde_path_to_error tracks
    // the path and its Display puts `<path>: ` in front (nothing for a top-level error such
    // as a missing field, whose message already names the field).
    serde_path_to_error::deserialize(args)
        .map_err(|e| Error::invalid(format!("invalid arguments for `{tool}`: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized
    struct Outer {
        a: Inner,
        /// Optional, with a doc comment
        /// over two lines.
        #[serde(default)]
        n: Option<u64>,
        #[serde(default)]
        pick: Option<Pick>,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized
    struct Inner {
        b: Vec<u64>,
    }

    /// Documented variants make schemars emit one-of-const alternatives.
    #[derive(Debug, Deserialize, JsonSchema)]
    #[allow(dead_code)] // only deserialized
    enum Pick {
        /// The first.
        #[serde(rename = "one")]
        One,
        /// The second.
        #[serde(rename = "two")]
        Two,
    }

    fn message(args: Value) -> String {
        parse_args::<Outer>("t", args, &schema_of::<Outer>()).unwrap_err().message().to_string()
    }

    #[test]
    fn errors_name_the_nested_field_path() {
        assert_eq!(
            message(json!({"a": {"b": [1, 2, "x"]}})),
            "invalid arguments for `t`: a.b[2]: invalid type: string \"x\", expected u64"
        );
        assert_eq!(
            message(json!({"a": {"c": 1}})),
            "invalid arguments for `t`: a.c: unknown field `c`, expected `b`"
        );
        assert_eq!(message(json!({})), "invalid arguments for `t`: missing field `a`");
        assert_eq!(message(json!([1])), "invalid arguments for `t`: expected a JSON object");
    }

    #[test]
    fn an_unknown_field_lists_only_what_the_published_schema_offers() {
        let mut schema = schema_of::<Outer>();
        schema["properties"].as_object_mut().unwrap().remove("pick");
        let e = parse_args::<Outer>("t", json!({"a": {"b": []}, "x": 1}), &schema).unwrap_err();
        assert_eq!(
            e.message(),
            "invalid arguments for `t`: unknown field `x`, expected one of `a`, `n`"
        );
        // A field the type knows but the schema withholds is refused the same way.
        let e = parse_args::<Outer>("t", json!({"a": {"b": []}, "pick": "one"}), &schema);
        assert!(
            e.unwrap_err().message().contains("unknown field `pick`, expected one of `a`, `n`")
        );
    }

    #[test]
    fn schemas_are_plain() {
        let schema = schema_of::<Outer>();
        let props = &schema["properties"];
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["required"], json!(["a"]));
        assert_eq!(props["n"]["type"], "integer", "{schema}");
        assert!(props["n"].get("format").is_none(), "{schema}");
        assert_eq!(props["n"]["description"], "Optional, with a doc comment over two lines.");
        assert_eq!(props["pick"]["type"], "string", "{schema}");
        assert_eq!(props["pick"]["enum"], json!(["one", "two"]), "{schema}");
        assert_eq!(props["a"]["type"], "object", "{schema}");
        assert_eq!(props["a"]["additionalProperties"], false, "{schema}");
        assert_eq!(props["a"]["properties"]["b"]["items"]["type"], "integer", "{schema}");
        assert!(props["n"].get("default").is_none(), "{schema}");
        let text = schema.to_string();
        for banned in ["\"$ref\"", "$defs", "oneOf", "anyOf", "allOf", "const\"", "null", "$schema"]
        {
            assert!(!text.contains(banned), "{banned} in {schema}");
        }
    }
}
