//! The `sandbox-exec` re-exec helper: `sandbox-exec --policy <json> [--runner R] -- argv...`.
//!
//! The runners never confine through `pre_exec` closures in conch's own (multi-threaded)
//! process. Instead the wrapped command line starts this helper, a fresh single-threaded
//! process, which confines itself step by step and then `execvp`s the exact argv, so
//! everything the command starts inherits the confinement:
//!
//! 1. every inherited descriptor above 2 is closed (neither Landlock nor read-only mounts
//!    stop a write through a descriptor that is already open);
//! 2. the command leaves the caller's terminal session (see `leave_callers_session`), so it
//!    cannot push keystrokes into conch's controlling terminal with `TIOCSTI`;
//! 3. alone (the `landlock` runner), the helper builds its mount layer (`mounts.rs`): a
//!    private mount namespace where everything outside the writable roots is read-only,
//!    the read-only paths under a root are read-only mount points, the pathname unix
//!    sockets outside the roots are covered, and `/dev/pts` is a devpts instance of the
//!    sandbox's own (its own controlling terminal, if any, bound onto `/dev/console`); when
//!    this user can have no mount namespace, Landlock confines alone and the runner's
//!    enforcement says what is then not denied;
//! 4. the Landlock ruleset is built (path descriptors opened while we still can). Of the
//!    terminals, only the command's own controlling terminal (found on its stdin, stdout or
//!    stderr), `/dev/tty` and `/dev/ptmx` are writable, and `/dev/pts` as a whole only
//!    where it is the sandbox's own instance: a command on a pipe can write to no terminal;
//! 5. every capability is dropped (bounding and ambient sets cleared, then `capset` to
//!    nothing): as root, a kept capability would let the command remount, `mknod` a disk or
//!    `chown` anything;
//! 6. `PR_SET_NO_NEW_PRIVS` and the Landlock restriction (reads everywhere; writes only
//!    under the policy's writable roots, minus its read-only paths; TCP bind/connect denied
//!    without network; signals and abstract unix sockets scoped to the sandbox; from ABI 9,
//!    pathname unix sockets outside the roots refused);
//! 7. seccomp filters: `chown` and the xattr writers are refused everywhere (Landlock does
//!    not cover metadata), `ioctl(TIOCSTI)` is refused (no input pushed into any terminal,
//!    the own one included), `io_uring` is refused (its socket operations bypass seccomp),
//!    every x32 system call is refused, and without network `socket`/`socketpair` accept
//!    only `AF_UNIX` (Landlock's TCP rules miss UDP, ICMP, MPTCP and raw sockets);
//! 8. `execvp`.
//!
//! Any step that fails ends the helper with [`UNAVAILABLE`] and one line
//! `conch-sandbox: unavailable: <why>` on stderr: the command never runs unconfined.
//!
//! Runners: `landlock` (the default) does all of the above. `bwrap` is used inside
//! bubblewrap, whose mounts are the mount layer (read-only binds, sockets covered, a fresh
//! `/dev` with a devpts of its own and the caller's terminal at `/dev/console`), so only
//! the read-only paths that do not exist yet (which cannot be bound) are kept by Landlock;
//! Landlock is still applied there as a second layer (FIFOs on read-only binds, signal
//! scoping) but its absence is tolerated, since bubblewrap is the primary confinement.
//!
//! Known limits (stated in docs/sandbox.md and tested where they hold):
//! - Without the mount layer (no mount namespace for this user): `chmod` and `utime` of
//!   files outside the roots that the user owns are not denied (Landlock has no right for
//!   them and seccomp cannot see paths), and a read-only path under a root (`.git/hooks`)
//!   is kept by granting the root's other entries one by one (Landlock rules only add
//!   rights), so new entries cannot be created directly in the workspace root or `.git`.
//! - Unix sockets are covered as listed in `/proc/net/unix` when the command starts: one
//!   bound later outside the roots is reachable before Landlock ABI 9.
//! - A hard link that already exists inside a root and points at a file outside is written
//!   through (rules and binds follow paths); making such a link from inside is denied.
//! - Without the mount layer (or where devpts cannot be mounted), `/dev/pts` is the
//!   machine's, so only the own terminal in it is granted: a new terminal's master opens
//!   (`/dev/ptmx`) but not its slave, so `script` and python's `pty` fail there.
//! - The shared `/tmp` is read-only unless it is a writable root; in workspace-write mode the
//!   runners give each command a private `TMPDIR` instead (see `tmp.rs`).

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};

