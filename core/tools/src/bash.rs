//! The one-shot `bash` tool: a fresh shell per call, optional background job.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use conch_env::ShellEnv;
use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::{
    Error, ErrorCode, JobHooks, JobOutput, JobRead, JobSettlement, JobStart, JobStatus, Jobs,
    Leftover, Result, ShellDialect, ShellExecRequest, ShellExecutor, ShellProcess,
    ShellProcessStatus, ShellRunResult, Tool, ToolContext, ToolOutput,
};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::args::{parse_args, schema_of};

/// Arguments of `bash`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BashArgs {
    /// The command line to run with bash -c.
    pub command: String,
    /// A short description of what the command does (used as the job label).
    #[serde(default)]
    pub description: Option<String>,
    /// Working directory (absolute, or relative to the default); state does not persist between calls.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Foreground timeout in milliseconds (default 120000, max 600000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Start as a background job and return its id at once.
    #[serde(default)]
    pub run_in_background: Option<bool>,
}

/// tool-bash config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BashToolConfig {
    /// Whether `run_in_background` is offered.
    pub enable_run_in_background: bool,
}

impl Default for BashToolConfig {
    fn default() -> Self {
        Self { enable_run_in_background: true }
    }
}

impl conch_seams::PluginConfig for BashToolConfig {}

/// The one-shot shell tool, named after the executor's dialect (`bash`).
#[derive(Debug)]
pub struct BashTool {
    shell: Arc<dyn ShellExecutor>,
    jobs: Option<Arc<dyn Jobs>>,
    shell_env: Arc<ShellEnv>,
    config: BashToolConfig,
    dialect: ShellDialect,
    description: String,
}

impl BashTool {
    /// A tool over a shell executor, with background jobs when `jobs` is given.
    pub fn new(
        shell: Arc<dyn ShellExecutor>,
        jobs: Option<Arc<dyn Jobs>>,
        shell_env: Arc<ShellEnv>,
        config: BashToolConfig,
    ) -> Self {
        let dialect = shell.dialect();
        let description = format!(
            "Run a command with {} in a fresh shell. No state (cwd, variables, functions) \
             persists between calls: pass workdir instead of cd. A non-zero exit is shown as \
             [exit code: N]. Long output keeps its tail and names the file holding the full \
             output. The call ends with its shell: processes it left running (with `&`, even \
             detached with setsid or nohup) are stopped and listed. run_in_background: true \
             returns a job id at once; read it with \
             job_output and stop it with job_kill.",
            dialect.one_shot
        );
        Self { shell, jobs, shell_env, config, dialect, description }
    }
}

/// `123 sleep (held the output), 130 python3`, at most eight named.
fn leftover_list(leftovers: &[Leftover]) -> String {
    let mut names: Vec<String> = leftovers
        .iter()
        .take(8)
        .map(|l| {
            let held = if l.held_output { " (held the output open)" } else { "" };
            format!("{} {}{held}", l.pid, l.name)
        })
        .collect();
    if leftovers.len() > 8 {
        names.push(format!("and {} more", leftovers.len() - 8));
    }
    names.join(", ")
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "es" }
}

/// What a result says in place of a spill path once the spill was evicted, so the model
/// learns the full output existed and is gone (rather than reading a path that fails).
pub(crate) const EVICTED: &str =
    "the full output was evicted from the spill directory (spill limits)";

