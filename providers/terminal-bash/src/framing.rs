//! Command framing: one typed line that runs a command after a private start marker, an
//! end marker (with the status) printed before the shell's next prompt, and a scanner that
//! finds both in the parsed output stream. The markers and the scanner are shared; the
//! typed line and the helpers it calls are each dialect's.
//!
//! In bash:
//!
//! - The end marker comes from the framed line itself or, failing that, from PROMPT_COMMAND,
//!   which runs before every prompt, so it arrives however the command line ended:
//!   normally, by a syntax or expansion error, or by an interrupt.
//! - The machinery stays out of the user's view: every helper runs with stderr to /dev/null
//!   (so `set -x` traces none of it; `__conch_s` turns xtrace off for the frame's own
//!   commands and the `eval` turns it back on first), and `trap` listings leave out the
//!   framing's traps.
//! - The command travels as one ANSI-C quoted word (`$'...'`, every byte outside printable
//!   ASCII escaped), so no quoting in its text can break the frame, it stays one typed line,
//!   and no helper process runs per call. `eval` keeps state changes (cd, export,
//!   functions) in the shell. Its stdin is /dev/null, as in the one-shot tool: a program
//!   that reads stdin sees end of file instead of waiting on the terminal (which would stop
//!   the call). Programs that open /dev/tty (password prompts) still reach the terminal;
//!   the session stops them (see `BashSession::stop_command`). `exec` is aliased to give
//!   the program the terminal back, so `exec bash` starts a working interactive shell.
//! - The framed line ends itself: after the `eval`, `__conch_e` prints the end marker with
//!   the status and puts the prompt hook back if the command replaced PROMPT_COMMAND. The
//!   PROMPT_COMMAND hook prints it only for a line that did not get there (interrupted,
//!   stopped by the errexit emulation, an expansion error).
//! - A shell's first prompt prints a fresh-shell marker (carrying the session's nonce): a
//!   frame whose command replaced the shell (`exec bash`) ends with it, and the session types
//!   the errexit emulation again before the next frame.
//! - Markers are printed from pieces (`%s`), so the echoed line never holds a whole marker.
//! - `set -e` is emulated instead of enabled (see [`INIT`]): the real errexit stays off and
//!   an ERR trap stops the command line at the first failure with a SIGINT to the shell
//!   itself, which an interactive bash answers by abandoning the line and returning to its
//!   prompt, where a real errexit would make it exit (and with `set -u`, an unset variable
//!   would too). So `set -e` in one call can never destroy the shell in that or a later
//!   call.
//! - The framed line starts with a space; with `HISTCONTROL=ignorespace` it is not recorded,
//!   so the nonce is not readable from `history`.
//!
//! The typed line is short because the line editor echoes every typed byte: a starter function,
//! re-defined by PROMPT_COMMAND before every prompt, prints the start marker; the command follows
//! as one `$'...'` word; the end marker and status are printed by PROMPT_COMMAND. `set -e` is
//! emulated by a `set` alias, a one-shot DEBUG trap that `set` arms, and an ERR trap, so it never
//! makes the shell exit.

/// Prefix of every frame marker.
const TAG: &str = "__CONCH_PB";

