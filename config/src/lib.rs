//! Composition loading: a YAML file (or an embedded one) plus `CONCH_PLUGINS__*`
//! environment overrides, merged with figment. Duplicate YAML keys and unknown config
//! fields are errors that name the file and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format};
use figment::value::{Dict, Value};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Compositions built into the binary, by name.
pub const EMBEDDED: &[(&str, &str)] = &[
    ("standard", include_str!("../../compositions/standard.yaml")),
    ("terminal", include_str!("../../compositions/terminal.yaml")),
    ("minimal", include_str!("../../compositions/minimal.yaml")),
];

/// The composition used when none is named.
pub const DEFAULT_COMPOSITION: &str = "standard";

/// Prefix of environment overrides: `CONCH_PLUGINS__BASH_LOCAL__TIMEOUT_MS=5000` sets
/// `plugins.bash-local.timeout_ms` (underscores in the plugin segment become dashes).
pub const ENV_OVERRIDE_PREFIX: &str = "CONCH_PLUGINS__";

/// Errors loading a composition.
#[derive(Debug, thiserror::Error)]
pub enum CompositionError {
    /// The selector is neither an embedded name nor a readable file.
    #[error("composition `{selector}` not found: not an embedded name ({known}) and no such file")]
    NotFound {
        /// What was asked for.
        selector: String,
        /// Embedded names.
        known: String,
    },
    /// The file is not valid YAML or has the wrong shape.
    #[error("{source_name}: {message}")]
    Invalid {
        /// File path or `embedded:<name>`.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// One plugin's config is invalid.
    #[error("{source_name}: plugin `{plugin}`: {message}")]
    BadConfig {
        /// File path or `embedded:<name>`.
        source_name: String,
        /// The plugin key.
        plugin: String,
        /// figment's message, which names the key.
        message: String,
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
        let value: yaml_serde::Value = yaml_serde::from_str(s)?;
        yaml_serde::from_value(value)
    }
}

/// A loaded, shape-checked composition.
#[derive(Debug, Clone)]
pub struct Composition {
    source_name: String,
    figment: Figment,
    plugins: Vec<String>,
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
                true,
            );
        }
        let path = Path::new(selector);
        if path.is_file() {
            return Self::from_path(path);
        }
        Err(CompositionError::NotFound {
            selector: selector.into(),
            known: EMBEDDED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
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
            true,
        )
    }

    /// Parses YAML text without environment overrides (tests, tools).
    ///
    /// # Errors
    /// As [`Composition::load`].
    pub fn from_yaml(source_name: &str, text: &str) -> Result<Self, CompositionError> {
        Self::from_figment(source_name.into(), Figment::from(StrictYaml::string(text)), false)
    }

    fn from_figment(
        source_name: String,
        figment: Figment,
        with_env: bool,
    ) -> Result<Self, CompositionError> {
        let figment = if with_env { figment.merge(env_overrides()) } else { figment };
        let top: TopLevel = figment.extract().map_err(|e| CompositionError::Invalid {
            source_name: source_name.clone(),
            message: render(&e),
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
        Ok(Self { source_name, figment, plugins: top.plugins.into_keys().collect() })
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
    /// `BadConfig` naming the file, plugin and key (unknown field, wrong type).
    pub fn plugin_config<T: DeserializeOwned>(&self, plugin: &str) -> Result<T, CompositionError> {
        let key = format!("plugins.{plugin}");
        let bad = |message: String| CompositionError::BadConfig {
            source_name: self.source_name.clone(),
            plugin: plugin.into(),
            message,
        };
        match self.figment.find_value(&key) {
            Ok(Value::Dict(_, d)) if !d.is_empty() => {
                self.figment.extract_inner::<T>(&key).map_err(|e| bad(render(&e)))
            }
            _ => Value::from(Dict::new()).deserialize::<T>().map_err(|e| bad(render(&e))),
        }
    }
}

fn env_overrides() -> Env {
    // figment lowercases keys only after filtering and mapping, so compare case-insensitively.
    Env::prefixed("CONCH_")
        .filter(|k| k.as_str().to_ascii_lowercase().starts_with("plugins__"))
        .map(|k| {
            let parts: Vec<String> =
                k.as_str().to_ascii_lowercase().split("__").map(str::to_string).collect();
            let mapped: Vec<String> = parts
                .iter()
                .enumerate()
                .map(|(i, p)| if i == 1 { p.replace('_', "-") } else { p.clone() })
                .collect();
            mapped.join(".").into()
        })
}

fn render(e: &figment::Error) -> String {
    e.clone().into_iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests;
