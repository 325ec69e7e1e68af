//! Composition loading: a YAML file (or an embedded one) plus `CONCH_PLUGINS__*`
//! environment overrides for the plugins it lists, merged with figment. Duplicate YAML keys
//! and unknown config fields are errors that name the file and the key
//! (`plugins.<plugin>.<key>`), and the variable when the value came from the environment.
//!
//! Overrides apply only to plugins the file lists; others are ignored. `Composition::config_issue`
//! gives a plugin's validation issues the same form. `Composition::with_setting` sets a front end's
//! own value over file and environment (`conch conformance` sets `sandbox-policy.workspace_root`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use figment::error::Kind;
use figment::providers::Format;
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Compositions built into the binary, by name.
pub const EMBEDDED: &[(&str, &str)] = &[
    ("standard", include_str!("../../compositions/standard.yaml")),
    ("terminal", include_str!("../../compositions/terminal.yaml")),
    ("minimal", include_str!("../../compositions/minimal.yaml")),
    ("remote-sandbox", include_str!("../../compositions/remote-sandbox.yaml")),
    ("remote-terminal", include_str!("../../compositions/remote-terminal.yaml")),
    ("sandbox", include_str!("../../compositions/sandbox.yaml")),
    ("sandbox-bwrap", include_str!("../../compositions/sandbox-bwrap.yaml")),
    ("sandbox-terminal", include_str!("../../compositions/sandbox-terminal.yaml")),
    ("pwsh", include_str!("../../compositions/pwsh.yaml")),
    ("pwsh-minimal", include_str!("../../compositions/pwsh-minimal.yaml")),
    ("swerex", include_str!("../../compositions/swerex.yaml")),
    ("swerex-sandbox", include_str!("../../compositions/swerex-sandbox.yaml")),
    ("docker", include_str!("../../compositions/docker.yaml")),
];

/// ` (did you mean `x`?)` for the candidate closest to `name` (a few edits away, or one
/// containing the other), or empty when none is close: the one suggestion rule for every
/// name a composition or a command line gets wrong.
pub fn did_you_mean(name: &str, candidates: &[&str]) -> String {
    candidates
        .iter()
        .map(|c| (edit_distance(name, c), *c))
        .filter(|(d, c)| *d <= 3 || (!name.is_empty() && (c.contains(name) || name.contains(c))))
        .min()
        .map(|(_, c)| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default()
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The composition used when none is named.
pub const DEFAULT_COMPOSITION: &str = "standard";

/// Prefix of environment overrides: `CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS=5000` sets
/// `plugins.bash-local.timeout_ms` (underscores in the plugin segment become dashes).
/// Overrides for plugins the composition does not list are ignored.
pub const ENV_OVERRIDE_PREFIX: &str = "CONCH_PLUGINS__";

/// Errors loading a composition.
#[derive(Debug, thiserror::Error)]
pub enum CompositionError {
    /// The selector is neither an embedded name nor a readable file.
    #[error(
        "composition `{selector}` not found{suggestion}: not an embedded name ({known}) and no such file"
    )]
    NotFound {
        /// What was asked for.
        selector: String,
        /// ` (did you mean `terminal`?)` when an embedded name is close, else empty.
        suggestion: String,
        /// Embedded names.
        known: String,
    },
    /// The file is not valid YAML or has the wrong shape.
    #[error("{source_name}: {message}")]
    Invalid {
        /// File path or `embedded:<name>`.
        source_name: String,
        /// What is wrong, naming the key (``key `plugns`: ...``) when there is one.
        message: String,
    },
    /// One plugin's config is invalid.
    #[error("{source_name}: plugin `{plugin}`: key `{key}`{origin}: {problem}")]
    BadConfig {
        /// File path or `embedded:<name>`.
        source_name: String,
        /// The plugin key.
        plugin: String,
        /// The full key path as a composition spells it: `plugins.bash-local.timeout_ms`.
        key: String,
        /// ` (from environment variable CONCH_PLUGINS__...)` when the value came from an
        /// environment override, else empty.
        origin: String,
        /// What is wrong with the value.
        problem: String,
    },
}

