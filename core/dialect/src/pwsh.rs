//! pwsh's text: how a command reaches PowerShell 7 as data, the wrapper that runs it with the
//! exit code a PowerShell user expects, and the framing of a persistent pwsh. The one-shot
//! executor and the persistent shell share all of it.
//!
//! - Encoding: `-EncodedCommand` takes base64 of UTF-16LE ([`encode_command`]), and the
//!   command itself travels inside the script as base64 of its UTF-8 ([`text_expression`],
//!   [`frame`]), so no quoting in it can reach pwsh's parser or line reader as anything but
//!   data.
//! - The one-shot wrapper ([`one_shot_script`]) makes the output model-friendly ([`PREAMBLE`]:
//!   no progress records, plain-text rendering, UTF-8 both ways) and leaves
//!   `$ErrorActionPreference` as the command sets it; parses the command first, so a syntax
//!   error is reported (`ParserError: line L, column C: ...`, exit 1) before any of it runs,
//!   as pwsh itself would refuse it; and runs it dot-sourced in the script's scope, followed by
//!   [`STATUS`], which turns the last statement's outcome into the exit code: 0 when it
//!   succeeded, `$LASTEXITCODE` when it failed and a native command last set a non-zero one,
//!   else 1. `exit N` still exits with N, and a terminating error (`throw`, `-ErrorAction
//!   Stop`) still ends pwsh with 1 and the error text, as pwsh reports it.
//! - A persistent pwsh starts with [`session_script`] and runs each command as the typed line
//!   of [`frame`], printing the [`markers`](crate::markers).

use base64::Engine as _;