/// Defines what a framed command needs beyond the prompt hook: the errexit emulation and the
/// exit hook; typed once per shell, before its first frame (again after `exec bash`).
///
/// `set` is an alias for a guard and the builtin, so `set -- args` still sets the caller's
/// positional parameters. The guard gives the builtin the true errexit state and arms a
/// one-shot DEBUG trap (inherited everywhere through functrace) that looks at `$-` right
/// after the builtin ran, turns a real errexit back off, keeps it as the emulation flag and
/// disarms itself: a command line without `set` runs no trap at all. (A DEBUG trap the
/// command installed itself is replaced by the next `set`.)
/// The ERR trap (inherited through errtrace) fires exactly where errexit would: it exits a
/// subshell with the status, or stops the shell's command line with a SIGINT to itself. It
/// acts only while a frame's command runs (`__conch_run`, set by the frame's starter and
/// cleared by its end, the prompt hook and the stop itself), so a failure in someone else's
/// prompt hook (pyenv, direnv) after the stop cannot interrupt the shell again and again.
/// Every helper runs as `{ helper; } 2>/dev/null`, so under `set -x` its trace goes nowhere.
///
/// `exec` is an alias that gives the program the terminal back as stdin (a framed command's
/// stdin is /dev/null, which would end a new interactive shell at once).
///
/// `trap` (listing) leaves these traps out: they are the shell's machinery, not the user's.
///
/// `__conch_framed` (exported) says the shell frames commands: only then does a new shell's
/// first prompt print the fresh-shell marker, so a terminal session (which never frames)
/// shows no marker in its banner or after `exec bash`.
///
/// The EXIT trap stops the shell's background jobs when it exits (`exit N` would otherwise
/// leave them holding the terminal, and the session would not see the shell's end until they
/// ended) and lists them; its last words are the exit marker, after which the shell writes
/// nothing, so the session knows it has all of the shell's output even while something the
/// shell left behind keeps the terminal open.
const INIT: &str = concat!(
    "__conch_dbg() { [[ $BASH_COMMAND == \"builtin set\"* ]] && return 0; builtin trap - DEBUG; ",
    "if [[ $- == *e* ]]; then builtin set +e; __conch_errexit=1; else __conch_errexit=; fi; }; ",
    "__conch_set() { [[ -n ${__conch_errexit-} ]] && builtin set -e; ",
    "builtin trap '{ __conch_dbg; } 2>/dev/null' DEBUG; }; ",
    "alias set='{ __conch_set; } 2>/dev/null; builtin set'; ",
    "alias exec='builtin exec 0<&2'; ",
    "__conch_err() { if [[ -n ${__conch_errexit-} && -n ${__conch_run-} ]]; then __conch_status=$1; ",
    "if [[ $BASHPID != \"$$\" ]]; then exit \"$1\"; fi; __conch_run=; builtin kill -INT \"$$\"; fi; }; ",
    "builtin trap '{ __conch_err $?; } 2>/dev/null' ERR; ",
    "__conch_exit() { __conch_run=; local p l s=; while IFS= builtin read -r l; do ",
    "[[ $l == *' Running '* || $l == *' Stopped '* ]] && s+=$'\\n'$l; done <<< \"$(builtin jobs -l)\"; ",
    "[[ -n $s ]] || return 0; for p in $(builtin jobs -p); do ",
    "builtin kill -TERM -- -$p || builtin kill -TERM $p; builtin kill -CONT -- -$p; done; ",
    "builtin printf '[the shell exited and stopped its background jobs:%s]\\n' \"$s\"; }; ",
    "__conch_bye() { __conch_exit; builtin printf '\\n%s_EXIT_%s__\\n' __CONCH_PB \"${__conch_sn-}\"; }; ",
    "builtin trap '{ __conch_bye; } 2>/dev/null' EXIT; ",
    "trap() { if [[ $# == 0 || $1 == -p ]]; then local l; while IFS= builtin read -r l; do ",
    "[[ -z $l || $l == *__conch_* ]] || builtin printf '%s\\n' \"$l\"; ",
    "done <<< \"$(builtin trap \"$@\")\"; else builtin trap \"$@\"; fi; }; ",
    "builtin set -ET; ",
    // Exported, so a shell this one execs prints the fresh-shell marker (see
    // `prompt_command`); a session that never framed a command never prints it.
    "export __conch_framed=1; ",
);

