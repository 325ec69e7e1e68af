//! The `conch` command line: list and call tools, run JSON-lines batches, check compositions,
//! run the conformance suites, serve a remote sandbox, and benchmark. It lives in the
//! library so that a binary linking more plugins (a provider's own, or a test's) is the same
//! CLI: `fn main() -> ExitCode { my_provider::register(); conch::cli::main() }`.
//!
//! `anyhow` is used here and nowhere else in the library. `sandboxd.rs` is the daemon's entry,
//! `conformance.rs` the conformance command, `logging.rs` the subscriber (`CONCH_LOG`,
//! `--log-format`), and `bench.rs` hands `conch bench` to the `conch-bench` binary, which holds
//! the benchmarks. The sandbox helper, `conch sandbox-exec`, and `conch bench` are dispatched in
//! `main` before any runtime starts.
//!
//! `call` waits for the jobs its call started (their notices and `job_output` results follow the
//! result), and SIGTERM or SIGINT to `call` or `batch` cancels the call in flight and disposes the
//! owner before the providers shut down, as `mcp` does.

mod bench;
mod conformance;
mod e2b;
mod image;
pub mod logging;
mod sandboxd;
mod strict_json;
mod swerex;

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use conch_jobs::{NoticeRoute, RoutingSink};
use conch_seams::{Error, ErrorCode, Notice, NoticeSink, Owner, ToolOutput};

#[derive(Parser)]
#[command(name = "conch", version, about = "execution framework for AI-agent harnesses")]
struct Cli {
    /// Composition: an embedded name (standard; swerex for swerex-remote) or a YAML file path.
    #[arg(long, global = true, default_value = crate::DEFAULT_COMPOSITION)]
    composition: String,
    /// Whether `--composition` was given (a command with a default of its own uses that
    /// otherwise).
    #[arg(skip)]
    composition_given: bool,
    /// Log lines on stderr as `text` or `json` (which events: the CONCH_LOG filter, default
    /// `warn`).
    #[arg(long, global = true, value_enum, default_value_t)]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The benchmark suites of `conch bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchSuite {
    /// The one-shot bash tool next to raw `bash -c true`.
    Oneshot,
    /// Raw PTY vs terminal_send vs persistent bash, and time to stdin_read.
    Terminal,
    /// Every latency/throughput goal next to its floor measured in the same run.
    Floors,
    /// The same calls local and through a `conch sandboxd` on loopback.
    Remote,
    /// bash-sandbox under each runner next to bash-local.
    Sandbox,
    /// The files seam: 1 GiB through files-local next to `cat`, remote next to local, and a
    /// small `file_edit` round trip remote next to local.
    Files,
    /// `conch swerex-remote` next to swe-rex's own server (`CONCH_SWEREX_SERVER` names it):
    /// `run_in_session("echo x")` and `execute(["true"])`.
    Swerex,
    /// `conch e2b` through the e2b SDK (`CONCH_E2B_PYTHON` names its venv's python) next to
    /// the same work through conch's own tools and files seam: `commands.run("true")` and a
    /// 50 MiB `files.write` + `files.read`.
    E2b,
    /// Sandboxes on the local Docker engine: create to first command, cold and from a warm
    /// pool, one and twenty at once, next to `docker run --rm IMAGE true`; an idle sandbox's
    /// memory.
    Engine,
    /// One runtime holding 1,000 terminals and 1,000 background jobs (open, send, idle CPU,
    /// threads, teardown), the floors a busy runtime keeps (terminal_send, stdin_read, 1 GB
    /// one-shot and background, the `conch call` process), and the daemon with 100 clients.
    Scale,
}