use crate::markers::TAG;

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
fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `text` as UTF-16LE bytes (astral characters as surrogate pairs), the encoding
/// `-EncodedCommand` expects.
fn utf16le(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

/// The `-EncodedCommand` argument that runs `script`.
pub fn encode_command(script: &str) -> String {
    base64(&utf16le(script))
}

/// The script an `-EncodedCommand` argument runs, as pwsh reads it (base64, then UTF-16LE):
/// the inverse of [`encode_command`]. `None` for an argument pwsh would refuse.
pub fn decode_command(encoded: &str) -> Option<String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
    if bytes.len() % 2 != 0 {
        return None;
    }
    let units: Vec<u16> = bytes.chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
    String::from_utf16(&units).ok()
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
fn checked(on_parse_error: &str) -> String {
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

/// The script a persistent pwsh starts with (`pwsh -NoLogo -NoProfile -NoExit
/// -EncodedCommand`), before its first prompt; `marker_payload` is the OSC payload of the
/// private prompt marker (`7770;<nonce>`). Why each piece:
///
/// - PSReadLine is removed, and `PSConsoleHostReadLine` reads a line with .NET's own
///   `Console.In.ReadLine()`. PSReadLine (loaded because the session is interactive) redraws
///   the line with cursor addressing and paints predictions after the cursor, and the host's
///   fallback editor rewrites the whole line at every key; on a PTY whose reader is not a
///   screen both turn the typed text into redraw noise. .NET's reader echoes each character
///   once, as a terminal in canonical mode would, which is what the echo check and the
///   framing rely on, and it blocks in `read(0)`, where the stdin-wait probe sees it.
/// - `prompt` prints the end marker of a pending frame (its status kept by the frame's
///   [`STATUS`] epilogue; 1 when the command ended by a
///   terminating error or an interrupt, which skip it), then the private marker and `PS> `.
/// - `__conch_f` runs one framed command: it records the frame, prints the start marker
///   (from pieces, so the echoed line never holds it), checks the command's syntax and
///   dot-sources it, so state it changes (location, variables, functions) stays global.
pub fn session_script(marker_payload: &str) -> String {
    format!(
        concat!(
            "Remove-Module PSReadLine -ErrorAction Ignore\n",
            "{preamble}",
            "$global:__conch_frame = $null\n",
            "$global:__conch_rc = $null\n",
            "function global:PSConsoleHostReadLine {{ [Console]::In.ReadLine() }}\n",
            "function global:prompt {{\n",
            "  $__conch_s = ''\n",
            "  if ($global:__conch_frame) {{\n",
            "    $__conch_c = $global:__conch_rc\n",
            "    if ($null -eq $__conch_c) {{ $__conch_c = 1 }}\n",
            "    $__conch_s = \"`n\" + '{tag}' + '_END_' + $global:__conch_frame + ':' + $__conch_c + \"__`n\"\n",
            "    $global:__conch_frame = $null\n",
            "  }}\n",
            "  $__conch_s + [char]27 + ']{payload}' + [char]7 + 'PS> '\n",
            "}}\n",
            "function global:__conch_f {{\n",
            "  param([string]$__conch_n, [string]$__conch_b)\n",
            "  $global:__conch_rc = $null\n",
            "  $global:__conch_frame = $__conch_n\n",
            "  [Console]::Out.Write(\"`n\" + '{tag}' + '_START_' + $__conch_n + \"__`n\")\n",
            "  $__conch_t = [System.Text.Encoding]::UTF8.GetString([System.Convert]::FromBase64String($__conch_b))\n",
            "{checked}",
            "  . ([scriptblock]::Create($__conch_t))\n",
            "  if ($null -eq $global:__conch_rc) {{ $global:__conch_rc = 0 }}\n",
            "}}\n",
        ),
        preamble = PREAMBLE,
        tag = TAG,
        payload = marker_payload,
        checked = checked("$global:__conch_rc = 1; return"),
    )
}

/// The single line typed into a pwsh session for `command` under `nonce`: the command as
/// base64 of its UTF-8, so no character in it can reach the line reader as anything but
/// data. Dot-sourced, so the command runs in the global scope.
pub fn frame(command: &str, nonce: &str) -> String {
    format!(" . __conch_f '{nonce}' '{}'", base64(command.as_bytes()))
}

/// Commands that break naive quoting: every quote pwsh knows (including the typographic
/// ones it treats as single quotes), `$`, backticks, newlines, CRLF, non-ASCII and astral
/// characters that UTF-16 carries as surrogate pairs. Every way a command reaches pwsh must
/// carry each of them byte for byte; the tests of each way check it.
pub const QUOTING_HAZARDS: &[&str] = &[
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

#[cfg(test)]
mod tests {
    use super::*;

    fn unbase64(text: &str) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD.decode(text).unwrap()
    }

    #[test]
    fn the_encoded_command_is_base64_of_utf16le_with_surrogate_pairs() {
        // `pwsh -EncodedCommand` of "dir" as documented: UTF-16LE "d\0i\0r\0".
        assert_eq!(encode_command("dir"), "ZABpAHIA");
        assert_eq!(utf16le("😀"), [0x3D, 0xD8, 0x00, 0xDE], "one astral char, one pair");
        for text in QUOTING_HAZARDS {
            assert_eq!(decode_command(&encode_command(text)).as_deref(), Some(*text));
        }
    }

    #[test]
    fn a_text_expression_carries_any_text_as_data() {
        for text in QUOTING_HAZARDS {
            let e = text_expression(text);
            let start = e.find("FromBase64String('").unwrap() + 18;
            let end = start + e[start..].find('\'').unwrap();
            assert_eq!(String::from_utf8(unbase64(&e[start..end])).unwrap(), *text);
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
    fn a_missing_pwsh_is_named_with_what_to_do() {
        assert!(missing_program("pwsh").starts_with("PowerShell 7 (`pwsh`) was not found on PATH"));
        assert!(
            missing_program("/opt/x/pwsh")
                .starts_with("PowerShell 7 (`/opt/x/pwsh`) was not found;")
        );
    }

    #[test]
    fn the_pwsh_frame_is_one_line_of_data() {
        for command in ["echo 'a'", "a\nb\r\n`$x \"q\" ‘s’ é😀", "'"] {
            let line = frame(command, "n1");
            assert!(!line.contains(['\n', '\r']), "one typed line: {line}");
            assert!(line.chars().all(|c| c.is_ascii_graphic() || c == ' '), "{line}");
            assert!(line.starts_with(" . __conch_f 'n1' '"), "dot-sourced: {line}");
            let b64 = line.rsplit('\'').nth(1).unwrap();
            assert_eq!(String::from_utf8(unbase64(b64)).unwrap(), command);
            assert!(!line.contains(crate::markers::start("n1").trim_end()), "no marker echoed");
        }
    }

    #[test]
    fn the_pwsh_startup_script_takes_over_the_line_reader_and_the_prompt() {
        let init = session_script("7770;abc");
        for piece in [
            "Remove-Module PSReadLine -ErrorAction Ignore",
            "function global:PSConsoleHostReadLine { [Console]::In.ReadLine() }",
            "function global:prompt {",
            "[char]27 + ']7770;abc' + [char]7 + 'PS> '",
            "function global:__conch_f {",
            "$ProgressPreference = 'SilentlyContinue'",
            "  . ([scriptblock]::Create($__conch_t))",
            "$global:__conch_rc = 1; return",
        ] {
            assert!(init.contains(piece), "{piece} in\n{init}");
        }
        // Printed from pieces: neither the script nor its echo carries a whole marker.
        assert!(!init.contains("__CONCH_PB_END_") && !init.contains("__CONCH_PB_START_"));
        let encoded = encode_command(&init);
        assert!(encoded.len() < 32 * 1024, "one modest argument: {}", encoded.len());
    }
}
