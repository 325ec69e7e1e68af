//! The one-shot shell tools, `bash` (`tool-bash`) and `pwsh` (`tool-pwsh`): one contract, a
//! fresh shell per call and an optional background job, worded in the executor's dialect.
//!
//! Under an executor that confines (its sandbox mode is read-only or workspace-write) the
//! tool also renders sandbox denials and offers escalation: a call with
//! `sandbox_permissions: "require_escalated"` and a `justification` asks the approval seam
//! and, if approved, runs the command once under danger-full-access. It never escalates on
//! its own: only a call that asks does.
//!
//! The escalation fields join the schema (built once) only under a confining executor, and a denial
//! renders as `[sandbox: file|network access denied under <mode> mode]`; an approved call's result
//! is marked `escalated`.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use conch_env::ShellEnv;
use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::{
    Approval, ApprovalDecision, Denial, Dialect, Error, ErrorCode, EscalationPermissions,
    EscalationRequest, JobHooks, JobOutput, JobRead, JobSettlement, JobStart, JobStatus, Jobs,
    Leftover, Result, SandboxInfo, SandboxMode, SandboxVerdict, ShellExecRequest, ShellExecutor,
    ShellProcess, ShellProcessStatus, ShellRunResult, Tool, ToolContext, ToolOutput, ToolRef,
};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::args::{parse_args, schema_of};
use crate::render::timeout_clamp_note;

/// Arguments of `bash`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellArgs {
    /// The command line to run with bash -c.
    pub command: String,
    /// A short description of what the command does (used as the job label).
    #[serde(default)]
    pub description: Option<String>,
    /// Working directory (absolute, or relative to the default); state does not persist between calls.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Foreground timeout in milliseconds, at least 1. The default and the limit are the
    /// executor's (120000 and 600000 unless configured); a larger value is lowered to the
    /// limit and the result says so.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// Start as a background job and return its id at once.
    #[serde(default)]
    pub run_in_background: Option<bool>,
    /// Only after a sandbox denial, when the command must run outside the sandbox:
    /// "require_escalated" asks for approval to run it once without confinement. Needs a
    /// justification.
    #[serde(default)]
    pub sandbox_permissions: Option<SandboxPermissions>,
    /// Why the command needs to run outside the sandbox (shown to whoever approves).
    #[serde(default)]
    pub justification: Option<String>,
}

/// What a call asks of the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum SandboxPermissions {
    /// Run this command once outside the sandbox, if the approver agrees.
    #[serde(rename = "require_escalated")]
    RequireEscalated,
}

impl SandboxPermissions {
    fn escalation(self) -> EscalationPermissions {
        match self {
            SandboxPermissions::RequireEscalated => EscalationPermissions::RequireEscalated,
        }
    }
}

/// tool-bash config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShellToolConfig {
    /// Whether `run_in_background` is offered.
    pub enable_run_in_background: bool,
}

impl Default for ShellToolConfig {
    fn default() -> Self {
        Self { enable_run_in_background: true }
    }
}

impl conch_registry::PluginConfig for ShellToolConfig {}

/// The one-shot shell tool, named after the executor's dialect (`bash`, `pwsh`).
#[derive(Debug)]
pub struct ShellTool {
    shell: Arc<dyn ShellExecutor>,
    jobs: Option<Arc<dyn Jobs>>,
    approval: Option<Arc<dyn Approval>>,
    /// The executor's mode when it confines; escalation is offered only then.
    confining: Option<SandboxMode>,
    schema: serde_json::Value,
    shell_env: Arc<ShellEnv>,
    config: ShellToolConfig,
    dialect: Dialect,
    description: String,
}

impl ShellTool {
    /// A tool over a shell executor, with background jobs when `jobs` is given.
    pub fn new(
        shell: Arc<dyn ShellExecutor>,
        jobs: Option<Arc<dyn Jobs>>,
        shell_env: Arc<ShellEnv>,
        config: ShellToolConfig,
    ) -> Self {
        Self::with_approval(shell, jobs, None, shell_env, config)
    }