#[derive(Subcommand)]
// A subcommand's arguments are built only when it is the one invoked: building every one of
// them touched code across the whole binary, about 0.7 ms of each `conch call`'s start and exit.
// Built late, an argument struct's doc comment would replace the subcommand's help line, so
// those structs carry plain comments (`a_subcommand_s_help_line_is_its_own` checks each).
#[command(defer = true)]
enum Command {
    /// Print the composition's tools (name, description, input schema) as JSON.
    Tools,
    /// Call one tool with JSON arguments and print its result.
    Call {
        /// Tool name.
        tool: String,
        /// JSON arguments object.
        #[arg(default_value = "{}")]
        args: String,
        /// Print `{"text", "structured"}` JSON instead of the text.
        #[arg(long)]
        json: bool,
    },
    /// Read one JSON tool call per stdin line (`{"tool": ..., "args": {...}, "id": ...}`, `id`
    /// optional), run them in one runtime as one owner, and print exactly one JSON result
    /// per input line (a blank or malformed line gets an error naming its line number),
    /// echoing `id`.
    Batch,
    /// Serve the composition's tools to one MCP client over stdio (JSON-RPC frames on
    /// stdin/stdout, nothing else on stdout) until stdin closes or SIGTERM/SIGINT; every job
    /// and terminal of the session is stopped before exit.
    Mcp,
    /// Validate a composition file (or embedded name): it must build and offer at least one
    /// tool; exit non-zero with the error otherwise.
    Check {
        /// File path or embedded name (default: the `--composition` one).
        file: Option<String>,
    },
    /// List registered plugins.
    Plugins,
    /// The sandbox runners' helper: confine this process under the policy, then exec the
    /// command (`sandbox-exec --policy <json> [--runner landlock|bwrap] -- argv...`).
    /// Handled before the runtime starts; listed here for `--help`.
    SandboxExec {
        /// `--policy <json> [--runner R] -- argv...`
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the conformance suites against the providers the composition binds and print
    /// one row per case (PASS, FAIL or SKIP, milliseconds, the failure message); exit 1 if
    /// any case failed.
    Conformance(conformance::Args),
    /// Serve this composition's subprocess provider to `remote-sandbox` clients over RXP/1
    /// (HTTP + WebSocket) until SIGTERM/SIGINT.
    Sandboxd(conch_frontend_sandboxd::Args),
    /// Serve SWE-ReX's HTTP API (swe-rex 1.4.0's `swerex-remote`) from this composition until
    /// SIGTERM/SIGINT; `conch` run under the name `swerex-remote` is this command.
    SwerexRemote(swerex::Args),
    /// Serve E2B's envd (the protocol the `e2b` SDK speaks to a sandbox) from this
    /// composition's subprocess and files seams until SIGTERM/SIGINT (docs/e2b.md).
    E2b(e2b::Args),
    /// The conch container image: `conch image build` makes `conch-sandbox:<version>` on the
    /// local Docker engine, offline (docs/engine.md).
    #[command(subcommand)]
    Image(image::ImageCommand),
    /// Exit 0 when every URL answers 2xx (or 401 or 403: up, and asking for its key); the
    /// image's health check.
    Health {
        /// `http://HOST:PORT/PATH` URLs.
        urls: Vec<String>,
    },
    /// Benchmarks: `oneshot` (bash tool vs raw `bash -c true`), `terminal` (raw PTY vs
    /// terminal_send vs persistent bash, and time to stdin_read), `floors` (every goal
    /// next to its floor measured in the same run, with the ratio), or `remote` (the same
    /// calls local and through a `conch sandboxd` started on loopback in this process), or
    /// `sandbox` (bash-sandbox under each runner next to bash-local).
    ///
    /// The benchmarks are the `conch-bench` binary (the `conch` binary links none of them):
    /// this command runs the one next to `conch`, else the one on PATH, with these flags.
    Bench(BenchArgs),
}

// Not a doc comment: it would replace the subcommand's help line (see `defer` on the CLI's
// `Command`).
// The flags of `conch bench`: `conch` parses them (so `--help` and a wrong value are its
// own) and hands them to `conch-bench`, which parses the same definition.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Which benchmark.
    #[arg(long, value_enum, default_value_t = BenchSuite::Oneshot)]
    pub suite: BenchSuite,
    /// Iterations per measurement.
    #[arg(long, default_value_t = 50)]
    pub iterations: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs the `conch` command line on this process's arguments and returns its exit code.
pub fn main() -> ExitCode {
    // `conch sandbox-exec --policy <json> [--runner R] -- argv...` is the sandbox runners'
    // re-exec helper. It must stay a single-threaded process until it execs the command
    // (Landlock and seccomp apply to the calling thread, and `close_range` must not pull a
    // descriptor from under a runtime), so it is dispatched before clap and before any
    // runtime starts. It returns only when it could not exec.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(conch_provider_sandbox::exec::SUBCOMMAND) {
        let code = conch_provider_sandbox::sandbox_exec_main(&args);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Run under the name `swerex-remote` (a link in an image), conch is that server, taking
    // its flags as SWE-ReX's deployments pass them.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let argv: Vec<std::ffi::OsString> =
        if std::path::Path::new(&argv0).file_name().is_some_and(|n| n == "swerex-remote") {
            ["conch", "swerex-remote"]
                .map(Into::into)
                .into_iter()
                .chain(args.iter().map(Into::into))
                .collect()
        } else {
            std::env::args_os().collect()
        };
    let cli = parse_cli(argv);
    if let Command::Bench(args) = &cli.command {
        // Replaces this process with `conch-bench`, which then owns stdout, the exit code
        // and signals; it returns only when no benchmark binary could be run.
        let e = bench::exec(args, &cli.composition, cli.log_format);
        eprintln!("error[{}]: {e}", e.code());
        return ExitCode::from(2);
    }
    // A daemon reports its lifecycle; one-shot commands only what went wrong.
    // The MCP library warns (in its own debug format) about every error response it sends,
    // which a client already got as a protocol frame; by default only its errors show.
    let default_level = match cli.command {
        Command::Sandboxd(_) | Command::SwerexRemote(_) | Command::E2b(_) => "info",
        Command::Mcp => "warn,rmcp=error",
        _ => "warn",
    };
    logging::init(cli.log_format, default_level);
    // One call, one check or one listing is a single task with a few helpers: a
    // current-thread runtime starts in a fraction of the time (no worker threads, no CPU
    // quota probe). Batches run many calls and keep the worker pool.
    let builder = match cli.command {
        Command::Batch
        | Command::Sandboxd(_)
        | Command::SwerexRemote(_)
        | Command::E2b(_)
        | Command::Mcp
        | Command::Conformance(_) => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let rt = match { builder }.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(run(cli));
    // Every provider was shut down and awaited inside `run`; what is left (idle blocking
    // threads) needs no orderly join before exit.
    rt.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Parses the command line (exiting with clap's message on a bad one), noting whether
/// `--composition` was given.
fn parse_cli(argv: Vec<std::ffi::OsString>) -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches_from(argv);
    let given = |m: &clap::ArgMatches| {
        m.value_source("composition").is_some_and(|s| s != clap::parser::ValueSource::DefaultValue)
    };
    // A global flag written after the subcommand is in the subcommand's matches.
    let composition_given =
        given(&matches) || matches.subcommand().is_some_and(|(_, sub)| given(sub));
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.composition_given = composition_given;
    cli
}

/// The registered plugins that offer tools (by the `tool-` naming rule).
fn tool_plugins() -> Vec<&'static str> {
    crate::plugins()
        .map(|all| all.iter().map(|p| p.name).filter(|n| n.starts_with("tool-")).collect())
        .unwrap_or_default()
}

fn print_line(value: &serde_json::Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}")?;
    out.flush()?;
    Ok(())
}

fn result_json(r: &Result<ToolOutput, Error>) -> serde_json::Value {
    match r {
        Ok(o) => serde_json::json!({ "ok": true, "text": o.text, "structured": o.structured }),
        Err(e) => serde_json::json!({ "ok": false, "error": e.to_json() }),
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check { file } => {
            match crate::build_runtime(file.as_deref().unwrap_or(&cli.composition)) {
                Ok(runtime) => {
                    let names: Vec<&str> = runtime.tools().iter().map(|t| t.name()).collect();
                    let source = runtime.source_name().to_string();
                    runtime.shutdown().await;
                    if names.is_empty() {
                        // It builds, but a model given it could call nothing.
                        eprintln!(
                            "error[{}]: {source}: the composition has no tools, so a model \
                             could call nothing; add a tool plugin ({})",
                            ErrorCode::InvalidComposition,
                            tool_plugins().join(", ")
                        );
                        return Ok(ExitCode::from(1));
                    }
                    println!("ok: {source} (tools: {})", names.join(", "));
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("error[{}]: {e}", e.code());
                    Ok(ExitCode::from(1))
                }
            }
        }
        // Dispatched in `main` before clap; reaching here means a global flag came first
        // (`conch --composition x sandbox-exec ...`), which the helper does not take.
        Command::SandboxExec { .. } => {
            eprintln!("error: sandbox-exec must come first, before any option");
            Ok(ExitCode::from(2))
        }
        Command::Plugins => {
            crate::link_all();
            for p in crate::plugins()? {
                let provides = p.provides.map(|s| s.as_str()).unwrap_or("-");
                let requires: Vec<&str> = p.requires.iter().map(|s| s.as_str()).collect();
                println!(
                    "{}\tprovides: {provides}\trequires: {}\t{}",
                    p.name,
                    requires.join(","),
                    p.description
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sandboxd(args) => {
            sandboxd::run(args, &cli.composition).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Image(command) => {
            image::run(command).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Health { urls } => match image::health(&urls) {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("unhealthy: {e:#}");
                Ok(ExitCode::from(1))
            }
        },
        Command::SwerexRemote(args) => {
            let composition =
                if cli.composition_given { cli.composition.as_str() } else { swerex::COMPOSITION };
            swerex::run(args, composition).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::E2b(args) => {
            e2b::run(args, &cli.composition).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp => mcp(&cli.composition).await,
        Command::Conformance(args) => conformance::run(args, &cli.composition).await,
        // Handed to `conch-bench` in `main`, before any runtime starts.
        Command::Bench(_) => Err(anyhow::anyhow!("`bench` runs before the runtime starts")),
        command => {
            // A runtime that cannot be built (a daemon that refuses the token, a bad
            // composition) is reported with its typed code, as `check` does.
            let runtime = match crate::build_runtime(&cli.composition) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error[{}]: {e}", e.code());
                    return Ok(ExitCode::from(1));
                }
            };
            let sink = Arc::new(CliSink::default());
            let owner = Owner::new("cli", Arc::clone(&sink) as Arc<dyn conch_seams::NoticeSink>);
            let code = match command {
                Command::Tools => {
                    let tools: Vec<serde_json::Value> = runtime
                        .tools()
                        .iter()
                        .map(|t| {
                            serde_json::json!({
                                "name": t.name(),
                                "description": t.description(),
                                "input_schema": t.input_schema(),
                            })
                        })
                        .collect();
                    println!("{}", serde_json::to_string_pretty(&tools)?);
                    ExitCode::SUCCESS
                }
                Command::Call { tool, args, json } => {
                    let stop = interrupt();
                    tokio::select! {
                        code = call(&runtime, &owner, &sink, &tool, &args, json) => code?,
                        signal = stop => {
                            interrupted(signal, json, "the call")?;
                            ExitCode::from(128 + signal)
                        }
                    }
                }
                Command::Batch => batch(&runtime, &owner, &sink).await?,
                Command::Check { .. }
                | Command::Plugins
                | Command::SandboxExec { .. }
                | Command::Bench(_)
                | Command::Image(_)
                | Command::Health { .. }
                | Command::Sandboxd(_)
                | Command::SwerexRemote(_)
                | Command::E2b(_)
                | Command::Mcp
                | Command::Conformance(_) => ExitCode::SUCCESS,
            };
            // Owner disposal cancels and awaits its jobs before the providers shut down.
            owner.dispose().await;
            runtime.shutdown().await;
            Ok(code)
        }
    }
}

/// Resolves on SIGTERM or SIGINT with the signal's number. Both handlers are installed when
/// this is called, not when the future is first polled: a caller that starts work in the
/// same `select!` must not leave a window in which the default action (death, with the
/// work left running) still applies.
fn interrupt() -> impl std::future::Future<Output = u8> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate()).ok();
    let int = signal(SignalKind::interrupt()).ok();
    async move {
        let next = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = next(term) => 15,
            _ = next(int) => 2,
        }
    }
}

/// Says that `what` was cut short by `signal`: everything it started is stopped next (owner
/// disposal, then the providers' shutdown), as when `conch mcp` is told to stop.
fn interrupted(signal: u8, json: bool, what: &str) -> anyhow::Result<()> {
    let name = if signal == 15 { "SIGTERM" } else { "SIGINT" };
    let message =
        format!("interrupted by {name} before {what} finished; everything it started is stopped");
    if json {
        let e = Error::new(ErrorCode::Cancelled, message);
        print_line(&serde_json::json!({ "ok": false, "error": e.to_json() }))?;
    } else {
        eprintln!("error[cancelled]: {message}");
    }
    Ok(())
}

/// `conch call`: one tool call, then every job it started, waited for (see [`settle_jobs`]).
async fn call(
    runtime: &conch_registry::Runtime,
    owner: &Arc<Owner>,
    sink: &CliSink,
    tool: &str,
    args: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let r = match strict_json::parse(args) {
        Ok(args) => {
            let _turn = sink.notices.begin_turn();
            runtime.call(owner, tool, args).await
        }
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            Err(Error::new(ErrorCode::InvalidArgument, format!("invalid arguments: {e}")))
        }
        Err(e) => Err(Error::new(
            ErrorCode::InvalidArgument,
            format!("the arguments must be a JSON object: {e}"),
        )),
    };
    // A background job cannot outlive the one call this process serves: wait for what the
    // call started, then print its notice and its output (as job_output renders it), so
    // nothing is killed unseen when the process exits.
    match &r {
        Ok(o) if !json => {
            print_text(&o.text);
            std::io::stdout().flush()?;
            let (notices, jobs) = settle_jobs(runtime, owner, sink).await;
            for n in &notices {
                println!("{}", n["text"].as_str().unwrap_or_default());
            }
            for job in &jobs {
                print_text(job["text"].as_str().unwrap_or_default());
            }
        }
        Ok(_) => {
            let (notices, jobs) = settle_jobs(runtime, owner, sink).await;
            let mut out = result_json(&r);
            if !notices.is_empty() {
                out["notices"] = serde_json::Value::Array(notices);
            }
            if !jobs.is_empty() {
                out["jobs"] = serde_json::Value::Array(jobs);
            }
            print_line(&out)?;
        }
        Err(_) if json => print_line(&result_json(&r))?,
        Err(e) => eprintln!("error[{}]: {e}", e.code()),
    }
    Ok(if r.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Prints `text` exactly, ending with one newline (none added to empty text).
fn print_text(text: &str) {
    if text.is_empty() || text.ends_with('\n') {
        print!("{text}");
    } else {
        println!("{text}");
    }
}

/// `conch mcp`: one MCP session over stdio; the session's owner is disposed (every job and
/// terminal stopped and awaited) before the providers shut down.
async fn mcp(composition: &str) -> anyhow::Result<ExitCode> {
    let runtime = match crate::build_runtime(composition) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            eprintln!("error[{}]: {e}", e.code());
            return Ok(ExitCode::from(1));
        }
    };
    let identity = conch_frontend_mcp::ServerIdentity {
        name: "conch".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        composition: runtime.source_name().into(),
    };
    // Installed before the session serves anything (see `interrupt`).
    let stop = interrupt();
    let served = conch_frontend_mcp::serve_stdio(Arc::clone(&runtime), identity, async move {
        stop.await;
    })
    .await;
    runtime.shutdown().await;
    match served {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error[{}]: {e}", e.code());
            Ok(ExitCode::from(1))
        }
    }
}

