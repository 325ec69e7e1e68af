//! Tier 1 readiness: the exact Linux stdin-wait probe.
//!
//! A foreground group "waits on stdin" only when some task of some member is positively
//! seen blocked in a syscall that waits for input on the terminal: `read`/`readv` of it,
//! `poll`/`ppoll` or `select`/`pselect6` whose fd arrays (read from the target's memory)
//! ask for input on it, or an `epoll_wait` family call whose interest list holds it. With a
//! terminal match, any fd that is the pty slave counts, and so does `/dev/tty` when the
//! task's controlling terminal is that pty (less, ssh and sudo prompt there); with
//! [`StdinMatch::Any`] only fd 0 does. Anything unreadable or unrecognised is a miss, never
//! a guess.

use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;

use conch_seams::{ForegroundCpu, StdinWait};

use crate::procfs;

/// `POLLIN | POLLRDNORM`: either asks the kernel for input readiness.
const POLL_INPUT: i16 = 0x1 | 0x40;
/// `EPOLLIN | EPOLLRDNORM`.
const EPOLL_INPUT: u32 = 0x1 | 0x40;
/// Upper bound on a pollfd array we are willing to copy out of a target.
const MAX_POLL_FDS: u64 = 4096;

/// Which file a waited-on fd must be for the wait to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StdinMatch<'a> {
    /// fd 0, whatever it is; other fds never count. Lets the tests probe piped stdin
    /// without a pty.
    #[cfg(test)]
    Any,
    /// Any pseudo-terminal slave (`/dev/pts/*` character device). Only the tests use it:
    /// every terminal knows its own slave.
    #[cfg(test)]
    AnyPts,
    /// Exactly this terminal device (compared by device number).
    Tty(&'a Path),
}

/// How a blocked syscall waits, decoded from its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaitKind {
    Read,
    Poll,
    Select,
    Epoll,
}

#[cfg(target_arch = "x86_64")]
fn wait_kind(nr: i64) -> Option<WaitKind> {
    match nr {
        0 | 19 => Some(WaitKind::Read),
        7 | 271 => Some(WaitKind::Poll),
        23 | 270 => Some(WaitKind::Select),
        232 | 281 | 441 => Some(WaitKind::Epoll),
        _ => None,
    }
}

#[cfg(target_arch = "aarch64")]
fn wait_kind(nr: i64) -> Option<WaitKind> {
    // asm-generic has no poll/select/epoll_wait; glibc maps them onto the p* forms.
    match nr {
        63 | 65 => Some(WaitKind::Read),
        73 => Some(WaitKind::Poll),
        72 => Some(WaitKind::Select),
        22 | 441 => Some(WaitKind::Epoll),
        _ => None,
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn wait_kind(_nr: i64) -> Option<WaitKind> {
    // Only architectures whose UAPI tables we carry get Tier 1.
    None
}

/// Whether the probe can decode blocked syscalls on this architecture at all.
const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// What the probe saw of one task or process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Waiting,
    NotWaiting,
    /// It could not be inspected (no permission): not a miss we may count as "not waiting".
    Unknown,
}

impl Seen {
    /// Combines tasks: one waiting task decides; otherwise one uninspectable task makes the
    /// whole answer unknown.
    fn any(items: impl IntoIterator<Item = Seen>) -> Seen {
        let mut out = Seen::NotWaiting;
        for s in items {
            match s {
                Seen::Waiting => return Seen::Waiting,
                Seen::Unknown => out = Seen::Unknown,
                Seen::NotWaiting => {}
            }
        }
        out
    }
}

/// Reads `path`; a permission refusal is `Err(Unknown)`, anything else (the task vanished,
/// the file is unreadable for another reason) is `Err(NotWaiting)`.
fn read_or(path: &Path) -> Result<String, Seen> {
    crate::procfs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => Seen::Unknown,
        _ => Seen::NotWaiting,
    })
}