/// Renders a foreground result the way the model sees it.
pub fn render_run(r: &ShellRunResult) -> String {
    let mut out = String::new();
    if r.output.omitted_bytes > 0 {
        match &r.output.spill {
            Some(p) => out.push_str(&format!("[output truncated; full output: {p}]\n")),
            None if r.output.spill_evicted => out.push_str(&format!(
                "[output truncated; {} earlier bytes omitted; {EVICTED}]\n",
                r.output.omitted_bytes
            )),
            None => out.push_str(&format!(
                "[output truncated; {} earlier bytes omitted; full output exceeded the spill cap]\n",
                r.output.omitted_bytes
            )),
        }
        if r.output.starts_mid_line {
            out.push_str("[the kept tail starts mid-line]\n");
        }
    }
    out.push_str(&r.output.text);
    let mut markers = Vec::new();
    if r.timed_out {
        markers.push(format!("[timed out after {}ms]", r.timeout_ms));
    }
    if !r.leftovers.is_empty() {
        let n = r.leftovers.len();
        markers.push(format!(
            "[stopped {n} background process{} that outlived the command's shell: {}; use \
             run_in_background for processes that must keep running]",
            plural(n),
            leftover_list(&r.leftovers)
        ));
    }
    if let Some(sig) = &r.status.signal {
        markers.push(format!("[killed by signal: {sig}]"));
    } else if let Some(code) = r.status.code
        && code != 0
    {
        markers.push(format!("[exit code: {code}]"));
    }
    if !markers.is_empty() {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&markers.join("\n"));
    }
    out
}

struct ProcessOutput(Arc<dyn ShellProcess>);

fn to_job_read(r: conch_seams::ShellProcessRead) -> JobRead {
    JobRead {
        text: r.text,
        lossy: r.lossy,
        skipped_bytes: r.skipped_bytes,
        spill_path: r.spill.map(|p| p.to_string()),
        spill_evicted: r.spill_evicted,
    }
}

impl JobOutput for ProcessOutput {
    fn read(&self) -> JobRead {
        to_job_read(self.0.read_output())
    }

    fn snapshot(&self) -> JobRead {
        to_job_read(self.0.snapshot())
    }

    fn release(&self) {
        self.0.release();
    }
}

fn settlement(p: &dyn ShellProcess) -> JobSettlement {
    let mut s = base_settlement(p);
    let left = p.leftovers();
    if !left.is_empty() {
        let n = left.len();
        let note = format!(
            "stopped {n} process{} that outlived the shell: {}",
            plural(n),
            leftover_list(&left)
        );
        s.detail = Some(match s.detail {
            Some(d) => format!("{d}; {note}"),
            None => note,
        });
    }
    s
}

fn base_settlement(p: &dyn ShellProcess) -> JobSettlement {
    match p.status() {
        ShellProcessStatus::Killed => JobSettlement {
            status: JobStatus::Killed,
            detail: Some(match p.exit().and_then(|e| e.signal) {
                Some(s) => format!("killed by signal: {s}"),
                None => "killed".into(),
            }),
        },
        _ => JobSettlement {
            status: JobStatus::Completed,
            detail: match p.exit().and_then(|e| e.code) {
                Some(0) => None,
                Some(c) => Some(format!("exit code: {c}")),
                None => None,
            },
        },
    }
}

