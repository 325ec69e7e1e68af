//! Signals by name: the only way a signal crosses a seam or a tool. Providers map them onto
//! their world's numbers (Linux, another Unix, a remote daemon); no raw number leaves one.

use std::fmt;
use std::str::FromStr;

use crate::{Error, ErrorCode};

/// A signal a caller may ask a provider to deliver.
///
/// The set is the portable POSIX job-control and termination signals; `as_str` values
/// (`SIGINT`, ...) are stable and are what tools, logs and the wire use.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Hang up (`SIGHUP`).
    Hup,
    /// Interrupt (`SIGINT`).
    Int,
    /// Quit (`SIGQUIT`).
    Quit,
    /// Kill, cannot be caught (`SIGKILL`).
    Kill,
    /// User signal 1 (`SIGUSR1`).
    Usr1,
    /// User signal 2 (`SIGUSR2`).
    Usr2,
    /// Alarm (`SIGALRM`).
    Alrm,
    /// Terminate (`SIGTERM`).
    Term,
    /// Continue a stopped process (`SIGCONT`).
    Cont,
    /// Stop, cannot be caught (`SIGSTOP`).
    Stop,
    /// Terminal stop (`SIGTSTP`).
    Tstp,
    /// Window size changed (`SIGWINCH`).
    Winch,
}

impl Signal {
    /// Every signal, in declaration order.
    pub const ALL: &'static [Signal] = &[
        Signal::Hup,
        Signal::Int,
        Signal::Quit,
        Signal::Kill,
        Signal::Usr1,
        Signal::Usr2,
        Signal::Alrm,
        Signal::Term,
        Signal::Cont,
        Signal::Stop,
        Signal::Tstp,
        Signal::Winch,
    ];

    /// The stable conventional name (`SIGINT`).
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Hup => "SIGHUP",
            Signal::Int => "SIGINT",
            Signal::Quit => "SIGQUIT",
            Signal::Kill => "SIGKILL",
            Signal::Usr1 => "SIGUSR1",
            Signal::Usr2 => "SIGUSR2",
            Signal::Alrm => "SIGALRM",
            Signal::Term => "SIGTERM",
            Signal::Cont => "SIGCONT",
            Signal::Stop => "SIGSTOP",
            Signal::Tstp => "SIGTSTP",
            Signal::Winch => "SIGWINCH",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Signal {
    type Err = Error;

    /// Parses `SIGINT`, `INT` or `int`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let upper = s.trim().to_ascii_uppercase();
        let want = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
        Signal::ALL.iter().copied().find(|sig| sig.as_str() == want).ok_or_else(|| {
            let known: Vec<&str> = Signal::ALL.iter().map(|s| s.as_str()).collect();
            Error::new(
                ErrorCode::InvalidArgument,
                format!("unknown signal `{s}`; known: {}", known.join(", ")),
            )
        })
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Signal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Signal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