/// True when any task of any process in group `pgid` is blocked waiting for input on
/// fd 0, whatever fd 0 is.
#[cfg(test)]
fn group_waits_on_stdin(pgid: i32) -> bool {
    group_waits_on(pgid, StdinMatch::Any) == StdinWait::Waiting
}

/// What the tasks of group `pgid` are doing about input on an fd that matches `stdin`
/// (see [`StdinMatch`]).
#[cfg(test)]
fn group_waits_on(pgid: i32, stdin: StdinMatch<'_>) -> StdinWait {
    sample_members(pgid, &procfs::group_members(pgid), stdin).stdin
}

/// One sample of a foreground group: its wait for input and its CPU use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GroupSample {
    pub(crate) stdin: StdinWait,
    /// `None` when some member could not be inspected.
    pub(crate) cpu: Option<ForegroundCpu>,
}

/// Samples the foreground group `pgid` of a terminal whose session leader is `sid`: only
/// the session's process tree is looked at, not every process of the machine.
pub(crate) fn sample_foreground(sid: i32, pgid: i32, stdin: StdinMatch<'_>) -> GroupSample {
    let members: Vec<i32> = match procfs::tree(sid) {
        Some(tree) => {
            let mut m: Vec<i32> = tree.iter().filter(|s| s.pgrp == pgid).map(|s| s.pid).collect();
            // A job leader the tree walk could miss (reparented away) is still the group id.
            if !m.contains(&pgid) && procfs::stat(pgid).is_some_and(|s| s.pgrp == pgid) {
                m.push(pgid);
            }
            m
        }
        None => procfs::group_members(pgid),
    };
    sample_members(pgid, &members, stdin)
}

fn sample_members(pgid: i32, members: &[i32], stdin: StdinMatch<'_>) -> GroupSample {
    if pgid <= 0 {
        return GroupSample { stdin: StdinWait::NotWaiting, cpu: None };
    }
    let mut cpu = Some(ForegroundCpu { busy: false, ticks: 0 });
    let seen = Seen::any(members.iter().map(|pid| sample_process(*pid, members, stdin, &mut cpu)));
    let stdin = match seen {
        // Only architectures whose syscall tables we carry can see a wait at all.
        _ if !SUPPORTED => StdinWait::Unavailable,
        Seen::Waiting => StdinWait::Waiting,
        Seen::NotWaiting => StdinWait::NotWaiting,
        Seen::Unknown => StdinWait::Unavailable,
    };
    GroupSample { stdin, cpu }
}

/// Looks at every task of `pid`, one of the group's `members`: whether one waits for input
/// (see [`task_waits_on`]), and what they do with the CPU (added to `cpu`, which becomes
/// `None` when the process cannot be inspected).
fn sample_process(
    pid: i32,
    members: &[i32],
    stdin: StdinMatch<'_>,
    cpu: &mut Option<ForegroundCpu>,
) -> Seen {
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            *cpu = None;
            return Seen::Unknown;
        }
        // Gone: it uses no CPU and waits for nothing any more.
        Err(_) => return Seen::NotWaiting,
    };
    let mut seen = Seen::NotWaiting;
    let (mut live, mut reaped_outside) = (false, false);
    for task in tasks.flatten() {
        if !task.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let path = task.path();
        let Some(stat) = procfs::read_stat(&path.join("stat"), 0) else { continue };
        if let Some(c) = cpu.as_mut() {
            c.busy |= stat.state == 'R';
            c.ticks = c.ticks.saturating_add(stat.ticks);
        }
        live |= stat.state != 'Z';
        reaped_outside |= stat.state == 'Z' && !members.contains(&stat.ppid);
        // One waiting task decides the wait; the rest are still counted for the CPU.
        if seen != Seen::Waiting {
            seen = Seen::any([seen, task_waits_on(&path, &stat, stdin)]);
        }
    }
    // A member that exited, with its reaper outside the group (the shell, which may still
    // wait for a CPU), ends the job: the shell is about to take over, nothing is idle.
    if !live
        && reaped_outside
        && let Some(c) = cpu.as_mut()
    {
        c.busy = true;
    }
    seen
}

