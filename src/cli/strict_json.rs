//! JSON text to a `serde_json::Value`, refusing a key repeated within one object: plain
//! `serde_json` keeps the last one silently, so `{"command":"a","command":"b"}` would run
//! `b` while the harness logged `a`.

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parses `text` as one JSON value; a repeated key in any object is an error naming it.
pub(crate) fn parse(text: &str) -> serde_json::Result<Value> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.into()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Strict.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(Strict)?;
            if out.contains_key(&key) {
                return Err(A::Error::custom(format!("duplicate key `{key}`")));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
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
