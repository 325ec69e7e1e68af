//! The subprocess seam: the execution world (argv spawn, byte streams, tree kill, PTYs).
//!
//! Everything that touches processes happens behind this seam, in the provider that owns the
//! world: cwd checks, the environment scrub, process-group kills, PTY foreground lookups, the
//! stdin-wait probe and terminal teardown. Callers above it never see a pid they could signal
//! themselves, so the same consumer works over a local, sandboxed or remote provider.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::{Result, Signal};

/// Environment overlay applied after the provider's scrub: `Some` sets, `None` unsets.
pub type EnvOverlay = BTreeMap<String, Option<String>>;

/// Durations travel as whole milliseconds (`grace_ms`, `drain_ms`).
#[cfg(feature = "serde")]
pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// What the child's stdin is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "kind", rename_all = "snake_case"))]
#[non_exhaustive]
pub enum StdinSpec {
    /// `/dev/null`.
    #[default]
    Null,
    /// These bytes, then EOF.
    Bytes {
        /// The bytes.
        data: Vec<u8>,
    },
    /// A pipe the caller writes with [`Process::write_stdin`].
    Pipe,
}

impl StdinSpec {
    /// Stdin that delivers `data`, then EOF.
    pub fn bytes(data: impl Into<Vec<u8>>) -> Self {
        StdinSpec::Bytes { data: data.into() }
    }
}

/// What happens to one output stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "kind", rename_all = "snake_case"))]
#[non_exhaustive]
pub enum OutputSpec {
    /// Discarded (`/dev/null`).
    #[default]
    Null,
    /// Collected by the provider: the last `max_bytes` stay in memory, the whole stream is
    /// spilled to a private 0600 file until it passes `spill_cap` bytes. A provider may
    /// also evict a finished stream's spill under limits of its own (total size, age);
    /// reads then say so with `spill_evicted`.
    Collect {
        /// Tail bytes kept in memory.
        max_bytes: usize,
        /// Largest complete spill; past it the spill is deleted.
        spill_cap: u64,
    },
    /// Stderr only: written into the stdout collector, interleaved in arrival order.
    MergeIntoStdout,
}

/// Which collected stream a read addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum StreamId {
    /// Standard output (and merged stderr).
    Stdout,
    /// Standard error when collected separately.
    Stderr,
}

/// What settlement waits for once the direct child has exited.
///
/// A child's background descendants inherit its output pipes, so EOF can come long after
/// the child itself is gone (`sleep 600 & echo started`), or never (`setsid daemon &`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "mode", rename_all = "snake_case"))]
#[non_exhaustive]
pub enum AfterExit {
    /// Settle when every collected stream reaches EOF, however long that takes. A kill
    /// still settles: processes holding the pipes are stopped after the group is gone.
    #[default]
    WaitForEof,
    /// Give processes left behind `drain` to finish by themselves, then stop every
    /// process still in the child's group, still holding one of its output pipes, or
    /// otherwise known to the provider as started by the child (detached ones too, where
    /// the provider can tell: subprocess-local marks every descendant)
    /// (TERM → grace → KILL), seal the streams and settle. Nothing the command left
    /// attached outlives the call; the stopped processes are reported as leftovers.
    StopLeftovers {
        /// How long leftovers may run on after the direct child exits.
        #[cfg_attr(feature = "serde", serde(rename = "drain_ms", with = "millis"))]
        drain: Duration,
    },
}

/// A process that was still running after the direct child exited and was stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Leftover {
    /// Its pid (in the provider's world).
    pub pid: u32,
    /// Its command name (`comm`).
    pub name: String,
    /// True when it held one of the collected output pipes (it kept the output open).
    pub held_output: bool,
}

/// Whose filesystem a path belongs to. A spill path is only meaningful in the world that
/// wrote it; a remote provider's spill lives on the remote machine, where the model reads it
/// with the same (remote) tools.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "kind", rename_all = "snake_case"))]
#[non_exhaustive]
pub enum World {
    /// This machine: the process conch runs in can open the path.
    #[default]
    Local,
    /// Another machine or container, named by its provider (for example a daemon URL).
    Remote {
        /// Who holds the file.
        name: String,
    },
}