/// One blocked syscall: number and the six argument registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blocked {
    nr: i64,
    args: [u64; 6],
}

/// Parses `/proc/.../syscall`: `NR a1..a6 sp pc` (NR decimal, the rest hex), `running`,
/// or `-1 sp pc` when blocked outside a syscall. Only the first form is a syscall wait.
fn parse_syscall(line: &str) -> Option<Blocked> {
    let mut it = line.split_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    if nr < 0 {
        return None;
    }
    let mut args = [0u64; 6];
    for a in &mut args {
        let f = it.next()?;
        *a = u64::from_str_radix(f.strip_prefix("0x").unwrap_or(f), 16).ok()?;
    }
    Some(Blocked { nr, args })
}

fn task_waits_on(task: &Path, stat: &procfs::Stat, stdin: StdinMatch<'_>) -> Seen {
    // Only a sleeping task can be parked in a wait; R, D, T, Z, ... are not waiting for us.
    if stat.state != 'S' {
        return Seen::NotWaiting;
    }
    // tty_nr is the controlling terminal, which `/dev/tty` stands for.
    let ctty = Some(stat.tty_nr);
    let line = match read_or(&task.join("syscall")) {
        Ok(l) => l,
        Err(seen) => return seen,
    };
    let Some(call) = parse_syscall(&line) else { return Seen::NotWaiting };
    let Some(kind) = wait_kind(call.nr) else { return Seen::NotWaiting };
    let tty_rdev = match stdin {
        StdinMatch::Tty(tty) => match std::fs::metadata(tty) {
            Ok(m) => Some(m.rdev()),
            Err(_) => return Seen::NotWaiting,
        },
        #[cfg(test)]
        _ => None,
    };
    let terminal = Terminal { task, stdin, ctty, tty_rdev };
    let waiting = match kind {
        WaitKind::Read => i32::try_from(call.args[0]).is_ok_and(|fd| terminal.is(fd)),
        // A task's mem is its address space, which is where its syscall arguments point.
        WaitKind::Poll => poll_wants(&terminal, call.args[0], call.args[1]),
        WaitKind::Select => select_wants(&terminal, call.args[0], call.args[1]),
        WaitKind::Epoll => epoll_wants(&terminal, call.args[0]),
    };
    if waiting { Seen::Waiting } else { Seen::NotWaiting }
}

/// Device number of `/dev/tty` (major 5, minor 0).
const DEV_TTY: u64 = 0x500;

/// Decides whether one of a task's fds is the terminal being probed.
struct Terminal<'a> {
    task: &'a Path,
    stdin: StdinMatch<'a>,
    ctty: Option<u64>,
    /// Device number of the `Tty` match, read once per task rather than once per fd.
    tty_rdev: Option<u64>,
}

impl Terminal<'_> {
    /// With `Any`, only fd 0 counts (piped stdin); with a terminal match, any fd that is
    /// the terminal does, including `/dev/tty` opened by programs such as less or ssh.
    fn is(&self, fd: i32) -> bool {
        if fd < 0 {
            return false;
        }
        let path = self.task.join(format!("fd/{fd}"));
        let Ok(meta) = std::fs::metadata(&path) else { return false };
        let via_dev_tty = |want: Option<u64>| {
            meta.rdev() == DEV_TTY && self.ctty.is_some_and(|c| c != 0 && Some(c) == want)
        };
        match self.stdin {
            #[cfg(test)]
            StdinMatch::Any => fd == 0,
            #[cfg(test)]
            StdinMatch::AnyPts => {
                meta.file_type().is_char_device()
                    && (std::fs::read_link(&path).is_ok_and(|t| t.starts_with("/dev/pts/"))
                        || via_dev_tty(self.ctty))
            }
            StdinMatch::Tty(_) => {
                meta.file_type().is_char_device()
                    && (Some(meta.rdev()) == self.tty_rdev || via_dev_tty(self.tty_rdev))
            }
        }
    }

    fn mem(&self) -> std::path::PathBuf {
        self.task.join("mem")
    }
}