/// The CLI's notice sink: routes (inject while a call runs, else follow up within the wake
/// budget), collects, and wakes whoever waits for the next notice.
#[derive(Debug, Default)]
struct CliSink {
    notices: RoutingSink,
    arrived: tokio::sync::Notify,
}

impl CliSink {
    fn take(&self) -> Vec<(NoticeRoute, Notice)> {
        self.notices.take()
    }
}

impl NoticeSink for CliSink {
    fn deliver(&self, notice: Notice) {
        self.notices.deliver(notice);
        // A stored permit: a waiter that registers after this still wakes.
        self.arrived.notify_one();
    }
}

/// How long a settled job's completion notice may take to arrive: the jobs registry sends
/// it right after the settlement it follows, so this only bounds a notice that never comes
/// (a job reported otherwise).
const NOTICE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits until every job of `owner` has settled (the jobs `conch call` started) and their
/// completion notices arrived, then returns the notices (as `batch` prints them) and each
/// job's output: the `job_output` tool's result (`ok`, `text`, `structured`) plus `job_id`.
async fn settle_jobs(
    runtime: &conch_registry::Runtime,
    owner: &Arc<Owner>,
    sink: &CliSink,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let mut pending = std::collections::HashSet::new();
    if let Some(jobs) = &runtime.seams().jobs {
        loop {
            let running: Vec<_> = jobs
                .list(owner)
                .into_iter()
                .filter(|j| j.status == conch_seams::JobStatus::Running)
                .collect();
            if running.is_empty() {
                break;
            }
            for job in running {
                pending.insert(job.id.clone());
                // Waiting never kills; a long wait simply waits again.
                let _ = jobs.wait(owner, &job.id, std::time::Duration::from_secs(3600)).await;
            }
        }
    }
    let mut ids: Vec<String> = pending.iter().cloned().collect();
    ids.sort();
    let mut notices = Vec::new();
    loop {
        for (route, n) in sink.take() {
            pending.remove(&n.source_id);
            notices.push((route, n));
        }
        if pending.is_empty()
            || tokio::time::timeout(NOTICE_GRACE, sink.arrived.notified()).await.is_err()
        {
            break;
        }
    }
    let mut outputs = Vec::new();
    // After the notices: a consuming read marks a settled job reported, and a job reported
    // before its notice step sends none.
    for id in &ids {
        let mut out = if runtime.tool("job_output").is_some() {
            // Rendered as the model sees it: truncation and spill lines, exit code, status.
            result_json(
                &runtime.call(owner, "job_output", serde_json::json!({ "job_id": id })).await,
            )
        } else if let Some(jobs) = &runtime.seams().jobs {
            match jobs.read_output(owner, id) {
                Ok((info, read)) => serde_json::json!({
                    "ok": true,
                    "text": read.text,
                    "structured": {
                        "status": info.status.as_str(),
                        "detail": info.detail,
                        "spill_path": read.spill.as_ref().map(ToString::to_string),
                        "spill_evicted": read.spill_evicted,
                        "skipped_bytes": read.skipped_bytes,
                    },
                }),
                Err(e) => result_json(&Err(e)),
            }
        } else {
            continue;
        };
        out["job_id"] = serde_json::Value::String(id.clone());
        outputs.push(out);
    }
    (notices_json(notices), outputs)
}