/// A spill file: the complete output of a stream, in the world that wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SpillRef {
    /// Whose filesystem holds it.
    pub world: World,
    /// The path there.
    pub path: PathBuf,
}

impl SpillRef {
    /// A spill on this machine.
    pub fn local(path: impl Into<PathBuf>) -> Self {
        Self { world: World::Local, path: path.into() }
    }
}

impl fmt::Display for SpillRef {
    /// The path as the model reads it (the tools it has run in the same world).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())
    }
}

/// Everything a spawn needs; the provider guesses nothing.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct SpawnSpec {
    /// `argv[0]` is the executable (resolved on the provider's PATH); no shell interpretation.
    pub argv: Vec<String>,
    /// Working directory; must exist in the provider's world. `None` is the provider's
    /// default directory, and a relative path is resolved against it.
    pub cwd: Option<PathBuf>,
    /// Stdin disposition.
    pub stdin: StdinSpec,
    /// Stdout disposition.
    pub stdout: OutputSpec,
    /// Stderr disposition.
    pub stderr: OutputSpec,
    /// Time between TERM and KILL when the tree is killed.
    #[cfg_attr(feature = "serde", serde(rename = "grace_ms", with = "millis"))]
    pub grace: Duration,
    /// Cancelling this kills the tree. Local to the caller: never on the wire.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub cancel: CancellationToken,
    /// Applied after the scrub.
    pub env: EnvOverlay,
    /// What settlement waits for after the direct child exits.
    pub after_exit: AfterExit,
    /// Bytes of each collected stream kept in memory beyond its `max_bytes`, so that a
    /// replica elsewhere (a remote client) can be replayed what it missed. Offset reads
    /// reach into them; summaries and the spill threshold still follow `max_bytes`.
    /// 0 for ordinary callers.
    #[cfg_attr(feature = "serde", serde(default))]
    pub replay_bytes: usize,
}

impl SpawnSpec {
    /// A spec with null stdio, a 3 s grace and a fresh cancel token.
    pub fn new(argv: Vec<String>, cwd: impl Into<PathBuf>) -> Self {
        Self::in_default_dir(argv).with_cwd(Some(cwd.into()))
    }

    /// A spec that runs in the provider's default directory.
    pub fn in_default_dir(argv: Vec<String>) -> Self {
        Self {
            argv,
            cwd: None,
            stdin: StdinSpec::Null,
            stdout: OutputSpec::Null,
            stderr: OutputSpec::Null,
            grace: Duration::from_secs(3),
            cancel: CancellationToken::new(),
            env: EnvOverlay::new(),
            after_exit: AfterExit::WaitForEof,
            replay_bytes: 0,
        }
    }

    /// Keeps `bytes` more of each collected stream in memory for replay (see the field).
    #[must_use]
    pub fn with_replay_bytes(mut self, bytes: usize) -> Self {
        self.replay_bytes = bytes;
        self
    }

    /// Sets the working directory (`None`: the provider's default).
    #[must_use]
    pub fn with_cwd(mut self, cwd: Option<PathBuf>) -> Self {
        self.cwd = cwd;
        self
    }

    /// Sets what settlement waits for after the direct child exits.
    #[must_use]
    pub fn with_after_exit(mut self, after_exit: AfterExit) -> Self {
        self.after_exit = after_exit;
        self
    }

    /// Sets stdin.
    #[must_use]
    pub fn with_stdin(mut self, stdin: StdinSpec) -> Self {
        self.stdin = stdin;
        self
    }

    /// Sets stdout.
    #[must_use]
    pub fn with_stdout(mut self, out: OutputSpec) -> Self {
        self.stdout = out;
        self
    }

    /// Sets stderr.
    #[must_use]
    pub fn with_stderr(mut self, err: OutputSpec) -> Self {
        self.stderr = err;
        self
    }

    /// Sets the kill grace.
    #[must_use]
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Sets the cancel token.
    #[must_use]
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Sets (`Some`) or unsets (`None`) one variable after the scrub.
    #[must_use]
    pub fn with_env(mut self, key: impl Into<String>, value: Option<String>) -> Self {
        self.env.insert(key.into(), value);
        self
    }
}

