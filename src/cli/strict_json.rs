//! JSON text to a `serde_json::Value`, refusing a key repeated within one object: plain
//! `serde_json` keeps the last one silently, so `{"command":"a","command":"b"}` would run
//! `b` while the harness logged `a`.

use serde_json::Value;

/// Parses `text` as one JSON value; a repeated key in any object is an error naming it.
pub(crate) fn parse(text: &str) -> serde_json::Result<Value> {
    // The same walk that refuses a composition's duplicate YAML keys, then the real parse.
    let mut de = serde_json::Deserializer::from_str(text);
    conch_config::refuse_duplicate_keys(&mut de)?;
    de.end()?;
    serde_json::from_str(text)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_repeated_key_at_any_depth_is_refused_by_name() {
        let e = parse(r#"{"tool":"bash","args":{"command":"a","command":"b"}}"#).unwrap_err();
        assert!(e.to_string().starts_with("duplicate key `command`"), "{e}");
        let e = parse(r#"{"id":1,"id":2}"#).unwrap_err();
        assert!(e.to_string().starts_with("duplicate key `id`"), "{e}");
        let v = parse(r#"{"a":[1,-2,1.5,"x",null,true,{"b":{}}],"c":"\u00e9"}"#).unwrap();
        assert_eq!(v, serde_json::json!({"a":[1,-2,1.5,"x",null,true,{"b":{}}],"c":"é"}));
        assert!(parse(r#"{"a":1} x"#).is_err(), "trailing input");
    }
}