fn notices_json(notices: Vec<(NoticeRoute, Notice)>) -> Vec<serde_json::Value> {
    notices
        .into_iter()
        .map(|(route, n)| {
            serde_json::json!({ "route": route.as_str(), "source_id": n.source_id, "text": n.text })
        })
        .collect()
}

/// The keys a batch call object may have.
const BATCH_KEYS: &[&str] = &["tool", "args", "id"];

/// Runs input line `number` of a batch: the call's `id` (when the line is an object that
/// has one) and its result.
async fn batch_call(
    runtime: &conch_registry::Runtime,
    owner: &Arc<Owner>,
    sink: &CliSink,
    number: u64,
    line: &str,
) -> (Option<serde_json::Value>, Result<ToolOutput, Error>) {
    let invalid = |message: String| Err(Error::new(ErrorCode::InvalidArgument, message));
    if line.trim().is_empty() {
        return (
            None,
            invalid(format!(
                "line {number} is blank; each line must be one call {{\"tool\": NAME, \"args\": {{...}}}}"
            )),
        );
    }
    let v = match strict_json::parse(line) {
        Ok(v) => v,
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            return (None, invalid(format!("line {number}: {e}")));
        }
        Err(e) => return (None, invalid(format!("line {number} is not JSON: {e}"))),
    };
    let Some(obj) = v.as_object() else {
        return (
            None,
            invalid(format!(
                "line {number}: each line must be an object {{\"tool\": NAME, \"args\": {{...}}, \"id\": ANY}}"
            )),
        );
    };
    let id = obj.get("id").cloned();
    if let Some(key) = obj.keys().find(|k| !BATCH_KEYS.contains(&k.as_str())) {
        return (
            id,
            invalid(format!(
                "line {number}: unknown key `{key}`; a call object has `tool`, `args` and an \
                 optional `id`"
            )),
        );
    }
    let Some(tool) = obj.get("tool").and_then(|t| t.as_str()) else {
        return (id, invalid(format!("line {number}: `tool` must name a tool (a string)")));
    };
    let _turn = sink.notices.begin_turn();
    let args = obj.get("args").cloned().unwrap_or(serde_json::Value::Null);
    (id, runtime.call(owner, tool, args).await)
}

