//! `job_output`, `job_list`, `job_kill`: model-facing controls over the jobs seam.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conch_output::tail_lines_utf8;
use conch_registry::{BuildContext, PluginEntry, PluginOutput, SeamId, register_plugin};
use conch_seams::{JobInfo, JobRead, Jobs, Result, Tool, ToolContext, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::args::{parse_args, schema_of};

/// Longest wait `job_output` accepts.
const MAX_WAIT_MS: u64 = 600_000;

fn info_json(info: &JobInfo) -> serde_json::Value {
    serde_json::json!({
        "job_id": info.id,
        "kind": info.kind,
        "label": info.label,
        "status": info.status.as_str(),
        "detail": info.detail,
        "cancel_requested": info.cancel_requested,
        "elapsed_ms": info.elapsed_ms,
    })
}

fn render(info: &JobInfo, read: &JobRead) -> ToolOutput {
    // Cut by the cap: start the kept tail at a line, so no fragment passes for a line.
    let (text, mid_line) = tail_lines_utf8(&read.text, info.output_cap);
    let cut = text.len() < read.text.len();
    let mut head = format!("[job {}: {}", info.id, info.status.as_str());
    if let Some(d) = &info.detail {
        head.push_str(&format!("; {d}"));
    }
    head.push(']');
    let mut out = head;
    if read.lossy || cut {
        // Without a complete spill the skipped bytes are gone: say how many.
        let gone = match read.skipped_bytes {
            0 => String::new(),
            n => format!("; {n} earlier bytes omitted"),
        };
        match &read.spill {
            Some(p) => out.push_str(&format!("\n[output truncated; full output: {p}]")),
            None if read.spill_evicted => {
                out.push_str(&format!("\n[output truncated{gone}; {}]", crate::shell::EVICTED));
            }
            None => out.push_str(&format!("\n[output truncated{gone}]")),
        }
        if cut && mid_line {
            out.push_str("\n[the kept output starts mid-line]");
        }
    }
    if !text.is_empty() {
        out.push('\n');
        out.push_str(text);
    }
    let mut json = info_json(info);
    json["output"] = serde_json::Value::String(text.to_string());
    json["lossy"] = serde_json::Value::Bool(read.lossy || cut);
    json["skipped_bytes"] = serde_json::Value::from(read.skipped_bytes);
    json["spill_path"] = read
        .spill
        .as_ref()
        .map_or(serde_json::Value::Null, |s| serde_json::Value::String(s.to_string()));
    json["spill_evicted"] = serde_json::Value::Bool(read.spill_evicted);
    ToolOutput { text: out, structured: Some(json) }
}

/// Arguments of `job_output`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobOutputArgs {
    /// The job id, such as `bash-1`.
    pub job_id: String,
    /// Wait for the job to finish (up to timeout_ms) before reading.
    #[serde(default)]
    pub wait: bool,
    /// How long a wait may take, in milliseconds (default 30000, limit 600000; a larger
    /// value is lowered to the limit and the result says so). A wait that runs out returns
    /// the job still running; it does not kill it.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `job_output`: consuming delta read, optionally after a bounded wait.
#[derive(Debug)]
pub struct JobOutputTool {
    jobs: Arc<dyn Jobs>,
}

#[async_trait]
impl Tool for JobOutputTool {
    fn name(&self) -> &'static str {
        "job_output"
    }

    fn description(&self) -> &'static str {
        "Read new output of a background job since the last read (each byte is returned at \
         most once). Output that was not kept between reads is reported, never hidden: \
         `[output truncated; full output: PATH]`, or how many earlier bytes were omitted. \
         With wait: true, wait up to timeout_ms for the job to finish first; if it is still \
         running then, it keeps running."
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<JobOutputArgs>()
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: JobOutputArgs = parse_args("job_output", args, &schema_of::<JobOutputArgs>())?;
        let mut clamped = None;
        if args.wait {
            let ms = args.timeout_ms.unwrap_or(30_000).min(MAX_WAIT_MS);
            clamped = crate::render::timeout_clamp_note(args.timeout_ms, Duration::from_millis(ms));
            // This tool owns its deadline: running out is a normal "still running" answer.
            tokio::select! {
                r = self.jobs.wait(&ctx.owner, &args.job_id, Duration::from_millis(ms)) => { r?; }
                () = ctx.cancel.cancelled() => {}
            }
        }
        let (info, read) = self.jobs.read_output(&ctx.owner, &args.job_id)?;
        let mut out = render(&info, &read);
        if let Some(note) = clamped {
            out.text = format!("{note}\n{}", out.text);
        }
        Ok(out)
    }
}

