//! The local shell executors: the shell seam over the subprocess seam.
//!
//! - `bash-local` runs each command as `bash -c`; `pwsh-local` as PowerShell 7's
//!   `pwsh -EncodedCommand` (see [`pwsh`]).
//! - `bash-sandbox` and `pwsh-sandbox` are the same executors with their command line wrapped
//!   through the sandbox seam under a per-call policy (one code path: the wrap is an optional
//!   step before the spawn), reporting what the sandbox did with every result.
//!
//! All four are one executor ([`engine::LocalShell`]) in two flavours: defaults, caps, the
//! env scrub and managed `CONCH_*` snapshot, fused timeout/abort, leftovers and background
//! handles that never fail are shared; a flavour supplies only its names, its terminal
//! overrides and the argv that runs one command.
//!
//! A command longer than one argv string may be (Linux refuses a longer one with E2BIG) goes
//! to bash in several argv strings and a fixed loader joins and evals them, so the argv stays
//! the only channel and works for any subprocess provider, remote ones included.
//!
//! A command longer than one argv string (128 KiB) goes as argv chunks to a fixed loader that
//! joins, clears and `eval`s them: still pure argv, so any subprocess provider can run it.

pub mod engine;
pub mod pwsh;

use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::{Dialect, Result};

pub use engine::{
    Flavor, Invocation, LocalShell, MAX_ARG_BYTES, MAX_COMMAND_BYTES_LIMIT, Settings,
};
pub use pwsh::{Pwsh, PwshLocal, PwshLocalConfig};

/// Plugin name.
pub const NAME: &str = "bash-local";

/// Plugin name of the sandboxed variant.
pub const SANDBOX_NAME: &str = "bash-sandbox";

/// Variables that keep tool output free of colour and pagers; the caller's env and the
/// managed snapshot are layered on top of these.
pub const ENV_OVERRIDES: &[(&str, &str)] =
    &[("NO_COLOR", "1"), ("TERM", "dumb"), ("PAGER", "cat"), ("GIT_PAGER", "cat")];

/// Runs a command that came in chunks as `"$@"` the way `bash -c` would have run it whole:
/// - `$_` is read first, before any command of ours changes it, and replayed by `:` as the
///   last simple command before the user's, quoted by `%q` so `eval` restores it exactly;
/// - `printf -v` joins the chunks unchanged and `set --` clears them, so `$#` is 0 (`$0` is
///   the bash name passed after the loader, as `bash -c` sets it);
/// - the text is expanded once into `eval`'s argument, expansion results are never rescanned,
///   and `eval` parses it once, command by command like a `-c` string (lines count from 1);
/// - `BASH_EXECUTION_STRING` is set to the text, and the first thing `eval` runs unsets both
///   helpers, before any of the user's commands.
///
/// Differences left: a syntax error is reported as `eval: line N` instead of `-c: line N`, and
/// bash forks the last command instead of replacing itself with it (so a last command killed
/// by a signal shows as bash's exit code 128+N).
const LOADER: &str = concat!(
    r#"printf -v __conch_u %q "$_"; printf -v __conch_c %s "$@"; set --; "#,
    r#"eval "BASH_EXECUTION_STRING=\$__conch_c; unset __conch_c __conch_u; : $__conch_u; $__conch_c""#,
);

/// The argv that runs `command` with `bash` exactly as `bash -c <command>` would: that argv
/// itself when the command fits one argv string, else the loader over chunks of at most
/// [`MAX_ARG_BYTES`], cut on char boundaries (argv strings are UTF-8 here).
pub fn bash_argv(bash: &str, command: &str) -> Vec<String> {
    if command.len() <= MAX_ARG_BYTES {
        return vec![bash.into(), "-c".into(), command.into()];
    }
    let mut argv = vec![bash.into(), "-c".into(), LOADER.into(), bash.into()];
    let mut rest = command;
    while !rest.is_empty() {
        let mut end = rest.len().min(MAX_ARG_BYTES);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (chunk, tail) = rest.split_at(end);
        argv.push(chunk.into());
        rest = tail;
    }
    argv
}

engine::local_shell_config!(
    /// bash-local (and bash-sandbox) config.
    BashLocalConfig,
    bash,
    "bash"
);

/// The bash flavour: `bash -c`, with the loader for commands longer than one argv string.
#[derive(Debug)]
pub struct Bash;

impl Flavor for Bash {
    const NAME: &'static str = NAME;
    const SANDBOX_NAME: &'static str = SANDBOX_NAME;
    const DIALECT: Dialect = Dialect::Bash;
    const ENV_OVERRIDES: &'static [(&'static str, &'static str)] = ENV_OVERRIDES;
    const PROGRAM_KEY: &'static str = "bash";

    fn invocation(program: &str, command: &str) -> Invocation {
        Invocation { argv: bash_argv(program, command), env: Vec::new() }
    }