fn read_target(mem: &Path, addr: u64, len: usize) -> Option<Vec<u8>> {
    let file = File::open(mem).ok()?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, addr).ok()?;
    Some(buf)
}

/// `poll(fds, nfds, ...)` / `ppoll(fds, nfds, ...)`: does some entry ask for input on the
/// terminal?
fn poll_wants(terminal: &Terminal<'_>, fds: u64, nfds: u64) -> bool {
    if fds == 0 || nfds == 0 || nfds > MAX_POLL_FDS {
        return false;
    }
    // struct pollfd { int fd; short events; short revents; } is 8 bytes everywhere.
    let Ok(len) = usize::try_from(nfds * 8) else { return false };
    let Some(buf) = read_target(&terminal.mem(), fds, len) else { return false };
    buf.chunks_exact(8).any(|e| {
        let fd = i32::from_ne_bytes([e[0], e[1], e[2], e[3]]);
        let events = i16::from_ne_bytes([e[4], e[5]]);
        events & POLL_INPUT != 0 && terminal.is(fd)
    })
}

/// `select(nfds, readfds, ...)` / `pselect6(...)`: is the terminal in the read set?
fn select_wants(terminal: &Terminal<'_>, nfds: u64, readfds: u64) -> bool {
    // nfds is an int; a negative value shows up sign-extended and fails the range check.
    if nfds == 0 || nfds > 64 * 1024 || readfds == 0 {
        return false;
    }
    // fd_set is a bit array of unsigned longs: bit n of the set is fd n.
    const WORD: u64 = std::mem::size_of::<libc::c_ulong>() as u64;
    let bytes = nfds.div_ceil(WORD * 8) * WORD;
    let Ok(len) = usize::try_from(bytes) else { return false };
    let Some(buf) = read_target(&terminal.mem(), readfds, len) else { return false };
    // Little- and big-endian words differ in byte order; decode per word.
    let mut fd: u64 = 0;
    for chunk in buf.chunks_exact(WORD as usize) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        let value = if WORD == 8 {
            u64::from_ne_bytes(w)
        } else {
            u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
        };
        for bit in 0..WORD * 8 {
            if fd + bit >= nfds {
                return false;
            }
            if value & (1 << bit) != 0 && i32::try_from(fd + bit).is_ok_and(|n| terminal.is(n)) {
                return true;
            }
        }
        fd += WORD * 8;
    }
    false
}

/// One `tfd:` line of an epoll fdinfo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EpollEntry {
    tfd: i32,
    events: u32,
    ino: Option<u64>,
}

/// Parses the `tfd:` lines of `/proc/.../fdinfo/EPFD`, e.g.
/// `tfd:        0 events:       19 data:                0  pos:0 ino:3 sdev:1a`.
fn parse_epoll_fdinfo(text: &str) -> Vec<EpollEntry> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("tfd:")?;
            let mut toks = rest.split_whitespace();
            let tfd = toks.next().and_then(|t| t.parse::<i32>().ok());
            let mut events = None;
            let mut ino = None;
            while let Some(tok) = toks.next() {
                if tok == "events:" {
                    events = toks.next().and_then(|t| u32::from_str_radix(t, 16).ok());
                } else if let Some(v) = tok.strip_prefix("ino:") {
                    ino = u64::from_str_radix(v, 16).ok();
                }
            }
            Some(EpollEntry { tfd: tfd?, events: events?, ino })
        })
        .collect()
}

