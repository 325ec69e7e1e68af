//! envd's request messages (`spec/envd/*.proto` in e2b-dev/E2B) in protobuf's JSON mapping,
//! and the helpers that write its responses.
//!
//! The mapping's rules a parser must accept: field names in lowerCamelCase or as declared,
//! `null` or an absent field for the default, integers as numbers or strings, bytes as
//! base64 (standard or URL-safe, padded or not), enums by name or number, and unknown fields
//! ignored. Responses are written with lowerCamelCase names, 64-bit integers as strings and
//! timestamps in RFC 3339, as protobuf's own JSON printer writes them.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::connect::RpcError;

/// A request message as `T`, or an `invalid_argument` naming what is wrong.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(message: Value) -> Result<T, RpcError> {
    serde_json::from_value(message)
        .map_err(|e| RpcError::invalid(format!("the request message is not valid: {e}")))
}

/// `null` is the default, as an absent field is.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// An integer field: a JSON number or a string of digits.
fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None => Ok(None),
        Some(Value::Number(n)) => {
            n.as_i64().map(Some).ok_or_else(|| de::Error::custom(format!("{n} is not an integer")))
        }
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| de::Error::custom(format!("{s:?} is not an integer"))),
        Some(other) => Err(de::Error::custom(format!("{other} is not an integer"))),
    }
}

fn u32_field<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match int(d)? {
        None => Ok(None),
        Some(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| de::Error::custom(format!("{n} is out of range"))),
    }
}

fn u32_or_zero<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    Ok(u32_field(d)?.unwrap_or(0))
}

/// A bytes field: base64 in any of its common alphabets and paddings.
fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let trimmed = text.trim_end_matches('=');
    let standard = base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed);
    standard
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(trimmed))
        .map(Some)
        .map_err(|e| de::Error::custom(format!("not base64: {e}")))
}

/// Bytes as the JSON mapping writes them (standard base64, padded).
pub(crate) fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// `ProcessConfig`: what runs, with which arguments, environment and directory.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub(crate) struct ProcessConfig {
    #[serde(deserialize_with = "nullable")]
    pub(crate) cmd: String,
    #[serde(deserialize_with = "nullable")]
    pub(crate) args: Vec<String>,
    #[serde(deserialize_with = "nullable")]
    pub(crate) envs: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cwd: Option<String>,
}

/// `PTY.Size`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct PtySize {
    #[serde(deserialize_with = "u32_or_zero")]
    pub(crate) cols: u32,
    #[serde(deserialize_with = "u32_or_zero")]
    pub(crate) rows: u32,
}

/// `PTY`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Pty {
    pub(crate) size: Option<PtySize>,
}

/// `StartRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StartRequest {
    pub(crate) process: Option<ProcessConfig>,
    pub(crate) pty: Option<Pty>,
    pub(crate) tag: Option<String>,
    /// Absent means a piped stdin (envd's default for older SDKs).
    pub(crate) stdin: Option<bool>,
}

/// `ProcessSelector`: a pid or a tag.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Selector {
    #[serde(deserialize_with = "u32_field")]
    pub(crate) pid: Option<u32>,
    pub(crate) tag: Option<String>,
}

/// Requests that name one process: `Connect`, `CloseStdin`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ProcessRequest {
    pub(crate) process: Option<Selector>,
}

/// `ProcessInput`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Input {
    #[serde(deserialize_with = "bytes")]
    pub(crate) stdin: Option<Vec<u8>>,
    #[serde(deserialize_with = "bytes")]
    pub(crate) pty: Option<Vec<u8>>,
}

/// `SendInputRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct SendInputRequest {
    pub(crate) process: Option<Selector>,
    pub(crate) input: Option<Input>,
}

/// `Signal`: envd knows two.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Signal {
    #[default]
    Unspecified,
    Term,
    Kill,
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Option::<Value>::deserialize(d)? {
            None => Ok(Signal::Unspecified),
            Some(Value::String(s)) => match s.as_str() {
                "SIGNAL_UNSPECIFIED" => Ok(Signal::Unspecified),
                "SIGNAL_SIGTERM" => Ok(Signal::Term),
                "SIGNAL_SIGKILL" => Ok(Signal::Kill),
                other => Err(de::Error::custom(format!("unknown signal {other:?}"))),
            },
            Some(Value::Number(n)) => match n.as_i64() {
                Some(0) => Ok(Signal::Unspecified),
                Some(15) => Ok(Signal::Term),
                Some(9) => Ok(Signal::Kill),
                _ => Err(de::Error::custom(format!("unknown signal {n}"))),
            },
            Some(other) => Err(de::Error::custom(format!("{other} is not a signal"))),
        }
    }
}

/// `SendSignalRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct SendSignalRequest {
    pub(crate) process: Option<Selector>,
    pub(crate) signal: Signal,
}