/// The PROMPT_COMMAND of a framing shell. Its helpers are defined again before every prompt,
/// so a command that redefined or removed one cannot break the next frame; all of it runs
/// with stderr to /dev/null, so `set -x` traces none of it:
///
/// - `__conch_pc` prints the end marker of a frame still pending (with the status, and `:e`
///   when the errexit emulation stopped the line) and re-asserts PS1. A frame's line that
///   ran to its end printed its marker itself (`__conch_e`); this one covers a line that was
///   abandoned (an interrupt, the errexit emulation, an expansion error).
/// - `__conch_s NONCE` records the frame, prints its start marker and takes `set -x` off for
///   the frame's own machinery (`$__conch_x` turns it back on inside the command's `eval`).
///   It is a function rather than text in every frame because the frame is typed: the line
///   editor echoes each typed byte, which costs more per byte than anything else in a call.
/// - `__conch_e` ends a frame whose line ran to its end: the end marker with the `eval`
///   status, and the prompt hook put back in front of PROMPT_COMMAND when the command
///   replaced it (direnv, conda and starship assign it), so the next frame still ends.
/// - The first prompt of a shell (a fresh one, or one started by `exec bash`) turns history
///   expansion off (`!` in a command is text) and prints the fresh-shell marker, which ends a
///   frame whose shell was replaced.
pub(crate) fn prompt_command(ps1: &str, session_nonce: &str) -> String {
    format!(
        "{{ __conch_rc=$?; __conch_run=; \
         __conch_pc() {{ if [[ -n ${{__conch_frame-}} ]]; then \
         if [[ -n ${{__conch_status-}} ]]; then __conch_rc=$__conch_status:e; fi; \
         builtin printf '\\n%s_END_%s:%s__\\n' {TAG} \"$__conch_frame\" \"$__conch_rc\"; \
         __conch_frame=; fi; __conch_status=; PS1='{ps1}'; }}; \
         __conch_s() {{ __conch_frame=$1; __conch_run=1; __conch_x=; if [[ $- == *x* ]]; then builtin set +x; \
         __conch_x=$'builtin set -x\\n'; fi; builtin printf '\\n%s_START_%s__\\n' {TAG} \"$1\"; }}; \
         __conch_e() {{ __conch_rc=$?; __conch_run=; if [[ -n ${{__conch_frame-}} ]]; then \
         builtin printf '\\n%s_END_%s:%s__\\n' {TAG} \"$__conch_frame\" \"$__conch_rc\"; \
         __conch_frame=; fi; [[ ${{PROMPT_COMMAND[*]-}} == *__conch_pc* ]] || \
         PROMPT_COMMAND=\"$__conch_hook${{PROMPT_COMMAND:+; $PROMPT_COMMAND}}\"; }}; \
         if [[ -z ${{__conch_hook-}} ]]; then __conch_hook=$PROMPT_COMMAND; __conch_sn={session_nonce}; \
         builtin set +H; \
         if [[ -n ${{__conch_framed-}} ]]; then \
         builtin printf '\\n%s_FRESH_%s__\\n' {TAG} '{session_nonce}'; fi; fi; \
         __conch_pc; }} 2>/dev/null"
    )
}

/// `$'...'` quoting of arbitrary bytes: printable ASCII stays, `\` and `'` are escaped,
/// every other byte (controls, newlines, UTF-8) becomes `\xHH`.
fn ansi_c_quote(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len() + 3);
    out.push_str("$'");
    for &b in data {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\'' => out.push_str("\\'"),
            0x20..=0x7E => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('\'');
    out
}

/// The single line typed into the shell for `command` under `nonce`; `init` prepends the
/// errexit emulation (the session's first frame). `eval` runs at the top level, not inside
/// the starter, so `local`, `return` and `$1` mean what they mean at a prompt.
pub(crate) fn frame(command: &str, nonce: &str, init: bool) -> String {
    format!(
        " {}{{ __conch_s {nonce}; }} 2>/dev/null;eval \"${{__conch_x-}}\"{} </dev/null;{{ __conch_e; }} 2>/dev/null",
        if init { INIT } else { "" },
        ansi_c_quote(command.as_bytes())
    )
}