/// Arguments of `job_list` (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobListArgs {}

/// `job_list`: the caller's live and settled jobs.
#[derive(Debug)]
pub struct JobListTool {
    jobs: Arc<dyn Jobs>,
}

#[async_trait]
impl Tool for JobListTool {
    fn name(&self) -> &'static str {
        "job_list"
    }

    fn description(&self) -> &'static str {
        "List your background jobs (running and finished) with their status."
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<JobListArgs>()
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let _: JobListArgs = parse_args("job_list", args, &schema_of::<JobListArgs>())?;
        let list = self.jobs.list(&ctx.owner);
        let text = if list.is_empty() {
            "no jobs".to_string()
        } else {
            list.iter()
                .map(|j| {
                    let detail = j.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
                    format!("{}\t{}{}\t{}", j.id, j.status.as_str(), detail, j.label)
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        Ok(ToolOutput {
            text,
            structured: Some(
                serde_json::json!({ "jobs": list.iter().map(info_json).collect::<Vec<_>>() }),
            ),
        })
    }
}

/// Arguments of `job_kill`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobKillArgs {
    /// The job id.
    pub job_id: String,
}

/// `job_kill`: requests cancellation; the terminal state follows the producer's settlement.
#[derive(Debug)]
pub struct JobKillTool {
    jobs: Arc<dyn Jobs>,
}

#[async_trait]
impl Tool for JobKillTool {
    fn name(&self) -> &'static str {
        "job_kill"
    }

    fn description(&self) -> &'static str {
        "Request that a background job stop. Returns once the request was delivered (an error \
         when it could not be: the job is then marked failed and may still run); use \
         job_output with wait: true to see its final state."
    }

    fn input_schema(&self) -> serde_json::Value {
        schema_of::<JobKillArgs>()
    }

    async fn call(&self, ctx: &ToolContext, args: serde_json::Value) -> Result<ToolOutput> {
        let args: JobKillArgs = parse_args("job_kill", args, &schema_of::<JobKillArgs>())?;
        self.jobs.kill(&ctx.owner, &args.job_id).await?;
        // A non-consuming snapshot, so the remaining output is still there for job_output.
        let (info, read) = self.jobs.peek_output(&ctx.owner, &args.job_id)?;
        let mut out = render(&info, &read);
        let note = if info.status == conch_seams::JobStatus::Running {
            "cancellation requested"
        } else {
            "job has settled"
        };
        out.text = format!("{note}: {}", out.text);
        if let Some(s) = out.structured.as_mut() {
            s["result"] = serde_json::Value::String(note.into());
        }
        Ok(out)
    }
}

fn build(ctx: &BuildContext<'_>) -> Result<PluginOutput> {
    let _: conch_registry::NoConfig = ctx.config()?;
    let jobs = ctx.jobs()?;
    Ok(PluginOutput::tools(vec![
        Arc::new(JobOutputTool { jobs: Arc::clone(&jobs) }),
        Arc::new(JobListTool { jobs: Arc::clone(&jobs) }),
        Arc::new(JobKillTool { jobs }),
    ]))
}

register_plugin!(PluginEntry {
    name: "tool-jobs",
    provides: None,
    requires: &[SeamId::Jobs],
    description: "job_output, job_list and job_kill over the jobs seam",
    build,
});
