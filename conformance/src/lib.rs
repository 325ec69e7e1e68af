//! Conformance suites written once against the seams and run for every provider
//! (object_store style). Each case is a `pub async fn` taking the seam as `&dyn` and
//! returning an [`Outcome`]: it panics with a descriptive message on failure and returns
//! `Err(Skip)` when its promise cannot be checked here (a missing utility, a provider
//! without terminals), saying why. Each suite's cases are listed once (`__<suite>_cases!`);
//! from that list the `*_suite!` macros instantiate one `#[tokio::test]` per case and
//! [`cases`] holds the same cases as values, which [`runner`] runs one by one (`conch
//! conformance`). Not API-stable.
//!
//! Cases never sleep to synchronise and use generous timeouts so a loaded 2-core machine
//! does not make them flaky.
//!
//! Each list is handed to a callback macro, so the tests and `conch conformance` run the same
//! functions; a skipped test prints `SKIP <test>: <reason>`. `shell_suite!(gate: f, make)` and
//! `terminal_suite!(gate: f, make)` return at once from every case while `f()` is `Err(why)`, and
//! print one visible line per suite, `skipped: <why> (N cases)` (the pwsh instantiations use
//! `pwsh_on_path`). A runner's stated hole and a script in the other dialect are skips too: shell
//! and terminal cases type their commands in the seam's dialect (bash, or the PowerShell text that
//! means the same).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod cases;
pub mod files;
pub mod files_sandbox;
pub mod runner;
pub mod sandbox;
pub mod shell;
pub mod subprocess;
pub mod terminal;
pub mod terminal_process;
pub mod workload_screen;
pub mod workload_send;
pub mod workload_shell;

use std::future::Future;
use std::time::Duration;

/// Why a case was not checked here (the reason is shown next to SKIP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    /// What is missing, in a few words.
    pub reason: String,
}

/// How a case that did not fail ended: `Ok(())` passed, `Err(Skip)` was not applicable here.
/// A failure is a panic.
pub type Outcome = Result<(), Skip>;

/// A skip with `reason`, as an [`Outcome`].
pub fn skip(reason: impl Into<String>) -> Outcome {
    Err(Skip { reason: reason.into() })
}

/// What the `*_suite!` tests do with an outcome: a skip passes the test and prints
/// `SKIP <test path>: <reason>` (shown with `--nocapture`, as the old println was).
pub fn report(outcome: Outcome, test: &str) {
    if let Err(s) = outcome {
        println!("SKIP {test}: {}", s.reason);
    }
}

/// Generous bound for anything that should happen "soon".
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Awaits `f` or panics naming `what` after [`PATIENCE`].
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {PATIENCE:?} waiting for: {what}"),
    }
}

/// A terminal session's last 30 lines, for a failure message: what the shell really showed.
pub fn terminal_tail(s: &dyn conch_seams::TerminalSession) -> String {
    s.read(0, 30).text
}

/// True when `/proc/<pid>` is gone or a zombie.
pub fn pid_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            stat.rfind(')').map(|i| stat[i + 1..].trim_start().starts_with('Z')).unwrap_or(true)
        }
    }
}

/// The start time of `pid` (clock ticks since boot, field 22 of its stat), while it exists.
/// With the pid it names one process for good: pids are recycled, start times are not.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.get(stat.rfind(')')? + 1..)?.split_whitespace().nth(19)?.parse().ok()
}

/// True when the process that was `pid` with `start` is gone or a zombie (even if the pid
/// now names another process).
pub fn gone(pid: i32, start: u64) -> bool {
    start_time(pid) != Some(start) || pid_gone(pid)
}

