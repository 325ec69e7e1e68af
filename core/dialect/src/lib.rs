//! conch dialects: the one [`Dialect`] enum and, for each dialect, the text conch gives that
//! shell or says about it. Pure text: no IO, no processes, no async.
//!
//! - [`Dialect`] is what a configuration names (`shell_dialect: pwsh` deserializes to it, so a
//!   misspelt name fails at config parse) and what executors and terminal backends report;
//!   its methods are the words the tools use (tool name, how one command runs, persistent
//!   state, exit-code rule), so tools hold no shell syntax.
//! - [`markers`] is the frame marker vocabulary every dialect's framing prints and the
//!   terminal backend scans for.
//! - [`bash`] and [`pwsh`] are each dialect's framing (the startup text and the typed line
//!   of a framed command in a persistent shell) and, for pwsh, its encoding and one-shot
//!   wrapper, which the one-shot executor and the persistent shell share.
//!
//! Providers depend on this crate, never on each other, for any of it.

pub mod bash;
pub mod markers;
pub mod pwsh;

use std::fmt;

use serde::Deserialize;

/// A shell dialect: which shell runs commands, and so the words and syntax around them.
/// Configuration names it in lowercase (`bash`, `pwsh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// GNU bash.
    Bash,
    /// PowerShell 7 (`pwsh`).
    Pwsh,
}

impl Dialect {
    /// Every dialect, for messages that list them.
    pub const ALL: &'static [Dialect] = &[Dialect::Bash, Dialect::Pwsh];

    /// The shell's name, which is also the name of the tools that run it (`bash`, `pwsh`)
    /// and its name in configuration.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Bash => "bash",
            Dialect::Pwsh => "pwsh",
        }
    }

    /// How one command is run in a fresh process, as a model would write it (`bash -c`).
    pub fn one_shot(self) -> &'static str {
        match self {
            Dialect::Bash => "bash -c",
            Dialect::Pwsh => "pwsh -NonInteractive",
        }
    }

    /// The shell as a reader knows it (`bash`, `PowerShell 7 (pwsh)`).
    pub fn display(self) -> &'static str {
        match self {
            Dialect::Bash => "bash",
            Dialect::Pwsh => "PowerShell 7 (pwsh)",
        }
    }

    /// The command a model would use to change directory (`cd`, `Set-Location`).
    pub fn change_directory(self) -> &'static str {
        match self {
            Dialect::Bash => "cd",
            Dialect::Pwsh => "Set-Location",
        }
    }

    /// How a command leaves processes running after it, as examples (`` `&` ``).
    pub fn background(self) -> &'static str {
        match self {
            Dialect::Bash => "with `&`, even detached with setsid or nohup",
            Dialect::Pwsh => {
                "with Start-Process, a `&` job or Start-Job, even detached with setsid or nohup"
            }
        }
    }

    /// The state a persistent shell keeps between calls, as a model thinks of it.
    pub fn persistent_state(self) -> &'static str {
        match self {
            Dialect::Bash => "cwd, exported variables and functions",
            Dialect::Pwsh => "the location, variables (and $env: variables), functions and aliases",
        }
    }

    /// How the shell decides a command's exit code, for tool descriptions (empty when it is
    /// the usual one: the last command's).
    pub fn exit_status(self) -> &'static str {
        match self {
            Dialect::Bash => "",
            Dialect::Pwsh => {
                "The exit code is N for `exit N`; otherwise 0 when the last statement \
                 succeeded, else $LASTEXITCODE when a native command set a non-zero one, \
                 else 1; a terminating error (throw, -ErrorAction Stop) exits 1 with its \
                 message."
            }
        }
    }

    /// What a persistent shell of this dialect does with a command's input, its timeout and
    /// a command that waits for input, for tool descriptions.
    pub fn persistent_input(self) -> &'static str {
        match self {
            Dialect::Bash => {
                "A command's stdin is empty (end of file, as from /dev/null), so `cat`, \
                 `read` or an interpreter sees no input and returns. On timeout, or when a \
                 program waits for input on the terminal itself (a password prompt), the \
                 command is interrupted (killed if it ignores that) and the shell keeps its \
                 state; only a command that cannot be stopped resets the shell (the new one \
                 gets its working directory and, where it can, its exported variables), and \
                 the result says so."
            }
            Dialect::Pwsh => {
                "On timeout or interruption the shell is reset and the next call starts \
                 fresh. Interactive programs that wait for input return their partial output \
                 and reset the shell."
            }
        }
    }

    /// The single line typed into a persistent shell of this dialect (started with its
    /// framing: [`bash::prompt_command`], [`pwsh::session_script`]) to run `command` as the
    /// frame `nonce`. `first`: the session's first frame, which for bash also defines the
    /// helpers the frame relies on ([`bash::frame`]); pwsh's come with its startup script.
    /// `restore`: a replaced shell's state script, which bash restores first; pwsh reports no
    /// state, so it never gets one.
    pub fn framed_line(
        self,
        command: &str,
        nonce: &str,
        first: bool,
        restore: Option<&str>,
    ) -> String {
        match self {
            Dialect::Bash => bash::frame(command, nonce, first, restore),
            Dialect::Pwsh => pwsh::frame(command, nonce),
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
