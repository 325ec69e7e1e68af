//! Signal names are pinned: they are the wire form and what tools accept.

use conch_seams::{ErrorCode, Signal};

#[test]
fn names_are_pinned_and_parse_back() {
    let names: Vec<&str> = Signal::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(
        names,
        [
            "SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGTERM",
            "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGWINCH"
        ]
    );
    for sig in Signal::ALL {
        assert_eq!(sig.as_str().parse::<Signal>().unwrap(), *sig);
    }
    assert_eq!("int".parse::<Signal>().unwrap(), Signal::Int);
    let e = "SIGFOO".parse::<Signal>().unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("SIGFOO"), "{e}");
}