/// Waits until the process `pid` with `start` is gone, or panics naming `what`.
pub async fn await_gone(what: &str, pid: i32, start: u64) {
    within(what, async {
        while !gone(pid, start) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Waits for `path` to hold a pid (a detached process writes `$$` there before it execs)
/// and returns it with its start time. The process is expected to be alive.
pub async fn pid_in(path: &std::path::Path) -> (i32, u64) {
    within(&format!("a pid in {}", path.display()), async {
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if let Some(pid) = text.strip_suffix('\n').and_then(|t| t.trim().parse().ok()) {
                let start = start_time(pid).unwrap_or_else(|| panic!("{pid} is alive"));
                return (pid, start);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// The environment variable [`marked`] looks for.
pub const MARK_VAR: &str = "CONCH_CASE_MARK";

/// A token no other run uses.
pub fn mark_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A live process found by its mark.
#[derive(Clone, Debug)]
pub struct Marked {
    pub pid: i32,
    pub start: u64,
    pub comm: String,
}

/// The live processes whose environment holds `MARK_VAR=token`. Host pids, whatever pid
/// namespace the processes are in (the pids a sandboxed shell prints are its namespace's).
pub fn marked(token: &str) -> Vec<Marked> {
    let needle = format!("{MARK_VAR}={token}");
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()).then_some(())?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let start = start_time(pid)?;
            (!pid_gone(pid)).then(|| Marked { pid, start, comm: comm.trim().to_string() })
        })
        .collect()
}

/// Waits until the marked processes satisfy `ready`, and returns them.
pub async fn await_marked(token: &str, ready: impl Fn(&[Marked]) -> bool) -> Vec<Marked> {
    within(&format!("processes marked {token}"), async {
        loop {
            let now = marked(token);
            if ready(&now) {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// A command that detaches a `sleep 1000` with `how` (`setsid`, `nohup`), its output closed,
/// after writing its pid to `pidfile`.
pub fn detach(how: &str, pidfile: &std::path::Path) -> String {
    format!(
        "{how} sh -c 'echo $$ > {}; exec sleep 1000' >/dev/null 2>&1 </dev/null &",
        pidfile.display()
    )
}

/// Writes one line to the process's real stderr, past the test harness's output capture, so
/// it shows in every `cargo test` run (a skipped suite must never pass unseen).
pub fn visible_line(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
    let _ = err.flush();
}

/// A gate for suites that need a program: `Ok` when `program` is an executable file on this
/// process's PATH, else why not. Looks only: it never runs the program.
pub fn on_path(program: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    });
    if found { Ok(()) } else { Err(format!("{program} not found on PATH")) }
}

/// The gate of PowerShell suites: `pwsh` on PATH.
pub fn pwsh_on_path() -> Result<(), String> {
    on_path("pwsh")
}

/// A gated suite's report: when the gate is closed, the one visible line that says how many
/// of its cases did not run, and why (`skipped: pwsh not found on PATH (25 cases)`).
pub fn report_gate(gate: Result<(), String>, cases: usize) {
    if let Err(why) = gate {
        visible_line(&format!("skipped: {why} ({cases} cases)"));
    }
}

/// The `subprocess` suite's cases, in order: calls `$callback!{ $($pass)* ; case, ... }`. The
/// one list both [`subprocess_suite!`] and [`cases::SUBPROCESS`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __subprocess_cases {
    ($callback:path { $($pass:tt)* }) => {
        $callback! { $($pass)* ;
            spawn_captures_stdout,
            nonzero_exit_is_data_not_error,
            death_by_signal_is_reported,
            missing_executable_is_spawn_failure,
            missing_cwd_is_spawn_failure,
            empty_argv_is_invalid,
            argv_is_not_shell_interpreted,
            cwd_is_respected,
            env_overlay_sets_and_unsets,
            ambient_managed_env_is_scrubbed,
            merged_stderr_keeps_arrival_order,
            separate_stderr_is_collected_apart,
            stdin_bytes_reach_the_child,
            stdin_pipe_is_writable_and_closable,
            offset_reads_are_caller_owned,
            stale_offset_read_is_lossy_tail,
            kill_terminates_group_when_children_ignore_sigterm,
            cancel_token_kills_the_tree,
            shutdown_reaps_everything_live,
            which_resolves_on_path,
            spawn_terminal_is_honest_about_support,
            wait_for_eof_waits_for_descendants_holding_the_output,
            stop_leftovers_stops_a_background_child_holding_the_output,
            stop_leftovers_stops_group_members_that_redirected_output,
            stop_leftovers_reaches_a_pipe_holder_outside_the_group,
            stop_leftovers_escalates_to_kill_for_term_trappers,
            output_written_within_the_drain_is_kept,
            kill_settles_even_when_an_escaped_process_holds_the_output,
            stop_leftovers_stops_a_process_that_detached_and_closed_the_output,
            kill_stops_what_detached_from_the_group,
            shutdown_leaves_nothing_detached_behind
        }
    };
}

/// Instantiates the subprocess suite: `subprocess_suite!(|| Arc<dyn Subprocess>)`.
/// `subprocess_suite!(@cases make; case, ...)` instantiates only the cases named.
#[macro_export]
macro_rules! subprocess_suite {
    ($make:expr) => {
        $crate::__subprocess_cases!($crate::subprocess_suite { @cases $make });
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let provider = ($make)();
                $crate::report(
                    $crate::subprocess::$case(provider.as_ref()).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
            }
        )*
    };
}

/// The `terminal_process` suite's cases, in order: calls `$callback!{ $($pass)* ; case, ... }`. The
/// one list both [`terminal_process_suite!`] and [`cases::TERMINAL_PROCESS`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __terminal_process_cases {
    ($callback:path { $($pass:tt)* }) => {
        $callback! { $($pass)* ;
            output_then_eof_then_exit_code_without_zombie,
            bad_cwd_is_spawn_failed,
            missing_program_is_spawn_failed,
            empty_argv_is_invalid_argument,
            the_default_directory_is_used_without_a_cwd,
            overlay_is_applied_after_the_scrub,
            child_env_is_exactly_the_scrubbed_map,
            cwd_is_honoured,
            a_relative_path_entry_is_a_directory_of_the_cwd,
            a_script_without_a_shebang_runs_under_sh,
            initial_size_and_resize_reach_the_tty,
            write_then_read_roundtrip_with_cat,
            a_write_larger_than_the_pty_holds_ends_as_the_program_reads,
            probe_sees_python_input_read,
            probe_sees_python_select,
            probe_sees_python_poll,
            probe_sees_python_epoll,
            probe_sees_a_worker_thread_reading,
            probe_sees_interactive_bash_prompt,
            a_foreground_only_sample_does_not_probe,
            probe_follows_the_foreground_job,
            probe_is_false_for_sleep_and_a_kill_reports_the_signal,
            a_signal_reaches_the_foreground_group_not_the_leader,
            terminate_stops_descendants_then_the_leader,
            terminate_stops_a_leader_that_keeps_forking,
            terminate_after_the_leader_exited_reports_its_status,
            shutdown_kills_live_terminals,
            shutdown_kills_dropped_terminals_and_their_jobs,
            terminate_stops_what_detached_while_the_leader_runs,
            terminate_after_the_leader_exited_stops_what_it_left_detached,
            shutdown_stops_what_dropped_terminals_left_detached,
            probe_misses_waits_on_other_fds
        }
    };
}

/// Instantiates the terminal process suite for a subprocess provider:
/// `terminal_process_suite!(|| Arc<dyn Subprocess>)`. Cases skip visibly without terminals.
/// `terminal_process_suite!(@cases make; case, ...)` instantiates only the cases named.
#[macro_export]
macro_rules! terminal_process_suite {
    ($make:expr) => {
        $crate::__terminal_process_cases!($crate::terminal_process_suite { @cases $make });
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let provider = ($make)();
                $crate::report(
                    $crate::terminal_process::$case(provider.as_ref()).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
            }
        )*
    };
}

/// The `shell` suite's cases, in order: calls `$callback!{ $($pass)* ; case, ... }`. The
/// one list both [`shell_suite!`] and [`cases::SHELL`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __shell_cases {
    ($callback:path { $($pass:tt)* }) => {
        $callback! { $($pass)* ;
            run_returns_output_and_zero_exit,
            nonzero_exit_is_a_result,
            terminal_overrides_are_applied,
            managed_env_wins_over_caller_env,
            timeout_kills_and_reports_timed_out,
            abort_kills_and_reports_aborted,
            already_aborted_request_does_not_run,
            resolve_fills_defaults_and_caps_timeout,
            resolve_rejects_an_empty_command,
            a_missing_workdir_is_refused_where_the_world_is,
            workdir_is_used,
            long_output_keeps_tail_and_complete_spill,
            background_reads_are_incremental_and_consuming,
            background_ignores_timeout,
            background_kill_settles_as_killed,
            a_background_child_holding_the_output_does_not_hold_the_call,
            a_clean_command_reports_no_leftovers,
            the_timeout_holds_despite_an_escaped_pipe_holder,
            a_background_job_ends_with_its_shell,
            a_long_heredoc_writes_its_bytes_exactly,
            a_long_command_runs_as_its_short_self,
            a_long_command_exits_with_its_code,
            a_detached_process_is_stopped_with_the_call,
            a_background_jobs_detached_child_is_stopped_when_it_settles,
            a_background_jobs_detached_child_is_stopped_when_it_is_killed
        }
    };
}

/// Instantiates the shell suite: `shell_suite!(|| Arc<dyn ShellExecutor>)`. With
/// `gate: fn() -> Result<(), String>` first, every case returns at once while the gate is
/// closed, and one more test prints the suite's single `skipped: <why> (N cases)` line.
/// `shell_suite!(@cases make; case, ...)` instantiates only the cases named.
#[macro_export]
macro_rules! shell_suite {
    (gate: $gate:expr, $make:expr) => {
        $crate::__shell_cases!($crate::shell_suite { @gated [$gate] $make });
    };
    ($make:expr) => {
        $crate::__shell_cases!($crate::shell_suite { @cases $make });
    };
    (@gated [$gate:expr] $make:expr; $($case:ident),* $(,)?) => {
        /// One visible `skipped: <why> (N cases)` line while the gate is closed.
        #[test]
        fn skipped_cases_are_reported() {
            let gate: fn() -> Result<(), String> = $gate;
            $crate::report_gate(gate(), [$(stringify!($case)),*].len());
        }
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let gate: fn() -> Result<(), String> = $gate;
                if gate().is_err() {
                    return;
                }
                let provider = ($make)();
                $crate::report(
                    $crate::shell::$case(provider.as_ref()).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
            }
        )*
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let provider = ($make)();
                $crate::report(
                    $crate::shell::$case(provider.as_ref()).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
            }
        )*
    };
}