/// `epoll_wait(epfd, ...)` family: does the interest list hold the terminal for input?
fn epoll_wants(terminal: &Terminal<'_>, epfd: u64) -> bool {
    let Ok(epfd) = i32::try_from(epfd) else { return false };
    let Ok(text) = crate::procfs::read(terminal.task.join(format!("fdinfo/{epfd}"))) else {
        return false;
    };
    parse_epoll_fdinfo(&text).into_iter().any(|e| {
        // The entry is keyed by the fd number at registration; when the kernel tells us the
        // inode, insist it is still the file behind that fd (it could have been replaced).
        let now =
            std::fs::metadata(terminal.task.join(format!("fd/{}", e.tfd))).ok().map(|m| m.ino());
        e.events & EPOLL_INPUT != 0
            && match (e.ino, now) {
                (Some(a), Some(b)) => a == b,
                (Some(_), None) => false,
                (None, _) => true,
            }
            && terminal.is(e.tfd)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    #[test]
    fn parses_syscall_lines() {
        let b = parse_syscall("0 0x0 0x7ffd1 0x400 0x0 0x0 0x0 0x7ffd0 0x7f12\n").unwrap();
        assert_eq!(b.nr, 0);
        assert_eq!(b.args, [0, 0x7ffd1, 0x400, 0, 0, 0]);
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x0 0x0\n"), None);
        assert_eq!(parse_syscall("7 0x1"), None, "truncated lines are misses");
    }

    #[test]
    fn parses_epoll_fdinfo() {
        let text = "pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t1057\n\
            tfd:        0 events:       19 data:                0  pos:0 ino:3 sdev:1a\n\
            tfd:        5 events: 80000004 data:                5  pos:0 ino:9 sdev:e\n";
        let v = parse_epoll_fdinfo(text);
        assert_eq!(
            v,
            vec![
                EpollEntry { tfd: 0, events: 0x19, ino: Some(3) },
                EpollEntry { tfd: 5, events: 0x8000_0004, ino: Some(9) },
            ]
        );
    }

    #[test]
    fn non_positive_groups_never_wait() {
        assert!(!group_waits_on_stdin(0));
        assert!(!group_waits_on_stdin(-1));
    }

    /// Spawns `argv` in its own group with piped stdin; the pipe keeps it blocked.
    fn spawn_group(argv: &[&str]) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn")
    }

    fn eventually(mut f: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn reap(mut child: std::process::Child) {
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn piped_read_is_seen_without_a_pty() {
        let child = spawn_group(&["cat"]);
        let pgid = i32::try_from(child.id()).unwrap();
        assert!(eventually(|| group_waits_on_stdin(pgid)), "cat blocks in read(0)");
        // A pipe is not a terminal, so the terminal-restricted forms must not match.
        assert_eq!(group_waits_on(pgid, StdinMatch::AnyPts), StdinWait::NotWaiting);
        reap(child);
    }

    #[test]
    fn piped_poll_is_seen_without_a_pty() {
        let Ok(_) = Command::new("python3").arg("-c").arg("pass").status() else {
            println!("SKIP piped_poll_is_seen_without_a_pty: python3 unavailable");
            return;
        };
        let child = spawn_group(&[
            "python3",
            "-c",
            "import select; p=select.poll(); p.register(0, select.POLLIN); p.poll()",
        ]);
        let pgid = i32::try_from(child.id()).unwrap();
        assert!(eventually(|| group_waits_on_stdin(pgid)), "poll on fd 0 is seen");
        reap(child);
    }

    #[test]
    fn sleeping_group_never_waits() {
        let child = spawn_group(&["sleep", "30"]);
        let pgid = i32::try_from(child.id()).unwrap();
        let pid = pgid;
        // Wait until sleep is really parked (its syscall is no longer exec/startup).
        assert!(eventually(|| {
            crate::procfs::read(format!("/proc/{pid}/syscall"))
                .ok()
                .and_then(|l| parse_syscall(&l))
                .is_some_and(|b| wait_kind(b.nr).is_none())
                && crate::procfs::read(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
        }));
        for _ in 0..10 {
            assert!(!group_waits_on_stdin(pgid));
            std::thread::sleep(Duration::from_millis(20));
        }
        reap(child);
    }
}