/// `UpdateRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct UpdateRequest {
    pub(crate) process: Option<Selector>,
    pub(crate) pty: Option<Pty>,
}

/// Filesystem requests that name one path: `Stat`, `MakeDir`, `Remove`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct PathRequest {
    #[serde(deserialize_with = "nullable")]
    pub(crate) path: String,
}

/// `MoveRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct MoveRequest {
    #[serde(deserialize_with = "nullable")]
    pub(crate) source: String,
    #[serde(deserialize_with = "nullable")]
    pub(crate) destination: String,
}

/// `ListDirRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ListDirRequest {
    #[serde(deserialize_with = "nullable")]
    pub(crate) path: String,
    #[serde(deserialize_with = "u32_or_zero")]
    pub(crate) depth: u32,
}

/// `WatchDirRequest` and `CreateWatcherRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct WatchRequest {
    #[serde(deserialize_with = "nullable")]
    pub(crate) path: String,
    #[serde(deserialize_with = "nullable")]
    pub(crate) recursive: bool,
    #[serde(deserialize_with = "nullable", alias = "include_entry")]
    pub(crate) include_entry: bool,
}

/// `GetWatcherEventsRequest` and `RemoveWatcherRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct WatcherRequest {
    #[serde(deserialize_with = "nullable", alias = "watcher_id")]
    pub(crate) watcher_id: String,
}

/// A path as envd takes one: a relative one joined to `home` (the world's default
/// directory, where envd uses the user's home), then cleaned lexically, as Go's
/// `filepath.Clean` does (`a/../b` is `b`, `.` parts and repeated slashes go), so `..` never
/// makes a directory appear on the way. The seam still checks the result against the
/// world's policy.
pub(crate) fn resolve_path(home: &std::path::Path, text: &str) -> std::path::PathBuf {
    clean_path(&home.join(text))
}

fn clean_path(path: &std::path::Path) -> std::path::PathBuf {
    use std::path::{Component, PathBuf};
    let mut out: Vec<Component<'_>> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match out.last() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                // `/..` is `/`.
                Some(Component::RootDir | Component::Prefix(_)) => {}
                _ => out.push(c),
            },
            other => out.push(other),
        }
    }
    if out.is_empty() {
        return PathBuf::from(".");
    }
    out.iter().collect()
}

/// A time in milliseconds since the epoch as an RFC 3339 UTC timestamp (protobuf's
/// `Timestamp` in JSON).
pub(crate) fn timestamp(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// days-to-civil algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn requests_take_every_spelling_the_json_mapping_allows() {
        let r: SendInputRequest =
            decode(json!({"process": {"pid": "42"}, "input": {"stdin": "aGkK"}})).unwrap();
        assert_eq!(r.process.unwrap().pid, Some(42));
        assert_eq!(r.input.unwrap().stdin.unwrap(), b"hi\n");
        let r: SendInputRequest = decode(json!({"input": {"pty": "_-8"}})).unwrap();
        assert_eq!(r.input.unwrap().pty.unwrap(), vec![0xff, 0xef]);
        let r: StartRequest =
            decode(json!({"process": {"cmd": "ls", "args": null, "cwd": null}, "extra": 1}))
                .unwrap();
        assert!(r.process.unwrap().args.is_empty());
        assert!(r.stdin.is_none());
        let s: SendSignalRequest = decode(json!({"signal": "SIGNAL_SIGKILL"})).unwrap();
        assert_eq!(s.signal, Signal::Kill);
        let s: SendSignalRequest = decode(json!({"signal": 15})).unwrap();
        assert_eq!(s.signal, Signal::Term);
        let w: WatchRequest = decode(json!({"path": "/x", "include_entry": true})).unwrap();
        assert!(w.include_entry);
        let bad: Result<SendInputRequest, _> = decode(json!({"process": {"pid": -1}}));
        assert!(bad.is_err());
    }

    #[test]
    fn paths_are_cleaned_as_go_cleans_them() {
        for (raw, clean) in [
            ("a/../b.txt", "b.txt"),
            ("/w/./x//y/../z", "/w/x/z"),
            ("/../etc", "/etc"),
            ("../up", "../up"),
            ("a/..", "."),
            ("/", "/"),
        ] {
            assert_eq!(clean_path(raw.as_ref()), std::path::PathBuf::from(clean), "{raw}");
        }
        let home = std::path::Path::new("/home/user");
        assert_eq!(resolve_path(home, "."), std::path::PathBuf::from("/home/user"));
        assert_eq!(resolve_path(home, "a/../b"), std::path::PathBuf::from("/home/user/b"));
        assert_eq!(resolve_path(home, "/etc/./x"), std::path::PathBuf::from("/etc/x"));
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(1_704_067_200_123), "2024-01-01T00:00:00.123Z");
        assert_eq!(timestamp(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(timestamp(-1), "1969-12-31T23:59:59.999Z");
    }
}
