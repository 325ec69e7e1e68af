//! `pwsh-local` and `pwsh-sandbox`: the shared executor in the PowerShell 7 flavour.
//!
//! A command runs as `pwsh -NoLogo -NoProfile -NonInteractive -OutputFormat Text
//! -EncodedCommand <base64 of UTF-16LE>`: the encoded script is the fixed wrapper of
//! `conch_dialect::pwsh` (which says what it does), and the command is data inside it (base64
//! of its UTF-8), so no quoting in the command can reach pwsh's own parser before the wrapper
//! hands the text over whole.
//!
//! A command too long for one argument travels in environment variables ([`CHUNK_VAR`]`0`,
//! `1`, ...; raw UTF-8, cut on char boundaries), which the wrapper joins and removes before
//! the command runs, so the command never sees them.

use std::sync::Arc;

use conch_dialect::pwsh::{
    ENV_OVERRIDES, encode_command, missing_program, one_shot_script, text_expression,
};
use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::{Dialect, Result, Sandbox, SandboxPolicy, Subprocess};

use crate::engine::{self, Flavor, Invocation, LocalShell, MAX_ARG_BYTES};

/// Plugin name.
pub const NAME: &str = "pwsh-local";

/// Plugin name of the sandboxed variant.
pub const SANDBOX_NAME: &str = "pwsh-sandbox";

/// The flags of a one-shot pwsh, before the encoded script.
pub const ONE_SHOT_FLAGS: &[&str] =
    &["-NoLogo", "-NoProfile", "-NonInteractive", "-OutputFormat", "Text", "-EncodedCommand"];

/// Prefix of the variables a long command travels in.
pub const CHUNK_VAR: &str = "__CONCH_PWSH_COMMAND_";

/// The command line that runs `command` with `program` (see the module doc).
pub fn invocation(program: &str, command: &str) -> Invocation {
    let argv = |script: &str| {
        let mut argv = vec![program.to_string()];
        argv.extend(ONE_SHOT_FLAGS.iter().map(|f| (*f).to_string()));
        argv.push(encode_command(script));
        argv
    };
    let inline = argv(&one_shot_script(&text_expression(command)));
    if inline.last().is_some_and(|a| a.len() <= MAX_ARG_BYTES) {
        return Invocation { argv: inline, env: Vec::new() };
    }
    let room = MAX_ARG_BYTES - CHUNK_VAR.len() - "999=".len();
    let mut env = Vec::new();
    let mut rest = command;
    while !rest.is_empty() {
        let mut end = rest.len().min(room);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (chunk, tail) = rest.split_at(end);
        env.push((format!("{CHUNK_VAR}{}", env.len()), chunk.to_string()));
        rest = tail;
    }
    // Joined in order, then removed from pwsh's environment (and so from every child's)
    // before the command runs.
    let source = format!(
        "-join (0..{last} | ForEach-Object {{ $__conch_v = '{CHUNK_VAR}' + $_; \
         [Environment]::GetEnvironmentVariable($__conch_v); \
         [Environment]::SetEnvironmentVariable($__conch_v, $null) }})",
        last = env.len() - 1
    );
    Invocation { argv: argv(&one_shot_script(&source)), env }
}

engine::local_shell_config!(
    /// pwsh-local (and pwsh-sandbox) config.
    PwshLocalConfig,
    pwsh,
    "pwsh"
);

/// The PowerShell 7 flavour.
#[derive(Debug)]
pub struct Pwsh;

impl Flavor for Pwsh {
    const NAME: &'static str = NAME;
    const SANDBOX_NAME: &'static str = SANDBOX_NAME;
    const DIALECT: Dialect = Dialect::Pwsh;
    const ENV_OVERRIDES: &'static [(&'static str, &'static str)] = ENV_OVERRIDES;
    const PROGRAM_KEY: &'static str = "pwsh";

    fn invocation(program: &str, command: &str) -> Invocation {
        invocation(program, command)
    }

    fn missing_program(program: &str) -> Option<String> {
        Some(missing_program(program))
    }
}

/// The pwsh-local executor, and with a sandbox bound, pwsh-sandbox.
pub type PwshLocal = LocalShell<Pwsh>;

impl LocalShell<Pwsh> {
    /// pwsh-local over a subprocess provider.
    ///
    /// # Errors
    /// Invalid config.
    pub fn new(config: PwshLocalConfig, subprocess: Arc<dyn Subprocess>) -> Result<Self> {
        Self::with_settings(config.settings(), subprocess)
    }