/// The `terminal` suite's cases, in order: calls `$callback!{ $($pass)* ; case, ... }`. The
/// one list both [`terminal_suite!`] and [`cases::TERMINAL`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __terminal_cases {
    ($callback:path { $($pass:tt)* }) => {
        $callback! { $($pass)* ;
            echo_returns_at_the_prompt_as_stdin_read,
            prompt_marker_never_reaches_output,
            state_persists_across_sends,
            open_honours_cwd_and_rejects_a_missing_one,
            a_program_reading_stdin_is_stdin_read,
            a_program_reading_dev_tty_is_stdin_read,
            a_silent_read_by_the_shell_itself_is_stdin_read,
            a_nested_shell_without_the_helpers_text_gets_its_ps1_put_back,
            output_written_before_a_blocking_read_is_all_in_the_result,
            a_quick_send_never_returns_before_the_shell_read_it,
            a_silent_program_is_inferred_idle_not_stdin_read,
            a_cancelled_send_interrupts_the_foreground,
            close_works_while_the_shell_runs_a_loop,
            an_interrupted_command_leaves_no_sigint_for_the_shell,
            a_busy_silent_foreground_is_not_idle,
            a_send_typed_while_the_shell_is_busy_gets_its_own_prompt,
            a_sigint_lost_while_the_command_started_is_sent_again,
            an_interrupt_says_whether_the_command_still_runs,
            exit_is_session_exit_with_the_code,
            sigkill_at_the_shell_is_rejected,
            close_leaves_no_descendant_even_one_ignoring_term,
            scrollback_pages_backward,
            utf8_output_arrives_intact,
            close_stops_processes_that_detached_with_setsid_and_nohup,
            a_cancelled_open_is_rolled_back,
            typed_tabs_bangs_and_heredocs_arrive_literally,
            crlf_line_ends_never_shift_later_results,
            a_multi_line_send_returns_after_its_last_line_under_load,
            runaway_output_is_capped_at_the_send_deadline,
            a_capped_send_names_a_spill_holding_all_of_its_output,
            a_quiet_command_waits_for_timeout_then_a_plain_wait,
            wait_for_returns_when_the_pattern_appears,
            framed_stdin_readers_get_end_of_file_and_keep_the_shell,
            a_framed_timeout_stops_the_command_and_keeps_the_shell,
            a_framed_terminal_reader_is_stopped_and_the_shell_kept,
            exec_bash_and_prompt_command_assignments_keep_the_framing,
            exit_with_a_background_job_ends_at_once_and_lists_it,
            history_expansion_is_off,
            a_shell_without_a_locale_gets_a_utf8_one,
            set_x_traces_only_the_command,
            a_replacement_shell_gets_the_cwd_and_exports_its_predecessor_left,
            a_progress_bar_comes_back_as_its_last_state,
            a_carriage_return_overwrites_and_a_backspace_erases,
            term_is_a_real_terminal_type_and_can_be_chosen,
            vim_shows_its_screen_and_exits_cleanly,
            less_shows_a_page_and_quits,
            a_python_repl_answers_line_by_line,
            a_resize_reaches_the_program,
            password_prompts_wait_for_input_and_never_echo_the_secret
        }
    };
}

