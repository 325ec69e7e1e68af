//! Argument parsing and JSON schemas shared by every tool.

use conch_seams::{Error, Result};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

/// The JSON schema of an argument type.
pub fn schema_of<T: JsonSchema>() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or(serde_json::Value::Null)
}

/// Parses tool arguments, turning serde's message into an `invalid_argument` that names
/// the tool and the field.
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
    serde_json::from_value(args)
        .map_err(|e| Error::invalid(format!("invalid arguments for `{tool}`: {e}")))
}
