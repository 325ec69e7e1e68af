//! bash's framing: what a persistent bash is given so each command it runs is framed by the
//! [`markers`](crate::markers), and the typed line of one framed command.
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
//!   the terminal backend stops them. `exec` is aliased to give the program the terminal
//!   back, so `exec bash` starts a working interactive shell.
//! - The framed line ends itself: after the `eval`, `__conch_e` prints the end marker with
//!   the status and puts the prompt hook back if the command replaced PROMPT_COMMAND. The
//!   PROMPT_COMMAND hook prints it only for a line that did not get there (interrupted,
//!   stopped by the errexit emulation, an expansion error).
//! - A shell's first prompt prints a fresh-shell marker (carrying the session's nonce): a
//!   frame whose command replaced the shell (`exec bash`) ends with it, and the backend types
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
//! defined again before every prompt of a framing shell, prints the start marker; the command
//! follows as one `$'...'` word; `__conch_e` (or, failing that, PROMPT_COMMAND) prints the end
//! marker and status. `set -e` is emulated by a `set` alias, a one-shot DEBUG trap that `set`
//! arms, and an ERR trap, so it never makes the shell exit.

use crate::markers::TAG;

/// The longest state script a state marker carries (its exports and working directory); a
/// larger one carries the working directory alone.
pub const STATE_MAX: usize = 256 * 1024;

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
/// `__conch_snap NONCE`, called after a frame's end marker, prints the state marker when the
/// shell's state (its exports and working directory) differs from what it last reported:
/// `export -p` is written to a scratch file (chosen here by writing it) and read back with
/// `mapfile` (no process is started per call; `read` costs several times more, since it takes
/// the text a byte at a time), compared with `test` (a plain string comparison, where `[[ ==
/// ]]` matches a pattern), and only a change is formatted: the script that restores both goes
/// out as one `printf %q` word. A replacement shell gets that script from [`frame`].
///
/// `trap` (listing) leaves these traps out: they are the shell's machinery, not the user's.
///
/// `shopt` is a function that runs the builtin with the real errexit set as the emulation has
/// it, then takes the result back into the emulation: `shopt -o errexit` reports it truly,
/// and `shopt -so errexit` turns on the emulation, not the real option. The builtin runs on
/// the left of `||`, so a query that answers no (`shopt -q`) never trips the real errexit;
/// the function's own status then does what errexit would.
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
pub const INIT: &str = concat!(
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
    "__conch_bye() { __conch_exit; [[ -n ${__conch_sf-} ]] && command rm -f -- \"$__conch_sf\"; ",
    "builtin printf '\\n%s_EXIT_%s__\\n' __CONCH_PB \"${__conch_sn-}\"; }; ",
    "builtin trap '{ __conch_bye; } 2>/dev/null' EXIT; ",
    "trap() { if [[ $# == 0 || $1 == -p ]]; then local l; while IFS= builtin read -r l; do ",
    "[[ -z $l || $l == *__conch_* ]] || builtin printf '%s\\n' \"$l\"; ",
    "done <<< \"$(builtin trap \"$@\")\"; else builtin trap \"$@\"; fi; }; ",
    "shopt() { { local r=0; [[ -n ${__conch_errexit-} ]] && builtin set -e; } 2>/dev/null; ",
    "builtin shopt \"$@\" || r=$?; { if [[ $- == *e* ]]; then builtin set +e; __conch_errexit=1; ",
    "else __conch_errexit=; fi; } 2>/dev/null; return $r; }; ",
    "builtin set -ET; ",
    // The scratch file `__conch_snap` (see `prompt_boot`) reads `export -p` back through:
    // tmpfs first, where the write costs least; tried by writing it, since a sandbox may deny
    // a write that the directory's mode allows.
    "__conch_sf=; for __conch_d in /dev/shm \"${TMPDIR:-/tmp}\"; do ",
    "if { : >| \"$__conch_d/.conch-state-$$\"; } 2>/dev/null; then __conch_sf=$__conch_d/.conch-state-$$; break; fi; done; ",
    "unset __conch_d; ",
    "__conch_lk=; __conch_lp=; __conch_lv=; ",
    // Defined once per shell, not before every prompt: it is the costliest helper to parse,
    // and a command that removes it loses only the next state report.
    "__conch_snap() { local v=() k=x s; { [[ -n ${__conch_sf-} ]] && builtin export -p >| \"$__conch_sf\" ",
    "&& builtin mapfile -d '' v < \"$__conch_sf\"; } || k=c; ",
    "[[ $k == \"${__conch_lk-}\" ]] && builtin test \"$PWD\" = \"${__conch_lp-}\" ",
    "&& builtin test \"${v-}\" = \"${__conch_lv-}\" && return 0; ",
    "__conch_lk=$k; __conch_lp=$PWD; __conch_lv=${v-}; ",
    "builtin printf -v s '%s\\nbuiltin cd -- %q' \"${v-}\" \"$PWD\"; if (( ${#s} > 262144 )); then k=c; ",
    "builtin printf -v s 'builtin cd -- %q' \"$PWD\"; fi; ",
    "builtin printf '\\n%s_STATE_%s:%s:%q__\\n' __CONCH_PB \"$1\" \"$k\" \"$s\"; }; ",
    // Exported, so a shell this one execs prints the fresh-shell marker (see
    // `prompt_boot`); a session that never framed a command never prints it.
    "export __conch_framed=1; ",
);

