//! Terminal cases from model workloads (issue 23): what a model types is what runs, every
//! result holds its own command's output and all of it, and the model decides how long a
//! send waits and how much it returns.
//!
//! The text is bash's; on PowerShell the cases skip (bracketed paste there depends on
//! PSReadLine announcing it, which these cases have not been run against).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use conch_seams::{
    Dialect, ErrorCode, Key, SendOutcome, SendRequest, SendSettle, Signal, TerminalBackend,
    TerminalOpenSpec, TerminalSession, WaitReason,
};
use tokio_util::sync::CancellationToken;

use crate::{Outcome, skip, terminal_tail, within};

/// Skips a case on PowerShell (see the module doc).
fn bash_only(p: &dyn TerminalBackend) -> Outcome {
    if p.dialect() == Dialect::Pwsh {
        return skip("workload cases type bash");
    }
    Ok(())
}

async fn open_in(
    p: &dyn TerminalBackend,
    dir: &std::path::Path,
) -> std::sync::Arc<dyn TerminalSession> {
    let mut spec = TerminalOpenSpec::default();
    spec.cwd = Some(dir.to_path_buf());
    within("terminal open", p.open(spec)).await.expect("open a session")
}

async fn request(s: &dyn TerminalSession, req: SendRequest) -> SendSettle {
    let what = format!("{req:?}");
    match within(&what, s.send(req, CancellationToken::new()))
        .await
        .unwrap_or_else(|e| panic!("send {what}: {e}"))
    {
        SendOutcome::Ready(settle) => settle,
        SendOutcome::Interrupted(i) => panic!("send {what} was interrupted: {i:?}"),
    }
}

async fn line(s: &dyn TerminalSession, text: &str) -> SendSettle {
    request(s, SendRequest::line(text)).await
}

/// True when some output line is exactly `want` (the echo of the typed command line holds
/// the same words, but never as a line of its own).
fn has_line(delta: &str, want: &str) -> bool {
    delta.lines().any(|l| l.trim_end() == want)
}

async fn close(s: &dyn TerminalSession) {
    let report = within("terminal close", s.close()).await.expect("close");
    assert!(report.survivors.is_empty(), "{report:?}");
}

/// Busy-loop processes that keep every core of a two-core box contended while alive.
struct Burners(Vec<Child>);

