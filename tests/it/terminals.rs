//! Terminal sessions over real PTYs: readiness tiers, state, signals, teardown, jobs.

use std::sync::Arc;

use conch_registry::Runtime;
use conch_seams::{ErrorCode, Owner, ToolOutput};
use serde_json::{Value, json};

use crate::{owner, runtime};

fn terminal_runtime(idle_ms: u64) -> Runtime {
    runtime(&format!(
        "plugins:\n  subprocess-local: {{}}\n  terminal-bash: {{ idle_silence_ms: {idle_ms}, dispose_grace_ms: 500 }}\n  terminals: {{}}\n  jobs: {{}}\n  tool-terminal: {{}}\n  tool-jobs: {{}}\n"
    ))
}

async fn call(rt: &Runtime, o: &Arc<Owner>, tool: &str, args: Value) -> ToolOutput {
    rt.call(o, tool, args).await.unwrap_or_else(|e| panic!("{tool} failed: {e}"))
}

async fn open(rt: &Runtime, o: &Arc<Owner>) -> String {
    let out = call(rt, o, "terminal_open", json!({})).await;
    out.structured.unwrap()["session_id"].as_str().unwrap().to_string()
}

async fn send(rt: &Runtime, o: &Arc<Owner>, id: &str, text: &str) -> Value {
    call(rt, o, "terminal_send", json!({"session_id": id, "text": text})).await.structured.unwrap()
}

/// Starts `text` as a background send (a `pty-send` job); returns the job id.
async fn send_in_background(rt: &Runtime, o: &Arc<Owner>, id: &str, text: &str) -> String {
    let args = json!({"session_id": id, "text": text, "run_in_background": true});
    let out = call(rt, o, "terminal_send", args).await;
    out.structured.unwrap()["job_id"].as_str().unwrap().to_string()
}

fn pid_gone(pid: i32) -> bool {
    conch_conformance::pid_gone(pid)
}

fn first_number(s: &str) -> i32 {
    s.lines()
        .filter_map(|l| l.trim().parse().ok())
        .next()
        .unwrap_or_else(|| panic!("no pid in {s:?}"))
}