use conch_seams::SandboxPolicy;

use crate::mounts::{self, Layer};
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Exit status when the sandbox cannot be applied (the command did not run).
pub const UNAVAILABLE: i32 = 126;
/// Exit status for a malformed helper command line.
pub const USAGE: i32 = 125;
/// Exit status when the command itself cannot be executed (as a shell reports it).
pub const NOT_FOUND: i32 = 127;
/// The prefix of the helper's own stderr lines.
pub const MARKER: &str = "conch-sandbox:";

/// The subcommand name the runners put after the helper path.
pub const SUBCOMMAND: &str = "sandbox-exec";

/// The Landlock ABI the helper codes against (9: `ResolveUnix`); older kernels downgrade
/// (best effort).
const ABI_WANTED: ABI = ABI::V9;

/// Which runner the helper serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runner {
    /// Landlock is the confinement: it must be enforced.
    Landlock,
    /// Inside bubblewrap: Landlock is a second layer, best effort, roots granted whole.
    Bwrap,
}

impl Runner {
    /// The `--runner` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Runner::Landlock => "landlock",
            Runner::Bwrap => "bwrap",
        }
    }
}

/// A parsed helper command line.
#[derive(Debug)]
struct Invocation {
    policy: SandboxPolicy,
    runner: Runner,
    /// Unix sockets to cover (bwrap runner: listed outside, where the host's are visible).
    cover: Vec<PathBuf>,
    argv: Vec<String>,
}

