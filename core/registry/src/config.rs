//! Plugin configuration: one convention for how every plugin's config is validated and how a
//! bad value is reported (``<file>: plugin `<name>`: key `plugins.<name>.<key>`: <problem>``,
//! the key spelled as in a composition).

use serde::de::DeserializeOwned;

use conch_seams::{Error, ErrorCode};

/// One bad config value: which key, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    /// The key inside the plugin's config (`timeout_ms`).
    pub key: &'static str,
    /// What is wrong, lowercase (`must be greater than 0`).
    pub problem: String,
}

impl ConfigIssue {
    /// An issue with `key`.
    pub fn new(key: &'static str, problem: impl Into<String>) -> Self {
        Self { key, problem: problem.into() }
    }

    /// `Err` unless `value > 0`.
    ///
    /// # Errors
    /// The issue naming `key`.
    pub fn positive(key: &'static str, value: u64) -> Result<(), ConfigIssue> {
        Self::at_least(key, value, 1)
    }

    /// `Err` unless `value >= min`.
    ///
    /// # Errors
    /// The issue naming `key`.
    pub fn at_least(key: &'static str, value: u64, min: u64) -> Result<(), ConfigIssue> {
        if value >= min {
            return Ok(());
        }
        let problem = if min == 1 {
            "must be greater than 0".to_string()
        } else {
            format!("must be at least {min}")
        };
        Err(Self::new(key, problem))
    }

    /// `Err` unless `value <= max`.
    ///
    /// # Errors
    /// The issue naming `key`.
    pub fn at_most(key: &'static str, value: u64, max: u64) -> Result<(), ConfigIssue> {
        if value <= max { Ok(()) } else { Err(Self::new(key, format!("must be at most {max}"))) }
    }

    /// `Err` unless a default `timeout_ms` fits under `max_timeout_ms`, blaming the key the
    /// user changed: `timeout_ms` unless it still has its default `default_timeout_ms`, so
    /// `{timeout_ms: 700000}` names `timeout_ms` and `{max_timeout_ms: 10}` names
    /// `max_timeout_ms`.
    ///
    /// # Errors
    /// The issue, naming both values.
    pub fn timeout_within_max(
        timeout_ms: u64,
        max_timeout_ms: u64,
        default_timeout_ms: u64,
    ) -> Result<(), ConfigIssue> {
        if max_timeout_ms >= timeout_ms {
            return Ok(());
        }
        Err(if timeout_ms == default_timeout_ms {
            Self::new(
                "max_timeout_ms",
                format!(
                    "{max_timeout_ms} is below timeout_ms ({timeout_ms}); it must be at least timeout_ms"
                ),
            )
        } else {
            Self::new(
                "timeout_ms",
                format!(
                    "{timeout_ms} is above max_timeout_ms ({max_timeout_ms}); raise max_timeout_ms too"
                ),
            )
        })
    }

    /// The `invalid_composition` error for `plugin` (the registry prefixes the file).
    pub fn into_error(self, plugin: &str) -> Error {
        Error::new(
            ErrorCode::InvalidComposition,
            format!("plugin `{plugin}`: key `plugins.{plugin}.{}`: {}", self.key, self.problem),
        )
    }
}

/// A plugin's config: deserialized from the composition (unknown keys rejected by the
/// type's `deny_unknown_fields`), then checked by [`PluginConfig::validate`].
pub trait PluginConfig: DeserializeOwned {
    /// Range and consistency checks that serde cannot express.
    ///
    /// # Errors
    /// The first bad key.
    fn validate(&self) -> Result<(), ConfigIssue> {
        Ok(())
    }

    /// [`PluginConfig::validate`] as an `invalid_composition` error naming `plugin`.
    ///
    /// # Errors
    /// As `validate`.
    fn check(&self, plugin: &str) -> conch_seams::Result<()> {
        self.validate().map_err(|i| i.into_error(plugin))
    }
}

/// The config of a plugin that has no keys: anything but an empty map is an unknown key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoConfig {}

impl PluginConfig for NoConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_name_the_plugin_and_key() {
        assert_eq!(ConfigIssue::positive("timeout_ms", 1), Ok(()));
        let e = ConfigIssue::positive("timeout_ms", 0).unwrap_err().into_error("bash-local");
        assert_eq!(e.code(), ErrorCode::InvalidComposition);
        assert_eq!(
            e.message(),
            "plugin `bash-local`: key `plugins.bash-local.timeout_ms`: must be greater than 0"
        );
        let e = ConfigIssue::at_least("max_read_bytes", 10, 64).unwrap_err();
        assert_eq!(e.problem, "must be at least 64");
        assert_eq!(
            ConfigIssue::at_most("drain_ms", 70_000, 60_000).unwrap_err().problem,
            "must be at most 60000"
        );
    }
}