/// How a process ended. A non-zero exit is data, not an error.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ExitStatus {
    /// Exit code, `None` when killed by a signal.
    pub code: Option<i32>,
    /// Signal name such as `SIGKILL`, when killed by one. A name rather than a [`Signal`],
    /// because a process can die of signals nobody may send through a seam (`SIGSEGV`).
    pub signal: Option<String>,
}

impl ExitStatus {
    /// An exit with `code`.
    pub fn code(code: i32) -> Self {
        Self { code: Some(code), signal: None }
    }

    /// Death by the signal named `name`.
    pub fn signal(name: impl Into<String>) -> Self {
        Self { code: None, signal: Some(name.into()) }
    }

    /// True for a zero exit code.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// One offset read of a collected stream.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StreamRead {
    /// The bytes returned.
    pub data: Vec<u8>,
    /// Stream offset of `data[0]` (greater than the requested offset when `lossy`).
    pub start_offset: u64,
    /// Where the next contiguous read starts.
    pub next_offset: u64,
    /// True when bytes between the requested offset and `start_offset` were dropped from
    /// memory; the retained tail was returned instead of a fake contiguous delta.
    pub lossy: bool,
    /// The spill file, only while it holds the complete stream so far.
    pub spill: Option<SpillRef>,
    /// True when the stream had a complete spill that the provider evicted under its spill
    /// limits (`spill` is then `None`): the full output existed and is gone, which is not
    /// the same as a stream that outgrew its spill cap.
    #[cfg_attr(feature = "serde", serde(default))]
    pub spill_evicted: bool,
    /// True once the stream reached EOF and was sealed.
    pub sealed: bool,
}

/// Summary of a collected stream (for final results).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CollectedOutput {
    /// The retained tail as text (UTF-8 safe: a partial leading code point is cut).
    pub text: String,
    /// Exact count of bytes the stream produced.
    pub total_bytes: u64,
    /// Bytes dropped from the head (`total_bytes` minus retained bytes).
    pub omitted_bytes: u64,
    /// The complete spill file, if still complete.
    pub spill: Option<SpillRef>,
    /// True when the complete spill was evicted under the provider's spill limits (see
    /// [`StreamRead::spill_evicted`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub spill_evicted: bool,
    /// True when bytes were dropped and `text` begins inside a line (one line longer than
    /// the whole tail); otherwise a cut tail begins at a line start.
    #[cfg_attr(feature = "serde", serde(default))]
    pub starts_mid_line: bool,
}

/// What a process provider can do.
///
/// Field names say what the provider can *prove*, not what it attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct SubprocessCapabilities {
    /// `spawn_terminal` works.
    pub terminals: bool,
    /// Tree kill proves group disappearance (not just direct-child exit).
    pub group_liveness: bool,
    /// [`TerminalProcess::observe`] can see a foreground task waiting for input (without
    /// it, `stdin` is never [`StdinWait::Waiting`]: a terminal with a foreground group is
    /// [`StdinWait::Unavailable`]).
    pub stdin_probe: bool,
}