impl Burners {
    fn start(n: usize) -> Self {
        Self(
            (0..n)
                .map(|_| {
                    // Spins while the process that started it lives: a test process that is
                    // killed (no Drop runs) leaves no busy loop behind.
                    Command::new("sh")
                        .args(["-c", "while kill -0 \"$PPID\" 2>/dev/null; do :; done"])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("spawn a CPU burner")
                })
                .collect(),
        )
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A tab inside quotes stays a tab (it once completed `long.txt` and left the quote open,
/// swallowing every later send at `> `); `!` is not history expansion; a Makefile written
/// through a heredoc keeps its recipe tab; Tab pressed as a key still completes.
pub async fn typed_tabs_bangs_and_heredocs_arrive_literally(p: &dyn TerminalBackend) -> Outcome {
    bash_only(p)?;
    let dir = tempfile::tempdir().expect("scratch dir");
    std::fs::write(dir.path().join("long.txt"), "").unwrap();
    let s = open_in(p, dir.path()).await;
    let r = line(s.as_ref(), "printf '%s\\n' 'lo\tX' | od -An -c").await;
    assert!(r.delta.contains("l   o  \\t   X  \\n"), "the tab was typed as a tab: {r:?}");
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    let r = line(s.as_ref(), "echo \"hi!\" 'a!b' é!").await;
    assert!(has_line(&r.delta, "hi! a!b é!"), "{r:?}");
    let make = "cat > Makefile <<'EOF'\nall:\n\t@echo made\nEOF\necho writ''ten";
    let r = line(s.as_ref(), make).await;
    assert!(has_line(&r.delta, "written"), "{r:?}");
    let written = std::fs::read_to_string(dir.path().join("Makefile")).unwrap();
    assert_eq!(written, "all:\n\t@echo made\n", "the recipe keeps its tab");
    // Tab as a key is completion, as a user's Tab would be.
    let r = request(s.as_ref(), {
        let mut q = SendRequest::typed("echo lon", false);
        q.keys = vec![Key::Tab, Key::Enter];
        q
    })
    .await;
    assert!(has_line(&r.delta, "long.txt"), "Tab completed the name: {r:?}");
    let r = line(s.as_ref(), "echo af''ter").await;
    assert!(has_line(&r.delta, "after"), "nothing was left open: {r:?}");
    close(s.as_ref()).await;
    Ok(())
}

/// `\r\n` and `\r` are line ends like `\n`: no send after them returns another's output.
pub async fn crlf_line_ends_never_shift_later_results(p: &dyn TerminalBackend) -> Outcome {
    bash_only(p)?;
    let dir = tempfile::tempdir().expect("scratch dir");
    let s = open_in(p, dir.path()).await;
    let _load = Burners::start(2);
    let r = line(s.as_ref(), "echo one; sleep 0.3\r\necho two\r\n").await;
    assert!(has_line(&r.delta, "one") && has_line(&r.delta, "two"), "{r:?}");
    let r = line(s.as_ref(), "echo three\n").await;
    assert!(has_line(&r.delta, "three") && !has_line(&r.delta, "two"), "{r:?}");
    let r = line(s.as_ref(), "echo four; sleep 0.3\recho five\r").await;
    assert!(has_line(&r.delta, "four") && has_line(&r.delta, "five"), "{r:?}");
    // A line end that ends the text is Enter, with or without submit.
    let r = request(s.as_ref(), SendRequest::typed("echo sub''mitted\n", false)).await;
    assert!(has_line(&r.delta, "submitted"), "{r:?}");
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    let r = line(s.as_ref(), "echo six").await;
    assert!(has_line(&r.delta, "six") && !has_line(&r.delta, "five"), "{r:?}");
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

/// A send of several lines (a heredoc and a continuation among them) returns once its last
/// line ran, with two busy loops contending for the CPUs.
pub async fn a_multi_line_send_returns_after_its_last_line_under_load(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let dir = tempfile::tempdir().expect("scratch dir");
    let s = open_in(p, dir.path()).await;
    let _load = Burners::start(2);
    for i in 0..20 {
        let text = if i % 2 == 0 {
            format!("echo one; sleep 0.2\necho two; sleep 0.2\necho three-{i}")
        } else {
            format!("cat <<'EOF'\nbody-{i}\nEOF\nsleep 0.2; echo a \\\n  b-{i}")
        };
        let r = line(s.as_ref(), &text).await;
        let last = if i % 2 == 0 { format!("three-{i}") } else { format!("a b-{i}") };
        if !has_line(&r.delta, &last) {
            // Which tier ended it, and what the terminal showed next.
            let session = format!("{s:?}");
            let _ = s.send(SendRequest::typed("", false), CancellationToken::new()).await;
            let shown = terminal_tail(s.as_ref());
            panic!(
                "try {i}: the last line's output is in: {r:?}\nthe session: {session}\nthe terminal then:\n{shown}"
            );
        }
        assert_eq!(r.wait_reason, WaitReason::StdinRead, "try {i}: {r:?}");
        assert!(r.at_prompt, "try {i}: the shell's prompt ended it: {r:?}");
    }
    close(s.as_ref()).await;
    Ok(())
}

/// Runaway output returns at the send's own deadline, capped at its `max_output_bytes`
/// (the newest kept), and the program keeps running until signalled.
pub async fn runaway_output_is_capped_at_the_send_deadline(p: &dyn TerminalBackend) -> Outcome {
    bash_only(p)?;
    let dir = tempfile::tempdir().expect("scratch dir");
    let s = open_in(p, dir.path()).await;
    let mut q = SendRequest::line("yes runaway-line");
    q.timeout = Some(Duration::from_millis(1500));
    q.ignore_silence = true;
    q.max_output_bytes = Some(4096);
    let r = request(s.as_ref(), q).await;
    assert_eq!(r.wait_reason, WaitReason::Timeout, "{}", r.delta.len());
    // The note on the first line says what was cut (and where all of it is); the rest is the
    // newest output, capped.
    let (note, kept) = r.delta.split_once('\n').unwrap_or_default();
    assert!(kept.len() <= 4096 + 64, "capped: {} bytes", kept.len());
    assert!(note.starts_with("[earlier output omitted"), "says it cut: {:.200}", r.delta);
    assert!(r.delta.contains("runaway-line\nrunaway-line"), "{:.200}", r.delta);
    within("SIGINT", s.signal(Signal::Int)).await.expect("signal yes");
    let r = line(s.as_ref(), "echo ba''ck").await;
    assert!(has_line(&r.delta, "back"), "{:.300}", r.delta);
    close(s.as_ref()).await;
    Ok(())
}

/// A capped send keeps its newest output and names a spill that holds all of it, in the
/// shell's world (a remote world's spill is kept on its daemon).
pub async fn a_capped_send_names_a_spill_holding_all_of_its_output(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let dir = tempfile::tempdir().expect("scratch dir");
    let s = open_in(p, dir.path()).await;
    let mut q = SendRequest::line("seq 1 30000");
    q.max_output_bytes = Some(4096);
    let r = request(s.as_ref(), q).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "{:.200}", r.delta);
    assert!(r.delta.len() <= 4096 + 200, "capped: {} bytes", r.delta.len());
    assert!(has_line(&r.delta, "30000"), "the newest output is kept: {:.200}", r.delta);
    // Every world keeps one (a remote one on its daemon, which these suites run here).
    let first = r.delta.lines().next().unwrap_or_default();
    let rest = first.strip_prefix("[earlier output omitted; full output: ");
    let path = rest.and_then(|r| r.strip_suffix(']'));
    let path = path.unwrap_or_else(|| panic!("the note names a spill: {:.200}", r.delta));
    let whole = std::fs::read_to_string(path).expect("the spill is readable");
    let numbers: String = (1..=30_000).map(|i| format!("{i}\n")).collect();
    assert!(whole.contains(&numbers), "every line is in the spill ({} bytes)", whole.len());
    close(s.as_ref()).await;
    Ok(())
}

/// A quiet long command: a send with its own deadline is not cut short by silence (the
/// backend's idle window is shorter), and a send of nothing then just waits for the prompt.
pub async fn a_quiet_command_waits_for_timeout_then_a_plain_wait(
    p: &dyn TerminalBackend,
) -> Outcome {
    bash_only(p)?;
    let dir = tempfile::tempdir().expect("scratch dir");
    let s = open_in(p, dir.path()).await;
    let mut q = SendRequest::line("sleep 4; echo bu''ilt");
    q.timeout = Some(Duration::from_millis(2500));
    q.ignore_silence = true;
    let r = request(s.as_ref(), q).await;
    assert_eq!(r.wait_reason, WaitReason::Timeout, "silence did not end it: {r:?}");
    assert!(!has_line(&r.delta, "built"), "{r:?}");
    let mut wait = SendRequest::typed("", false);
    wait.timeout = Some(Duration::from_secs(30));
    wait.ignore_silence = true;
    let r = request(s.as_ref(), wait).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "the prompt came back: {r:?}");
    assert!(has_line(&r.delta, "built"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}

/// `wait_for` returns once its pattern appears in the output (not in the echoed command
/// line), with the command still running; a bad pattern types nothing.
pub async fn wait_for_returns_when_the_pattern_appears(p: &dyn TerminalBackend) -> Outcome {
    bash_only(p)?;
    let dir = tempfile::tempdir().expect("scratch dir");
    let s = open_in(p, dir.path()).await;
    let mut bad = SendRequest::line("echo never-typed");
    bad.wait_for = Some("(".into());
    let e = within("bad pattern", s.send(bad, CancellationToken::new())).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    // The line comes from the program that keeps running, so the C-c below reaches it
    // (a Ctrl-C pressed while bash forks the next command meets bash's handler and is lost,
    // as it is for a user).
    let mut q =
        SendRequest::line("echo starting; sleep 1.5; sh -c 'echo ready-now; exec sleep 60'");
    q.wait_for = Some("^ready-now$".into());
    let r = request(s.as_ref(), q).await;
    assert_eq!(r.wait_reason, WaitReason::Matched, "{r:?}");
    assert!(has_line(&r.delta, "starting") && has_line(&r.delta, "ready-now"), "{r:?}");
    // The command still runs; C-c as a key stops it.
    let mut stop = SendRequest::typed("", false);
    stop.keys = vec![Key::Ctrl(b'c')];
    let r = request(s.as_ref(), stop).await;
    assert_eq!(r.wait_reason, WaitReason::StdinRead, "C-c brought the prompt back: {r:?}");
    let r = line(s.as_ref(), "echo ne''xt").await;
    assert!(has_line(&r.delta, "next") && !r.delta.contains("never-typed"), "{r:?}");
    close(s.as_ref()).await;
    Ok(())
}
