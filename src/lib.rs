//! The `conch` facade: links every provider crate (so their `inventory` registrations are
//! kept) and builds runtimes from compositions; [`cli`] is the `conch` command line.

pub mod cli;

use conch_config::Composition;
use conch_env::ShellEnv;
use conch_registry::{RegistryError, Runtime};

// Referencing each provider crate keeps its plugin registrations in the final binary.
use conch_jobs as _;
#[cfg(target_os = "linux")]
use conch_provider_files as _;
#[cfg(unix)]
use conch_provider_local as _;
use conch_provider_remote as _;
use conch_provider_shell as _;
use conch_provider_terminal_shell as _;
use conch_terminals as _;
use conch_tools as _;

pub use conch_config::{DEFAULT_COMPOSITION, EMBEDDED};
pub use conch_registry::plugins;

/// Forces every provider crate to link (call from binaries and test crates).
pub fn link_all() {
    #[cfg(unix)]
    conch_provider_local::register();
    conch_provider_shell::register();
    conch_provider_remote::register();
    conch_tools::register();
    conch_jobs::register();
    conch_provider_terminal_shell::register();
    conch_terminals::register();
    conch_provider_sandbox::register();
    conch_provider_approval::register();
    #[cfg(target_os = "linux")]
    conch_provider_files::register();
    conch_provider_docker::provision::register();
}

/// Loads a composition by embedded name or path and builds it with the process's CONCH_HOME.
///
/// # Errors
/// Any load or resolution error, naming the file and key.
pub fn build_runtime(selector: &str) -> Result<Runtime, RegistryError> {
    link_all();
    let composition = Composition::load(selector)?;
    Runtime::build(&composition, ShellEnv::from_process_env())
}

/// Builds from YAML text (no env overrides).
///
/// # Errors
/// Any load or resolution error.
pub fn build_runtime_from_yaml(
    source_name: &str,
    yaml: &str,
    shell_env: ShellEnv,
) -> Result<Runtime, RegistryError> {
    link_all();
    let composition = Composition::from_yaml(source_name, yaml)?;
    Runtime::build(&composition, shell_env)
}