/// A live (or finished) process. Handles are cheap to share behind `Arc`.
///
/// # Contract
/// - `wait_exit` resolves when the direct child exits; `wait` resolves at settlement:
///   the child exited and its collected streams reached EOF or were sealed as
///   [`SpawnSpec::after_exit`] says.
/// - `kill` is idempotent and returns once the provider has taken the request (for a remote
///   provider: once the daemon confirmed it); the TERM → grace → KILL escalation runs in
///   the background and keeps probing group liveness after the direct child is gone.
///   After a kill, settlement is bounded even when an escaped process holds a pipe.
/// - `kill`, `close_stdin` and `release` report a request that could not be delivered as an
///   `Err`: a caller never assumes a kill happened.
///
/// # Errors
/// The waits fail only when the provider lost its world (a remote daemon went away): that is
/// never reported as an exit.
#[async_trait]
pub trait Process: Send + Sync + fmt::Debug {
    /// Pid of the direct child in the provider's world (None when not exposed); for
    /// diagnostics only, callers never signal it themselves.
    fn pid(&self) -> Option<u32>;
    /// Waits for settlement (see contract).
    ///
    /// # Errors
    /// The provider lost track of the process (transport gone).
    async fn wait(&self) -> Result<ExitStatus>;
    /// Waits for the direct child's exit only; streams may still be open.
    ///
    /// # Errors
    /// As [`Process::wait`].
    async fn wait_exit(&self) -> Result<ExitStatus>;
    /// Processes stopped because they outlived the direct child (final after `wait`).
    fn leftovers(&self) -> Vec<Leftover>;
    /// The exit status if already settled.
    fn try_status(&self) -> Option<ExitStatus>;
    /// Reads a collected stream from a caller-owned offset, at most `max_bytes`.
    ///
    /// # Errors
    /// `invalid_argument` when the stream is not collected.
    fn read(&self, stream: StreamId, offset: u64, max_bytes: usize) -> Result<StreamRead>;
    /// Resolves once a collected stream holds bytes at or past `offset`, or is sealed, so a
    /// reader can wait for output instead of polling [`Process::read`]. It says nothing about
    /// whether those bytes are still retained (a read tells, with `lossy`).
    ///
    /// # Errors
    /// `invalid_argument` when the stream is not collected; as [`Process::wait`].
    async fn readable(&self, stream: StreamId, offset: u64) -> Result<()>;
    /// A summary of a collected stream (None when not collected).
    fn collected(&self, stream: StreamId) -> Option<CollectedOutput>;
    /// Writes to a piped stdin.
    ///
    /// # Errors
    /// `invalid_argument` when stdin is not a pipe; `io` when the child closed it.
    async fn write_stdin(&self, data: &[u8]) -> Result<()>;
    /// Closes a piped stdin (EOF for the child); a no-op when stdin is not a pipe.
    ///
    /// # Errors
    /// The request could not be delivered (a remote provider lost its daemon).
    async fn close_stdin(&self) -> Result<()>;
    /// Requests a tree kill (TERM, grace, KILL).
    ///
    /// # Errors
    /// The request could not be delivered (a remote provider lost its daemon): the process
    /// may still run.
    async fn kill(&self) -> Result<()>;
    /// Resolves once the whole process group is gone (the liveness proof).
    ///
    /// # Errors
    /// As [`Process::wait`].
    async fn wait_group_gone(&self) -> Result<()>;
    /// Releases retained output: a spill file is deleted and never published again. For
    /// owners that are done with the output (a deleted job record); reads keep working on
    /// what is still in memory.
    ///
    /// # Errors
    /// The request could not be delivered (a remote provider lost its daemon).
    async fn release(&self) -> Result<()>;
}

/// Terminal size in cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TerminalSize {
    /// Height in character rows.
    pub rows: u16,
    /// Width in character columns.
    pub cols: u16,
}

impl Default for TerminalSize {
    fn default() -> Self {
        Self { rows: 24, cols: 200 }
    }
}

/// A PTY spawn request.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct TerminalSpawnSpec {
    /// `argv[0]` is the executable.
    pub argv: Vec<String>,
    /// Working directory, validated by the provider (never silently replaced by $HOME);
    /// `None` is the provider's default directory, a relative path is resolved against it.
    pub cwd: Option<PathBuf>,
    /// Applied after the scrub.
    pub env: EnvOverlay,
    /// Initial size.
    pub size: TerminalSize,
}

impl TerminalSpawnSpec {
    /// A spec with the default size and no overlay.
    pub fn new(argv: Vec<String>, cwd: impl Into<PathBuf>) -> Self {
        Self { cwd: Some(cwd.into()), ..Self::in_default_dir(argv) }
    }

    /// A spec that starts in the provider's default directory.
    pub fn in_default_dir(argv: Vec<String>) -> Self {
        Self { argv, cwd: None, env: EnvOverlay::new(), size: TerminalSize::default() }
    }
}

/// How much one [`TerminalProcess::observe`] sample looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Probe {
    /// Only who owns the foreground (cheap: no process scan).
    Foreground,
    /// The foreground and the exact stdin-wait probe.
    Stdin,
}