#[async_trait]
impl Tool for BashTool {
    fn name(&self) -> &str {
        self.dialect.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> serde_json::Value {
        let mut schema = schema_of::<BashArgs>();
        if (!self.config.enable_run_in_background || self.jobs.is_none())
            && let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut())
        {
            props.remove("run_in_background");
        }
        schema
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: BashArgs = parse_args(self.dialect.name, args)?;
        let background = args.run_in_background.unwrap_or(false);
        let mut req = ShellExecRequest::new(args.command.clone())
            .with_managed_env(self.shell_env.snapshot(ctx.owner.session_id()));
        req.workdir = args.workdir.map(PathBuf::from);
        req.timeout_ms = args.timeout_ms;
        if !background {
            req.cancel = Some(ctx.cancel.clone());
            let spec = self.shell.resolve(req)?;
            let result = self.shell.run(spec).await?;
            if result.aborted {
                return Err(Error::new(
                    ErrorCode::Cancelled,
                    format!("the {} tool call was aborted", self.dialect.name),
                ));
            }
            let text = render_run(&result);
            return Ok(ToolOutput {
                text,
                structured: Some(serde_json::json!({
                    "exit_code": result.status.code,
                    "signal": result.status.signal,
                    "timed_out": result.timed_out,
                    "total_bytes": result.output.total_bytes,
                    "omitted_bytes": result.output.omitted_bytes,
                    "spill_path": result.output.spill.as_ref().map(|s| s.path.clone()),
                    "spill_evicted": result.output.spill_evicted,
                    "leftovers": result.leftovers.iter().map(|l| serde_json::json!({
                        "pid": l.pid, "name": l.name, "held_output": l.held_output,
                    })).collect::<Vec<_>>(),
                })),
            });
        }
        if !self.config.enable_run_in_background {
            return Err(Error::invalid("run_in_background is disabled in this composition"));
        }
        let Some(jobs) = &self.jobs else {
            return Err(Error::new(
                ErrorCode::Unsupported,
                "run_in_background needs the jobs plugin in the composition",
            ));
        };
        // The tool call's own cancellation applies only until the job id is published.
        if ctx.cancel.is_cancelled() {
            return Err(Error::new(
                ErrorCode::Cancelled,
                format!("the {} tool call was aborted", self.dialect.name),
            ));
        }
        let spec = self.shell.resolve(req)?;
        let label = args
            .description
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(|| args.command.clone());
        let mut start = JobStart::new(self.dialect.name, label);
        start.output_cap = spec.output_max_bytes;
        let shell = Arc::clone(&self.shell);
        let info = jobs
            .start(
                &ctx.owner,
                start,
                Box::new(move || {
                    Box::pin(async move {
                        let process = shell.start(spec).await;
                        let killer = Arc::clone(&process);
                        let waiter = Arc::clone(&process);
                        Ok(JobHooks {
                            cancel: Box::new(move || {
                                killer.kill();
                                Ok(())
                            }),
                            done: Box::pin(async move {
                                waiter.wait().await;
                                settlement(waiter.as_ref())
                            }),
                            output: Some(Arc::new(ProcessOutput(process))),
                        })
                    })
                }),
            )
            .await?;
        Ok(ToolOutput {
            text: format!(
                "started background job {}; read its output with job_output and stop it with job_kill",
                info.id
            ),
            structured: Some(
                serde_json::json!({ "job_id": info.id, "status": info.status.as_str() }),
            ),
        })
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let config: BashToolConfig = ctx.config()?;
    let tool = BashTool::new(ctx.shell()?, ctx.jobs().ok(), ctx.shell_env(), config);
    Ok(PluginOutput::tools(vec![Arc::new(tool)]))
}

register_plugin!(PluginEntry {
    name: "tool-bash",
    provides: None,
    requires: &[SeamId::Shell],
    description: "the one-shot bash tool (fresh process per call, optional background job)",
    build,
});

#[cfg(test)]
mod tests {
    use conch_seams::{CollectedOutput, ExitStatus, SpillRef};

    use super::*;

    fn result(output: CollectedOutput) -> ShellRunResult {
        ShellRunResult {
            status: ExitStatus::code(0),
            timed_out: false,
            aborted: false,
            timeout_ms: 1000,
            output,
            sandbox: None,
            leftovers: Vec::new(),
        }
    }

    #[test]
    fn a_truncated_result_names_its_spill_or_says_why_there_is_none() {
        let out = |spill: Option<SpillRef>, spill_evicted| CollectedOutput {
            text: "tail\n".into(),
            total_bytes: 105,
            omitted_bytes: 100,
            spill,
            spill_evicted,
            starts_mid_line: false,
        };
        let named = render_run(&result(out(Some(SpillRef::local("/tmp/s/stream-1")), false)));
        assert_eq!(named, "[output truncated; full output: /tmp/s/stream-1]\ntail\n");
        let evicted = render_run(&result(out(None, true)));
        assert_eq!(
            evicted,
            "[output truncated; 100 earlier bytes omitted; the full output was evicted from the \
             spill directory (spill limits)]\ntail\n"
        );
        let capped = render_run(&result(out(None, false)));
        assert!(capped.contains("exceeded the spill cap"), "{capped}");
    }
}
