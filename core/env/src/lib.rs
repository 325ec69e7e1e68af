//! Child environment policy: the ambient scrub every provider applies, and the managed
//! CONCH_* facts (`ShellEnv`) that shell tools inject per call.
//!
//! `CALL_ID_VAR` (`CONCH_CALL_ID`) is the spawn id a process provider marks its trees with;
//! `call_id_value` chains it after the ids this process inherited, so an outer conch still finds an
//! inner one's processes.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Prefix of every variable conch manages.
pub const ENV_PREFIX: &str = "CONCH_";

/// True for names that look like credentials (KEY, PASSWORD, SECRET, TOKEN anywhere,
/// case-insensitive) or that conch manages itself (CONCH_*, case-insensitive).
pub fn is_scrubbed(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with(ENV_PREFIX)
        || ["KEY", "PASSWORD", "SECRET", "TOKEN"].iter().any(|p| upper.contains(p))
}

/// Scrubs `ambient`, then applies `overlay` (`Some` sets, `None` unsets). The overlay comes
/// last so a deployment can still forward a credential-shaped or CONCH_* value on purpose.
pub fn build_child_env<I>(
    ambient: I,
    overlay: &BTreeMap<String, Option<String>>,
) -> BTreeMap<String, String>
where
    I: IntoIterator<Item = (String, String)>,
{
    let mut env: BTreeMap<String, String> =
        ambient.into_iter().filter(|(k, _)| !is_scrubbed(k)).collect();
    for (k, v) in overlay {
        match v {
            Some(v) => {
                env.insert(k.clone(), v.clone());
            }
            None => {
                env.remove(k);
            }
        }
    }
    env
}

/// The scrubbed ambient environment of this process plus an overlay.
pub fn child_env(overlay: &BTreeMap<String, Option<String>>) -> BTreeMap<String, String> {
    build_child_env(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        overlay,
    )
}

/// The variable a process provider sets in every child it spawns to mark that spawn's process
/// tree. Descendants inherit it, so a process that leaves the group, the session and the
/// output pipes (`setsid`, `nohup`, a double fork) can still be found and stopped with the
/// spawn that started it. The value is a space-separated list of spawn ids, outermost first:
/// see [`call_id_value`]. It is the one CONCH_* name a child gets that no overlay set.
pub const CALL_ID_VAR: &str = "CONCH_CALL_ID";

/// The [`CALL_ID_VAR`] value for a child of the spawn `id`: the ids this process itself
/// inherited (a conch running inside another conch's call), then `id`. The scrub removes the
/// inherited value from the child's environment like any CONCH_* name; keeping the outer ids
/// lets the outer conch still find the inner one's processes if the inner one dies first.
pub fn call_id_value(id: &str) -> String {
    chain_call_ids(std::env::var(CALL_ID_VAR).ok().as_deref(), id)
}

/// `inherited` ids (blanks dropped) followed by `id`.
fn chain_call_ids(inherited: Option<&str>, id: &str) -> String {
    let mut ids: Vec<&str> = inherited.unwrap_or("").split(' ').filter(|t| !t.is_empty()).collect();
    ids.push(id);
    ids.join(" ")
}

/// Errors registering managed facts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShellEnvError {
    /// Two contributors claimed one key.
    #[error("managed env key `{key}` is already owned by `{owner}`")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Its existing owner.
        owner: String,
    },
    /// A key outside the CONCH_ namespace.
    #[error("managed env key `{0}` must start with CONCH_")]
    BadPrefix(String),
}

impl ShellEnvError {
    /// Stable code.
    pub fn code(&self) -> conch_seams::ErrorCode {
        match self {
            ShellEnvError::DuplicateKey { .. } => conch_seams::ErrorCode::AlreadyExists,
            ShellEnvError::BadPrefix(_) => conch_seams::ErrorCode::InvalidArgument,
        }
    }
}

/// The managed CONCH_* facts: CONCH_HOME, CONCH_SHELL=1, CONCH_SESSION_ID (per owner),
/// plus facts other plugins register under a declared owner.
#[derive(Debug, Clone)]
pub struct ShellEnv {
    home: PathBuf,
    facts: BTreeMap<String, (String, String)>,
}

impl ShellEnv {
    /// A registry with CONCH_HOME = `home`.
    pub fn new(home: PathBuf) -> Self {
        Self { home, facts: BTreeMap::new() }
    }

