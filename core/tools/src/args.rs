//! Argument parsing and JSON schemas shared by every tool.

use conch_seams::{Error, Result};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

/// The JSON schema of an argument type.
pub fn schema_of<T: JsonSchema>() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or(serde_json::Value::Null)
}

/// Parses tool arguments, turning serde's message into an `invalid_argument` that names
/// the tool and the field path (`timeout_ms`, `a.b[2]`), so a model can tell which argument
/// to fix.
///
/// # Errors
/// `invalid_argument`.
pub fn parse_args<T: DeserializeOwned>(tool: &str, args: serde_json::Value) -> Result<T> {
    let args = if args.is_null() { serde_json::Value::Object(Default::default()) } else { args };
    if !args.is_object() {
        return Err(Error::invalid(format!(
            "invalid arguments for `{tool}`: expected a JSON object"
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

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized
    struct Outer {
        a: Inner,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized
    struct Inner {
        b: Vec<u64>,
    }

    fn message(args: serde_json::Value) -> String {
        parse_args::<Outer>("t", args).unwrap_err().message().to_string()
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
}