fn parse(args: &[String]) -> Result<Invocation, String> {
    let mut rest = args;
    if rest.first().map(String::as_str) == Some(SUBCOMMAND) {
        rest = &rest[1..];
    }
    let mut policy = None;
    let mut runner = Runner::Landlock;
    let mut cover = Vec::new();
    while let Some((head, tail)) = rest.split_first() {
        match head.as_str() {
            "--cover" => {
                let path = tail.first().ok_or("--cover needs a path")?;
                cover.push(PathBuf::from(path));
                rest = &tail[1..];
            }
            "--policy" => {
                let json = tail.first().ok_or("--policy needs a JSON value")?;
                policy = Some(
                    serde_json::from_str::<SandboxPolicy>(json)
                        .map_err(|e| format!("bad --policy: {e}"))?,
                );
                rest = &tail[1..];
            }
            "--runner" => {
                runner = match tail.first().map(String::as_str) {
                    Some("landlock") => Runner::Landlock,
                    Some("bwrap") => Runner::Bwrap,
                    other => return Err(format!("unknown --runner {other:?}")),
                };
                rest = &tail[1..];
            }
            "--" => {
                rest = tail;
                break;
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    let policy = policy.ok_or("--policy is required")?;
    if rest.is_empty() {
        return Err("no command after --".into());
    }
    for root in policy.writable().iter().chain(&policy.read_only_paths) {
        if !root.is_absolute() {
            return Err(format!("{} is not an absolute path", root.display()));
        }
    }
    for p in &cover {
        if !p.is_absolute() {
            return Err(format!("--cover {} is not an absolute path", p.display()));
        }
    }
    Ok(Invocation { policy, runner, cover, argv: rest.to_vec() })
}

/// The argument that asks the helper what it can enforce here instead of running anything.
pub const PROBE: &str = "--probe";

/// What [`PROBE`] prints (one JSON line): the Landlock ABI and whether the mount layer can
/// be built by this user on this kernel.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ProbeReport {
    /// The kernel's Landlock ABI, if any.
    pub landlock_abi: Option<i32>,
    /// Why the mount layer cannot be built (`None`: it can).
    pub mount_layer_unavailable: Option<String>,
}

fn probe_report() -> String {
    let report = ProbeReport {
        landlock_abi: landlock_abi().ok(),
        mount_layer_unavailable: match mounts::probe() {
            Layer::Applied => None,
            Layer::Unavailable(why) => Some(why),
        },
    };
    serde_json::to_string(&report).unwrap_or_default()
}

/// Runs the helper: confines this process per `args` and execs the command. Returns only on
/// failure, with the exit status to use ([`UNAVAILABLE`], [`USAGE`] or [`NOT_FOUND`]), or
/// after printing the [`PROBE`] report (0).
///
/// `args` are the arguments after the program name, optionally starting with
/// `sandbox-exec`.
pub fn sandbox_exec_main(args: &[String]) -> i32 {
    let rest = args.strip_prefix(&[SUBCOMMAND.to_string()]).unwrap_or(args);
    if rest == [PROBE] {
        println!("{}", probe_report());
        return 0;
    }
    let inv = match parse(args) {
        Ok(inv) => inv,
        Err(e) => {
            eprintln!(
                "{MARKER} usage: sandbox-exec --policy <json> [--runner landlock|bwrap] [--cover <socket>]... -- argv... ({e})"
            );
            return USAGE;
        }
    };
    let Ok(argv) =
        inv.argv.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<Vec<_>, _>>()
    else {
        eprintln!("{MARKER} usage: an argument contains a NUL byte");
        return USAGE;
    };
    if inv.policy.mode.confines()
        && let Err(why) = confine(&inv)
    {
        eprintln!("{MARKER} unavailable: {why}");
        return UNAVAILABLE;
    }
    exec(&argv)
}

fn confine(inv: &Invocation) -> Result<(), String> {
    close_inherited_fds()?;
    leave_callers_session();
    let own_tty = controlling_terminal();
    let writable = inv.policy.writable();
    let points = mounts::read_only_points(&writable, &inv.policy.read_only_paths);
    // Inside bubblewrap the mounts are bubblewrap's (its `/dev/pts` is a devpts instance of
    // the sandbox's own); alone, the helper builds its own view, with a private devpts.
    let (layer, private_pts) = match inv.runner {
        Runner::Landlock => {
            match mounts::apply(&writable, &points.mount, &inv.policy.hidden_paths)? {
                Layer::Applied => {
                    let private = mounts::private_devpts(own_tty.as_ref().map(|t| t.fd))?;
                    (Layer::Applied, private)
                }
                // Landlock grants reads everywhere: only a mount can hide a path.
                Layer::Unavailable(why) if !inv.policy.hidden_paths.is_empty() => {
                    return Err(format!(
                        "the policy hides paths, which needs a mount namespace: {why}"
                    ));
                }
                unavailable => (unavailable, false),
            }
        }
        Runner::Bwrap => {
            mounts::cover_in_new_namespace(&inv.cover)?;
            (Layer::Applied, true)
        }
    };
    let terminals = Terminals {
        // Looked up in the final view: the own terminal may now be at `/dev/console`.
        own: own_tty.and_then(|t| t.path()),
        private_pts,
    };
    // With a mount layer (bubblewrap's or our own) the existing read-only paths are
    // read-only mount points already; one that does not exist yet (a `.git` without
    // `hooks`) cannot be mounted, so Landlock keeps it from being created.
    let kept_by_landlock = match layer {
        Layer::Unavailable(_) => &inv.policy.read_only_paths,
        Layer::Applied => &points.missing,
    };
    let ruleset = build_ruleset(inv, &writable, kept_by_landlock, &terminals)?;
    let filters = seccomp_filters(&inv.policy)?;
    drop_capabilities()?;
    set_no_new_privs()?;
    match ruleset {
        Some(ruleset) => {
            let status = ruleset.restrict_self().map_err(|e| format!("landlock: {e}"))?;
            if status.ruleset == RulesetStatus::NotEnforced && inv.runner == Runner::Landlock {
                return Err("landlock is not enforced by this kernel".into());
            }
        }
        None if inv.runner == Runner::Landlock => {
            return Err("landlock is not supported by this kernel".into());
        }
        None => {}
    }
    for filter in &filters {
        seccompiler::apply_filter(filter).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

/// Closes every descriptor above 2: a descriptor conch (or its parent) left open would be a
/// write channel that no path rule checks.
fn close_inherited_fds() -> Result<(), String> {
    // SAFETY: close_range only closes descriptors; nothing in this single-threaded helper
    // holds one it still needs (std's stdio are 0-2).
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if r == 0 {
        return Ok(());
    }
    // Kernels before 5.9: close what /proc lists (collected first, closed after, so the
    // directory's own descriptor is not closed under the iteration).
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| format!("cannot list descriptors: {e}"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: as above; EBADF for the listing's own (now closed) descriptor is harmless.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Leaves the caller's session, so the command cannot inject input into conch's
/// controlling terminal (`TIOCSTI` works only on one's own controlling terminal once
/// capabilities are gone).
///
/// - stdin is the session's controlling terminal (a sandboxed terminal under bubblewrap,
///   where the helper is not the leader): keep it, for the same reason.
/// - Already a session leader (a terminal backend started the helper as the leader of a
///   PTY session): keep it, and keep the PTY as the controlling terminal; job control and
///   `/dev/tty` inside the sandboxed terminal need it, and that terminal is the sandbox's
///   own.
/// - Not a process group leader: `setsid()` makes a new session without a terminal.
/// - A process group leader but not a session leader (subprocess-local starts every child
///   in a group of its own, so `setsid` fails with `EPERM`): detach from the controlling
///   terminal with `TIOCNOTTY`, which for a non-leader just drops the association. The
///   command then has no controlling terminal; a child that later calls `setsid` cannot
///   acquire conch's terminal, which still belongs to conch's session.
fn leave_callers_session() {
    // SAFETY: getsid/getpid/isatty/tcgetsid/setsid have no memory effects.
    let (sid, pid) = unsafe { (libc::getsid(0), libc::getpid()) };
    if sid == pid {
        return;
    }
    // Inside bubblewrap the helper is a member, not the leader, of the session the caller
    // made: a terminal backend hands a sandboxed shell its PTY as stdin and as the
    // session's controlling terminal, and that session is the sandbox's own. One-shot
    // spawns never get a terminal as stdin (subprocess seams give null, bytes or a pipe).
    // SAFETY: as above.
    if unsafe { libc::isatty(0) == 1 && libc::tcgetsid(0) == sid } {
        return;
    }
    // SAFETY: as above.
    if unsafe { libc::setsid() } >= 0 {
        return;
    }
    // SAFETY: opening /dev/tty and an argument-less ioctl; the fd is closed right after.
    unsafe {
        let fd = libc::open(c"/dev/tty".as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::ioctl(fd, libc::TIOCNOTTY);
            libc::close(fd);
        }
    }
}

/// Which terminals the command may open by path (besides `/dev/tty` and `/dev/ptmx`).
#[derive(Debug)]
struct Terminals {
    /// Its own controlling terminal, where this mount view shows it.
    own: Option<PathBuf>,
    /// `/dev/pts` is a devpts instance of the sandbox's own (holding only the terminals the
    /// command makes), so it may be granted whole; otherwise it holds every terminal of the
    /// machine and none but the own one is granted.
    private_pts: bool,
}

/// The command's controlling terminal, as one of its standard descriptors (after
/// [`leave_callers_session`], so it is the sandbox's own terminal or none).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnTerminal {
    /// A standard descriptor (0-2) open on the terminal.
    pub fd: i32,
    dev: u64,
    ino: u64,
}

/// Finds the controlling terminal (field 7 of `/proc/self/stat`) among the standard
/// descriptors. One that is not on stdin, stdout or stderr is not looked for: it stays
/// reachable through `/dev/tty`, and a device number alone does not name one terminal
/// (every devpts instance numbers its terminals from 0).
fn controlling_terminal() -> Option<OwnTerminal> {
    use std::os::unix::fs::MetadataExt;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let tty_nr: i64 = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().nth(4)?.parse().ok()?;
    if tty_nr == 0 {
        return None;
    }
    (0..=2).find_map(|fd| {
        let meta = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
        (meta.rdev() == tty_nr as u64).then(|| OwnTerminal { fd, dev: meta.dev(), ino: meta.ino() })
    })
}

impl OwnTerminal {
    /// The terminal's path in the current mount view: the name its descriptor was opened by,
    /// or `/dev/console` (where bubblewrap, and the helper under a private devpts, bind it),
    /// if that path is this very terminal.
    fn path(&self) -> Option<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let named = std::fs::read_link(format!("/proc/self/fd/{}", self.fd)).ok();
        named.into_iter().chain([PathBuf::from("/dev/console")]).find(|p| {
            p.is_absolute()
                && std::fs::metadata(p).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino)
        })
    }
}

/// The kernel's Landlock ABI version, or why there is none.
pub fn landlock_abi() -> Result<i32, String> {
    // SAFETY: the version query takes no attribute and creates no descriptor.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v > 0 {
        return Ok(v as i32);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP) => Err("landlock is built into the kernel but not enabled (add landlock to the lsm= boot parameter)".into()),
        _ => Err("the kernel has no landlock (Linux 5.13 or newer with CONFIG_SECURITY_LANDLOCK is needed)".into()),
    }
}

/// The Landlock ruleset: reads everywhere, writes under `writable` except `protected`.
fn build_ruleset(
    inv: &Invocation,
    writable: &[PathBuf],
    protected: &[PathBuf],
    terminals: &Terminals,
) -> Result<Option<RulesetCreated>, String> {
    if landlock_abi().is_err() {
        return Ok(None);
    }
    let abi = ABI_WANTED;
    let err = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    if !inv.policy.network {
        // Handled with no rule: every TCP bind and connect is denied.
        ruleset = ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp).map_err(err)?;
    }
    let mut created = ruleset
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(err)?
        .create()
        .map_err(err)?;
    created = add(created, Path::new("/"), AccessFs::from_read(abi))?;
    // `/dev/tty` always names the caller's own controlling terminal; `/dev/ptmx` only makes
    // new terminals, whose slaves are usable only where `/dev/pts` is private.
    let mut devices: Vec<PathBuf> =
        ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx"]
            .into_iter()
            .map(PathBuf::from)
            .collect();
    if terminals.private_pts {
        devices.push(PathBuf::from("/dev/pts"));
    }
    devices.extend(terminals.own.iter().cloned());
    for dev in &devices {
        if dev.exists() {
            created = add(created, dev, AccessFs::from_all(abi))?;
        }
    }
    for path in writable_grants(writable, protected) {
        created = add(created, &path, AccessFs::from_all(abi))?;
    }
    Ok(Some(created))
}

