//! `conch conformance`: the conformance suites (`conch-conformance`) run against the
//! providers a composition binds, with the same cases `cargo test` instantiates. Each case
//! gets a runtime of its own, built from the composition like any command's, so a case that
//! shuts its provider down or leaves processes behind affects no other; the runtime is shut
//! down after the case, whatever its verdict.
//!
//! The suites and what they run on:
//! - `subprocess`: the subprocess cases and the subprocess provider's terminal-process
//!   cases, on the composition's subprocess provider;
//! - `shell`: on its shell executor;
//! - `terminal`: on its terminal backend;
//! - `sandbox`: on its sandbox runner, spawning through its subprocess provider;
//! - `files`: on its files provider (scratch directories under the system temp directory).
//!
//! The shell, terminal and files cases make scratch directories in the system temp directory,
//! so under a `sandbox-policy` that directory is made the workspace root for those suites (the
//! policy's mode stays the composition's).
//!
//! Before the cases, the command builds one probe runtime: the same-world check, and one trivial
//! shell call and terminal open, so a provider that cannot start anything here is a skipped suite
//! with its reason.

use std::sync::Arc;
use std::time::Duration;

use conch_config::Composition;
use conch_conformance::cases;
use conch_conformance::runner::{self, Verdict};
use conch_env::ShellEnv;
use conch_registry::{RegistryError, Runtime, SeamId};
use futures::StreamExt;

// Not a doc comment: it would replace the subcommand's help line (see `defer` on the CLI's
// `Command`).
// The command's flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which suites: `subprocess` (with the subprocess provider's terminal-process cases),
    /// `shell`, `terminal`, `sandbox`, `files`, or `all`. A suite named here must be bound by the
    /// composition; with `all`, an unbound suite's cases are listed as SKIP.
    #[arg(long, default_value = "all", value_parser = ["subprocess", "shell", "terminal", "sandbox", "files", "all"])]
    pub suite: String,
    /// Only the cases whose name contains this.
    #[arg(long)]
    pub case: Option<String>,
    /// Print one JSON object (`rows`: suite, case, result, ms, message) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Cases run at once (default: the number of CPUs).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// A case still running after this many milliseconds fails.
    #[arg(long, default_value_t = 120_000)]
    pub case_timeout_ms: u64,
}

/// The conformance suites, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Suite {
    Subprocess,
    TerminalProcess,
    Shell,
    Terminal,
    Sandbox,
    Files,
}

impl Suite {
    const ALL: [Suite; 6] = [
        Suite::Subprocess,
        Suite::TerminalProcess,
        Suite::Shell,
        Suite::Terminal,
        Suite::Sandbox,
        Suite::Files,
    ];

    fn name(self) -> &'static str {
        match self {
            Suite::Subprocess => "subprocess",
            Suite::TerminalProcess => "terminal-process",
            Suite::Shell => "shell",
            Suite::Terminal => "terminal",
            Suite::Sandbox => "sandbox",
            Suite::Files => "files",
        }
    }

    /// The `--suite` value that selects it.
    fn flag(self) -> &'static str {
        match self {
            Suite::TerminalProcess => "subprocess",
            s => s.name(),
        }
    }

    fn case_names(self) -> Vec<&'static str> {
        match self {
            Suite::Subprocess => cases::SUBPROCESS.iter().map(|c| c.name).collect(),
            Suite::TerminalProcess => cases::TERMINAL_PROCESS.iter().map(|c| c.name).collect(),
            Suite::Shell => cases::SHELL.iter().map(|c| c.name).collect(),
            Suite::Terminal => cases::TERMINAL.iter().map(|c| c.name).collect(),
            Suite::Sandbox => cases::SANDBOX.iter().map(|c| c.name).collect(),
            Suite::Files => cases::FILES.iter().map(|c| c.name).collect(),
        }
    }
}

/// Which seams the composition binds, by the plugin that provides each.
#[derive(Debug, Default)]
struct Bound {
    subprocess: Option<&'static str>,
    shell: Option<&'static str>,
    terminal: Option<&'static str>,
    sandbox: Option<&'static str>,
    files: Option<&'static str>,
    /// Why the bound shell cannot start a command here at all (its program is missing:
    /// pwsh on a machine without PowerShell), found by one trivial call.
    shell_cannot_start: Option<String>,
    /// The same for the terminal backend (one session opened and closed).
    terminal_cannot_start: Option<String>,
}