/// Instantiates the terminal backend suite: `terminal_suite!(|| Arc<dyn TerminalBackend>)`.
/// The factory's backend should use an idle window of at most a few seconds. A `gate:` first
/// works as for [`shell_suite!`].
/// `terminal_suite!(@cases make; case, ...)` instantiates only the cases named.
#[macro_export]
macro_rules! terminal_suite {
    (gate: $gate:expr, $make:expr) => {
        $crate::__terminal_cases!($crate::terminal_suite { @gated [$gate] $make });
    };
    ($make:expr) => {
        $crate::__terminal_cases!($crate::terminal_suite { @cases $make });
    };
    (@gated [$gate:expr] $make:expr; $($case:ident),* $(,)?) => {
        /// One visible `skipped: <why> (N cases)` line while the gate is closed.
        #[test]
        fn skipped_cases_are_reported() {
            let gate: fn() -> Result<(), String> = $gate;
            $crate::report_gate(gate(), [$(stringify!($case)),*].len());
        }
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let gate: fn() -> Result<(), String> = $gate;
                if gate().is_err() {
                    return;
                }
                let provider = ($make)();
                $crate::report(
                    $crate::terminal::$case(provider.as_ref()).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
            }
        )*
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let provider = ($make)();
                $crate::report(
                    $crate::terminal::$case(provider.as_ref()).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
            }
        )*
    };
}

