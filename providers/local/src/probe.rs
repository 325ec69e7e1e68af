//! Tier 1 readiness: the exact Linux stdin-wait probe.
//!
//! A foreground group "waits on stdin" only when some task of some member is positively
//! seen blocked in a syscall that waits for input on fd 0: `read`/`readv` of fd 0,
//! `poll`/`ppoll` or `select`/`pselect6` whose fd arrays (read from the target's memory)
//! ask for input on fd 0, or an `epoll_wait` family call whose interest list holds fd 0.
//! Anything unreadable or unrecognised is a miss, never a guess.

use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;

/// `POLLIN | POLLRDNORM`: either asks the kernel for input readiness.
const POLL_INPUT: i16 = 0x1 | 0x40;
/// `EPOLLIN | EPOLLRDNORM`.
const EPOLL_INPUT: u32 = 0x1 | 0x40;
/// Upper bound on a pollfd array we are willing to copy out of a target.
const MAX_POLL_FDS: u64 = 4096;

/// Which file fd 0 of a waiting task must be for the wait to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdinMatch<'a> {
    /// Any file: a wait on fd 0 counts whatever fd 0 is (useful with piped stdin).
    Any,
    /// Any pseudo-terminal slave (`/dev/pts/*` character device).
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

/// True when any task of any process in group `pgid` is blocked waiting for input on
/// fd 0, whatever fd 0 is.
pub fn group_waits_on_stdin(pgid: i32) -> bool {
    group_waits_on(pgid, StdinMatch::Any)
}

/// True when any task of any process in group `pgid` is blocked waiting for input on
/// fd 0 and fd 0 matches `stdin`.
pub fn group_waits_on(pgid: i32, stdin: StdinMatch<'_>) -> bool {
    if pgid <= 0 {
        return false;
    }
    group_members(pgid).into_iter().any(|pid| process_waits_on(pid, stdin))
}

/// The fields of a `/proc/.../stat` line after the comm, which may hold spaces and parens.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().collect())
}

/// Pids whose process group is `pgid` (field 5 of stat, index 2 after the comm).
pub(crate) fn group_members(pgid: i32) -> Vec<i32> {
    members_where(|f| f.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid))
}

/// Live (not zombie or dead) pids whose session is `sid` (field 6 of stat).
pub(crate) fn session_members(sid: i32) -> Vec<i32> {
    members_where(|f| {
        let live = !matches!(f.first().copied(), Some("Z" | "X"));
        live && f.get(3).and_then(|s| s.parse::<i32>().ok()) == Some(sid)
    })
}

/// True when some process (zombies included) of group `pgid` belongs to session `sid`.
pub(crate) fn group_in_session(pgid: i32, sid: i32) -> bool {
    !members_where(|f| {
        let field = |i: usize| f.get(i).and_then(|v| v.parse::<i32>().ok());
        field(2) == Some(pgid) && field(3) == Some(sid)
    })
    .is_empty()
}

fn members_where(pred: impl Fn(&[&str]) -> bool) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| stat_fields(&s).map(|f| pred(&f)))
                .unwrap_or(false)
        })
        .collect()
}

fn process_waits_on(pid: i32, stdin: StdinMatch<'_>) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .any(|e| task_waits_on(&e.path(), stdin))
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

fn task_waits_on(task: &Path, stdin: StdinMatch<'_>) -> bool {
    // Only a sleeping task can be parked in a wait; R, D, T, Z, ... are not waiting for us.
    let Ok(stat) = std::fs::read_to_string(task.join("stat")) else { return false };
    if stat_fields(&stat).and_then(|f| f.first().copied()) != Some("S") {
        return false;
    }
    let Ok(line) = std::fs::read_to_string(task.join("syscall")) else { return false };
    let Some(call) = parse_syscall(&line) else { return false };
    let Some(kind) = wait_kind(call.nr) else { return false };
    let waits = match kind {
        WaitKind::Read => call.args[0] == 0,
        // A task's mem is its address space, which is where its syscall arguments point.
        WaitKind::Poll => poll_wants_fd0(&task.join("mem"), call.args[0], call.args[1]),
        WaitKind::Select => select_wants_fd0(&task.join("mem"), call.args[0], call.args[1]),
        WaitKind::Epoll => epoll_wants_fd0(task, call.args[0]),
    };
    waits && fd0_matches(task, stdin)
}

fn read_target(mem: &Path, addr: u64, len: usize) -> Option<Vec<u8>> {
    let file = File::open(mem).ok()?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, addr).ok()?;
    Some(buf)
}