impl Bound {
    fn of(composition: &Composition) -> Self {
        let plugins = conch_registry::plugins().unwrap_or_default();
        let by = |seam: SeamId| {
            plugins
                .iter()
                .find(|p| {
                    p.provides == Some(seam) && composition.plugins().iter().any(|n| n == p.name)
                })
                .map(|p| p.name)
        };
        Self {
            subprocess: by(SeamId::Subprocess),
            shell: by(SeamId::Shell),
            terminal: by(SeamId::TerminalBackend),
            sandbox: by(SeamId::Sandbox),
            files: by(SeamId::Files),
            shell_cannot_start: None,
            terminal_cannot_start: None,
        }
    }

    /// Tries the bound shell and terminal backend once each: a provider whose program is
    /// not installed here (a `spawn_failed` before anything ran) has nothing to judge, and
    /// its suite is skipped saying so instead of failing every case the same way.
    async fn probe_startup(&mut self, seams: &conch_registry::Seams) {
        use conch_seams::{ErrorCode, ShellExecRequest, TerminalOpenSpec};
        let cannot = |e: &conch_seams::Error| {
            (e.code() == ErrorCode::SpawnFailed).then(|| format!("cannot start here: {e}"))
        };
        if let Some(shell) = &seams.shell {
            // `exit 0` means the same in every dialect.
            let ran = match shell.resolve(ShellExecRequest::new("exit 0")) {
                Ok(spec) => shell.run(spec).await.map(|_| ()),
                Err(e) => Err(e),
            };
            self.shell_cannot_start = ran.err().as_ref().and_then(cannot);
        }
        if let Some(backend) = &seams.terminal_backend {
            match backend.open(TerminalOpenSpec::default()).await {
                Ok(session) => {
                    let _ = session.close().await;
                }
                Err(e) => self.terminal_cannot_start = cannot(&e),
            }
        }
    }

    /// True when `suite`'s seam is bound but its provider cannot start here.
    fn unstartable(&self, suite: Suite) -> bool {
        match suite {
            Suite::Shell => self.shell.is_some() && self.shell_cannot_start.is_some(),
            Suite::Terminal => self.terminal.is_some() && self.terminal_cannot_start.is_some(),
            _ => false,
        }
    }

    /// Why `suite` cannot run here, or `None` when it can.
    fn missing(&self, suite: Suite) -> Option<String> {
        let (seam, what) = match suite {
            Suite::Subprocess | Suite::TerminalProcess => (self.subprocess, "subprocess"),
            Suite::Shell => (self.shell, "shell"),
            Suite::Terminal => (self.terminal, "terminal"),
            Suite::Sandbox => (self.sandbox, "sandbox"),
            Suite::Files => (self.files, "files"),
        };
        let mut why = seam.is_none().then(|| format!("composition binds no {what} seam"));
        if suite == Suite::Sandbox && why.is_none() && self.subprocess.is_none() {
            why = Some("composition binds no subprocess seam to spawn sandboxed commands".into());
        }
        let unstartable = match suite {
            Suite::Shell => self.shell_cannot_start.as_ref(),
            Suite::Terminal => self.terminal_cannot_start.as_ref(),
            _ => None,
        };
        why.or_else(|| unstartable.map(|u| format!("{} {u}", seam.unwrap_or(what))))
    }
}

/// One finished case.
#[derive(Debug)]
struct Row {
    suite: Suite,
    case: &'static str,
    verdict: Verdict,
    ms: u128,
}

/// What every case's runtime is built from.
struct Plan {
    composition: Composition,
    /// The composition for the shell, terminal and files suites (workspace root in the temp
    /// dir).
    scratch: Composition,
    limit: Duration,
}