fn add(
    ruleset: RulesetCreated,
    path: &Path,
    access: landlock::BitFlags<AccessFs>,
) -> Result<RulesetCreated, String> {
    let fd =
        PathFd::new(path).map_err(|e| format!("landlock: cannot open {}: {e}", path.display()))?;
    // A rule on a file may carry only file rights.
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let access = if meta.is_dir() { access } else { access & AccessFs::from_file(ABI_WANTED) };
    ruleset
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|e| format!("landlock: rule for {}: {e}", path.display()))
}

/// The paths to grant full access to so that everything under `roots` is writable except
/// the `protected` paths (Landlock rules only add rights, so a protected path under a root
/// is kept by granting the root's other entries one by one instead of the root).
///
/// A protected path is honoured when the first component below its root exists (`.git`); a
/// workspace without `.git` is granted whole. Symlinked entries are never granted (a rule
/// follows the link and would grant its target). Roots that do not exist are skipped.
pub fn writable_grants(roots: &[PathBuf], protected: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for root in roots {
        let Ok(root) = std::fs::canonicalize(root) else { continue };
        let mine: Vec<PathBuf> = protected
            .iter()
            .filter_map(|p| {
                let rel = p.strip_prefix(&root).ok()?;
                let first = rel.components().next()?;
                root.join(first).symlink_metadata().ok()?;
                Some(p.clone())
            })
            .collect();
        split(&root, &mine, &mut out);
    }
    out
}

