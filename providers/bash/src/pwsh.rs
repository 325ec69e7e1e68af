//! `pwsh-local` and `pwsh-sandbox`: the shared executor in the PowerShell 7 flavour, and the
//! pwsh text both it and terminal-bash's pwsh dialect run.
//!
//! A command runs as `pwsh -NoLogo -NoProfile -NonInteractive -OutputFormat Text
//! -EncodedCommand <base64 of UTF-16LE>`: the encoded script is a fixed wrapper, and the
//! command is data inside it (base64 of its UTF-8), so no quoting in the command can reach
//! pwsh's own parser before the wrapper hands the text over whole. The wrapper:
//!
//! - makes the output model-friendly ([`PREAMBLE`]: no progress records, plain-text
//!   rendering, UTF-8 both ways) and leaves `$ErrorActionPreference` as the command sets it;
//! - parses the command first, so a syntax error is reported (`ParserError: line L, column C:
//!   ...`, exit 1) before any of it runs, as pwsh itself would refuse it;
//! - runs it dot-sourced in the script's scope, followed by [`STATUS`], which turns the last
//!   statement's outcome into the exit code a PowerShell user expects: 0 when it succeeded,
//!   `$LASTEXITCODE` when it failed and a native command last set a non-zero one, else 1.
//!   `exit N` still exits with N, and a terminating error (`throw`, `-ErrorAction Stop`)
//!   still ends pwsh with 1 and the error text, as pwsh reports it.
//!
//! A command longer than fits one argv string once encoded travels in environment
//! variables ([`CHUNK_VAR`]`0`, `1`, ...; raw UTF-8, cut on char boundaries), which the
//! wrapper joins and removes before the command runs, so the command never sees them.
//!
//! A command too long for one argument travels in `__CONCH_PWSH_COMMAND_<n>` variables the wrapper
//! removes before it runs.

use std::sync::Arc;

use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::{Result, Sandbox, SandboxPolicy, ShellDialect, Subprocess};

use crate::engine::{self, Flavor, Invocation, LocalShell, MAX_ARG_BYTES};

/// Plugin name.
pub const NAME: &str = "pwsh-local";

/// Plugin name of the sandboxed variant.
pub const SANDBOX_NAME: &str = "pwsh-sandbox";

/// Variables that keep pwsh's output plain and keep it off the network: no colour, no
/// pagers, no telemetry, no update check.
pub const ENV_OVERRIDES: &[(&str, &str)] = &[
    ("NO_COLOR", "1"),
    ("TERM", "dumb"),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("POWERSHELL_TELEMETRY_OPTOUT", "1"),
    ("POWERSHELL_UPDATECHECK", "Off"),
];

/// The flags of a one-shot pwsh, before the encoded script.
pub const ONE_SHOT_FLAGS: &[&str] =
    &["-NoLogo", "-NoProfile", "-NonInteractive", "-OutputFormat", "Text", "-EncodedCommand"];

/// Prefix of the variables a long command travels in.
pub const CHUNK_VAR: &str = "__CONCH_PWSH_COMMAND_";

/// Output settings every pwsh conch starts gets: progress records are not rendered (they
/// would interleave with the output as redraws), formatting is plain text (no ANSI), and
/// text goes out, and to native commands, as UTF-8.
pub const PREAMBLE: &str = concat!(
    "$ProgressPreference = 'SilentlyContinue'\n",
    "if ($PSStyle) { $PSStyle.OutputRendering = 'PlainText' }\n",
    "$OutputEncoding = [System.Text.UTF8Encoding]::new($false)\n",
    "[Console]::OutputEncoding = [System.Text.UTF8Encoding]::new($false)\n",
);

/// Appended to a command (after two newlines, so no line continuation can join it to the
/// command's last statement) to record its status in `$global:__conch_rc`. `$?` is read first,
/// before anything else can change it; `$LASTEXITCODE` is read without failing under
/// `Set-StrictMode` when no native command has run. Contains no single quote, so it travels
/// as one single-quoted literal.
pub const STATUS: &str = concat!(
    "$global:__conch_ok = $?\n",
    "if ($global:__conch_ok) { $global:__conch_rc = 0 } else { $global:__conch_rc = 1; ",
    "$__conch_lec = Get-Variable -Name LASTEXITCODE -Scope Global -ValueOnly -ErrorAction Ignore; ",
    "if ($__conch_lec -is [int] -and $__conch_lec -ne 0) { $global:__conch_rc = $__conch_lec } }\n",
);

