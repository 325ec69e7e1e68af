//! The model-facing tools over the standard composition, with real processes.

use std::time::Duration;

use conch_jobs::NoticeRoute;
use conch_seams::ErrorCode;
use serde_json::json;

use crate::{owner, standard};

pub(crate) async fn call(
    rt: &conch_registry::Runtime,
    o: &std::sync::Arc<conch_seams::Owner>,
    tool: &str,
    args: serde_json::Value,
) -> conch_seams::ToolOutput {
    rt.call(o, tool, args).await.unwrap_or_else(|e| panic!("{tool} failed: {e}"))
}

pub(crate) async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    conch_conformance::within(what, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn bash_returns_plain_output_for_success() {
    let rt = standard();
    let (o, _) = owner("s");
    let out = call(&rt, &o, "bash", json!({"command": "echo hello"})).await;
    assert_eq!(out.text, "hello\n");
    assert_eq!(out.structured.unwrap()["exit_code"], 0);
    rt.shutdown().await;
}

#[tokio::test]
async fn bash_marks_nonzero_exit_timeout_and_signal() {
    let rt = standard();
    let (o, _) = owner("s");
    let out = call(&rt, &o, "bash", json!({"command": "echo x; exit 3"})).await;
    assert_eq!(out.text, "x\n[exit code: 3]");
    let out =
        call(&rt, &o, "bash", json!({"command": "echo begun; sleep 100", "timeout_ms": 300})).await;
    assert_eq!(out.text, "begun\n[timed out after 300ms]\n[killed by signal: SIGTERM]");
    let out = call(&rt, &o, "bash", json!({"command": "kill -9 $$"})).await;
    assert_eq!(out.text, "[killed by signal: SIGKILL]");
    rt.shutdown().await;
}

#[tokio::test]
async fn bash_truncates_to_the_tail_and_names_the_full_output() {
    let rt = standard();
    let (o, _) = owner("s");
    let out = call(&rt, &o, "bash", json!({"command": "seq 1 100000"})).await;
    let first = out.text.lines().next().unwrap();
    let path = first
        .strip_prefix("[output truncated; full output: ")
        .and_then(|s| s.strip_suffix(']'))
        .expect(first);
    let full = std::fs::read_to_string(path).unwrap();
    assert_eq!(full.lines().count(), 100_000);
    assert!(out.text.ends_with("99999\n100000\n"));
    assert!(out.text.len() <= 64_000 + first.len() + 1);
    rt.shutdown().await;
}

#[tokio::test]
async fn bash_is_a_fresh_shell_with_workdir_and_managed_env() {
    let rt = standard();
    let (o, _) = owner("sess-7");
    call(&rt, &o, "bash", json!({"command": "cd /; export FOO=1"})).await;
    let dir = tempfile::tempdir().unwrap();
    let wd = dir.path().canonicalize().unwrap();
    let out =
        call(&rt, &o, "bash", json!({"command": "echo ${FOO-unset}; pwd -P", "workdir": wd})).await;
    assert_eq!(out.text, format!("unset\n{}\n", wd.display()));
    let out = call(
        &rt,
        &o,
        "bash",
        json!({"command": "echo $CONCH_SESSION_ID $CONCH_SHELL $CONCH_HOME"}),
    )
    .await;
    assert_eq!(out.text, "sess-7 1 /tmp/conch-test-home\n");
    rt.shutdown().await;
}

#[tokio::test]
async fn bad_arguments_are_invalid_argument_errors_naming_the_field() {
    let rt = standard();
    let (o, _) = owner("s");
    let e = rt.call(&o, "bash", json!({"command": 5})).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = rt.call(&o, "bash", json!({"command": "true", "cwd": "/"})).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.to_string().contains("cwd"), "{e}");
    let e = rt
        .call(&o, "bash", json!({"command": "true", "workdir": "/nonexistent/x"}))
        .await
        .unwrap_err();
    // The directory is checked where the world is: the subprocess provider refuses the spawn.
    assert_eq!(e.code(), ErrorCode::SpawnFailed);
    assert!(e.to_string().contains("/nonexistent/x"), "{e}");
    let e = rt.call(&o, "no_such_tool", json!({})).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    rt.shutdown().await;
}