    /// pwsh-sandbox: every command line wrapped by `sandbox` under a per-call policy,
    /// `policy` unless a request overrides its mode.
    ///
    /// # Errors
    /// Invalid config.
    pub fn sandboxed(
        config: PwshLocalConfig,
        subprocess: Arc<dyn Subprocess>,
        sandbox: Arc<dyn Sandbox>,
        policy: SandboxPolicy,
    ) -> Result<Self> {
        Self::with_settings_sandboxed(config.settings(), subprocess, sandbox, policy)
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: PwshLocalConfig = ctx.config()?;
    engine::plugin::build_local::<Pwsh>(ctx, config.settings())
}

register_plugin!(PluginEntry {
    name: NAME,
    provides: Some(SeamId::Shell),
    requires: &[SeamId::Subprocess],
    description: "PowerShell 7 (pwsh -EncodedCommand) over the subprocess seam",
    build,
});

fn build_sandboxed(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: PwshLocalConfig = ctx.config()?;
    engine::plugin::build_sandboxed::<Pwsh>(ctx, config.settings())
}

register_plugin!(PluginEntry {
    name: SANDBOX_NAME,
    provides: Some(SeamId::Shell),
    requires: &[SeamId::Subprocess, SeamId::Sandbox],
    description: "pwsh-local with every command line wrapped through the sandbox seam",
    build: build_sandboxed,
});

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use conch_dialect::pwsh::{PREAMBLE, QUOTING_HAZARDS};
    use conch_registry::PluginConfig;

    use super::*;

    fn unbase64(text: &str) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD.decode(text).unwrap()
    }

    /// What pwsh runs for an `-EncodedCommand` argument.
    fn decode_command(encoded: &str) -> String {
        conch_dialect::pwsh::decode_command(encoded).expect("a valid encoded command")
    }

    /// The command inside a one-shot script, as the embedded expression yields it.
    fn embedded_command(script: &str) -> String {
        let start = script.find("FromBase64String('").expect("an embedded command") + 18;
        let end = start + script[start..].find('\'').unwrap();
        String::from_utf8(unbase64(&script[start..end])).unwrap()
    }

    #[test]
    fn any_command_round_trips_through_the_argv_exactly() {
        for text in QUOTING_HAZARDS {
            let inv = invocation("pwsh", text);
            assert!(inv.env.is_empty(), "short commands need no variables");
            assert_eq!(inv.argv[0], "pwsh");
            assert_eq!(&inv.argv[1..7], ONE_SHOT_FLAGS);
            assert_eq!(inv.argv.len(), 8, "the script is one argument");
            let script = decode_command(&inv.argv[7]);
            assert_eq!(embedded_command(&script), *text, "the command is data, byte for byte");
            assert!(script.starts_with(PREAMBLE), "{script}");
        }
    }

    #[test]
    fn a_command_too_long_for_one_argument_travels_in_variables() {
        // Astral characters, so cuts land inside them unless moved to a char boundary.
        let command = format!("#{}", "😀".repeat(100_000));
        let inv = invocation("pwsh", &command);
        assert!(inv.env.len() > 1, "{} variables", inv.env.len());
        let joined: String = inv.env.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(joined, command);
        for (i, (k, v)) in inv.env.iter().enumerate() {
            assert_eq!(k, &format!("{CHUNK_VAR}{i}"));
            assert!(k.len() + 1 + v.len() <= MAX_ARG_BYTES, "each fits one environment string");
        }
        let script = decode_command(&inv.argv[7]);
        assert!(inv.argv[7].len() <= MAX_ARG_BYTES);
        assert!(script.contains(&format!("0..{}", inv.env.len() - 1)), "{script}");
        assert!(script.contains("SetEnvironmentVariable($__conch_v, $null)"), "removed");
        // Just past the inline limit, the command switches to variables.
        let mut n = 30_000;
        while invocation("pwsh", &"x".repeat(n)).env.is_empty() {
            n += 1000;
        }
        assert!(n > 30_000, "tens of KiB still run inline");
    }

    #[test]
    fn config_names_the_pwsh_key() {
        let c = PwshLocalConfig { pwsh: String::new(), ..PwshLocalConfig::default() };
        let err = c.check(NAME).unwrap_err();
        assert!(err.message().contains("pwsh"), "{err}");
        assert_eq!(PwshLocalConfig::default().pwsh, "pwsh");
        assert_eq!(PwshLocalConfig::default().settings().timeout_ms, 120_000);
    }
}