impl CompositionError {
    /// Stable code.
    pub fn code(&self) -> conch_seams::ErrorCode {
        conch_seams::ErrorCode::InvalidComposition
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopLevel {
    plugins: BTreeMap<String, Value>,
}

/// YAML through yaml_serde, which (unlike figment's own YAML format) rejects duplicate keys.
struct StrictYaml;

impl Format for StrictYaml {
    type Error = yaml_serde::Error;
    const NAME: &'static str = "YAML";

    fn from_str<T: DeserializeOwned>(s: &str) -> Result<T, Self::Error> {
        // yaml_serde's own duplicate check reports the line of the mapping that holds the
        // duplicate; this walk fails while reading the second key itself, so the error
        // carries that key's line and column.
        yaml_serde::from_str::<NoDuplicateKeys>(s)?;
        let value: yaml_serde::Value = yaml_serde::from_str(s)?;
        yaml_serde::from_value(value)
    }
}

/// Reads one document from `d` only to refuse a mapping key seen twice in any of its
/// mappings, failing at the second one (`duplicate key `k``, with the deserializer's
/// position). Format-agnostic: it serves the YAML compositions here and the CLI's JSON calls.
///
/// # Errors
/// The duplicate key, or whatever `d` fails to read.
pub fn refuse_duplicate_keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    NoDuplicateKeys::deserialize(d).map(|_| ())
}

/// A document walked only to refuse a mapping key seen twice, at the second one.
struct NoDuplicateKeys;

impl<'de> Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeys)
    }
}

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeys {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_none<E>(self) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut seen = BTreeSet::new();
        while map.next_key_seed(UniqueKey(&mut seen))?.is_some() {
            map.next_value::<NoDuplicateKeys>()?;
        }
        Ok(self)
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<Self, A::Error> {
        // A tagged value (`!tag x`): only its content can hold mappings.
        use serde::de::VariantAccess;
        let (_, variant) = data.variant::<serde::de::IgnoredAny>()?;
        variant.newtype_variant::<NoDuplicateKeys>()?;
        Ok(self)
    }
}

/// One mapping key, refused (while the parser is at it) when `.0` already holds it.
struct UniqueKey<'a>(&'a mut BTreeSet<(u8, String)>);

impl UniqueKey<'_> {
    /// Keeps `key` of scalar kind `kind` (so `1` and `"1"` stay different keys).
    fn insert<E: serde::de::Error>(self, kind: u8, key: String) -> Result<(), E> {
        if self.0.insert((kind, key.clone())) {
            Ok(())
        } else {
            Err(E::custom(format_args!("duplicate key `{key}`")))
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKey<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKey<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a mapping key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<(), E> {
        self.insert(0, key.to_string())
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        self.insert(1, v.to_string())
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        self.insert(2, v.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        self.insert(2, v.to_string())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        self.insert(3, v.to_string())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.insert(4, "~".into())
    }

    // Complex keys are rare and left to yaml_serde's own check.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

/// One `CONCH_PLUGINS__<P>__<KEY>` variable that applies to a plugin of the composition.
#[derive(Debug, Clone)]
struct EnvOverride {
    /// The variable's name as exported, for messages.
    var: String,
    /// Where it lands: `["plugins", "bash-local", "timeout_ms"]`.
    path: Vec<String>,
    value: String,
}

/// The metadata name of the env-override provider: an error whose value carries it came
/// from the environment.
const ENV_SOURCE: &str = "`CONCH_PLUGINS__*` environment variables";

/// The env overrides as a figment provider. Our own snapshot rather than figment's `Env`, so
/// that only the composition's plugins are read and every key traces back to its variable.
struct EnvProvider(Vec<EnvOverride>);

impl Provider for EnvProvider {
    fn metadata(&self) -> Metadata {
        Metadata::named(ENV_SOURCE)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut root = Dict::new();
        for o in &self.0 {
            // As figment's `Env` does: `5000` is a number, `[1, 2]` a list, `soon` a string.
            let value = match o.value.parse::<Value>() {
                Ok(v) => v,
                Err(never) => match never {},
            };
            insert(&mut root, &o.path, value);
        }
        Ok(Profile::Default.collect(root))
    }
}

fn insert(dict: &mut Dict, path: &[String], value: Value) {
    let Some((first, rest)) = path.split_first() else { return };
    if rest.is_empty() {
        dict.insert(first.clone(), value);
        return;
    }
    let entry = dict.entry(first.clone()).or_insert_with(|| Dict::new().into());
    if !matches!(entry, Value::Dict(..)) {
        *entry = Dict::new().into();
    }
    if let Value::Dict(_, inner) = entry {
        insert(inner, rest, value);
    }
}

/// The overrides among `vars` for `plugins`. `CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS` sets
/// `plugins.bash-local.timeout_ms`; names match case-insensitively and keys are lowercased,
/// as with figment's `Env`.
fn env_overrides(vars: &[(String, String)], plugins: &BTreeSet<String>) -> Vec<EnvOverride> {
    let mut found: Vec<EnvOverride> = vars
        .iter()
        .filter_map(|(var, value)| {
            let name = var.trim();
            let head = name.get(..ENV_OVERRIDE_PREFIX.len())?;
            if !head.eq_ignore_ascii_case(ENV_OVERRIDE_PREFIX) {
                return None;
            }
            let segments: Vec<String> = name[ENV_OVERRIDE_PREFIX.len()..]
                .split("__")
                .map(str::to_ascii_lowercase)
                .collect();
            if segments.iter().any(String::is_empty) {
                return None;
            }
            let plugin = segments[0].replace('_', "-");
            // An override for a plugin the composition does not list is ignored rather than
            // an "unknown plugin": one exported set of overrides must serve every
            // composition. Nothing is printed (stdout belongs to results); there is no
            // tracing yet to note it at debug level.
            if !plugins.contains(&plugin) {
                return None;
            }
            let path =
                ["plugins".to_string(), plugin].into_iter().chain(segments.into_iter().skip(1));
            Some(EnvOverride { var: var.clone(), path: path.collect(), value: value.clone() })
        })
        .collect();
    // The environment has no order; sort so that overlapping overrides merge the same way
    // every time.
    found.sort_by(|a, b| a.var.cmp(&b.var));
    found
}

/// The process environment, read once per load.
fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into_owned()))
        .collect()
}