/// The `sandbox` suite's cases, in order: calls `$callback!{ $($pass)* ; case, ... }`. The
/// one list both [`sandbox_suite!`] and [`cases::SANDBOX`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __sandbox_cases {
    ($callback:path { $($pass:tt)* }) => {
        $callback! { $($pass)* ;
            writes_inside_the_root_succeed,
            writes_outside_the_root_are_denied,
            metadata_changes_outside_the_root_are_denied,
            x32_system_calls_are_refused,
            read_only_mode_writes_only_dev_null,
            tcp_connect_is_denied_without_network,
            udp_send_is_denied_without_network,
            tcp_connect_works_with_network,
            inherited_descriptors_are_closed,
            git_hooks_and_config_stay_read_only,
            a_setsid_daemon_does_not_outlive_the_call,
            signals_to_outside_processes_are_denied,
            the_command_has_no_capabilities_and_no_new_privs,
            other_processes_environ_is_unreadable,
            danger_full_access_is_unconfined,
            a_fifo_outside_the_root_is_not_writable,
            a_unix_socket_outside_the_root_is_not_reachable,
            a_socket_gone_before_the_start_does_not_fail_the_command,
            a_private_tmpdir_is_writable_and_the_shared_tmp_is_not,
            other_terminals_are_not_writable,
            hidden_paths_are_neither_read_nor_written
        }
    };
}