/// What the stdin-wait probe saw in the terminal's foreground group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum StdinWait {
    /// A foreground task was positively seen blocked waiting for input on the terminal.
    Waiting,
    /// Every foreground task was examined and none waits on the terminal.
    NotWaiting,
    /// The provider could not tell (no probe on this platform, no permission to inspect a
    /// task). Never a guess either way: consumers treat it as "not seen waiting".
    Unavailable,
    /// The sample did not ask for the probe ([`Probe::Foreground`]).
    NotProbed,
}

/// One readiness sample of a terminal, taken in the provider's world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TerminalObservation {
    /// The foreground process group, as an identity in the provider's world (compare for
    /// equality only); `None` when the terminal has no foreground group.
    pub foreground: Option<i32>,
    /// True when the leader's own group owns the foreground (a shell at its prompt).
    pub leader_owns_foreground: bool,
    /// The stdin-wait probe's answer.
    pub stdin: StdinWait,
    /// Total output bytes `read_chunk` had handed out when the sample was taken.
    pub delivered_bytes: u64,
    /// The provider held output it had not handed out yet. A consumer that has taken in
    /// `delivered_bytes` and sees no pending output knows the output written before the
    /// sample (a prompt printed before a blocking read) has reached it.
    pub output_pending: bool,
    /// What the foreground group was doing with the CPU ([`Probe::Stdin`] samples only;
    /// `None` when not sampled, or the provider cannot tell).
    #[cfg_attr(feature = "serde", serde(default))]
    pub cpu: Option<ForegroundCpu>,
}

/// The foreground group's CPU use at one sample: a program that is still computing (or
/// waiting for a CPU on a loaded machine) is busy even while it prints nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ForegroundCpu {
    /// Some task of the group was running or waiting for a CPU (state `R`), or a member
    /// exited and waits for a reaper outside the group (the job is over: the shell is about
    /// to take the terminal back).
    pub busy: bool,
    /// CPU time (user + system, in clock ticks) the group's current members have used so
    /// far. Compare two samples of the same group: any change means it ran in between (or
    /// its membership changed).
    pub ticks: u64,
}

/// Which foreground group a signal may reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ForegroundTarget {
    /// Whatever group is in the foreground, the leader's included.
    Any,
    /// Only a group other than the leader's; when the leader owns the foreground, nothing
    /// is sent (checked in the same step as the delivery).
    NotLeader,
}

/// A delivered foreground signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SignalDelivery {
    /// The group that got it (an identity in the provider's world).
    pub pgid: i32,
    /// True when that group is the leader's.
    pub leader: bool,
}

/// The result of [`TerminalProcess::terminate`].
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TeardownReport {
    /// The leader's exit; `None` when it was left running because descendants survived
    /// (it anchors the tree so a retry can still find them).
    pub leader: Option<ExitStatus>,
    /// Pids still alive after teardown; empty means every descendant is proven gone.
    pub survivors: Vec<u32>,
}

