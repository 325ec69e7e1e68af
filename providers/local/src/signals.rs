//! Signal names ↔ this OS's numbers. The only place the provider turns a seam [`Signal`]
//! into a number, or a raw wait status back into a name.

use conch_seams::Signal;
use nix::sys::signal::Signal as Nix;

/// The OS signal for a seam signal; `None` for one this build cannot deliver.
pub(crate) fn to_nix(signal: Signal) -> Option<Nix> {
    Some(match signal {
        Signal::Hup => Nix::SIGHUP,
        Signal::Int => Nix::SIGINT,
        Signal::Quit => Nix::SIGQUIT,
        Signal::Kill => Nix::SIGKILL,
        Signal::Usr1 => Nix::SIGUSR1,
        Signal::Usr2 => Nix::SIGUSR2,
        Signal::Alrm => Nix::SIGALRM,
        Signal::Term => Nix::SIGTERM,
        Signal::Cont => Nix::SIGCONT,
        Signal::Stop => Nix::SIGSTOP,
        Signal::Tstp => Nix::SIGTSTP,
        Signal::Winch => Nix::SIGWINCH,
        // The seam enum is non-exhaustive: a newer signal this build does not know.
        _ => return None,
    })
}

/// The conventional name of a raw signal number from a wait status (`9` → `SIGKILL`).
pub(crate) fn name(number: i32) -> String {
    match Nix::try_from(number) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("SIG{number}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seam_signal_maps_to_its_namesake() {
        for s in Signal::ALL {
            assert_eq!(to_nix(*s).map(Nix::as_str), Some(s.as_str()));
        }
        assert_eq!(name(9), "SIGKILL");
        assert_eq!(name(11), "SIGSEGV");
        assert_eq!(name(200), "SIG200");
    }
}