/// Standard base64 (with padding) of `bytes`.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `text` as UTF-16LE bytes (astral characters as surrogate pairs), the encoding
/// `-EncodedCommand` expects.
pub fn utf16le(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// The `-EncodedCommand` argument that runs `script`.
pub fn encode_command(script: &str) -> String {
    base64(&utf16le(script))
}

/// A PowerShell expression whose value is `text`, whatever it holds: the UTF-8 of `text`
/// as base64, decoded in place.
pub fn text_expression(text: &str) -> String {
    format!(
        "[System.Text.Encoding]::UTF8.GetString([System.Convert]::FromBase64String('{}'))",
        base64(text.as_bytes())
    )
}

/// Statements that check the command text in `$__conch_t` and prepare it to run: a syntax
/// error is printed, one line each, and `on_parse_error` runs; otherwise `$global:__conch_rc`
/// is cleared and [`STATUS`] appended, unless the text is written in named blocks
/// (`begin`/`process`/`end`/`clean`), after which no statement may follow: such a command's
/// status is 0 unless it exits or throws. Reads only properties every PowerShell 7 has, so a
/// `Set-StrictMode` a persistent shell kept cannot trip it.
pub fn checked(on_parse_error: &str) -> String {
    format!(
        concat!(
            "$__conch_p = $null\n",
            "$__conch_a = [System.Management.Automation.Language.Parser]::ParseInput(",
            "$__conch_t, [ref]$null, [ref]$__conch_p)\n",
            "if ($__conch_p.Count -gt 0) {{\n",
            "  foreach ($__conch_x in $__conch_p) {{ [Console]::Error.WriteLine('ParserError: line ' + ",
            "$__conch_x.Extent.StartLineNumber + ', column ' + $__conch_x.Extent.StartColumnNumber + ",
            "': ' + $__conch_x.Message) }}\n",
            "  {on_parse_error}\n",
            "}}\n",
            "$global:__conch_rc = $null\n",
            "if ($__conch_a.EndBlock -and $__conch_a.EndBlock.Unnamed -and -not ",
            "($__conch_a.BeginBlock -or $__conch_a.ProcessBlock -or $__conch_a.DynamicParamBlock)) {{ ",
            "$__conch_t += \"`n`n\" + '{status}' }}\n",
        ),
        on_parse_error = on_parse_error,
        status = STATUS,
    )
}

/// The one-shot wrapper around the command text that `source` (a PowerShell expression)
/// yields. Ends with `exit` and the status: `exit` inside the command, or a terminating
/// error, end pwsh before that with their own code.
pub fn one_shot_script(source: &str) -> String {
    format!(
        concat!(
            "{preamble}",
            "$__conch_t = {source}\n",
            "{checked}",
            // Out-Default inside the statement: formatted output is complete before `exit`.
            ". ([scriptblock]::Create($__conch_t)) | Out-Default\n",
            "if ($null -eq $global:__conch_rc) {{ $global:__conch_rc = 0 }}\n",
            "exit $global:__conch_rc\n",
        ),
        preamble = PREAMBLE,
        source = source,
        checked = checked("exit 1"),
    )
}

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

/// What a missing pwsh is called: by name on PATH, or the configured path.
pub fn missing_program(program: &str) -> String {
    if program.contains('/') {
        format!(
            "PowerShell 7 (`{program}`) was not found; install PowerShell 7 there or set \
             `pwsh` to where it is"
        )
    } else {
        format!(
            "PowerShell 7 (`{program}`) was not found on PATH; install PowerShell 7 or set \
             `pwsh` to its path"
        )
    }
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
    const DIALECT: ShellDialect = ShellDialect::PWSH;
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
    use conch_seams::PluginConfig;

    use super::*;

    /// Decodes standard base64; the tests' independent check of [`base64`].
    fn unbase64(text: &str) -> Vec<u8> {
        let value = |c: u8| match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        };
        let mut out = Vec::new();
        for quad in text.as_bytes().chunks(4) {
            assert_eq!(quad.len(), 4, "padded to whole quads");
            let pad = quad.iter().filter(|c| **c == b'=').count();
            let n = quad.iter().take(4 - pad).fold(0u32, |n, c| (n << 6) | value(*c)) << (6 * pad);
            out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
        }
        out
    }

    /// What pwsh does with an `-EncodedCommand` argument: base64, then UTF-16LE.
    fn decode_command(encoded: &str) -> String {
        let bytes = unbase64(encoded);
        assert_eq!(bytes.len() % 2, 0, "whole UTF-16 code units");
        let units: Vec<u16> = bytes.chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        String::from_utf16(&units).expect("valid UTF-16: surrogates come in pairs")
    }

    /// The command inside a one-shot script, as the embedded expression yields it.
    fn embedded_command(script: &str) -> String {
        let start = script.find("FromBase64String('").expect("an embedded command") + 18;
        let end = start + script[start..].find('\'').unwrap();
        String::from_utf8(unbase64(&script[start..end])).unwrap()
    }

    /// Commands that break naive quoting: every quote pwsh knows (including the typographic
    /// ones it treats as single quotes), `$`, backticks, newlines, CRLF, non-ASCII and astral
    /// characters that UTF-16 carries as surrogate pairs.
    const HARD: &[&str] = &[
        "Write-Output 'it''s'",
        "echo \"a\" 'b' ‘c’ “d” `e `$f $(1+1) @'\nhere\n'@",
        "line1\nline2\r\nline3\n",
        "$env:X = 'é€'; \"$env:X 😀 𝄞 \u{10FFFF}\"",
        "`\n`",
        "'",
        "\u{feff}bom first",
        "a",
        "ab",
        "abc",
    ];

    #[test]
    fn base64_round_trips_every_length_and_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        for n in 0..bytes.len() {
            assert_eq!(unbase64(&base64(&bytes[..n])), &bytes[..n], "{n} bytes");
        }
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
    }

    #[test]
    fn the_encoded_command_is_base64_of_utf16le_with_surrogate_pairs() {
        // `pwsh -EncodedCommand` of "dir" as documented: UTF-16LE "d\0i\0r\0".
        assert_eq!(encode_command("dir"), "ZABpAHIA");
        assert_eq!(utf16le("😀"), [0x3D, 0xD8, 0x00, 0xDE], "one astral char, one pair");
        for text in HARD {
            assert_eq!(decode_command(&encode_command(text)), *text);
        }
    }

    #[test]
    fn any_command_round_trips_through_the_argv_exactly() {
        for text in HARD {
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
    fn the_wrapper_checks_then_runs_the_command_with_its_status() {
        let script = one_shot_script("$x");
        let order = [
            "$ProgressPreference = 'SilentlyContinue'",
            "$__conch_t = $x",
            "ParseInput($__conch_t",
            "exit 1",
            "$global:__conch_rc = $null",
            ". ([scriptblock]::Create($__conch_t)) | Out-Default",
            "exit $global:__conch_rc",
        ];
        let mut at = 0;
        for piece in order {
            let found = script[at..].find(piece).unwrap_or_else(|| panic!("{piece} after {at}"));
            at += found + piece.len();
        }
        assert!(!STATUS.contains('\''), "STATUS travels as one single-quoted literal");
        assert!(script.contains(&format!("'{STATUS}'")), "{script}");
        assert!(STATUS.starts_with("$global:__conch_ok = $?"), "$? is read first");
        assert!(!script.contains("ErrorActionPreference"), "left as the command sets it");
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
    fn a_missing_pwsh_is_named_with_what_to_do() {
        assert!(missing_program("pwsh").starts_with("PowerShell 7 (`pwsh`) was not found on PATH"));
        assert!(
            missing_program("/opt/x/pwsh")
                .starts_with("PowerShell 7 (`/opt/x/pwsh`) was not found;")
        );
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