    /// CONCH_HOME from the given value of `CONCH_HOME`, else `$HOME/.conch`.
    pub fn from_env_values(conch_home: Option<String>, home: Option<String>) -> Self {
        let home = conch_home
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(home.unwrap_or_else(|| "/tmp".into())).join(".conch"));
        Self::new(home)
    }

    /// Reads CONCH_HOME / HOME from this process (the one place that does).
    pub fn from_process_env() -> Self {
        Self::from_env_values(std::env::var("CONCH_HOME").ok(), std::env::var("HOME").ok())
    }

    /// The CONCH_HOME value.
    pub fn home(&self) -> &PathBuf {
        &self.home
    }

    /// Registers one extra fact owned by `owner`.
    ///
    /// # Errors
    /// Duplicate ownership or a key outside CONCH_.
    pub fn register(&mut self, owner: &str, key: &str, value: &str) -> Result<(), ShellEnvError> {
        if !key.starts_with(ENV_PREFIX) {
            return Err(ShellEnvError::BadPrefix(key.into()));
        }
        if ["CONCH_HOME", "CONCH_SHELL", "CONCH_SESSION_ID"].contains(&key) {
            return Err(ShellEnvError::DuplicateKey { key: key.into(), owner: "shell-env".into() });
        }
        if let Some((o, _)) = self.facts.get(key) {
            return Err(ShellEnvError::DuplicateKey { key: key.into(), owner: o.clone() });
        }
        self.facts.insert(key.into(), (owner.into(), value.into()));
        Ok(())
    }

    /// The sorted snapshot for one call by the owner with `session_id`.
    pub fn snapshot(&self, session_id: &str) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> =
            self.facts.iter().map(|(k, (_, v))| (k.clone(), v.clone())).collect();
        out.insert("CONCH_HOME".into(), self.home.display().to_string());
        out.insert("CONCH_SHELL".into(), "1".into());
        out.insert("CONCH_SESSION_ID".into(), session_id.into());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn scrub_removes_credentials_and_managed_names_case_insensitively() {
        let ambient = pairs(&[
            ("PATH", "/bin"),
            ("HOME", "/root"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("github_token", "x"),
            ("DB_Password", "x"),
            ("apikey", "x"),
            ("conch_home", "x"),
            ("CONCH_SESSION_ID", "x"),
            ("LANG", "C.UTF-8"),
            ("HTTPS_PROXY", "http://p"),
        ]);
        let env = build_child_env(ambient, &BTreeMap::new());
        assert_eq!(
            env.keys().cloned().collect::<Vec<_>>(),
            vec!["HOME", "HTTPS_PROXY", "LANG", "PATH"]
        );
    }

    #[test]
    fn call_ids_chain_after_the_inherited_ones() {
        assert_eq!(chain_call_ids(None, "c1.0.3"), "c1.0.3");
        assert_eq!(chain_call_ids(Some(""), "c1.0.3"), "c1.0.3");
        assert_eq!(chain_call_ids(Some(" c9.1.0  c8.0.2 "), "c1.0.3"), "c9.1.0 c8.0.2 c1.0.3");
        assert!(is_scrubbed(CALL_ID_VAR), "the inherited value never reaches a child as is");
    }

    #[test]
    fn overlay_applies_after_scrub_and_can_unset() {
        let ambient = pairs(&[("PATH", "/bin"), ("MY_TOKEN", "t"), ("FOO", "1")]);
        let mut overlay = BTreeMap::new();
        overlay.insert("MY_TOKEN".to_string(), Some("forwarded".to_string()));
        overlay.insert("FOO".to_string(), None);
        let env = build_child_env(ambient, &overlay);
        assert_eq!(env.get("MY_TOKEN").map(String::as_str), Some("forwarded"));
        assert!(!env.contains_key("FOO"));
    }

    #[test]
    fn snapshot_has_builtins_and_rejects_duplicate_owners() {
        let mut se = ShellEnv::new(PathBuf::from("/h/.conch"));
        se.register("plugin-a", "CONCH_EXTRA", "1").unwrap();
        assert_eq!(
            se.register("plugin-b", "CONCH_EXTRA", "2"),
            Err(ShellEnvError::DuplicateKey {
                key: "CONCH_EXTRA".into(),
                owner: "plugin-a".into()
            })
        );
        assert!(matches!(
            se.register("x", "CONCH_HOME", "y"),
            Err(ShellEnvError::DuplicateKey { .. })
        ));
        assert!(matches!(se.register("x", "OTHER", "y"), Err(ShellEnvError::BadPrefix(_))));
        let snap = se.snapshot("s1");
        assert_eq!(
            snap.into_iter().collect::<Vec<_>>(),
            vec![
                ("CONCH_EXTRA".to_string(), "1".to_string()),
                ("CONCH_HOME".to_string(), "/h/.conch".to_string()),
                ("CONCH_SESSION_ID".to_string(), "s1".to_string()),
                ("CONCH_SHELL".to_string(), "1".to_string()),
            ]
        );
    }
}
