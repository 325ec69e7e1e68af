//! The `conch-bench` binary: every benchmark behind `conch bench`, kept out of the shipped
//! `conch` binary (which links none of this and execs this binary instead, see
//! `src/cli/bench.rs`). It takes the flags of `conch bench` plus the two global ones it
//! uses, `--composition` (the `oneshot` suite's) and `--log-format`. Like `conch`, it is
//! also the sandbox runners' `sandbox-exec` helper, which they find as the running
//! executable.
//!
//! `bench.rs` holds the `oneshot` and `terminal` suites, `floors.rs` the `floors` suite and
//! the goal rows the others share, `remote_bench.rs` the `remote` suite and
//! `sandbox_bench.rs` the `sandbox` suite, `files_bench.rs` the `files` suite,
//! `swerex_bench.rs` the `swerex` suite, `e2b_bench.rs` the `e2b` suite and
//! `engine_bench.rs` the `engine` suite and `scale_bench.rs` the `scale` suite.

mod bench;
mod e2b_bench;
mod engine_bench;
mod files_bench;
mod floors;
mod remote_bench;
mod sandbox_bench;
mod scale_bench;
mod swerex_bench;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use conch::cli::logging::{self, LogFormat};
use conch::cli::{BenchArgs, BenchSuite};

#[derive(Parser)]
#[command(
    name = "conch-bench",
    version,
    about = "conch's benchmarks, as `conch bench` runs them (run `conch bench` instead)"
)]
struct Cli {
    /// Composition of the `oneshot` suite: an embedded name (standard) or a YAML file path.
    #[arg(long, default_value = conch::DEFAULT_COMPOSITION)]
    composition: String,
    /// Log lines on stderr as `text` or `json` (which events: the CONCH_LOG filter, default
    /// `warn`).
    #[arg(long, value_enum, default_value_t)]
    log_format: LogFormat,
    /// The `conch` binary the `floors` suite times (`conch call`) and the `swerex` suite
    /// serves with (`conch bench` names itself; default: the `conch` next to this binary).
    #[arg(long, value_name = "PATH")]
    conch: Option<PathBuf>,
    #[command(flatten)]
    bench: BenchArgs,
}

fn main() -> ExitCode {
    // The sandbox runners' helper defaults to the running executable, which in the
    // `sandbox` suite is this one: dispatched as `conch` does it (see `conch::cli::main`),
    // single-threaded, before clap and before any runtime starts.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(conch_provider_sandbox::exec::SUBCOMMAND) {
        let code = conch_provider_sandbox::sandbox_exec_main(&args);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = Cli::parse();
    logging::init(cli.log_format, "warn");
    // Benchmarks run many calls (and the remote suite a daemon): the worker pool, as for
    // `conch batch`.
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(run(&cli));
    // Every runtime was shut down and awaited inside `run`.
    rt.shutdown_background();
    match result {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs the chosen suite and returns its report (a table, or one JSON object per line).
async fn run(cli: &Cli) -> anyhow::Result<String> {
    let BenchArgs { suite, iterations, json } = cli.bench;
    match suite {
        BenchSuite::Remote => remote_bench::run(iterations, json).await,
        BenchSuite::Sandbox => sandbox_bench::run(iterations, json).await,
        BenchSuite::Files => files_bench::run(iterations, json).await,
        BenchSuite::Swerex => swerex_bench::run(iterations, json, &conch_binary(cli)?).await,
        BenchSuite::E2b => e2b_bench::run(iterations, json, &conch_binary(cli)?).await,
        BenchSuite::Engine => engine_bench::run(iterations, json).await,
        BenchSuite::Scale => scale_bench::run(iterations, json, &conch_binary(cli)?).await,
        BenchSuite::Floors => floors::run(iterations, json, &conch_binary(cli)?).await,
        BenchSuite::Terminal => bench::run_terminal(iterations.max(1), json).await,
        BenchSuite::Oneshot => {
            let runtime =
                conch::build_runtime(&cli.composition).map_err(|e| anyhow::anyhow!("{e}"))?;
            let report = bench::run(&runtime, iterations.max(1), json).await;
            runtime.shutdown().await;
            report
        }
    }
}

/// The `conch` binary the `floors` suite runs: the one `--conch` names, else the one next to
/// this binary (where cargo builds and installs both).
fn conch_binary(cli: &Cli) -> anyhow::Result<PathBuf> {
    if let Some(conch) = &cli.conch {
        return Ok(conch.clone());
    }
    let exe = std::env::current_exe().context("locating the conch binary")?;
    Ok(exe.with_file_name("conch"))
}