#[tokio::test]
async fn bash_writes_a_file_with_a_heredoc_longer_than_one_argument() {
    let rt = standard();
    let (o, _) = owner("s");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.txt");
    // 150 KB: more than Linux lets one argv string carry, the way models write files.
    let body: String = (0..5000).map(|i| format!("{i} ünïcødé 'q' \"$q\" \\ `b`\n")).collect();
    assert!(body.len() > 150_000);
    let cmd = format!("cat > '{}' <<'EOF'\n{body}EOF\nwc -c < '{0}'", file.display());
    let out = call(&rt, &o, "bash", json!({ "command": cmd })).await;
    assert_eq!(out.text, format!("{}\n", body.len()));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), body);
    let e = rt
        .call(&o, "bash", json!({ "command": format!("#{}", "x".repeat(1_048_576)) }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(
        e.to_string().contains(
            "command is 1048577 bytes; the limit is 1048576 (bash-local max_command_bytes)"
        ),
        "{e}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn every_argument_error_names_its_field() {
    let rt = standard();
    let (o, _) = owner("s");
    let cases = [
        (
            "bash",
            json!({"command": "true", "timeout_ms": -5}),
            "invalid arguments for `bash`: timeout_ms: invalid value: integer `-5`, expected u64",
        ),
        (
            "bash",
            json!({"command": "true", "timeout_ms": "5000"}),
            "invalid arguments for `bash`: timeout_ms: invalid type: string \"5000\", expected u64",
        ),
        (
            "bash",
            json!({"command": "true", "run_in_background": "yes"}),
            "invalid arguments for `bash`: run_in_background: invalid type: string \"yes\", expected a boolean",
        ),
        (
            "job_output",
            json!({"job_id": "bash-1", "timeout_ms": "soon"}),
            "invalid arguments for `job_output`: timeout_ms: invalid type: string \"soon\", expected u64",
        ),
        (
            "job_output",
            json!({"job_id": 7}),
            "invalid arguments for `job_output`: job_id: invalid type: integer `7`, expected a string",
        ),
    ];
    for (tool, args, want) in cases {
        let e = rt.call(&o, tool, args).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
        assert_eq!(e.message(), want);
    }
    // An unknown field is named too (deny_unknown_fields).
    let e = rt.call(&o, "bash", json!({"command": "true", "timeout_mss": 5})).await.unwrap_err();
    assert!(e.message().starts_with("invalid arguments for `bash`: "), "{e}");
    assert!(e.message().contains("unknown field `timeout_mss`"), "{e}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_read_that_lost_bytes_says_how_many() {
    // Memory keeps 1000 bytes and there is no spill to fall back on (the cap equals the
    // window), so a read after 5000 bytes skips 4000 of them and must say so.
    let rt = crate::runtime(
        "plugins:\n  subprocess-local: {}\n  bash-local: { max_output_bytes: 1000, max_spill_bytes: 1000 }\n  jobs: {}\n  tool-bash: {}\n  tool-jobs: {}\n",
    );
    let (o, _) = owner("s");
    let args = json!({"command": "head -c 5000 /dev/zero | tr '\\0' x", "run_in_background": true});
    let out = call(&rt, &o, "bash", args).await;
    let id = out.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    let out =
        call(&rt, &o, "job_output", json!({"job_id": id, "wait": true, "timeout_ms": 30000})).await;
    let s = out.structured.as_ref().unwrap();
    assert_eq!(s["status"], "completed", "{}", out.text);
    assert_eq!(s["lossy"], true);
    assert_eq!(s["skipped_bytes"], 4000);
    assert!(out.text.contains("[output truncated; 4000 earlier bytes omitted]"), "{}", out.text);
    assert_eq!(s["output"].as_str().unwrap().len(), 1000);
    rt.shutdown().await;
}

#[tokio::test]
async fn background_job_output_is_a_consuming_delta_and_wait_returns_final() {
    let rt = standard();
    let (o, _) = owner("s");
    let out = call(
        &rt,
        &o,
        "bash",
        json!({"command": "echo one; echo two; exit 4", "run_in_background": true}),
    )
    .await;
    let id = out.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("bash-"), "{id}");
    let out =
        call(&rt, &o, "job_output", json!({"job_id": id, "wait": true, "timeout_ms": 30000})).await;
    let s = out.structured.unwrap();
    assert_eq!(s["status"], "completed");
    assert_eq!(s["detail"], "exit code: 4");
    assert_eq!(s["output"], "one\ntwo\n");
    let again = call(&rt, &o, "job_output", json!({"job_id": id})).await;
    assert_eq!(again.structured.unwrap()["output"], "", "output is consumed once");
    rt.shutdown().await;
}

#[tokio::test]
async fn wait_deadline_returns_running_and_kill_then_settles_killed() {
    let rt = standard();
    let (o, _) = owner("s");
    let out =
        call(&rt, &o, "bash", json!({"command": "echo up; sleep 1000", "run_in_background": true}))
            .await;
    let id = out.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    let out =
        call(&rt, &o, "job_output", json!({"job_id": id, "wait": true, "timeout_ms": 200})).await;
    assert_eq!(out.structured.unwrap()["status"], "running", "a wait that runs out does not kill");
    let out = call(&rt, &o, "job_kill", json!({"job_id": id})).await;
    let s = out.structured.unwrap();
    assert_eq!(s["cancel_requested"], true);
    let out =
        call(&rt, &o, "job_output", json!({"job_id": id, "wait": true, "timeout_ms": 30000})).await;
    let s = out.structured.unwrap();
    assert_eq!(s["status"], "killed");
    let list = call(&rt, &o, "job_list", json!({})).await;
    assert!(list.text.contains(&id) && list.text.contains("killed"), "{}", list.text);
    rt.shutdown().await;
}

#[tokio::test]
async fn jobs_are_fenced_by_exact_owner() {
    let rt = standard();
    let (a, _) = owner("same-session");
    let (b, _) = owner("same-session");
    let out =
        call(&rt, &a, "bash", json!({"command": "sleep 1000", "run_in_background": true})).await;
    let id = out.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    for tool in ["job_output", "job_kill"] {
        let e = rt.call(&b, tool, json!({"job_id": id})).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::ForeignOwner, "{tool}: {e}");
    }
    let e = rt.call(&a, "job_output", json!({"job_id": "bash-999"})).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert_eq!(call(&rt, &b, "job_list", json!({})).await.text, "no jobs");
    a.dispose().await;
    rt.shutdown().await;
}

#[tokio::test]
async fn per_owner_cap_rejects_the_eleventh_job() {
    let rt = standard();
    let (o, _) = owner("s");
    for _ in 0..10 {
        call(&rt, &o, "bash", json!({"command": "sleep 1000", "run_in_background": true})).await;
    }
    let e = rt
        .call(&o, "bash", json!({"command": "sleep 1000", "run_in_background": true}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::LimitExceeded, "{e}");
    conch_conformance::within("owner disposal", o.dispose()).await;
    rt.shutdown().await;
}

#[tokio::test]
async fn completion_notice_follows_up_an_idle_owner() {
    let rt = standard();
    let (o, sink) = owner("s");
    let out = call(&rt, &o, "bash", json!({"command": "true", "run_in_background": true})).await;
    let id = out.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    let mut got = Vec::new();
    eventually("a completion notice", || {
        got.extend(sink.take());
        !got.is_empty()
    })
    .await;
    assert_eq!(got[0].0, NoticeRoute::Followup);
    assert_eq!(got[0].1.source_id, id);
    rt.shutdown().await;
}

#[tokio::test]
async fn owner_disposal_kills_and_awaits_its_jobs_then_deletes_records() {
    let rt = standard();
    let (o, _) = owner("s");
    let out = call(
        &rt,
        &o,
        "bash",
        json!({"command": "echo $$; exec sleep 1000", "run_in_background": true}),
    )
    .await;
    let id = out.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    let mut text = String::new();
    eventually("the job's pid", || {
        text.push_str(&job_text(&rt, &o, &id));
        text.contains('\n')
    })
    .await;
    let pid: i32 = text.trim().parse().unwrap();
    conch_conformance::within("owner disposal", o.dispose()).await;
    assert!(conch_conformance::pid_gone(pid), "the job's process is gone once disposal returns");
    rt.shutdown().await;
}

fn job_text(rt: &conch_registry::Runtime, o: &conch_seams::Owner, id: &str) -> String {
    let jobs = rt.seams().jobs.clone().unwrap();
    jobs.read_output(o, id).map(|(_, r)| r.text).unwrap_or_default()
}

/// Runs `bash` with a command that first touches a marker, returns the call's task once the
/// command is running, and the pid it printed into the marker.
async fn running_call(
    rt: &std::sync::Arc<conch_registry::Runtime>,
    ctx: conch_seams::ToolContext,
    dir: &std::path::Path,
) -> (tokio::task::JoinHandle<conch_seams::Result<conch_seams::ToolOutput>>, i32) {
    let marker = dir.join("running");
    let cmd = format!("echo $$ > {}.tmp && mv {0}.tmp {0}; exec sleep 1000", marker.display());
    let rt2 = std::sync::Arc::clone(rt);
    let task =
        tokio::spawn(async move { rt2.call_with(&ctx, "bash", json!({"command": cmd})).await });
    eventually("the command to start", || marker.exists()).await;
    let pid = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    (task, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disposing_an_owner_aborts_its_calls_in_flight() {
    let rt = std::sync::Arc::new(standard());
    let (o, _) = owner("s");
    let dir = tempfile::tempdir().unwrap();
    let (task, pid) =
        running_call(&rt, conch_seams::ToolContext::new(std::sync::Arc::clone(&o)), dir.path())
            .await;
    conch_conformance::within("owner disposal", o.dispose()).await;
    let r = conch_conformance::within("the aborted call", task).await.unwrap();
    let e = r.expect_err("the call was aborted by the disposal");
    assert_eq!(e.code(), ErrorCode::Cancelled, "{e}");
    eventually("the command's process to be gone", || conch_conformance::pid_gone(pid)).await;
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_with_takes_the_front_ends_cancellation() {
    let rt = std::sync::Arc::new(standard());
    let (o, _) = owner("s");
    let dir = tempfile::tempdir().unwrap();
    let ctx = conch_seams::ToolContext::new(std::sync::Arc::clone(&o));
    let cancel = ctx.cancel.clone();
    let (task, pid) = running_call(&rt, ctx, dir.path()).await;
    cancel.cancel();
    let r = conch_conformance::within("the cancelled call", task).await.unwrap();
    assert_eq!(r.unwrap_err().code(), ErrorCode::Cancelled);
    eventually("the command's process to be gone", || conch_conformance::pid_gone(pid)).await;
    assert!(o.is_live(), "cancelling one call leaves its owner alone");
    let out = call(&rt, &o, "bash", json!({"command": "echo still"})).await;
    assert_eq!(out.text, "still\n");
    rt.shutdown().await;
}

fn spill_of(text: &str) -> std::path::PathBuf {
    let first = text.lines().next().unwrap_or_default();
    first
        .strip_prefix("[output truncated; full output: ")
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or_else(|| panic!("a spill is named: {first}"))
        .into()
}

/// A runtime whose subprocess provider keeps its spill home under `parent`, with `limits`
/// (extra `subprocess-local` keys).
fn spilling(parent: &std::path::Path, limits: &str) -> conch_registry::Runtime {
    crate::runtime(&format!(
        "plugins:\n  subprocess-local: {{ spill_dir: {parent:?}{limits} }}\n  bash-local: {{}}\n  jobs: {{}}\n  tool-bash: {{}}\n  tool-jobs: {{}}\n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spills_results_named_outlive_their_job_record_and_the_runtime() {
    let parent = tempfile::tempdir().unwrap();
    let rt = spilling(parent.path(), "");
    let (o, _) = owner("s");
    let fg = spill_of(&call(&rt, &o, "bash", json!({"command": "seq 1 100000"})).await.text);
    let home = parent.path().join(format!("conch-spills-{}", nix_euid()));
    assert!(fg.starts_with(&home), "{fg:?} is in the spill home under the configured spill_dir");
    let out =
        call(&rt, &o, "bash", json!({"command": "seq 1 100000", "run_in_background": true})).await;
    let id = out.structured.unwrap()["job_id"].as_str().unwrap().to_string();
    let done =
        call(&rt, &o, "job_output", json!({"job_id": id, "wait": true, "timeout_ms": 30000})).await;
    let bg: std::path::PathBuf = done.structured.unwrap()["spill_path"].as_str().unwrap().into();
    conch_conformance::within("owner disposal", o.dispose()).await;
    rt.shutdown().await;
    // Disposal deleted the job's record and shutdown ended the runtime; the paths its
    // results named still hold every byte.
    for spill in [&fg, &bg] {
        assert_eq!(std::fs::read_to_string(spill).unwrap().lines().count(), 100_000, "{spill:?}");
    }
    use std::os::unix::fs::PermissionsExt;
    for (path, mode) in [(&home, 0o700), (&fg, 0o600), (&fg.parent().unwrap().to_path_buf(), 0o700)]
    {
        let m = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, mode, "{path:?}");
    }
}

fn nix_euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    // A file this process creates is owned by its effective uid.
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_run_evicts_what_ended_runs_left_by_age_then_total() {
    let parent = tempfile::tempdir().unwrap();
    // 588,895 bytes a spill: two fit under the 1.5 MB cap, three do not.
    let cap = ", max_spill_total_bytes: 1500000";
    let mut left = Vec::new();
    for _ in 0..2 {
        let rt = spilling(parent.path(), cap);
        let (o, _) = owner("s");
        left.push(spill_of(&call(&rt, &o, "bash", json!({"command": "seq 1 100000"})).await.text));
        o.dispose().await;
        rt.shutdown().await;
    }
    assert!(left.iter().all(|p| p.is_file()), "two ended runs' spills fit the cap: {left:?}");
    // The oldest was written first; its age now counts against it too.
    let rt = spilling(parent.path(), cap);
    let (o, _) = owner("s");
    let mine = spill_of(&call(&rt, &o, "bash", json!({"command": "seq 1 100000"})).await.text);
    o.dispose().await;
    rt.shutdown().await;
    assert!(mine.is_file(), "the run's own spill stays");
    assert!(!left[0].exists(), "past the cap, the oldest ended run's spill goes first");
    assert!(left[1].is_file(), "then the total fits again: {:?}", left[1]);
    assert!(!left[0].parent().unwrap().exists(), "its empty directory goes too");
    // With an age limit of 1 ms every ended run's spill is too old for the next run that
    // spills (its shutdown bounds the home).
    let rt = spilling(parent.path(), ", max_spill_age_ms: 1");
    let (o, _) = owner("s");
    call(&rt, &o, "bash", json!({"command": "seq 1 100000"})).await;
    o.dispose().await;
    rt.shutdown().await;
    assert!(!left[1].exists() && !mine.exists(), "ended runs' spills past the age limit go");
}