    fn missing_program(_: &str) -> Option<String> {
        None
    }
}

/// The bash-local executor, and with a sandbox bound, bash-sandbox.
pub type BashLocal = LocalShell<Bash>;

impl LocalShell<Bash> {
    /// bash-local over a subprocess provider.
    ///
    /// # Errors
    /// Invalid config.
    pub fn new(
        config: BashLocalConfig,
        subprocess: std::sync::Arc<dyn conch_seams::Subprocess>,
    ) -> Result<Self> {
        Self::with_settings(config.settings(), subprocess)
    }

    /// bash-sandbox: every command line wrapped by `sandbox` under a per-call policy,
    /// `policy` unless a request overrides its mode.
    ///
    /// # Errors
    /// Invalid config.
    pub fn sandboxed(
        config: BashLocalConfig,
        subprocess: std::sync::Arc<dyn conch_seams::Subprocess>,
        sandbox: std::sync::Arc<dyn conch_seams::Sandbox>,
        policy: conch_seams::SandboxPolicy,
    ) -> Result<Self> {
        Self::with_settings_sandboxed(config.settings(), subprocess, sandbox, policy)
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: BashLocalConfig = ctx.config()?;
    engine::plugin::build_local::<Bash>(ctx, config.settings())
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::Shell),
    requires: &[SeamId::Subprocess],
    description: "bash -c over the subprocess seam",
    build,
});

fn build_sandboxed(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: BashLocalConfig = ctx.config()?;
    engine::plugin::build_sandboxed::<Bash>(ctx, config.settings())
}

register_plugin!(PluginEntry {
    name: SANDBOX_NAME,
    provides: Some(SeamId::Shell),
    requires: &[SeamId::Subprocess, SeamId::Sandbox],
    description: "bash-local with every command line wrapped through the sandbox seam",
    build: build_sandboxed,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}

#[cfg(test)]
mod tests {
    use conch_registry::PluginConfig;

    use super::*;

    #[test]
    fn a_command_that_fits_one_argv_string_keeps_the_plain_argv() {
        let cmd = "x".repeat(MAX_ARG_BYTES);
        assert_eq!(bash_argv("bash", &cmd), ["bash", "-c", cmd.as_str()]);
    }

    #[test]
    fn a_longer_command_is_cut_into_strings_that_fit_on_char_boundaries() {
        // One ASCII byte first, so the 4-byte chars straddle every cut at MAX_ARG_BYTES.
        let cmd = format!("x{}", "😀".repeat(MAX_ARG_BYTES / 2));
        let argv = bash_argv("/bin/bash", &cmd);
        assert_eq!(argv[..4], ["/bin/bash", "-c", LOADER, "/bin/bash"], "$0 is the bash name");
        let chunks = &argv[4..];
        assert!(chunks.len() > 1 && chunks.iter().all(|c| c.len() <= MAX_ARG_BYTES));
        assert!(chunks.iter().any(|c| c.len() < MAX_ARG_BYTES), "a cut moved off a char");
        assert_eq!(chunks.concat(), cmd);
        let cmd = "y".repeat(MAX_ARG_BYTES + 1);
        assert_eq!(bash_argv("bash", &cmd)[4..].concat(), cmd);
    }

    #[test]
    fn max_command_bytes_stays_well_below_arg_max() {
        let at = |max_command_bytes| BashLocalConfig { max_command_bytes, ..Default::default() };
        assert_eq!(at(MAX_COMMAND_BYTES_LIMIT).check(NAME).map_err(|e| e.to_string()), Ok(()));
        for bad in [0, MAX_COMMAND_BYTES_LIMIT + 1] {
            let err = at(bad).check(NAME).unwrap_err();
            assert!(err.message().contains("max_command_bytes"), "{err}");
        }
    }

    #[test]
    fn config_validation_names_the_key() {
        let c = BashLocalConfig { max_timeout_ms: 10, ..BashLocalConfig::default() };
        let err = c.check(NAME).unwrap_err();
        assert_eq!(err.code(), conch_seams::ErrorCode::InvalidComposition);
        assert!(err.message().contains("key `plugins.bash-local.max_timeout_ms`"), "{err}");
        // The key the user set is the one blamed: a default timeout above the default limit.
        let c = BashLocalConfig { timeout_ms: 700_000, ..BashLocalConfig::default() };
        assert_eq!(
            c.check(NAME).unwrap_err().message(),
            "plugin `bash-local`: key `plugins.bash-local.timeout_ms`: 700000 is above \
             max_timeout_ms (600000); raise max_timeout_ms too"
        );
        let c = BashLocalConfig { bash: String::new(), ..BashLocalConfig::default() };
        assert!(c.check(NAME).unwrap_err().message().contains("bash"));
    }
}