/// The environment variable that carries [`prompt_boot`]'s text, exported with PROMPT_COMMAND
/// so that a shell started from the session's (`bash`, `exec bash`) evaluates it too.
pub const BOOT_VAR: &str = "__conch_boot";

/// The PROMPT_COMMAND of every bash session, whose PS1 is `ps1`. All of it runs with stderr to
/// /dev/null, so `set -x` traces none of it.
///
/// A shell that frames commands (`__conch_framed`, exported by [`INIT`]) or has not yet seen
/// its first prompt evaluates [`prompt_boot`]'s text (from [`BOOT_VAR`], exported with it)
/// before every prompt, then runs `__conch_pc`: the helpers are defined again each time, so a
/// command that redefined or removed one cannot break the next frame. Any other shell (a
/// terminal session typed into) only re-asserts PS1: it has no frame to end, and parsing that
/// kilobyte of function text before each prompt cost bash 0.06 to 0.12 ms, where its whole
/// round trip of `echo x` to the prompt takes 0.12 to 0.16 ms without it (paired runs). A
/// shell that got PROMPT_COMMAND without [`BOOT_VAR`] (a wrapper that passes on only some
/// variables) still puts PS1 back.
pub fn prompt_command(ps1: &str) -> String {
    format!(
        "{{ __conch_rc=$?; __conch_run=; \
         if [[ -n ${{__conch_hook-}} && -z ${{__conch_framed-}} ]]; then PS1='{ps1}'; \
         else builtin eval \"${{__conch_boot-}}\"; __conch_pc || PS1='{ps1}'; fi; }} 2>/dev/null"
    )
}