/// A loaded, shape-checked composition.
#[derive(Debug, Clone)]
pub struct Composition {
    source_name: String,
    figment: Figment,
    plugins: Vec<String>,
    env: Vec<EnvOverride>,
}

impl Composition {
    /// Loads an embedded name or a file path, with process-env overrides.
    ///
    /// # Errors
    /// Not found, invalid YAML, duplicate keys, unknown top-level keys.
    pub fn load(selector: &str) -> Result<Self, CompositionError> {
        if let Some((_, text)) = EMBEDDED.iter().find(|(n, _)| *n == selector) {
            return Self::from_figment(
                format!("embedded:{selector}"),
                Figment::from(StrictYaml::string(text)),
                &process_env(),
            );
        }
        let path = Path::new(selector);
        if path.is_file() {
            return Self::from_path(path);
        }
        let names: Vec<&str> = EMBEDDED.iter().map(|(n, _)| *n).collect();
        Err(CompositionError::NotFound {
            selector: selector.into(),
            suggestion: did_you_mean(selector, &names),
            known: names.join(", "),
        })
    }

    /// Loads a file with process-env overrides.
    ///
    /// # Errors
    /// As [`Composition::load`].
    pub fn from_path(path: &Path) -> Result<Self, CompositionError> {
        let abs = path.canonicalize().unwrap_or_else(|_| PathBuf::from(path));
        Self::from_figment(
            abs.display().to_string(),
            Figment::from(StrictYaml::file_exact(&abs)),
            &process_env(),
        )
    }

    /// Parses YAML text without environment overrides (tests, tools).
    ///
    /// # Errors
    /// As [`Composition::load`].
    pub fn from_yaml(source_name: &str, text: &str) -> Result<Self, CompositionError> {
        Self::from_figment(source_name.into(), Figment::from(StrictYaml::string(text)), &[])
    }