/// `poll(fds, nfds, ...)` / `ppoll(fds, nfds, ...)`: does some entry ask for input on fd 0?
fn poll_wants_fd0(mem: &Path, fds: u64, nfds: u64) -> bool {
    if fds == 0 || nfds == 0 || nfds > MAX_POLL_FDS {
        return false;
    }
    // struct pollfd { int fd; short events; short revents; } is 8 bytes everywhere.
    let Ok(len) = usize::try_from(nfds * 8) else { return false };
    let Some(buf) = read_target(mem, fds, len) else { return false };
    buf.chunks_exact(8).any(|e| {
        let fd = i32::from_ne_bytes([e[0], e[1], e[2], e[3]]);
        let events = i16::from_ne_bytes([e[4], e[5]]);
        fd == 0 && events & POLL_INPUT != 0
    })
}

/// `select(nfds, readfds, ...)` / `pselect6(...)`: is fd 0 in the read set?
fn select_wants_fd0(mem: &Path, nfds: u64, readfds: u64) -> bool {
    // nfds is an int; a negative value shows up sign-extended and fails the range check.
    if nfds == 0 || nfds > 1024 * 1024 || readfds == 0 {
        return false;
    }
    // fd_set is an array of unsigned long; fd 0 is the lowest bit of the first word.
    const WORD: usize = std::mem::size_of::<libc::c_ulong>();
    let Some(buf) = read_target(mem, readfds, WORD) else { return false };
    let mut word = [0u8; 8];
    word[..WORD].copy_from_slice(&buf);
    let value = if WORD == 8 {
        u64::from_ne_bytes(word)
    } else {
        u64::from(u32::from_ne_bytes([word[0], word[1], word[2], word[3]]))
    };
    value & 1 != 0
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

/// `epoll_wait(epfd, ...)` family: does the interest list hold fd 0 for input?
fn epoll_wants_fd0(task: &Path, epfd: u64) -> bool {
    let Ok(epfd) = i32::try_from(epfd) else { return false };
    let Ok(text) = std::fs::read_to_string(task.join(format!("fdinfo/{epfd}"))) else {
        return false;
    };
    // The entry is keyed by the fd number at registration; when the kernel tells us the
    // inode, insist it is still the file behind fd 0 (fd 0 could have been replaced).
    let fd0_ino = std::fs::metadata(task.join("fd/0")).ok().map(|m| m.ino());
    parse_epoll_fdinfo(&text).into_iter().any(|e| {
        e.tfd == 0
            && e.events & EPOLL_INPUT != 0
            && match (e.ino, fd0_ino) {
                (Some(a), Some(b)) => a == b,
                (Some(_), None) => false,
                (None, _) => true,
            }
    })
}

fn fd0_matches(task: &Path, stdin: StdinMatch<'_>) -> bool {
    let fd0 = task.join("fd/0");
    match stdin {
        StdinMatch::Any => true,
        StdinMatch::AnyPts => {
            let is_char = std::fs::metadata(&fd0).is_ok_and(|m| m.file_type().is_char_device());
            is_char && std::fs::read_link(&fd0).is_ok_and(|t| t.starts_with("/dev/pts/"))
        }
        StdinMatch::Tty(tty) => {
            let (Ok(a), Ok(b)) = (std::fs::metadata(&fd0), std::fs::metadata(tty)) else {
                return false;
            };
            a.file_type().is_char_device() && a.rdev() == b.rdev()
        }
    }
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
    fn stat_fields_split_after_last_paren() {
        let f = stat_fields("42 (a) (b c) S 1 42 42 34816 42 4194560").unwrap();
        assert_eq!(&f[..4], &["S", "1", "42", "42"]);
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
        assert!(!group_waits_on(pgid, StdinMatch::AnyPts));
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
            std::fs::read_to_string(format!("/proc/{pid}/syscall"))
                .ok()
                .and_then(|l| parse_syscall(&l))
                .is_some_and(|b| wait_kind(b.nr).is_none())
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
        }));
        for _ in 0..10 {
            assert!(!group_waits_on_stdin(pgid));
            std::thread::sleep(Duration::from_millis(20));
        }
        reap(child);
    }
}