/// The script a pwsh session starts with (`pwsh -NoLogo -NoProfile -NoExit -EncodedCommand`),
/// before its first prompt. Why each piece:
///
/// - PSReadLine is removed, and `PSConsoleHostReadLine` reads a line with .NET's own
///   `Console.In.ReadLine()`. PSReadLine (loaded because the session is interactive) redraws
///   the line with cursor addressing and paints predictions after the cursor, and the host's
///   fallback editor rewrites the whole line at every key; on a PTY whose reader is not a
///   screen both turn the typed text into redraw noise. .NET's reader echoes each character
///   once, as a terminal in canonical mode would, which is what the echo check and the
///   framing rely on, and it blocks in `read(0)`, where the stdin-wait probe sees it.
/// - `prompt` prints the end marker of a pending frame (its status kept by the frame's
///   [`STATUS`](conch_provider_bash::pwsh::STATUS) epilogue; 1 when the command ended by a
///   terminating error or an interrupt, which skip it), then the private marker and `PS> `.
/// - `__conch_f` runs one framed command: it records the frame, prints the start marker
///   (from pieces, so the echoed line never holds it), checks the command's syntax and
///   dot-sources it, so state it changes (location, variables, functions) stays global.
pub(crate) fn pwsh_init(marker_payload: &str) -> String {
    use conch_provider_bash::pwsh::{PREAMBLE, checked};
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
pub(crate) fn pwsh_frame(command: &str, nonce: &str) -> String {
    format!(" . __conch_f '{nonce}' '{}'", conch_provider_bash::pwsh::base64(command.as_bytes()))
}

/// Finds one frame's markers in parsed output (newlines already normalised to `\n`) fed in
/// arbitrary pieces, and counts the bytes of the command's output between them exactly.
#[derive(Debug)]
pub(crate) struct FrameScanner {
    start: String,
    end: String,
    /// The marker the first prompt of a new shell prints (`exec bash` replaced the shell).
    fresh: String,
    /// The marker the shell prints last when it exits.
    exit: String,
    /// Unmatched text that could still be the beginning of the marker being looked for.
    window: String,
    /// Bytes of command output seen after the start marker (end marker excluded).
    body_bytes: u64,
    started: bool,
    code: Option<i32>,
    /// The errexit emulation stopped the line (bash then printed one newline of its own).
    errexit: bool,
    /// The frame ended because the command replaced the shell (`exec bash`).
    replaced: bool,
    /// The shell printed its exit marker: every byte it wrote is in.
    exited: bool,
}

impl FrameScanner {
    /// A scanner for the frame `nonce` of the session whose fresh-shell marker carries
    /// `session_nonce`.
    pub(crate) fn new(nonce: &str, session_nonce: &str) -> Self {
        Self {
            start: format!("{TAG}_START_{nonce}__\n"),
            end: format!("\n{TAG}_END_{nonce}:"),
            fresh: fresh_marker(session_nonce),
            exit: exit_marker(session_nonce),
            window: String::new(),
            body_bytes: 0,
            started: false,
            code: None,
            errexit: false,
            replaced: false,
            exited: false,
        }
    }

    /// True once the exiting shell's last words (its exit marker) arrived.
    pub(crate) fn shell_exited(&self) -> bool {
        self.exited
    }

    /// True when the frame ended because the command replaced the shell with a new one
    /// (which needs [`INIT`] again before its first frame).
    pub(crate) fn replaced_shell(&self) -> bool {
        self.replaced
    }

    /// The exit status, once the end marker (with its status) arrived.
    pub(crate) fn code(&self) -> Option<i32> {
        self.code
    }

    /// Bytes of command output between the markers so far (what the window still holds
    /// back is counted by [`FrameScanner::finish`]).
    #[cfg(test)]
    pub(crate) fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// True when the errexit emulation ended the command.
    pub(crate) fn stopped_by_errexit(&self) -> bool {
        self.errexit
    }

    /// True once the start marker arrived (the command began printing).
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// Ends the scan: every byte after the start marker, up to the end marker when it came,
    /// including text held back in case it began a marker.
    pub(crate) fn finish(self) -> u64 {
        if self.started && self.code.is_none() && !self.exited {
            self.body_bytes + self.window.len() as u64
        } else {
            self.body_bytes
        }
    }

    /// Feeds parsed text.
    pub(crate) fn push(&mut self, text: &str) {
        if self.code.is_some() || self.exited {
            return;
        }
        self.window.push_str(text);
        if !self.started {
            match self.window.find(&self.start) {
                Some(i) => {
                    self.window.drain(..i + self.start.len());
                    self.started = true;
                }
                None => {
                    self.keep_possible_prefix(self.start.len());
                    return;
                }
            }
        }
        if let Some(j) = self.window.find(&self.end) {
            let after = &self.window[j + self.end.len()..];
            // The status is complete once its closing `__` arrived.
            if let Some(k) = after.find("__") {
                let status = &after[..k];
                let (code, errexit) = match status.strip_suffix(":e") {
                    Some(c) => (c, true),
                    None => (status, false),
                };
                self.body_bytes += j as u64;
                self.code = Some(code.trim().parse().unwrap_or(-1));
                self.errexit = errexit;
                if errexit && self.body_bytes > 0 {
                    // The newline bash prints when it abandons the line is not output.
                    self.body_bytes -= 1;
                }
                self.window.clear();
            }
            return;
        }
        if let Some(j) = self.window.find(&self.exit) {
            // The shell exited (its status comes from the process, not a marker).
            self.body_bytes += j as u64;
            self.exited = true;
            self.window.clear();
            return;
        }
        if let Some(j) = self.window.find(&self.fresh) {
            // A new shell's first prompt: the command replaced the shell (`exec bash`), which
            // never reports a status; the exec itself succeeded.
            self.body_bytes += j as u64;
            self.code = Some(0);
            self.replaced = true;
            self.window.clear();
            return;
        }
        // Everything but a possible start of a marker is command output.
        let longest = self.end.len().max(self.fresh.len()).max(self.exit.len());
        let keep = self.possible_prefix_len(longest);
        let done = self.window.len() - keep;
        self.body_bytes += done as u64;
        self.window.drain(..done);
    }

    /// Length of the longest tail of the window that is shorter than `marker_len` and sits
    /// on a char boundary: the only part that could still begin a marker.
    fn possible_prefix_len(&self, marker_len: usize) -> usize {
        let mut keep = self.window.len().min(marker_len.saturating_sub(1));
        while !self.window.is_char_boundary(self.window.len() - keep) {
            keep -= 1;
        }
        keep
    }

    fn keep_possible_prefix(&mut self, marker_len: usize) {
        let keep = self.possible_prefix_len(marker_len);
        let cut = self.window.len() - keep;
        self.window.drain(..cut);
    }
}

/// What the first prompt of a new shell prints (see [`prompt_command`]).
fn fresh_marker(session_nonce: &str) -> String {
    format!("\n{TAG}_FRESH_{session_nonce}__\n")
}

/// What an exiting framed shell prints last (see [`INIT`]).
fn exit_marker(session_nonce: &str) -> String {
    format!("\n{TAG}_EXIT_{session_nonce}__\n")
}

/// The command's output inside `retained` (the tail of everything the command's line
/// produced): after the start marker when it is still there, up to the end marker when it
/// arrived. `started` says the scanner saw the start marker go by, so a tail that lost it
/// is still all command output.
pub(crate) fn extract<'a>(
    retained: &'a str,
    nonce: &str,
    session_nonce: &str,
    started: bool,
    errexit: bool,
) -> &'a str {
    let start = format!("{TAG}_START_{nonce}__\n");
    let end = format!("\n{TAG}_END_{nonce}:");
    // A replaced shell ends the frame with its fresh marker instead, an exiting one with its
    // exit marker.
    let end = [end, fresh_marker(session_nonce), exit_marker(session_nonce)]
        .into_iter()
        .find(|m| retained.contains(m.as_str()))
        .unwrap_or_else(|| format!("\n{TAG}_END_{nonce}:"));
    let body = match retained.find(&start) {
        Some(i) => &retained[i + start.len()..],
        // The tail can lose the start marker under long output; what is left is output.
        None if started || retained.contains(&end) => retained,
        // The command never started printing: the text is the echoed line.
        None => return "",
    };
    match body.find(&end) {
        // After the errexit emulation (or an interrupt) stopped the line, bash printed one
        // newline itself.
        Some(j) if errexit => body[..j].strip_suffix('\n').unwrap_or(&body[..j]),
        Some(j) => &body[..j],
        None => body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_c_quoting_escapes_everything_a_line_could_break_on() {
        assert_eq!(ansi_c_quote(b"echo 'a' \\ $x"), "$'echo \\'a\\' \\\\ $x'");
        assert_eq!(ansi_c_quote("é\n\x1b".as_bytes()), "$'\\xc3\\xa9\\x0a\\x1b'");
        let line = frame("a\nb\r\n", "n", true);
        assert!(!line.contains('\n') && !line.contains('\r'), "one typed line: {line}");
    }

    #[test]
    fn the_echoed_frame_never_contains_a_whole_marker() {
        let w = frame("echo hi", "abc", true);
        assert!(!w.contains("__CONCH_PB_START_abc__"));
        assert!(!w.contains("__CONCH_PB_END_abc:"));
    }

    #[test]
    fn the_scanner_finds_markers_split_anywhere_and_counts_the_body() {
        let stream = format!(
            "$ {}\n\n{TAG}_START_n1__\nhéllo\nworld\n\n{TAG}_END_n1:3__\n$ ",
            frame("x", "n1", false)
        );
        for piece in 1..stream.len() {
            let mut s = FrameScanner::new("n1", "sn");
            let mut rest = stream.as_str();
            while !rest.is_empty() {
                let mut cut = piece.min(rest.len());
                while !rest.is_char_boundary(cut) {
                    cut += 1;
                }
                s.push(&rest[..cut]);
                rest = &rest[cut..];
            }
            assert_eq!(s.code(), Some(3), "pieces of {piece}");
            assert_eq!(s.body_bytes(), "héllo\nworld\n".len() as u64, "pieces of {piece}");
        }
    }

    #[test]
    fn an_errexit_stop_is_flagged_and_bashs_newline_is_not_output() {
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\nstep1\n\n\n{TAG}_END_n:1:e__\n"));
        assert_eq!((s.code(), s.stopped_by_errexit()), (Some(1), true));
        assert_eq!(s.body_bytes(), "step1\n".len() as u64);
        let text = format!("{TAG}_START_n__\nstep1\n\n\n{TAG}_END_n:1:e__\n# ");
        assert_eq!(extract(&text, "n", "sn", true, true), "step1\n");
    }

    #[test]
    fn a_replaced_or_exiting_shell_ends_the_frame_with_its_own_marker() {
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\nexit\n[stopped]\n\n{TAG}_EXIT_s"));
        assert!(!s.shell_exited(), "the marker is not whole yet");
        s.push("n__\n");
        assert!(s.shell_exited() && s.code().is_none());
        assert_eq!(s.finish(), "exit\n[stopped]\n".len() as u64);
        let text = format!("{TAG}_START_n__\nexit\n\n{TAG}_EXIT_sn__\n");
        assert_eq!(extract(&text, "n", "sn", true, false), "exit\n");
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\n\n{TAG}_FRESH_sn__\n"));
        assert_eq!((s.code(), s.replaced_shell()), (Some(0), true));
        // Another session's markers are output.
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\n\n{TAG}_FRESH_other__\n"));
        assert_eq!(s.code(), None);
    }

    #[test]
    fn the_scanner_waits_for_the_whole_status() {
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\nout\n{TAG}_END_n:12"));
        assert_eq!(s.code(), None, "12 may continue");
        s.push("7__\n");
        assert_eq!(s.code(), Some(127));
    }

    #[test]
    fn extract_returns_output_between_markers() {
        let acc = format!(
            "# {}\n\n{TAG}_START_n1__\nhello\n\n{TAG}_END_n1:3__\n# ",
            frame("x", "n1", false)
        );
        assert_eq!(extract(&acc, "n1", "sn", true, false), "hello\n");
        let cut = format!("99\n100\n\n{TAG}_END_n1:0__\n# ");
        assert_eq!(extract(&cut, "n1", "sn", true, false), "99\n100\n");
        let partial = format!("\n{TAG}_START_n1__\nName? ");
        assert_eq!(extract(&partial, "n1", "sn", true, false), "Name? ");
        assert_eq!(extract("echoed line only", "n1", "sn", false, false), "");
        // A timed-out command whose tail lost the start marker still returns that tail.
        assert_eq!(extract("99998\n99999\n", "n1", "sn", true, false), "99998\n99999\n");
    }

    /// Feeds `chunks` through a pwsh session's parser (answering cursor requests) into a
    /// frame scanner, as the session does; returns the text, the answers and the markers.
    fn pwsh_session(
        nonce: &str,
        chunks: &[&[u8]],
    ) -> (FrameScanner, String, Vec<(u16, u16)>, usize) {
        use crate::parser::{Event, Parser};
        let mut parser = Parser::new("7770;abc").answering(24, 200);
        let mut scanner = FrameScanner::new(nonce, "sn");
        let (mut text, mut queries, mut markers) = (String::new(), Vec::new(), 0);
        for chunk in chunks {
            for ev in parser.feed(chunk) {
                match ev {
                    Event::Text(t) => {
                        scanner.push(&t);
                        text.push_str(&t);
                    }
                    Event::Marker => markers += 1,
                    Event::CursorQuery { row, col } => queries.push((row, col)),
                }
            }
        }
        (scanner, text, queries, markers)
    }

    #[test]
    fn the_pwsh_frame_is_one_line_of_data() {
        for command in ["echo 'a'", "a\nb\r\n`$x \"q\" ‘s’ é😀", "'"] {
            let line = pwsh_frame(command, "n1");
            assert!(!line.contains(['\n', '\r']), "one typed line: {line}");
            assert!(line.chars().all(|c| c.is_ascii_graphic() || c == ' '), "{line}");
            assert!(line.starts_with(" . __conch_f 'n1' '"), "dot-sourced: {line}");
            let b64 = line.rsplit('\'').nth(1).unwrap();
            assert_eq!(b64, conch_provider_bash::pwsh::base64(command.as_bytes()));
            assert!(!line.contains("__CONCH_PB_START_n1__"), "the echo holds no marker");
        }
    }

    #[test]
    fn the_pwsh_startup_script_takes_over_the_line_reader_and_the_prompt() {
        let init = pwsh_init("7770;abc");
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
        let encoded = conch_provider_bash::pwsh::encode_command(&init);
        assert!(encoded.len() < 32 * 1024, "one modest argument: {}", encoded.len());
    }

    // PowerShell 7 output on a PTY as the pwsh dialect's session receives it, written from
    // its documented behaviour (pwsh is not installed where these tests were written):
    // .NET asks for the cursor (`ESC [6n`) before the prompt, the host turns cursor keys to
    // application mode (`ESC [?1h`) after it, every line ends CRLF (the tty's ONLCR), the
    // typed line comes back as .NET's echo, and `__conch_f` and `prompt` print the markers.
    const STARTUP: &[u8] = b"\x1b[6n\x1b]7770;abc\x07PS> \x1b[?1h";

    #[test]
    fn pwsh_output_samples_frame_and_answer_like_a_terminal() {
        let echo = format!("{}\r\n", pwsh_frame("echo hi", "n1"));
        let chunks: Vec<&[u8]> = vec![
            STARTUP,
            echo.as_bytes(),
            b"\r\n__CONCH_PB_START_n1__\r\nhi\r\n",
            b"\x1b[6n\r\n__CONCH_PB_END_n1:0__\r",
            b"\n\x1b]7770;abc\x07PS> \x1b[?1h",
        ];
        let (scanner, text, queries, markers) = pwsh_session("n1", &chunks);
        assert_eq!(scanner.code(), Some(0));
        assert_eq!(markers, 2, "the startup prompt and the one after the command");
        assert_eq!(queries, [(1, 1), (5, 1)], "asked at column 1 both times: {text:?}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        assert_eq!(extract(&text, "n1", "sn", scanner.started(), false), "hi\n");
        assert_eq!(scanner.finish(), 3);
    }

    #[test]
    fn pwsh_samples_of_a_failure_and_of_output_without_a_final_newline() {
        // A native command failing with 3, its error split across reads inside a CRLF.
        let chunks: Vec<&[u8]> = vec![
            STARTUP,
            b" . __conch_f 'n2' 'bHMgL25vcGU='\r\n\r\n__CONCH_PB_START_n2__\r\nls: cannot access '/nope': No such file or directory\r",
            b"\n\x1b[6n\r\n__CONCH_PB_END_n2:3__\r\n\x1b]7770;abc\x07PS> ",
        ];
        let (scanner, text, queries, _) = pwsh_session("n2", &chunks);
        assert_eq!(scanner.code(), Some(3));
        assert_eq!(
            extract(&text, "n2", "sn", true, false),
            "ls: cannot access '/nope': No such file or directory\n"
        );
        assert_eq!(queries.len(), 2);
        // `Write-Host -NoNewline hi`: the cursor is not at column 1, so the host writes a
        // line break before the prompt, and the body keeps it.
        let chunks: Vec<&[u8]> = vec![
            STARTUP,
            b" . __conch_f 'n3' 'eA=='\r\n\r\n__CONCH_PB_START_n3__\r\nhi\x1b[6n",
            b"\r\n\r\n__CONCH_PB_END_n3:0__\r\n\x1b]7770;abc\x07PS> ",
        ];
        let (scanner, text, queries, _) = pwsh_session("n3", &chunks);
        assert_eq!(queries.last(), Some(&(4, 3)), "after `hi`: column 3");
        assert_eq!((scanner.code(), extract(&text, "n3", "sn", true, false)), (Some(0), "hi\n"));
    }

    #[test]
    fn finish_counts_what_the_window_held_back() {
        let mut s = FrameScanner::new("n", "sn");
        s.push(&format!("{TAG}_START_n__\n"));
        s.push(&"x".repeat(100));
        assert!(s.body_bytes() < 100, "a possible marker start is held back");
        assert_eq!(s.finish(), 100, "an unfinished frame counts every byte after the start");
    }
}