/// Waits until one of the owner's sessions shows `needle` in its scrollback (polling: the
/// scrollback has no change notification).
async fn await_scrollback(rt: &Runtime, o: &Owner, needle: &str) {
    let terminals = rt.seams().terminals.clone().unwrap();
    conch_conformance::within(needle, async {
        loop {
            let seen = terminals
                .list(o)
                .iter()
                .any(|i| terminals.read(o, &i.id, 0, 50).is_ok_and(|p| p.text.contains(needle)));
            if seen {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_returns_at_the_prompt_with_stdin_read() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    assert!(id.starts_with("pty-"), "{id}");
    let r = send(&rt, &o, &id, "echo hello").await;
    assert_eq!(r["wait_reason"], "stdin_read");
    assert_eq!(r["session_status"]["state"], "running");
    assert!(r["output"].as_str().unwrap().contains("hello\n"), "{r}");
    assert!(!r["output"].as_str().unwrap().contains("7770"), "the prompt marker is stripped: {r}");
    call(&rt, &o, "terminal_close", json!({"session_id": id})).await;
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_input_and_read_prompt_are_stdin_read_not_idle() {
    // A long idle window: reaching stdin_read proves the exact probe (or prompt) fired first.
    let rt = terminal_runtime(20_000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let r = send(&rt, &o, &id, "python3 -c 'input()'").await;
    assert_eq!(r["wait_reason"], "stdin_read", "{r}");
    let r = send(&rt, &o, &id, "").await;
    assert_eq!(r["wait_reason"], "stdin_read", "python got its line and the prompt came back: {r}");
    let r = send(&rt, &o, &id, "read -p 'name? ' n").await;
    assert_eq!(r["wait_reason"], "stdin_read", "{r}");
    assert!(r["output"].as_str().unwrap().contains("name? "), "{r}");
    let r = send(&rt, &o, &id, "conch").await;
    assert_eq!(r["wait_reason"], "stdin_read");
    let r = send(&rt, &o, &id, "echo \"got $n\"").await;
    assert!(r["output"].as_str().unwrap().contains("got conch"), "{r}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_command_is_inferred_idle_and_ctrl_c_recovers_the_shell() {
    let rt = terminal_runtime(500);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let r = send(&rt, &o, &id, "sleep 1000").await;
    assert_eq!(r["wait_reason"], "inferred_idle", "sleep is not reading stdin: {r}");
    let s = call(&rt, &o, "terminal_signal", json!({"session_id": id, "signal": "SIGINT"})).await;
    assert_eq!(s.structured.unwrap()["delivered"], true);
    let r = send(&rt, &o, &id, "echo back").await;
    assert_eq!(r["wait_reason"], "stdin_read", "{r}");
    assert!(r["output"].as_str().unwrap().contains("back\n"), "{r}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cwd_and_exported_variables_persist_across_sends() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    send(&rt, &o, &id, "cd /tmp && export CONCH_T_VAR=kept").await;
    let r = send(&rt, &o, &id, "echo \"$CONCH_T_VAR $(pwd)\"").await;
    assert!(r["output"].as_str().unwrap().contains("kept /tmp\n"), "{r}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_argument_errors_name_the_field() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let e = rt
        .call(&o, "terminal_send", json!({"session_id": "pty-1", "text": "x", "submit": "no"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert_eq!(
        e.message(),
        "invalid arguments for `terminal_send`: submit: invalid type: string \"no\", expected a boolean"
    );
    let e = rt.call(&o, "terminal_send", json!({"session_id": "pty-1", "text": ["x"]})).await;
    assert_eq!(
        e.unwrap_err().message(),
        "invalid arguments for `terminal_send`: text: invalid type: sequence, expected a string"
    );
    let e = rt
        .call(&o, "terminal_send", json!({"session_id": "pty-1", "text": "x", "sumbit": true}))
        .await
        .unwrap_err();
    assert!(e.message().contains("unknown field `sumbit`"), "{e}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_signal_list_and_close_answer_in_prose_with_the_facts_structured() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("prose");
    let text = |out: &ToolOutput| {
        assert!(!out.text.trim_start().starts_with('{'), "prose, not JSON: {}", out.text);
        out.text.clone()
    };
    assert_eq!(
        text(&call(&rt, &o, "terminal_list", json!({})).await),
        "No open terminal sessions."
    );
    let opened = call(&rt, &o, "terminal_open", json!({"name": "main"})).await;
    assert_eq!(
        text(&opened),
        "Opened terminal session pty-1 (bash, name \"main\", unconfined); type into it with \
         terminal_send."
    );
    assert_eq!(opened.structured.as_ref().unwrap()["session_id"], "pty-1");
    let listed = call(&rt, &o, "terminal_list", json!({})).await;
    assert_eq!(
        text(&listed),
        "1 open terminal session(s):\npty-1 \"main\" (bash, running, unconfined)"
    );
    assert_eq!(listed.structured.unwrap()["sessions"][0]["status"]["state"], "running");
    let r = send(&rt, &o, "main", "sleep 30").await;
    assert_eq!(r["wait_reason"], "inferred_idle", "{r}");
    let signalled =
        call(&rt, &o, "terminal_signal", json!({"session_id": "main", "signal": "SIGINT"})).await;
    let pgid = signalled.structured.as_ref().unwrap()["target_pgid"].as_i64().unwrap();
    assert_eq!(
        text(&signalled),
        format!("Sent SIGINT to the foreground process group {pgid} of main.")
    );
    let closed = call(&rt, &o, "terminal_close", json!({"session_id": "pty-1"})).await;
    assert!(
        text(&closed).starts_with("Closed terminal session pty-1: its shell exited")
            && closed.text.ends_with("; every process it started is gone."),
        "{}",
        closed.text
    );
    assert_eq!(closed.structured.unwrap()["survivors"], json!([]));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_gives_session_exit_and_sigkill_at_the_shell_is_rejected() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let e = rt
        .call(&o, "terminal_signal", json!({"session_id": id, "signal": "SIGKILL"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("terminal_close"), "{e}");
    let r = send(&rt, &o, &id, "exit 3").await;
    assert_eq!(r["wait_reason"], "session_exit", "{r}");
    assert_eq!(r["session_status"]["state"], "exited");
    assert_eq!(r["session_status"]["code"], 3);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_fenced_by_exact_owner() {
    let rt = terminal_runtime(3000);
    let (a, _) = owner("same");
    let (b, _) = owner("same");
    let id = open(&rt, &a).await;
    for (tool, args) in [
        ("terminal_send", json!({"session_id": id, "text": "echo x"})),
        ("terminal_read", json!({"session_id": id})),
        ("terminal_signal", json!({"session_id": id, "signal": "SIGINT"})),
        ("terminal_close", json!({"session_id": id})),
    ] {
        let e = rt.call(&b, tool, args).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::ForeignOwner, "{tool}: {e}");
    }
    let list = call(&rt, &b, "terminal_list", json!({})).await;
    assert_eq!(list.structured.unwrap()["sessions"], json!([]));
    let list = call(&rt, &a, "terminal_list", json!({})).await;
    assert_eq!(list.structured.unwrap()["sessions"][0]["session_id"], id.as_str());
    let e = rt
        .call(&a, "terminal_send", json!({"session_id": "pty-999", "text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_open_close_cycles_leave_no_processes() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let mut pids = Vec::new();
    for _ in 0..20 {
        let id = open(&rt, &o).await;
        let r = send(&rt, &o, &id, "echo $$; (trap '' TERM; exec sleep 1000) & echo $!").await;
        let out = r["output"].as_str().unwrap().to_string();
        let nums: Vec<i32> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        assert_eq!(nums.len(), 2, "shell pid and a TERM-ignoring child: {r}");
        pids.extend(nums);
        let c = call(&rt, &o, "terminal_close", json!({"session_id": id})).await;
        assert_eq!(c.structured.unwrap()["survivors"], json!([]));
    }
    for pid in pids {
        assert!(pid_gone(pid), "process {pid} survived terminal_close");
    }
    assert_eq!(
        call(&rt, &o, "terminal_list", json!({})).await.structured.unwrap()["sessions"],
        json!([])
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_send_is_a_pty_send_job() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let job = send_in_background(&rt, &o, &id, "sleep 0.3; echo done").await;
    assert!(job.starts_with("pty-send-"), "{job}");
    let e = rt
        .call(&o, "terminal_send", json!({"session_id": id, "text": "echo no"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::AlreadyExists, "one active send per session: {e}");
    let r = call(&rt, &o, "job_output", json!({"job_id": job, "wait": true, "timeout_ms": 30000}))
        .await;
    let s = r.structured.unwrap();
    assert_eq!(s["status"], "completed", "{s}");
    assert!(s["output"].as_str().unwrap().contains("done"), "{s}");
    // A killed background send interrupts the foreground program with a real SIGINT.
    let job = send_in_background(&rt, &o, &id, "sleep 1000").await;
    call(&rt, &o, "job_kill", json!({"job_id": job})).await;
    let r = call(&rt, &o, "job_output", json!({"job_id": job, "wait": true, "timeout_ms": 30000}))
        .await;
    assert_eq!(r.structured.unwrap()["status"], "killed");
    let r = send(&rt, &o, &id, "echo alive").await;
    assert!(r["output"].as_str().unwrap().contains("alive"), "the shell is usable again: {r}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_read_pages_backward_through_scrollback() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    send(&rt, &o, &id, "seq 1 50").await;
    let p = call(
        &rt,
        &o,
        "terminal_read",
        json!({"session_id": id, "max_lines": 5, "offset_lines": 1}),
    )
    .await;
    let p = p.structured.unwrap();
    let text = p["text"].as_str().unwrap();
    assert!(text.ends_with("50"), "page ends one line before the prompt line: {text:?}");
    assert_eq!(text.lines().count(), 5);
    let total = p["total_lines"].as_u64().unwrap();
    assert!(total >= 51);
    let far = json!({"session_id": id, "offset_lines": total + 10});
    let r = call(&rt, &o, "terminal_read", far).await;
    assert!(r.text.contains("past the oldest retained line"), "an empty page says why: {}", r.text);
    assert!(r.text.contains(&format!("{total} of {total} lines are retained")), "{}", r.text);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_disposal_closes_its_sessions() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let r = send(&rt, &o, &id, "echo $$").await;
    let pid = first_number(r["output"].as_str().unwrap());
    conch_conformance::within("owner disposal", o.dispose()).await;
    assert!(pid_gone(pid), "the shell is gone once disposal returns");
    rt.shutdown().await;
}

mod persistent {
    use super::*;

    fn minimal() -> Runtime {
        runtime(conch::EMBEDDED.iter().find(|(n, _)| *n == "minimal").unwrap().1)
    }

    async fn bash(rt: &Runtime, o: &Arc<Owner>, args: Value) -> String {
        call(rt, o, "bash", args).await.text
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn state_persists_and_only_the_command_output_returns() {
        let rt = minimal();
        let (o, _) = owner("s");
        assert_eq!(bash(&rt, &o, json!({"command": "cd /tmp; export PB_X=1"})).await, "");
        assert_eq!(bash(&rt, &o, json!({"command": "echo \"$PB_X\"; pwd"})).await, "1\n/tmp\n");
        assert_eq!(
            bash(&rt, &o, json!({"command": "for i in 1 2; do echo \"'$i'\"; done"})).await,
            "'1'\n'2'\n"
        );
        assert_eq!(
            bash(&rt, &o, json!({"command": "echo out; false"})).await,
            "out\n[exit code: 1]"
        );
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn argument_errors_name_the_field() {
        let rt = minimal();
        let (o, _) = owner("s");
        let e = rt.call(&o, "bash", json!({"command": "true", "timeout_ms": -5})).await;
        let e = e.unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
        assert_eq!(
            e.message(),
            "invalid arguments for `bash`: timeout_ms: invalid value: integer `-5`, expected u64"
        );
        let e = rt.call(&o, "bash", json!({"command": "true", "timeout_ms": "5000"})).await;
        assert_eq!(
            e.unwrap_err().message(),
            "invalid arguments for `bash`: timeout_ms: invalid type: string \"5000\", expected u64"
        );
        let e = rt.call(&o, "bash", json!({"command": "true", "workdir": "/"})).await;
        assert!(e.unwrap_err().message().contains("unknown field `workdir`"));
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_command_that_times_out_still_returns_its_tail() {
        let rt = minimal();
        let (o, _) = owner("s");
        // 169 kB, past the 64,000-byte cap, printed well inside the deadline even on a loaded
        // machine (100,000 lines in 3 s did not always make it at a load of 8): the deadline
        // is what is under test, so the output must be done long before it.
        let cmd = json!({"command": "seq 1 30000; sleep 1000", "timeout_ms": 10000});
        let out = bash(&rt, &o, cmd).await;
        assert!(out.starts_with("[output truncated to its last "), "{out:.200}");
        assert!(
            out.contains("29999\n30000\n"),
            "the tail survives the lost start marker: {:?}",
            &out[out.len().saturating_sub(300)..]
        );
        assert!(out.ends_with(&kept_after(10000)), "{out:.200}");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn issue_23_output_past_the_cap_is_whole_in_the_spill_the_result_names() {
        let rt = minimal();
        let (o, _) = owner("s");
        let out = bash(&rt, &o, json!({"command": "seq 1 100000"})).await;
        let first = out.lines().next().unwrap_or_default();
        let path = first
            .strip_prefix("[output truncated to its last ")
            .and_then(|l| l.split_once(" bytes; full output: "))
            .and_then(|(_, p)| p.strip_suffix(']'))
            .unwrap_or_else(|| panic!("names its spill: {first:?}"));
        assert!(out.ends_with("99999\n100000\n"), "{:.100}", &out[out.len() - 100..]);
        let whole = std::fs::read_to_string(path).expect("the spill is readable");
        let want: String = (1..=100_000).map(|i| format!("{i}\n")).collect();
        assert!(whole == want, "the spill is the command's output exactly ({} bytes)", whole.len());
        // A small output names no spill.
        assert_eq!(bash(&rt, &o, json!({"command": "echo small"})).await, "small\n");
        rt.shutdown().await;
        // As the one-shot tool's: it outlives the runtime that named it.
        assert!(std::path::Path::new(path).exists(), "the spill outlives the runtime");
    }

    /// The note on a command stopped at its `timeout_ms`.
    fn kept_after(ms: u64) -> String {
        format!("[timed out after {ms}ms; the command was stopped and the shell kept its state]")
    }

    /// Sets a cwd, an export and a function in the owner's shell.
    async fn set_state(rt: &Runtime, o: &Arc<Owner>) {
        let cmd = "cd /tmp && export PB_Y=set && pb_f() { echo fn; }";
        assert_eq!(bash(rt, o, json!({"command": cmd})).await, "");
    }

    async fn assert_state(rt: &Runtime, o: &Arc<Owner>, after: &str) {
        let out = bash(rt, o, json!({"command": "echo $PWD ${PB_Y-unset}; pb_f"})).await;
        assert_eq!(out, "/tmp set\nfn\n", "the shell's state after {after}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn issue_23_a_timeout_stops_the_command_and_keeps_the_shell() {
        let rt = minimal();
        let (o, _) = owner("s");
        set_state(&rt, &o).await;
        let out =
            bash(&rt, &o, json!({"command": "echo before; sleep 100", "timeout_ms": 800})).await;
        assert_eq!(out, format!("before\n{}", kept_after(800)));
        assert_state(&rt, &o, "a timeout").await;
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn issue_23_stdin_readers_get_end_of_file_and_the_shell_keeps_its_state() {
        let rt = minimal();
        let (o, _) = owner("s");
        set_state(&rt, &o).await;
        for (cmd, want) in [
            ("cat; echo cat=$?", "cat=0\n"),
            ("read line; echo read=$?", "read=1\n"),
            ("read -t 2 x; echo read-t=$?", "read-t=1\n"),
            ("python3 -c 'input()' 2>/dev/null; echo py=$?", "py=1\n"),
        ] {
            assert_eq!(bash(&rt, &o, json!({"command": cmd})).await, want, "{cmd}");
            assert_state(&rt, &o, cmd).await;
        }
        // `exec bash` and a PROMPT_COMMAND assignment keep the framing.
        let out = bash(&rt, &o, json!({"command": "PROMPT_COMMAND='pb_h=1'; echo pc"})).await;
        assert_eq!(out, "pc\n");
        assert_eq!(bash(&rt, &o, json!({"command": "exec bash"})).await, "");
        let out = bash(&rt, &o, json!({"command": "echo $PWD $PB_Y; echo \"a!b\""})).await;
        assert_eq!(out, "/tmp set\na!b\n");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn issue_23_a_shell_that_cannot_be_stopped_is_replaced_with_its_cwd_and_exports() {
        let rt = minimal();
        let (o, _) = owner("s");
        set_state(&rt, &o).await;
        // A loop in the shell itself that ignores SIGINT: only closing the shell ends it.
        let cmd = json!({"command": "trap '' INT; while :; do :; done", "timeout_ms": 1000});
        assert_eq!(
            bash(&rt, &o, cmd).await,
            "[timed out after 1000ms; the shell was reset: the next call starts a new shell with \
             the working directory and exported variables of the last command that finished \
             (functions, aliases and unexported variables are gone)]"
        );
        let cmd = "echo $PWD ${PB_Y-unset}; type pb_f >/dev/null 2>&1 || echo no-function";
        assert_eq!(bash(&rt, &o, json!({"command": cmd})).await, "/tmp set\nno-function\n");
        // `exit` is the shell's own end: the next shell starts as any new one does.
        let out = bash(&rt, &o, json!({"command": "exit 3"})).await;
        assert!(out.ends_with("[the shell exited; the next call starts a fresh shell]"), "{out}");
        assert_eq!(bash(&rt, &o, json!({"command": "echo ${PB_Y-unset}"})).await, "unset\n");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn issue_23_exit_with_a_background_job_reports_the_code_at_once() {
        let rt = minimal();
        let (o, _) = owner("s");
        let started = std::time::Instant::now();
        let out = bash(&rt, &o, json!({"command": "sleep 300 & exit 7"})).await;
        assert!(started.elapsed() < std::time::Duration::from_secs(15), "{:?}", started.elapsed());
        assert!(out.contains("stopped its background jobs:"), "{out:?}");
        assert!(out.contains("sleep 300 &"), "{out:?}");
        assert!(
            out.ends_with("[exit code: 7]\n[the shell exited; the next call starts a fresh shell]"),
            "{out:?}"
        );
        assert_eq!(bash(&rt, &o, json!({"command": "echo fresh"})).await, "fresh\n");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn issue_23_set_x_shows_the_command_and_nothing_of_the_framing() {
        let rt = minimal();
        let (o, _) = owner("s");
        let out = bash(&rt, &o, json!({"command": "set -x; echo traced"})).await;
        assert_eq!(out.lines().count(), 2, "{out:?}");
        assert!(out.ends_with("+ echo traced\ntraced\n") && !out.contains("conch"), "{out:?}");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn regression_10_set_e_stops_the_call_but_never_the_shell() {
        let rt = minimal();
        let (o, _) = owner("s");
        bash(&rt, &o, json!({"command": "cd /tmp; export PB_E=kept; plain=also"})).await;
        let cmd = "set -euo pipefail; echo step1; false; echo step2";
        assert_eq!(bash(&rt, &o, json!({"command": cmd})).await, "step1\n[exit code: 1]");
        // The shell, its cwd and its variables survived.
        let out = bash(&rt, &o, json!({"command": "echo $PWD $PB_E $plain"})).await;
        assert_eq!(out, "/tmp kept also\n");
        // errexit is still in force for later calls, and still stops only the command.
        let out = bash(&rt, &o, json!({"command": "false; echo not-reached"})).await;
        assert_eq!(out, "[exit code: 1]");
        let out = bash(&rt, &o, json!({"command": "f() { false; echo in-f; }; f"})).await;
        assert_eq!(out, "[exit code: 1]", "errexit inside a function");
        let out = bash(&rt, &o, json!({"command": "(echo sub; false; echo no); echo no2"})).await;
        assert_eq!(out, "sub\n[exit code: 1]", "errexit in a subshell");
        // set -u's unbound variable: reported, and the shell lives on.
        let out = bash(&rt, &o, json!({"command": "echo $PB_NOPE"})).await;
        assert!(
            out.contains("PB_NOPE: unbound variable") && out.ends_with("[exit code: 1]"),
            "{out:?}"
        );
        // Positional parameters still belong to the caller; errexit comes off again.
        let out = bash(&rt, &o, json!({"command": "set -- a b c; echo $# $2"})).await;
        assert_eq!(out, "3 b\n");
        let out = bash(&rt, &o, json!({"command": "set +eu; false; echo went-on"})).await;
        assert_eq!(out, "went-on\n");
        assert_eq!(bash(&rt, &o, json!({"command": "echo $PB_E"})).await, "kept\n");
        // `shopt` reports and sets the emulated errexit, never the real one (which would end
        // the shell at the next failure), and a query that answers no is no failure by itself.
        let cmd = "shopt -qo nounset; echo q=$?; shopt -so errexit; shopt -o errexit";
        let out = bash(&rt, &o, json!({"command": cmd})).await;
        assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["q=1", "errexit", "on"], "{out:?}");
        let out =
            bash(&rt, &o, json!({"command": "set -o | grep -w errexit; false; echo no"})).await;
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            ["errexit", "on", "[exit", "code:", "1]"]
        );
        let out = bash(&rt, &o, json!({"command": "shopt -uo errexit; false; echo $PB_E"})).await;
        assert_eq!(out, "kept\n", "the shell survived, and errexit is off again");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_that_breaks_the_frame_starter_or_traps_does_not_break_the_next_call() {
        let rt = minimal();
        let (o, _) = owner("s");
        let out = bash(&rt, &o, json!({"command": "unset -f __conch_s; echo a"})).await;
        assert_eq!(out, "a\n");
        let out = bash(&rt, &o, json!({"command": "__conch_s() { echo hijacked; }; echo b"})).await;
        assert_eq!(out, "b\n");
        assert_eq!(bash(&rt, &o, json!({"command": "echo c"})).await, "c\n");
        // A `set` arms the emulation's one-shot trap; the call after it runs none.
        let out = bash(&rt, &o, json!({"command": "set -e; trap -p DEBUG"})).await;
        assert_eq!(out, "", "the trap disarmed itself before the next command: {out:?}");
        assert_eq!(bash(&rt, &o, json!({"command": "false; echo no"})).await, "[exit code: 1]");
        assert_eq!(bash(&rt, &o, json!({"command": "set +e; false; echo yes"})).await, "yes\n");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn regression_10_an_unterminated_escape_does_not_swallow_the_end_marker() {
        let rt = minimal();
        let (o, _) = owner("s");
        let out =
            bash(&rt, &o, json!({"command": "printf '\\033]0;title'; echo; echo visible"})).await;
        assert_eq!(out, "\nvisible\n", "the result arrives, not a stdin wait: {out:?}");
        let out =
            bash(&rt, &o, json!({"command": "printf '\\033[12'; echo; echo after-csi"})).await;
        assert!(out.ends_with("after-csi\n"), "{out:?}");
        assert_eq!(bash(&rt, &o, json!({"command": "echo same-shell"})).await, "same-shell\n");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn regression_10_framed_lines_stay_out_of_the_history() {
        let rt = minimal();
        let (o, _) = owner("s");
        bash(&rt, &o, json!({"command": "echo one"})).await;
        let out = bash(&rt, &o, json!({"command": "history"})).await;
        assert!(!out.contains("__conch") && !out.contains("CONCH_PB"), "{out:?}");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn regression_10_a_timeout_leaves_no_prompt_and_no_process_behind() {
        let rt = minimal();
        let (o, _) = owner("s");
        // The command ignores INT and TERM: it is killed, and the shell stays.
        let cmd = "bash -c 'trap \"\" INT TERM; echo $$ started; exec sleep 1000'";
        let out = bash(&rt, &o, json!({"command": cmd, "timeout_ms": 500})).await;
        let sleeper: i32 = out.split_whitespace().next().unwrap().parse().unwrap();
        assert!(out.ends_with(&kept_after(500)), "{out:?}");
        assert!(!out.contains("$ ") && !out.contains("CONCH"), "no prompt residue: {out:?}");
        assert!(conch_conformance::pid_gone(sleeper), "the command that ignored INT was killed");
        assert_eq!(bash(&rt, &o, json!({"command": "echo same"})).await, "same\n");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_interactive_child_returns_partial_output() {
        let rt = minimal();
        let (o, _) = owner("s");
        set_state(&rt, &o).await;
        // A prompt on the terminal itself (stdin is empty): stopped, its output returned.
        let cmd = "echo first; read -p 'Name? ' n < /dev/tty; echo never";
        let out = bash(&rt, &o, json!({"command": cmd})).await;
        assert!(out.starts_with("first\nName? \n[the command waited for input"), "{out:?}");
        assert!(out.contains("the shell kept its state"), "{out:?}");
        assert!(!out.contains("never") && !out.contains("terminal tools"), "{out:?}");
        assert_state(&rt, &o, "a terminal prompt").await;
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shell_exit_is_reported_and_the_next_call_starts_fresh() {
        let rt = minimal();
        let (o, _) = owner("s");
        bash(&rt, &o, json!({"command": "export PB_Z=set"})).await;
        let out = bash(&rt, &o, json!({"command": "echo bye; exit 3"})).await;
        assert!(out.starts_with("bye\n"), "{out:?}");
        assert!(
            out.contains("[exit code: 3]\n[the shell exited;"),
            "the status is reported: {out:?}"
        );
        assert_eq!(bash(&rt, &o, json!({"command": "echo \"${PB_Z-unset}\""})).await, "unset\n");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_aborted_call_interrupts_resets_and_the_next_call_starts_fresh() {
        let rt = minimal();
        let (o, _) = owner("s");
        bash(&rt, &o, json!({"command": "export PB_A=set"})).await;
        let tool = Arc::clone(rt.tool("bash").unwrap());
        let ctx = conch_seams::ToolContext::new(Arc::clone(&o));
        let cancel = ctx.cancel.clone();
        let running = tokio::spawn(async move {
            tool.call(&ctx, json!({"command": "echo st''arted; sleep 1000"})).await
        });
        // Abort only once the command is running in the owner's session.
        await_scrollback(&rt, &o, "\nstarted").await;
        let terminals = rt.seams().terminals.clone().unwrap();
        cancel.cancel();
        let e = conch_conformance::within("the aborted call", running).await.unwrap().unwrap_err();
        assert_eq!(e.code(), ErrorCode::Cancelled, "{e}");
        assert!(terminals.list(&o).is_empty(), "the aborted session was closed");
        assert_eq!(bash(&rt, &o, json!({"command": "echo \"${PB_A-unset}\""})).await, "unset\n");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn owners_get_separate_shells() {
        let rt = minimal();
        let (a, _) = owner("a");
        let (b, _) = owner("b");
        bash(&rt, &a, json!({"command": "export WHO=a"})).await;
        assert_eq!(bash(&rt, &b, json!({"command": "echo \"${WHO-none}\""})).await, "none\n");
        assert_eq!(bash(&rt, &a, json!({"command": "echo $WHO"})).await, "a\n");
        rt.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_10_a_send_to_an_exited_session_is_a_typed_error() {
    let rt = terminal_runtime(3000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let r = send(&rt, &o, &id, "exit 4").await;
    assert_eq!(r["wait_reason"], "session_exit", "{r}");
    let e = rt
        .call(&o, "terminal_send", json!({"session_id": id, "text": "echo lost"}))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Some(conch_seams::ErrorReason::SessionExited), "{e}");
    assert!(e.to_string().contains("exited with code 4"), "{e}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_background_send_interrupts_even_with_isig_disabled() {
    // A long idle window: on a loaded machine a short one could settle the send as
    // inferred_idle before the kill lands, and this case is about the kill.
    let rt = terminal_runtime(60_000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    // With ISIG off a typed Ctrl-C is just a byte; only a real SIGINT stops the program.
    let job = send_in_background(&rt, &o, &id, "stty -isig; echo st''arted; sleep 1000").await;
    // Kill only once the command is running, so the kill is not answered by "nothing typed".
    await_scrollback(&rt, &o, "\nstarted").await;
    call(&rt, &o, "job_kill", json!({"job_id": job})).await;
    let r = call(&rt, &o, "job_output", json!({"job_id": job, "wait": true, "timeout_ms": 30000}))
        .await;
    assert_eq!(r.structured.as_ref().unwrap()["status"], "killed", "{r:?}");
    let r = send(&rt, &o, &id, "echo $((6*7))").await;
    assert_eq!(r["wait_reason"], "stdin_read", "{r}");
    assert!(r["output"].as_str().unwrap().contains("42\n"), "sleep is gone, bash is back: {r}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_capped_on_code_point_boundaries_and_tiny_caps_are_rejected() {
    let rt = runtime(
        "plugins:\n  subprocess-local: {}\n  terminal-bash: {}\n  terminals: {}\n  tool-terminal: { max_result_bytes: 301 }\n",
    );
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let r = call(
        &rt,
        &o,
        "terminal_send",
        json!({"session_id": id, "text": "printf 'é%.0s' $(seq 1 2000); echo"}),
    )
    .await;
    assert!(r.text.len() <= 301, "{} bytes", r.text.len());
    assert!(r.text.contains("[result truncated"), "{}", r.text);
    assert!(
        r.text.contains("[wait_reason: stdin_read"),
        "the status line survives the cap: {}",
        r.text
    );
    let page = call(&rt, &o, "terminal_read", json!({"session_id": id})).await;
    assert!(page.text.len() <= 301, "{} bytes", page.text.len());
    rt.shutdown().await;

    let err = conch::build_runtime_from_yaml(
        "tiny.yaml",
        "plugins:\n  subprocess-local: {}\n  terminal-bash: {}\n  terminals: {}\n  tool-terminal: { max_result_bytes: 63 }\n",
        conch_env::ShellEnv::new("/tmp/conch-test-home".into()),
    )
    .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidComposition, "{err}");
    assert!(err.to_string().contains("max_result_bytes"), "{err}");
}

/// Reads a job's output (consuming) until `needle` has arrived, returning the status seen
/// with it and all text read (polling: job output has no change notification).
async fn read_job_until(rt: &Runtime, o: &Arc<Owner>, job: &str, needle: &str) -> (String, String) {
    conch_conformance::within(needle, async {
        let mut seen = String::new();
        loop {
            let r = call(rt, o, "job_output", json!({"job_id": job})).await.structured.unwrap();
            seen.push_str(r["output"].as_str().unwrap());
            if seen.contains(needle) {
                return (r["status"].as_str().unwrap().to_string(), seen);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_send_runs_while_silent_and_streams_its_output() {
    // A 1 s idle window: a send job that settled on silence would complete during the sleep.
    let rt = terminal_runtime(1000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let job = send_in_background(&rt, &o, &id, "echo ti''ck-1; sleep 4; echo fin''ished").await;
    let (status, seen) = read_job_until(&rt, &o, &job, "tick-1\n").await;
    assert_eq!(status, "running", "output streams while the send runs: {seen}");
    // Past the idle window and still running: silence is not completion.
    let r = call(&rt, &o, "job_output", json!({"job_id": job, "wait": true, "timeout_ms": 2000}))
        .await
        .structured
        .unwrap();
    assert_eq!(r["status"], "running", "{r}");
    let r = call(&rt, &o, "job_output", json!({"job_id": job, "wait": true, "timeout_ms": 30000}))
        .await
        .structured
        .unwrap();
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["detail"], "wait_reason: stdin_read", "{r}");
    let rest = r["output"].as_str().unwrap();
    assert!(rest.contains("finished\n") && !rest.contains("tick-1\n"), "each byte once: {r}");
    assert!(rest.contains("[wait_reason: stdin_read; session: running]"), "{r}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_arguments_keys_timeout_wait_for_and_the_default_cap() {
    let rt = terminal_runtime(1000);
    let (o, _) = owner("s");
    let id = open(&rt, &o).await;
    let e = rt
        .call(&o, "terminal_send", json!({"session_id": id, "keys": ["C-cc"]}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("C-cc"), "{e}");
    let e = rt
        .call(&o, "terminal_send", json!({"session_id": id, "text": "x", "timeout_ms": 0}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    // A quiet command with a deadline longer than the idle window returns at the deadline.
    let r = call(
        &rt,
        &o,
        "terminal_send",
        json!({"session_id": id, "text": "sleep 30", "timeout_ms": 1500}),
    )
    .await
    .structured
    .unwrap();
    assert_eq!(r["wait_reason"], "timeout", "{r}");
    // keys without text: no Enter after them.
    let r = call(&rt, &o, "terminal_send", json!({"session_id": id, "keys": ["C-c"]}))
        .await
        .structured
        .unwrap();
    assert_eq!(r["wait_reason"], "stdin_read", "{r}");
    let r = call(
        &rt,
        &o,
        "terminal_send",
        json!({"session_id": id, "text": "sleep 0.5; sh -c 'echo up-and-running; exec sleep 30'", "wait_for": "^up-and"}),
    )
    .await
    .structured
    .unwrap();
    assert_eq!(r["wait_reason"], "matched", "{r}");
    call(&rt, &o, "terminal_send", json!({"session_id": id, "keys": ["C-c"]})).await;
    // The default result keeps the newest 64 KiB; the rest is in the scrollback.
    let r = send(&rt, &o, &id, "seq 1 40000").await;
    let text = r["output"].as_str().unwrap();
    // The note naming the spill comes first, on top of the capped output.
    let (note, kept) = text.split_once('\n').unwrap();
    assert!(note.starts_with("[earlier output omitted; full output: "), "{text:.200}");
    assert!(kept.len() <= 65_536, "{}", kept.len());
    assert!(text.contains("\n40000\n"), "the newest output is kept");
    let r = call(
        &rt,
        &o,
        "terminal_send",
        json!({"session_id": id, "text": "seq 1 40000", "max_output_bytes": 200}),
    )
    .await
    .structured
    .unwrap();
    let (_, kept) = r["output"].as_str().unwrap().split_once('\n').unwrap();
    assert!(kept.len() <= 200, "{r}");
    rt.shutdown().await;
}