    /// A tool that can escalate through `approval` when its executor confines.
    pub fn with_approval(
        shell: Arc<dyn ShellExecutor>,
        jobs: Option<Arc<dyn Jobs>>,
        approval: Option<Arc<dyn Approval>>,
        shell_env: Arc<ShellEnv>,
        config: ShellToolConfig,
    ) -> Self {
        let dialect = shell.dialect();
        let confining = shell.sandbox_mode().filter(|m| m.confines());
        let mut description = format!(
            "Run a command with {one_shot} in a fresh {display} process. No state (working \
             directory, variables, functions) persists between calls: pass workdir instead of {cd}. A \
             non-zero exit is shown as [exit code: N].{exit} Long output keeps its tail and \
             names the file holding the full output. The call ends with its shell: processes \
             it left running ({background}) are stopped and listed.",
            one_shot = dialect.one_shot(),
            display = dialect.display(),
            cd = dialect.change_directory(),
            exit = if dialect.exit_status().is_empty() {
                String::new()
            } else {
                format!(" {}", dialect.exit_status())
            },
            background = dialect.background(),
        );
        let background_offered = config.enable_run_in_background && jobs.is_some();
        if background_offered {
            description.push_str(
                " run_in_background: true returns a job id at once; read it with job_output and \
                 stop it with job_kill.",
            );
        }
        if let Some(mode) = confining {
            description.push_str(&format!(
                " Commands run in a sandbox ({mode} mode); a denied access is shown as \
                 [sandbox: file access denied under {mode} mode] (or network access). If the \
                 command must run outside the sandbox, call again with sandbox_permissions: \
                 \"require_escalated\" and a justification; it runs once without confinement \
                 only if approved."
            ));
        }
        // Built once: the arguments offered depend on the composition, not on the call.
        let mut schema = schema_of::<ShellArgs>();
        // The type's name is the bash tool's; every shell tool's schema is titled by its own.
        schema["title"] = format!("{} arguments", dialect.name()).into();
        schema["description"] = format!("Arguments of `{}`.", dialect.name()).into();
        if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
            if let Some(command) = props.get_mut("command").and_then(|c| c.as_object_mut()) {
                command.insert(
                    "description".into(),
                    format!("The command line to run with {}.", dialect.one_shot()).into(),
                );
            }
            if !background_offered {
                props.remove("run_in_background");
            }
            if confining.is_none() {
                props.remove("sandbox_permissions");
                props.remove("justification");
            }
        }
        Self { shell, jobs, approval, confining, schema, shell_env, config, dialect, description }
    }

    /// The jobs seam, when this tool offers `run_in_background`.
    fn background_offered(&self) -> Result<&Arc<dyn Jobs>> {
        if !self.config.enable_run_in_background {
            return Err(Error::invalid("run_in_background is disabled in this composition"));
        }
        self.jobs.as_ref().ok_or_else(|| {
            Error::new(
                ErrorCode::Unsupported,
                "run_in_background needs the jobs plugin in the composition",
            )
        })
    }

    /// Decides an escalation the call asked for: `Ok` to run it unconfined once.
    async fn escalate(
        &self,
        ctx: &ToolContext,
        command: &str,
        permissions: SandboxPermissions,
        justification: Option<String>,
    ) -> Result<()> {
        let justification = justification.filter(|j| !j.trim().is_empty()).ok_or_else(|| {
            Error::invalid(format!(
                "invalid arguments for `{}`: justification is required when \
                 sandbox_permissions is \"require_escalated\"",
                self.dialect.name()
            ))
        })?;
        let Some(approval) = &self.approval else {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                "escalation refused: no approval provider in this composition (add \
                 approval-allowlist or approval-prompt to allow escalations)",
            ));
        };
        let request = EscalationRequest::new(
            command,
            justification,
            permissions.escalation(),
            ctx.owner.session_id(),
        );
        match approval.approve_escalation(&request).await? {
            ApprovalDecision::Approved => Ok(()),
            ApprovalDecision::Denied { reason } => Err(Error::new(
                ErrorCode::PermissionDenied,
                format!(
                    "escalation denied by {}: {reason}. The command did not run.",
                    approval.provider_name()
                ),
            )),
        }
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

/// The marker for a sandbox denial, or `None` when the sandbox denied nothing.
pub fn sandbox_marker(info: &SandboxInfo) -> Option<String> {
    let what = match info.verdict {
        SandboxVerdict::Denied(Some(Denial::Network)) => "network access",
        SandboxVerdict::Denied(Some(Denial::File) | None) => "file access",
        SandboxVerdict::Clean | SandboxVerdict::RunnerFailed => return None,
    };
    Some(conch_seams::sandbox::denial_marker(what, info.mode))
}