fn split(dir: &Path, protected: &[PathBuf], out: &mut Vec<PathBuf>) {
    if protected.iter().any(|p| p == dir) {
        return;
    }
    if !protected.iter().any(|p| p.starts_with(dir)) {
        out.push(dir.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for entry in entries {
        let Ok(meta) = entry.symlink_metadata() else { continue };
        if meta.file_type().is_symlink() {
            continue;
        }
        let below: Vec<PathBuf> =
            protected.iter().filter(|p| p.starts_with(&entry)).cloned().collect();
        if below.is_empty() {
            out.push(entry);
        } else if meta.is_dir() {
            split(&entry, &below, out);
        }
    }
}

fn seccomp_filters(policy: &SandboxPolicy) -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| format!("seccomp: unsupported architecture {}", std::env::consts::ARCH))?;
    // seccompiler targets only 64-bit architectures, where `c_long` is `i64`.
    let always = |n: libc::c_long| (n, Vec::new());
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> = [
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_setxattr,
        libc::SYS_lsetxattr,
        libc::SYS_fsetxattr,
        libc::SYS_removexattr,
        libc::SYS_lremovexattr,
        libc::SYS_fremovexattr,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ]
    .into_iter()
    .map(always)
    .collect();
    #[cfg(target_arch = "x86_64")]
    for n in [libc::SYS_chown, libc::SYS_lchown] {
        denied.insert(n, Vec::new());
    }
    let err = |e: seccompiler::BackendError| format!("seccomp: {e}");
    // `TIOCSTI` pushes input into a terminal as if typed: into the sandbox's own terminal it
    // would feed whatever reads it next, so it is refused outright (the kernel already
    // refuses it on any other terminal once capabilities are gone). The request is
    // compared on its low 32 bits, as the kernel's `unsigned int cmd` sees it.
    // `Ioctl` is `c_ulong` with glibc but `c_int` with musl.
    #[allow(clippy::unnecessary_cast)]
    let request = libc::TIOCSTI as u64;
    let tiocsti = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
        .and_then(|c| SeccompRule::new(vec![c]))
        .map_err(err)?;
    denied.insert(libc::SYS_ioctl, vec![tiocsti]);
    let mut out = vec![compile(denied, libc::EPERM, arch).map_err(err)?];
    #[cfg(target_arch = "x86_64")]
    out.push(no_x32());
    if !policy.network {
        let not_unix = || {
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )
            .and_then(|c| SeccompRule::new(vec![c]))
        };
        let sockets: BTreeMap<i64, Vec<SeccompRule>> = [
            (libc::SYS_socket, vec![not_unix().map_err(err)?]),
            (libc::SYS_socketpair, vec![not_unix().map_err(err)?]),
        ]
        .into_iter()
        .collect();
        out.push(compile(sockets, libc::EAFNOSUPPORT, arch).map_err(err)?);
    }
    Ok(out)
}