/// Instantiates the sandbox suite: `sandbox_suite!(|| (Arc<dyn Sandbox>, Arc<dyn Subprocess>))`.
/// Cases a runner cannot hold here skip, saying why.
/// `sandbox_suite!(@cases make; case, ...)` instantiates only the cases named.
#[macro_export]
macro_rules! sandbox_suite {
    ($make:expr) => {
        $crate::__sandbox_cases!($crate::sandbox_suite { @cases $make });
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (sandbox, sub) = ($make)();
                $crate::report(
                    $crate::sandbox::$case(sandbox.as_ref(), sub.as_ref()).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
            }
        )*
    };
}

/// The `files` suite's cases, in order: calls `$callback!{ $($pass)* ; case, ... }`. The one
/// list both [`files_suite!`] and [`cases::FILES`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __files_cases {
    ($callback:path { $($pass:tt)* }) => {
        $callback! { $($pass)* ;
            stat_describes_files_dirs_and_symlinks,
            reads_are_chunked_at_caller_offsets,
            write_modes_create_truncate_and_append,
            write_permissions_and_parents,
            atomic_replace_shows_old_or_new_never_a_mix,
            a_dropped_atomic_writer_leaves_the_target_and_no_temp,
            list_is_sorted_with_depth_and_limit,
            make_dir_with_and_without_parents,
            rename_overwrites_only_when_asked,
            remove_is_recursive_only_when_asked,
            tar_round_trip_keeps_modes_symlinks_and_nesting,
            tar_import_refuses_slips,
            a_large_file_streams_both_ways,
            watch_reports_created_modified_renamed_removed
        }
    };
}

/// Instantiates the files suite: `files_suite!(|| (Arc<dyn Files>, base))`, where each case
/// makes its scratch directory under `base` (a `PathBuf`; inside a writable root for a
/// sandboxed provider). The factory may return a third value that lives as long as the case
/// (a temp dir guard). `files_suite!(@cases make; case, ...)` instantiates only the cases named.
#[macro_export]
macro_rules! files_suite {
    ($make:expr) => {
        $crate::__files_cases!($crate::files_suite { @cases $make });
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                #[allow(unused_variables)]
                let (files, base, keep) = ($make)();
                $crate::report(
                    $crate::files::$case(files.as_ref(), &base).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
                drop(keep);
            }
        )*
    };
}

/// The `files_sandbox` suite's cases (escapes a sandboxed files provider refuses), in order.
/// The one list both [`files_sandbox_suite!`] and [`cases::FILES_SANDBOX`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __files_sandbox_cases {
    ($callback:path { $($pass:tt)* }) => {
        $callback! { $($pass)* ;
            writes_inside_the_roots_succeed,
            writes_outside_the_roots_are_denied,
            an_absolute_symlink_out_is_never_followed,
            a_relative_symlink_out_is_never_followed,
            dotdot_and_proc_self_root_do_not_escape,
            git_hooks_and_config_stay_read_only,
            a_missing_git_hooks_cannot_be_created,
            git_cannot_be_renamed_or_removed,
            the_writable_root_itself_cannot_be_removed_or_renamed,
            a_directory_swapped_for_a_symlink_never_lets_a_write_out,
            read_only_mode_refuses_every_write
        }
    };
}

/// Instantiates the files sandbox suite: `files_sandbox_suite!(|| (Arc<dyn Files>, policy,
/// keep))`, a fresh workspace root per case (the cases make `.git` in it); `keep` lives as
/// long as the case. `files_sandbox_suite!(@cases make; case, ...)` instantiates only the
/// cases named.
#[macro_export]
macro_rules! files_sandbox_suite {
    ($make:expr) => {
        $crate::__files_sandbox_cases!($crate::files_sandbox_suite { @cases $make });
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                #[allow(unused_variables)]
                let (files, policy, keep) = ($make)();
                $crate::report(
                    $crate::files_sandbox::$case(files.as_ref(), &policy).await,
                    concat!(module_path!(), "::", stringify!($case)),
                );
                drop(keep);
            }
        )*
    };
}