fn sandbox_json(info: &SandboxInfo) -> serde_json::Value {
    serde_json::json!({
        "mode": info.mode.as_str(),
        "denied": info.denied(),
        "denial": info.denial().map(|d| match d {
            Denial::File => "file",
            Denial::Network => "network",
        }),
        "enforcement": info.enforcement.as_ref().map(ToString::to_string),
        "runner_failed": info.runner_failed(),
        "escalated": info.escalated,
    })
}

/// Renders a foreground result the way the model sees it; `background_offered` says whether
/// the leftovers marker may point to `run_in_background`.
pub fn render_run(r: &ShellRunResult, background_offered: bool) -> String {
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
    if let Some(marker) = r.sandbox.as_ref().and_then(sandbox_marker) {
        markers.push(marker);
    }
    if r.sandbox.as_ref().is_some_and(|s| s.escalated) {
        markers.push("[ran outside the sandbox after an approved escalation]".into());
    }
    if !r.leftovers.is_empty() {
        let n = r.leftovers.len();
        let hint = if background_offered {
            "; use run_in_background for processes that must keep running"
        } else {
            ""
        };
        markers.push(format!(
            "[stopped {n} background process{} that outlived the command's shell: {}{hint}]",
            plural(n),
            leftover_list(&r.leftovers)
        ));
    }
    if let Some(marker) = crate::render::status_marker(&r.status) {
        markers.push(marker);
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

#[async_trait]
impl JobOutput for ProcessOutput {
    fn read(&self) -> JobRead {
        self.0.read_output()
    }

    fn snapshot(&self) -> JobRead {
        self.0.snapshot()
    }

    async fn release(&self) -> Result<()> {
        self.0.release().await
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
    if p.sandbox().is_some_and(|s| s.runner_failed()) {
        return JobSettlement {
            status: JobStatus::Killed,
            detail: Some(
                "sandbox unavailable: the runner could not confine the command, which did not run"
                    .into(),
            ),
        };
    }
    match p.status() {
        ShellProcessStatus::Lost => JobSettlement {
            status: JobStatus::Lost,
            detail: p.world_lost().map(|b| {
                let code = b.code;
                format!("{code}: {}", Error::from_body(b))
            }),
        },
        ShellProcessStatus::Killed => JobSettlement {
            status: JobStatus::Killed,
            detail: Some(match p.exit() {
                Some(e) => match e.signal {
                    Some(s) => format!("killed by signal: {s}"),
                    None => "killed".into(),
                },
                // No exit at all: it never started (or its world was lost), and its output
                // is the reason; the completion notice carries it.
                None => p
                    .snapshot()
                    .text
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .map_or_else(|| "killed".into(), str::to_string),
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
impl Tool for ShellTool {
    fn name(&self) -> &str {
        self.dialect.name()
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> serde_json::Value {
        self.schema.clone()
    }

    fn refers_to(&self) -> Vec<ToolRef> {
        if self.background_offered().is_err() {
            return Vec::new();
        }
        let because = "run_in_background is offered; add `tool-jobs: {}` to the composition, or \
                       set `enable_run_in_background: false` on this tool's plugin";
        ["job_output", "job_kill"]
            .into_iter()
            .map(|tool| ToolRef { tool: tool.into(), because: because.into() })
            .collect()
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        // Fields the type knows but this composition withholds get their own reason
        // rather than parse_args' "unknown field".
        let given = |k: &str| args.get(k).is_some();
        if self.confining.is_none() && (given("sandbox_permissions") || given("justification")) {
            return Err(Error::invalid(format!(
                "invalid arguments for `{}`: sandbox_permissions and justification apply only \
                 under a sandboxed executor, and this one confines nothing",
                self.dialect.name()
            )));
        }
        if given("run_in_background") {
            self.background_offered()?;
        }
        let args: ShellArgs = parse_args(self.dialect.name(), args, &self.schema)?;
        let background = args.run_in_background.unwrap_or(false);
        let escalated = args.sandbox_permissions.is_some();
        if escalated && background {
            return Err(Error::invalid(format!(
                "invalid arguments for `{}`: sandbox_permissions applies to foreground calls \
                 only; run the escalated command without run_in_background",
                self.dialect.name()
            )));
        }
        let mut req = ShellExecRequest::new(args.command.clone())
            .with_managed_env(self.shell_env.snapshot(ctx.owner.session_id()));
        req.workdir = args.workdir.map(PathBuf::from);
        req.timeout_ms = args.timeout_ms;
        let asked_timeout = args.timeout_ms;
        if let Some(permissions) = args.sandbox_permissions {
            self.escalate(ctx, &args.command, permissions, args.justification).await?;
            // Approved: this one run, and only it, goes without confinement.
            req.sandbox_mode = Some(SandboxMode::DangerFullAccess);
        }
        if !background {
            req.cancel = Some(ctx.cancel.clone());
            let mut spec = self.shell.resolve(req)?;
            let clamped = timeout_clamp_note(asked_timeout, spec.timeout);
            spec.progress = ctx.progress.clone();
            let mut result = self.shell.run(spec).await?;
            if escalated && let Some(info) = result.sandbox.as_mut() {
                info.escalated = true;
            }
            if result.aborted {
                return Err(Error::new(
                    ErrorCode::Cancelled,
                    format!("the {} tool call was aborted", self.dialect.name()),
                ));
            }
            let mut text = render_run(&result, self.background_offered().is_ok());
            if let Some(note) = clamped {
                text = if text.is_empty() { note } else { format!("{note}\n{text}") };
            }
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
                    "sandbox": result.sandbox.as_ref().map(sandbox_json),
                })),
            });
        }
        let jobs = self.background_offered()?;
        // The tool call's own cancellation applies only until the job id is published.
        if ctx.cancel.is_cancelled() {
            return Err(Error::new(
                ErrorCode::Cancelled,
                format!("the {} tool call was aborted", self.dialect.name()),
            ));
        }
        let spec = self.shell.resolve(req)?;
        let clamped = timeout_clamp_note(asked_timeout, spec.timeout);
        let label = args
            .description
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(|| args.command.clone());
        let mut start = JobStart::new(self.dialect.name(), label);
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
                            // Resolves once the kill was delivered; an undelivered one is
                            // the caller's error (job_kill reports it).
                            cancel: Box::new(move || {
                                let killer = Arc::clone(&killer);
                                Box::pin(async move { killer.kill().await.map(drop) })
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
        let started = format!(
            "started background job {}; read its output with job_output and stop it with job_kill",
            info.id
        );
        Ok(ToolOutput {
            text: match clamped {
                Some(note) => format!("{note}\n{started}"),
                None => started,
            },
            structured: Some(
                serde_json::json!({ "job_id": info.id, "status": info.status.as_str() }),
            ),
        })
    }
}

/// The shell seam's executor, when it speaks `dialect` (the tool named after it).
pub(crate) fn shell_speaking(
    ctx: &BuildContext<'_>,
    plugin: &str,
    dialect: Dialect,
) -> Result<Arc<dyn ShellExecutor>> {
    let shell = ctx.shell()?;
    let speaks = shell.dialect();
    if speaks != dialect {
        return Err(ctx.locate(Error::new(
            ErrorCode::InvalidComposition,
            format!(
                "plugin `{plugin}` runs {} commands, but the shell provider `{}` speaks {}; \
                 use tool-{} with it, or a {} executor",
                dialect.name(),
                shell.provider_name(),
                speaks.name(),
                speaks.name(),
                dialect.name()
            ),
        )));
    }
    Ok(shell)
}

fn build_for(ctx: &BuildContext<'_>, plugin: &str, dialect: Dialect) -> Result<PluginOutput> {
    let config: ShellToolConfig = ctx.config()?;
    let tool = ShellTool::with_approval(
        shell_speaking(ctx, plugin, dialect)?,
        ctx.jobs().ok(),
        ctx.approval(),
        ctx.shell_env(),
        config,
    );
    Ok(PluginOutput::tools(vec![Arc::new(tool)]))
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    build_for(ctx, "tool-bash", Dialect::Bash)
}

register_plugin!(PluginEntry {
    name: "tool-bash",
    provides: None,
    requires: &[SeamId::Shell],
    description: "the one-shot bash tool (fresh process per call, optional background job)",
    build,
});

fn build_pwsh(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    build_for(ctx, "tool-pwsh", Dialect::Pwsh)
}

register_plugin!(PluginEntry {
    name: "tool-pwsh",
    provides: None,
    requires: &[SeamId::Shell],
    description: "the one-shot pwsh tool (fresh PowerShell 7 per call, optional background job)",
    build: build_pwsh,
});

#[cfg(test)]
mod tests {
    use conch_seams::{CollectedOutput, ExitStatus, Leftover, SpillRef};

    use super::*;

    fn result(output: CollectedOutput) -> ShellRunResult {
        ShellRunResult {
            status: ExitStatus::code(0),
            timed_out: false,
            aborted: false,
            timeout_ms: 1000,
            output,
            stderr: None,
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
        let named = render_run(&result(out(Some(SpillRef::local("/tmp/s/stream-1")), false)), true);
        assert_eq!(named, "[output truncated; full output: /tmp/s/stream-1]\ntail\n");
        let evicted = render_run(&result(out(None, true)), true);
        assert_eq!(
            evicted,
            "[output truncated; 100 earlier bytes omitted; the full output was evicted from the \
             spill directory (spill limits)]\ntail\n"
        );
        let capped = render_run(&result(out(None, false)), true);
        assert!(capped.contains("exceeded the spill cap"), "{capped}");
    }

    #[test]
    fn every_one_shot_ending_renders_a_status_parse_exit_status_recovers() {
        use crate::render::{RenderedExit, parse_exit_status};
        let with = |text: &str, status: ExitStatus, timed_out: bool| {
            let mut r = result(CollectedOutput { text: text.into(), ..CollectedOutput::default() });
            r.status = status;
            r.timed_out = timed_out;
            r
        };
        let killed = ExitStatus { code: None, signal: Some("SIGTERM".into()) };
        let mut denied = with("touch: denied\n", ExitStatus::code(1), false);
        let info = SandboxInfo::new(SandboxMode::ReadOnly);
        denied.sandbox = Some(info.with_verdict(SandboxVerdict::Denied(None)));
        let mut left = with("started", ExitStatus::code(0), false);
        left.leftovers = vec![Leftover { pid: 42, name: "sleep".into(), held_output: true }];
        let cases = [
            (with("ok\n", ExitStatus::code(0), false), RenderedExit::Code(0)),
            (with("", ExitStatus::code(0), false), RenderedExit::Code(0)),
            (with("partial", ExitStatus::code(7), false), RenderedExit::Code(7)),
            (with("started\n", killed.clone(), true), RenderedExit::Signal("SIGTERM".into())),
            (denied, RenderedExit::Code(1)),
            (left, RenderedExit::Code(0)),
            // The command printed a marker-like line, then a newline: output, exit 0.
            (with("[exit code: 5]\n", ExitStatus::code(0), false), RenderedExit::Code(0)),
        ];
        for (r, want) in cases {
            let text = render_run(&r, true);
            assert_eq!(parse_exit_status(&text), Some(want), "{text:?}");
        }
    }

    #[test]
    fn the_leftovers_marker_points_to_run_in_background_only_where_it_is_offered() {
        let mut r =
            result(CollectedOutput { text: "started\n".into(), ..CollectedOutput::default() });
        r.leftovers = vec![Leftover { pid: 42, name: "sleep".into(), held_output: false }];
        let offered = render_run(&r, true);
        assert!(offered.contains("use run_in_background"), "{offered}");
        let not_offered = render_run(&r, false);
        assert!(not_offered.contains("[stopped 1 background process"), "{not_offered}");
        assert!(!not_offered.contains("run_in_background"), "{not_offered}");
    }

    #[test]
    fn a_sandbox_denial_renders_its_marker_with_the_mode() {
        let mut r = result(CollectedOutput {
            text: "touch: cannot touch '/etc/x': Permission denied\n".into(),
            ..CollectedOutput::default()
        });
        r.status = ExitStatus::code(1);
        let mut info = SandboxInfo::new(SandboxMode::WorkspaceWrite);
        r.sandbox = Some(info.clone());
        assert!(!render_run(&r, true).contains("[sandbox:"), "no denial, no marker");
        info.verdict = SandboxVerdict::Denied(None);
        r.sandbox = Some(info.clone());
        assert_eq!(
            render_run(&r, true),
            "touch: cannot touch '/etc/x': Permission denied\n\
             [sandbox: file access denied under workspace-write mode]\n[exit code: 1]"
        );
        info.verdict = SandboxVerdict::Denied(Some(Denial::Network));
        info.mode = SandboxMode::ReadOnly;
        r.sandbox = Some(info);
        assert!(
            render_run(&r, true).contains("[sandbox: network access denied under read-only mode]"),
            "{}",
            render_run(&r, true)
        );
    }
}