async fn build(composition: &Composition) -> Result<Runtime, RegistryError> {
    let composition = composition.clone();
    // Building may block (a remote sandbox connects), so it runs off the async workers.
    tokio::task::spawn_blocking(move || Runtime::build(&composition, ShellEnv::from_process_env()))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// Runs one case on a runtime of its own and shuts that runtime down.
async fn run_one(plan: Arc<Plan>, suite: Suite, index: usize) -> Row {
    let case = suite.case_names()[index];
    let composition = match suite {
        Suite::Shell | Suite::Terminal | Suite::Files => &plan.scratch,
        _ => &plan.composition,
    };
    let rt = match build(composition).await {
        Ok(rt) => rt,
        Err(e) => {
            let verdict = Verdict::Fail(format!("the composition did not build: {e}"));
            return Row { suite, case, verdict, ms: 0 };
        }
    };
    let seams = rt.seams().clone();
    let limit = plan.limit;
    let unbound = || Verdict::Fail("the runtime built for this case binds no such seam".into());
    let (verdict, took) = match suite {
        Suite::Subprocess | Suite::TerminalProcess => match seams.subprocess {
            Some(p) => {
                let list = if suite == Suite::Subprocess {
                    cases::SUBPROCESS
                } else {
                    cases::TERMINAL_PROCESS
                };
                let run = list[index].run;
                runner::run_case(limit, async move { run(p.as_ref()).await }).await
            }
            None => (unbound(), Duration::ZERO),
        },
        Suite::Shell => match seams.shell {
            Some(p) => {
                let run = cases::SHELL[index].run;
                runner::run_case(limit, async move { run(p.as_ref()).await }).await
            }
            None => (unbound(), Duration::ZERO),
        },
        Suite::Terminal => match seams.terminal_backend {
            Some(p) => {
                let run = cases::TERMINAL[index].run;
                runner::run_case(limit, async move { run(p.as_ref()).await }).await
            }
            None => (unbound(), Duration::ZERO),
        },
        Suite::Sandbox => match (seams.sandbox, seams.subprocess) {
            (Some(s), Some(p)) => {
                let run = cases::SANDBOX[index].run;
                runner::run_case(limit, async move { run(s.as_ref(), p.as_ref()).await }).await
            }
            _ => (unbound(), Duration::ZERO),
        },
        Suite::Files => match seams.files {
            Some(f) => {
                let run = cases::FILES[index].run;
                let base = std::env::temp_dir();
                runner::run_case(limit, async move { run(f.as_ref(), &base).await }).await
            }
            None => (unbound(), Duration::ZERO),
        },
    };
    rt.shutdown().await;
    Row { suite, case, verdict, ms: took.as_millis() }
}

/// Runs the command; the exit code is 0 when no case failed, 1 when one did (or the
/// composition does not build), 2 when there is nothing this command can judge.
pub async fn run(args: Args, selector: &str) -> anyhow::Result<std::process::ExitCode> {
    use std::process::ExitCode;
    crate::link_all();
    let composition = match Composition::load(selector) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error[{}]: {e}", e.code());
            return Ok(ExitCode::from(1));
        }
    };
    // One runtime to see what is bound and where its processes run.
    let probe = match build(&composition).await {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error[{}]: {e}", e.code());
            return Ok(ExitCode::from(1));
        }
    };
    let mut bound = Bound::of(&composition);
    let world = match probe.seams().subprocess.clone() {
        Some(sub) => runner::same_world(sub.as_ref()).await,
        None => Ok(()),
    };
    if world.is_ok() {
        bound.probe_startup(probe.seams()).await;
    }
    probe.shutdown().await;
    if let Err(why) = world {
        eprintln!(
            "error: cannot judge {}: {why}. The cases check their effects in this machine's \
             /proc, so run `conch conformance` where the processes run (for a remote \
             sandbox: on the daemon's machine, with the daemon on loopback)",
            composition.source_name()
        );
        return Ok(ExitCode::from(2));
    }
    let selected: Vec<Suite> =
        Suite::ALL.into_iter().filter(|s| args.suite == "all" || s.flag() == args.suite).collect();
    if args.suite != "all"
        && let Some(why) = selected.iter().find_map(|s| bound.missing(*s))
    {
        let seam = match args.suite.as_str() {
            "shell" => SeamId::Shell,
            "terminal" => SeamId::TerminalBackend,
            "sandbox" => SeamId::Sandbox,
            "files" => SeamId::Files,
            _ => SeamId::Subprocess,
        };
        if bound.unstartable(selected[0]) {
            eprintln!(
                "error: {why}; the {} suite cannot be judged on this machine ({})",
                args.suite,
                composition.source_name()
            );
        } else {
            eprintln!(
                "error: {why}, so the {} suite has nothing to run on in {}; add a plugin \
                 that provides it ({}), or run --suite all",
                args.suite,
                composition.source_name(),
                providers_of(seam).join(", ")
            );
        }
        return Ok(ExitCode::from(2));
    }
    let scratch = composition.clone().with_setting(
        "sandbox-policy",
        "workspace_root",
        std::env::temp_dir().display().to_string(),
    );
    let plan = Arc::new(Plan {
        composition: composition.clone(),
        scratch,
        limit: Duration::from_millis(args.case_timeout_ms.max(1)),
    });

    // Every case in order: those of unbound suites are skipped rows, the rest are jobs.
    let mut work: Vec<(Suite, usize, &'static str)> = Vec::new();
    for suite in &selected {
        for (i, name) in suite.case_names().into_iter().enumerate() {
            if args.case.as_deref().is_none_or(|f| name.contains(f)) {
                work.push((*suite, i, name));
            }
        }
    }
    if work.is_empty() {
        eprintln!("error: no case matches --case {:?}", args.case.unwrap_or_default());
        return Ok(ExitCode::from(2));
    }
    let width = work.iter().map(|(_, _, n)| n.len()).max().unwrap_or(0);
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from))
        .max(1);
    if !args.json {
        println!("{}", header(composition.source_name(), &bound));
        if composition.plugins().iter().any(|p| p == "sandbox-policy") {
            println!(
                "note: the shell, terminal and files suites run with \
                 sandbox-policy.workspace_root = {} (their cases write scratch files there)",
                std::env::temp_dir().display()
            );
        }
    }
    let started = std::time::Instant::now();
    let mut rows = Vec::with_capacity(work.len());
    let mut stream = futures::stream::iter(work.into_iter().map(|(suite, i, name)| {
        let plan = Arc::clone(&plan);
        let skip = bound.missing(suite);
        async move {
            match skip {
                Some(why) => Row { suite, case: name, verdict: Verdict::Skip(why), ms: 0 },
                None => run_one(plan, suite, i).await,
            }
        }
    }))
    .buffered(jobs);
    while let Some(row) = stream.next().await {
        if !args.json {
            println!("{}", table_row(&row, width));
        }
        rows.push(row);
    }
    let count = |label: &str| rows.iter().filter(|r| r.verdict.label() == label).count();
    let (passed, failed, skipped) = (count("PASS"), count("FAIL"), count("SKIP"));
    if args.json {
        let out = serde_json::json!({
            "composition": composition.source_name(),
            "providers": {
                "subprocess": bound.subprocess,
                "shell": bound.shell,
                "terminal": bound.terminal,
                "sandbox": bound.sandbox,
                "files": bound.files,
            },
            "passed": passed,
            "failed": failed,
            "skipped": skipped,
            "rows": rows.iter().map(|r| serde_json::json!({
                "suite": r.suite.name(),
                "case": r.case,
                "result": r.verdict.label(),
                "ms": r.ms,
                "message": r.verdict.message(),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{passed} passed, {failed} failed, {skipped} skipped in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        for r in rows.iter().filter(|r| matches!(r.verdict, Verdict::Fail(_))) {
            println!("FAILED {}::{}", r.suite.name(), r.case);
        }
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The registered plugins that provide `seam`.
fn providers_of(seam: SeamId) -> Vec<&'static str> {
    let all = conch_registry::plugins().unwrap_or_default();
    all.iter().filter(|p| p.provides == Some(seam)).map(|p| p.name).collect()
}

fn header(source: &str, b: &Bound) -> String {
    let show = |name: &str, p: Option<&str>| format!("{name}: {}", p.unwrap_or("not bound"));
    format!(
        "conformance of {source} ({}; {}; {}; {}; {})",
        show("subprocess", b.subprocess),
        show("shell", b.shell),
        show("terminal", b.terminal),
        show("sandbox", b.sandbox),
        show("files", b.files)
    )
}

/// `suite  case  RESULT  ms  message`, the message on one line.
fn table_row(r: &Row, width: usize) -> String {
    let message = r.verdict.message().map(one_line).unwrap_or_default();
    format!(
        "{:<16} {:<width$} {} {:>7}  {}",
        r.suite.name(),
        r.case,
        r.verdict.label(),
        r.ms,
        message
    )
    .trim_end()
    .to_owned()
}

/// Collapses a multi-line message (an `assert_eq!` report) into one line.
fn one_line(m: &str) -> String {
    m.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" / ")
}