/// Refuses every x32 system call (`nr | 0x4000_0000` under the x86-64 audit arch): the
/// other filters name native numbers only, and an x32 `fchown` would pass them on a kernel
/// built with x32 support. Nothing conch runs is an x32 binary.
#[cfg(target_arch = "x86_64")]
fn no_x32() -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_ABS_W: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const ARCH_OFFSET: u32 = 4; // seccomp_data.arch
    const NR_OFFSET: u32 = 0; // seccomp_data.nr
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const X32_BIT: u32 = 0x4000_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        op(LD_ABS_W, 0, 0, ARCH_OFFSET),
        op(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        op(LD_ABS_W, 0, 0, NR_OFFSET),
        op(JGE_K, 0, 1, X32_BIT),
        op(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32),
        op(RET_K, 0, 0, RET_ALLOW),
    ]
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: i32,
    arch: TargetArch,
) -> Result<BpfProgram, seccompiler::BackendError> {
    SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch)?
        .try_into()
}

/// Clears the bounding and ambient sets, then every capability set. As root this is what
/// keeps `execve` from handing the command a full set again (root's permitted set after exec
/// is capped by the bounding set).
fn drop_capabilities() -> Result<(), String> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<libc::c_ulong>().ok())
        .unwrap_or(63);
    for cap in 0..=last {
        // SAFETY: prctl with integer arguments. EINVAL past the kernel's last cap and EPERM
        // without CAP_SETPCAP (then the bounding set cannot matter: we cannot gain caps
        // through root's exec rule without being root with them) are fine.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
    // SAFETY: as above; EINVAL on kernels without ambient capabilities.
    unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) };
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header { version: 0x2008_0522, pid: 0 }; // _LINUX_CAPABILITY_VERSION_3
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: header and two data words as capset(2) expects for version 3.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) };
    if r != 0 {
        return Err(format!("cannot drop capabilities: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn set_no_new_privs() -> Result<(), String> {
    // SAFETY: prctl with integer arguments.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if r != 0 {
        return Err(format!("PR_SET_NO_NEW_PRIVS: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn exec(argv: &[CString]) -> i32 {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: a NUL-terminated array of valid C strings that outlive the call.
    unsafe { libc::execvp(ptrs[0], ptrs.as_ptr()) };
    let e = std::io::Error::last_os_error();
    eprintln!("{MARKER} cannot run {}: {e}", argv[0].to_string_lossy());
    if e.raw_os_error() == Some(libc::ENOENT) { NOT_FOUND } else { UNAVAILABLE }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conch_seams::SandboxMode;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_string()).collect()
    }

    #[test]
    fn parse_takes_policy_runner_and_argv() {
        let json = serde_json::to_string(&SandboxPolicy::new(SandboxMode::ReadOnly, "/w")).unwrap();
        let inv =
            parse(&s(&["sandbox-exec", "--policy", &json, "--runner", "bwrap", "--", "ls", "-l"]))
                .unwrap();
        assert_eq!(inv.runner, Runner::Bwrap);
        assert_eq!(inv.argv, s(&["ls", "-l"]));
        assert!(parse(&s(&["--policy", &json, "--"])).is_err(), "no argv");
        assert!(parse(&s(&["--", "ls"])).is_err(), "no policy");
        let rel =
            serde_json::to_string(&SandboxPolicy::new(SandboxMode::WorkspaceWrite, "w")).unwrap();
        assert!(parse(&s(&["--policy", &rel, "--", "ls"])).is_err(), "relative root");
    }

    #[test]
    fn grants_skip_protected_paths_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(root.join(".git/objects")).unwrap();
        std::fs::write(root.join(".git/config"), "").unwrap();
        std::fs::write(root.join("a"), "").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        let protected = vec![root.join(".git/hooks"), root.join(".git/config")];
        let grants = writable_grants(std::slice::from_ref(&root), &protected);
        assert_eq!(grants, vec![root.join(".git/objects"), root.join("a")]);
        // Without .git the root is granted whole.
        let plain = tempfile::tempdir().unwrap();
        let plain = std::fs::canonicalize(plain.path()).unwrap();
        assert_eq!(
            writable_grants(std::slice::from_ref(&plain), &[plain.join(".git/hooks")]),
            vec![plain]
        );
    }
}