    /// Checks the file's shape, then merges the overrides among `env` for the plugins the
    /// file lists: the file alone decides which plugins there are.
    fn from_figment(
        source_name: String,
        figment: Figment,
        env: &[(String, String)],
    ) -> Result<Self, CompositionError> {
        let top: TopLevel = figment.extract().map_err(|e| CompositionError::Invalid {
            source_name: source_name.clone(),
            message: render_all(&e),
        })?;
        for name in top.plugins.keys() {
            if name.is_empty()
                || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                return Err(CompositionError::Invalid {
                    source_name,
                    message: format!(
                        "plugin name `{name}` must be lowercase letters, digits and dashes"
                    ),
                });
            }
        }
        let plugins: BTreeSet<String> = top.plugins.into_keys().collect();
        let env = env_overrides(env, &plugins);
        let figment =
            if env.is_empty() { figment } else { figment.merge(EnvProvider(env.clone())) };
        Ok(Self { source_name, figment, plugins: plugins.into_iter().collect(), env })
    }

    /// Sets `plugins.<plugin>.<key>` to `value` over the file and the environment: a front
    /// end's own adjustment (`conch conformance` points `sandbox-policy.workspace_root` at
    /// the directory its cases write in). The plugin must be one the composition lists;
    /// otherwise nothing changes (as with an environment override).
    #[must_use]
    pub fn with_setting(mut self, plugin: &str, key: &str, value: impl serde::Serialize) -> Self {
        if self.plugins.iter().any(|p| p == plugin) {
            let at = format!("plugins.{plugin}.{key}");
            self.figment = self.figment.merge(figment::providers::Serialized::default(&at, value));
        }
        self
    }

    /// File path or `embedded:<name>`.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// Plugin names, sorted.
    pub fn plugins(&self) -> &[String] {
        &self.plugins
    }

    /// Deserializes one plugin's config; an empty or null entry means all defaults.
    ///
    /// # Errors
    /// `BadConfig` naming the file, plugin and key (unknown field, wrong type, an entry that
    /// is not a map).
    pub fn plugin_config<T: DeserializeOwned>(&self, plugin: &str) -> Result<T, CompositionError> {
        let base = format!("plugins.{plugin}");
        match self.figment.find_value(&base) {
            Ok(Value::Dict(_, d)) if !d.is_empty() => {
                // `focus` rather than `extract_inner`, which appends the entry's path after
                // the key inside it (`timeout_ms.plugins.bash-local`); in the focused entry
                // the error path is just the key inside it.
                self.figment.focus(&base).extract::<T>().map_err(|e| self.bad(plugin, &e))
            }
            Ok(Value::Empty(..) | Value::Dict(..)) | Err(_) => {
                Value::from(Dict::new()).deserialize::<T>().map_err(|e| self.bad(plugin, &e))
            }
            Ok(other) => other.deserialize::<T>().map_err(|e| {
                // A bare value's error knows no provider: look its tag up in the figment.
                let md = self.figment.get_metadata(other.tag());
                let from_env = md.is_some_and(|m| m.name == ENV_SOURCE);
                self.bad_at(plugin, Vec::new(), from_env, problem(&e.kind))
            }),
        }
    }

    /// The error for a bad value at `key` (inside `plugin`'s config) that a check after
    /// deserialization found (the registry's `PluginConfig::validate`), in the same form as a
    /// deserialization error (naming the variable when an override set the key).
    pub fn config_issue(&self, plugin: &str, key: &str, problem: String) -> CompositionError {
        let inner: Vec<String> = key.split('.').map(str::to_string).collect();
        let full = key_path(plugin, inner.clone());
        // Env overrides win over the file, so an override at exactly this key set it.
        let from_env = self.env.iter().any(|o| o.path == full);
        self.bad_at(plugin, inner, from_env, problem)
    }

    fn bad(&self, plugin: &str, e: &figment::Error) -> CompositionError {
        // Deserialization stops at its first error, so the chain has one entry.
        let from_env = e.metadata.as_ref().is_some_and(|m| m.name == ENV_SOURCE);
        self.bad_at(plugin, e.path.clone(), from_env, problem(&e.kind))
    }

    fn bad_at(
        &self,
        plugin: &str,
        inner: Vec<String>,
        from_env: bool,
        problem: String,
    ) -> CompositionError {
        let path = key_path(plugin, inner);
        let origin = if from_env {
            // The variable that set this key or the nearest enclosing one; an error about a
            // whole entry (a missing field) may sit above the variable's key instead.
            let var = self
                .env
                .iter()
                .filter(|o| path.starts_with(&o.path))
                .max_by_key(|o| o.path.len())
                .or_else(|| self.env.iter().find(|o| o.path.starts_with(&path)));
            match var {
                Some(o) => format!(" (from environment variable {})", o.var),
                None => format!(" (from a {ENV_OVERRIDE_PREFIX}* environment variable)"),
            }
        } else {
            String::new()
        };
        CompositionError::BadConfig {
            source_name: self.source_name.clone(),
            plugin: plugin.into(),
            key: path.join("."),
            origin,
            problem,
        }
    }
}

/// `plugins.<plugin>.<inner...>` as segments.
fn key_path(plugin: &str, inner: Vec<String>) -> Vec<String> {
    ["plugins".to_string(), plugin.to_string()].into_iter().chain(inner).collect()
}

/// What is wrong, without figment's key and source suffix: callers name both in the
/// composition's own terms.
fn problem(kind: &Kind) -> String {
    let one_of = |names: &[&str]| names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>();
    match kind {
        // figment renders these as "found `x`, expected ``a` or `b``"; the key path already
        // names `x`, so say only what is accepted.
        Kind::UnknownField(_, []) => "unknown key; none are accepted here".into(),
        Kind::UnknownField(_, expected) => {
            format!("unknown key; expected one of {}", one_of(expected).join(", "))
        }
        Kind::UnknownVariant(found, expected) => {
            format!("unknown variant `{found}`; expected one of {}", one_of(expected).join(", "))
        }
        other => other.to_string(),
    }
}

/// Every error of a chain, each naming its key when it has one.
fn render_all(e: &figment::Error) -> String {
    e.clone()
        .into_iter()
        .map(|e| {
            if e.path.is_empty() {
                problem(&e.kind)
            } else {
                format!("key `{}`: {}", e.path.join("."), problem(&e.kind))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests;