/// The helpers of a framing shell, as the text [`prompt_command`] evaluates before its prompts:
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
/// - Both print the end marker through `__conch_end`, which then calls `__conch_snap NONCE`
///   (defined by [`INIT`]) and clears the frame.
/// - The first prompt of a shell (a fresh one, or one started by `exec bash`) turns history
///   expansion off (`!` in a command is text) and prints the fresh-shell marker, which ends a
///   frame whose shell was replaced.
pub fn prompt_boot(ps1: &str, session_nonce: &str) -> String {
    format!(
        "__conch_end() {{ builtin printf '\\n%s_END_%s:%s__\\n' {TAG} \"$__conch_frame\" \"$__conch_rc\"; \
         __conch_snap \"$__conch_frame\"; __conch_frame=; }}; \
         __conch_pc() {{ if [[ -n ${{__conch_frame-}} ]]; then \
         if [[ -n ${{__conch_status-}} ]]; then __conch_rc=$__conch_status:e; fi; \
         __conch_end; fi; __conch_status=; PS1='{ps1}'; }}; \
         __conch_s() {{ __conch_frame=$1; __conch_run=1; __conch_x=; if [[ $- == *x* ]]; then builtin set +x; \
         __conch_x=$'builtin set -x\\n'; fi; builtin printf '\\n%s_START_%s__\\n' {TAG} \"$1\"; }}; \
         __conch_e() {{ __conch_rc=$?; __conch_run=; if [[ -n ${{__conch_frame-}} ]]; then \
         __conch_end; fi; [[ ${{PROMPT_COMMAND[*]-}} == *__conch_pc* ]] || \
         PROMPT_COMMAND=\"$__conch_hook${{PROMPT_COMMAND:+; $PROMPT_COMMAND}}\"; }}; \
         if [[ -z ${{__conch_hook-}} ]]; then __conch_hook=$PROMPT_COMMAND; __conch_sn={session_nonce}; \
         builtin set +H; \
         if [[ -n ${{__conch_framed-}} ]]; then \
         builtin printf '\\n%s_FRESH_%s__\\n' {TAG} '{session_nonce}'; fi; fi"
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
///
/// With `state` (a state marker's script, see [`INIT`]), the frame first restores a replaced
/// shell's exported variables, then its working directory. The new shell keeps its own prompt
/// settings (PS1, PS2, PROMPT_COMMAND and [`BOOT_VAR`] are exported to every managed shell, with
/// the old session's marker in them). Only a failed `cd` prints anything, a note that starts the
/// command's output, since the shell then starts somewhere else.
pub fn frame(command: &str, nonce: &str, init: bool, state: Option<&str>) -> String {
    let restore = match state {
        Some(script) => format!(
            "{{ __conch_k=(\"$PS1\" \"$PS2\" \"$PROMPT_COMMAND\" \"${{__conch_boot-}}\"); eval {script}; \
             __conch_k[4]=$?; PS1=${{__conch_k[0]}}; PS2=${{__conch_k[1]}}; PROMPT_COMMAND=${{__conch_k[2]}}; \
             __conch_boot=${{__conch_k[3]}}; }} >/dev/null 2>&1; [[ ${{__conch_k[4]}} == 0 ]] || builtin printf '%s%s]\\n' \
             '[could not return to the working directory the shell had; it is in ' \"$PWD\"; \
             unset __conch_k;"
        ),
        None => String::new(),
    };
    format!(
        " {}{{ __conch_s {nonce}; }} 2>/dev/null;{restore}eval \"${{__conch_x-}}\"{} </dev/null;{{ __conch_e; }} 2>/dev/null",
        if init { INIT } else { "" },
        ansi_c_quote(command.as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::markers;

    #[test]
    fn ansi_c_quoting_escapes_everything_a_line_could_break_on() {
        assert_eq!(ansi_c_quote(b"echo 'a' \\ $x"), "$'echo \\'a\\' \\\\ $x'");
        assert_eq!(ansi_c_quote("é\n\x1b".as_bytes()), "$'\\xc3\\xa9\\x0a\\x1b'");
        let line = frame("a\nb\r\n", "n", true, None);
        assert!(!line.contains('\n') && !line.contains('\r'), "one typed line: {line}");
    }

    #[test]
    fn the_echoed_frame_never_contains_a_whole_marker() {
        let w = frame("echo hi", "abc", true, None);
        assert!(!w.contains(markers::start("abc").trim_end()));
        assert!(!w.contains(markers::end("abc").trim_start()));
    }

    #[test]
    fn the_state_report_caps_its_script_at_state_max() {
        assert!(INIT.contains(&format!("(( ${{#s}} > {STATE_MAX} ))")), "{INIT}");
    }

    #[test]
    fn the_shell_prints_the_markers_the_vocabulary_names() {
        // `printf` fills `%s` with the tag: each format is the marker with the tag cut out.
        let unfill = |m: String| m.replace(TAG, "%s").replace('\n', "\\n");
        assert!(INIT.contains(&unfill(markers::exit("%s"))), "{INIT}");
        let pc = prompt_boot("$ ", "sn");
        assert!(pc.contains(&unfill(markers::fresh("%s"))), "{pc}");
        assert!(pc.contains(&unfill(markers::start("%s"))), "{pc}");
        assert!(pc.contains(&unfill(markers::end("%s"))), "{pc}");
    }
}
