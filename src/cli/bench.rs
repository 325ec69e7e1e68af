//! `conch bench`: hands the command to the `conch-bench` binary, which holds every benchmark,
//! so the shipped `conch` links none of them (their raw-process floors and their in-process
//! daemon included).
//!
//! `conch` parses the flags itself (its `--help` and its refusal of a wrong value stay its
//! own) and then execs `conch-bench` with them spelled out in full: the one next to the
//! running executable first (the pair `cargo build` and `cargo install` put side by side),
//! then the one on PATH. Exec, not spawn: the benchmark becomes this process, so its
//! output, exit code and signals are the command's without a relay. This is the CLI
//! replacing itself, not a process it manages, which is why it may name
//! `std::process::Command` outside the local provider (`tests/it/tidy.rs` lists it).

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};

use clap::ValueEnum as _;
use conch_seams::ErrorCode;

use super::BenchArgs;
use super::logging::LogFormat;

/// The file name of the benchmark binary `conch bench` runs.
pub const BENCH_BINARY: &str = "conch-bench";

/// The cargo command that builds the benchmark binary next to this one: the same profile.
const BUILD: &str = if cfg!(debug_assertions) { "cargo build" } else { "cargo build --release" };

/// Why `conch bench` could not run the benchmark binary.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// No `conch-bench` next to the running executable nor on PATH.
    #[error(
        "`conch bench` runs the `{BENCH_BINARY}` binary, which is neither next to {exe} nor on \
         PATH; build it with `{build} --bin {BENCH_BINARY}` (`{build}` and `cargo install --path \
         .` build it with `conch`; `cargo run` does not)",
        build = BUILD
    )]
    NotFound {
        /// Where the running executable is (or why that is unknown).
        exe: String,
    },
    /// A `conch-bench` was found but could not be executed.
    #[error("cannot run {}: {source}", path.display())]
    Exec {
        /// The binary that failed to start.
        path: PathBuf,
        /// What exec reported.
        source: std::io::Error,
    },
}

impl BenchError {
    /// The stable code of this error.
    #[must_use]
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotFound { .. } => ErrorCode::NotFound,
            Self::Exec { .. } => ErrorCode::SpawnFailed,
        }
    }
}

/// The arguments `conch-bench` receives: every flag, the defaults included, so what runs
/// does not depend on the two binaries agreeing on a default, and `--conch` naming this
/// executable, whose `conch call` process the `floors` suite times.
fn forwarded(
    args: &BenchArgs,
    composition: &str,
    log_format: LogFormat,
    exe: Option<&Path>,
) -> Vec<OsString> {
    let name = |v: Option<clap::builder::PossibleValue>| {
        v.map(|v| v.get_name().to_string()).unwrap_or_default()
    };
    let mut out: Vec<OsString> = vec![
        "--composition".into(),
        composition.into(),
        "--log-format".into(),
        name(log_format.to_possible_value()).into(),
        "--suite".into(),
        name(args.suite.to_possible_value()).into(),
        "--iterations".into(),
        args.iterations.to_string().into(),
    ];
    if args.json {
        out.push("--json".into());
    }
    if let Some(exe) = exe {
        out.extend(["--conch".into(), exe.as_os_str().to_owned()]);
    }
    out
}

/// Replaces this process with `conch-bench` run on `args`; returns only when no benchmark
/// binary could be executed.
pub(super) fn exec(args: &BenchArgs, composition: &str, log_format: LogFormat) -> BenchError {
    let exe = std::env::current_exe();
    let argv = forwarded(args, composition, log_format, exe.as_deref().ok());
    if let Ok(exe) = &exe
        && let Some(dir) = exe.parent()
    {
        let sibling = dir.join(BENCH_BINARY);
        let source = std::process::Command::new(&sibling).args(&argv).exec();
        // A sibling that exists but cannot run is reported, not skipped for another one.
        if source.kind() != std::io::ErrorKind::NotFound {
            return BenchError::Exec { path: sibling, source };
        }
    }
    // A bare name: exec searches PATH.
    let source = std::process::Command::new(BENCH_BINARY).args(&argv).exec();
    if source.kind() != std::io::ErrorKind::NotFound {
        return BenchError::Exec { path: PathBuf::from(BENCH_BINARY), source };
    }
    let exe = match exe {
        Ok(exe) => exe.display().to_string(),
        Err(e) => format!("the running executable (unknown: {e})"),
    };
    BenchError::NotFound { exe }
}