/// A process on a PTY. Output arrives as chunks; the terminal backend does the parsing.
///
/// # Contract
/// - `read_chunk` returns `Ok(None)` only at EOF (every slave fd closed); a lost transport
///   is an `Err`, never EOF. `wait` likewise never reports a transport loss as an exit.
/// - `observe`, `signal_foreground`, `resize` and `terminate` run in the provider's world;
///   the caller never needs the pids they act on.
/// - `terminate` stops every descendant of the leader, and every process the provider knows
///   the terminal started even if it detached (identified by pid and start time, so a
///   recycled pid is never signalled), children first, TERM → grace → KILL, rescanning for
///   processes forked meanwhile and verifying they are gone; only then the leader (HUP,
///   grace, KILL) is stopped and reaped, then anything it started still running. After the
///   leader exited by itself, what it started is still stopped. Survivors are listed, never
///   hidden.
#[async_trait]
pub trait TerminalProcess: Send + Sync + fmt::Debug {
    /// Pid of the session leader in the provider's world (diagnostics only).
    fn pid(&self) -> Option<u32>;
    /// Next chunk of PTY output; `Ok(None)` at EOF.
    ///
    /// # Errors
    /// The transport to the provider's world was lost.
    async fn read_chunk(&self) -> Result<Option<Vec<u8>>>;
    /// Writes bytes to the master.
    ///
    /// # Errors
    /// `io` when the PTY is gone.
    async fn write(&self, data: &[u8]) -> Result<()>;
    /// One readiness sample: who owns the foreground, and (with [`Probe::Stdin`]) whether a
    /// foreground task waits for input on the terminal.
    ///
    /// # Errors
    /// The provider could not look at its world at all (transport gone).
    async fn observe(&self, probe: Probe) -> Result<TerminalObservation>;
    /// Sends `signal` to the terminal's current foreground process group; `Ok(None)` when
    /// `target` excluded the group that owns the foreground.
    ///
    /// # Errors
    /// `not_found` when the terminal has no foreground group; `permission_denied`.
    async fn signal_foreground(
        &self,
        signal: Signal,
        target: ForegroundTarget,
    ) -> Result<Option<SignalDelivery>>;
    /// Resizes the terminal.
    ///
    /// # Errors
    /// `io` when the PTY is gone.
    async fn resize(&self, size: TerminalSize) -> Result<()>;
    /// Tears down the leader's tree (see the contract) and reports what is left.
    ///
    /// # Errors
    /// The transport to the provider's world was lost.
    async fn terminate(&self, grace: Duration) -> Result<TeardownReport>;
    /// Waits for the leader to exit.
    ///
    /// # Errors
    /// The transport to the provider's world was lost.
    async fn wait(&self) -> Result<ExitStatus>;
    /// The leader's status if it already exited.
    fn try_status(&self) -> Option<ExitStatus>;
}

/// The subprocess seam.
///
/// # Contract
/// - MUST scrub the ambient environment (names matching KEY|PASSWORD|SECRET|TOKEN
///   case-insensitively, and every CONCH_* name) before applying the overlay.
/// - MUST put each spawned child in its own process group and kill trees, not pids.
/// - MUST check the working directory itself (callers compute no filesystem facts).
/// - `spawn` returns as soon as the child exists; spawn failure is an `Err`, exit is data.
/// - `shutdown` kills and reaps everything still live and releases retained output.
///
/// # Cancellation
/// Cancelling `SpawnSpec::cancel` is the same as [`Process::kill`].
#[async_trait]
pub trait Subprocess: Send + Sync + fmt::Debug + 'static {
    /// Provider name for diagnostics.
    fn provider_name(&self) -> &'static str;
    /// What this provider supports.
    fn capabilities(&self) -> SubprocessCapabilities;
    /// Resolves an executable on the provider's PATH: `Ok(None)` when it is not there.
    ///
    /// # Errors
    /// The provider could not look (a remote provider lost its daemon): never reported as
    /// "not found".
    async fn which(&self, program: &str) -> Result<Option<PathBuf>>;
    /// Keeps `text` as a spill file in this provider's world, under the same limits and for
    /// as long as the spills of the streams it collects, so that a result can name the
    /// whole of output it had to cut (a terminal send's, a framed command's). `Ok(None)`: this
    /// provider keeps no such spills, or `text` is over its spill cap.
    ///
    /// # Errors
    /// The provider could not be asked (a remote provider lost its daemon).
    async fn keep_spill(&self, text: Vec<u8>) -> Result<Option<SpillRef>>;
    /// Starts a process.
    ///
    /// # Errors
    /// `spawn_failed` (missing executable, bad cwd), `invalid_argument` (empty argv).
    async fn spawn(&self, spec: SpawnSpec) -> Result<Arc<dyn Process>>;
    /// Starts a process on a new PTY.
    ///
    /// # Errors
    /// `unsupported` when `capabilities().terminals` is false; `spawn_failed` otherwise.
    async fn spawn_terminal(&self, spec: TerminalSpawnSpec) -> Result<Arc<dyn TerminalProcess>>;
    /// Kills and reaps every live process this provider started (with their trees, detached
    /// parts included where the provider can tell), and deletes the spill files it still
    /// holds.
    async fn shutdown(&self);
}