async fn batch(
    runtime: &conch_registry::Runtime,
    owner: &Arc<Owner>,
    sink: &CliSink,
) -> anyhow::Result<ExitCode> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(16);
    // stdin is blocking; read it on a thread so tool calls keep running on the runtime.
    // Lines are read as bytes: one that is not UTF-8 gets its own error line, not the end of
    // the batch.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().split(b'\n') {
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let stop = interrupt();
    tokio::pin!(stop);
    let mut number = 0_u64;
    loop {
        let line = tokio::select! {
            line = rx.recv() => match line {
                Some(line) => line.context("reading stdin")?,
                None => break,
            },
            signal = &mut stop => return Ok(ExitCode::from(128 + signal)),
        };
        number += 1;
        // Every input line gets exactly one output line, so a harness can pair them by
        // position; a call may also carry an `id`, echoed back.
        let (id, r) = match String::from_utf8(line) {
            Ok(mut line) => {
                if line.ends_with('\r') {
                    line.pop();
                }
                // A byte-order mark some editors write first is not part of the call.
                let line = if number == 1 { line.trim_start_matches('\u{feff}') } else { &line };
                tokio::select! {
                    done = batch_call(runtime, owner, sink, number, line) => done,
                    signal = &mut stop => {
                        interrupted(signal, true, &format!("the call on line {number}"))?;
                        return Ok(ExitCode::from(128 + signal));
                    }
                }
            }
            Err(e) => (
                None,
                Err(Error::new(
                    ErrorCode::InvalidArgument,
                    format!("line {number} is not UTF-8 text: {}", e.utf8_error()),
                )),
            ),
        };
        let mut out = result_json(&r);
        let notices = notices_json(sink.take());
        if !notices.is_empty() {
            out["notices"] = serde_json::Value::Array(notices);
        }
        if let Some(id) = id {
            out["id"] = id;
        }
        print_line(&out)?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn a_subcommand_s_help_line_is_its_own() {
        let listed: Vec<(String, Option<String>)> = Cli::command()
            .get_subcommands()
            .map(|s| (s.get_name().to_owned(), s.get_about().map(ToString::to_string)))
            .collect();
        // Building runs every subcommand's deferred arguments.
        let mut built = Cli::command();
        built.build();
        for (name, about) in listed {
            let sub = built.find_subcommand(&name).expect("still there");
            assert!(about.is_some(), "`{name}` has a help line");
            assert_eq!(sub.get_about().map(ToString::to_string), about, "`{name}`'s help line");
        }
    }
}
