//! The seam conformance suites, instantiated for each local provider.

mod subprocess_local {
    use std::sync::Arc;

    use conch_provider_local::{LocalConfig, LocalSubprocess};

    conch_conformance::subprocess_suite!(|| Arc::new(LocalSubprocess::new(LocalConfig::default())));

    mod terminal_process {
        use super::*;

        conch_conformance::terminal_process_suite!(|| Arc::new(LocalSubprocess::new(
            LocalConfig::default()
        )));
    }
}

mod bash_local {
    use std::sync::Arc;

    use conch_provider_local::{LocalConfig, LocalSubprocess};
    use conch_provider_shell::{BashLocal, BashLocalConfig};

    fn make() -> Arc<BashLocal> {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        Arc::new(BashLocal::new(BashLocalConfig::default(), sub).unwrap())
    }

    conch_conformance::shell_suite!(make);
}

mod bash_local_specific {
    use std::sync::Arc;

    use conch_provider_local::{LocalConfig, LocalSubprocess};
    use conch_provider_shell::{BashLocal, BashLocalConfig};
    use std::time::Duration;

    use conch_seams::{ShellExecRequest, ShellExecutor, ShellProcessStatus};

    #[tokio::test]
    async fn start_never_fails_and_settles_killed_with_the_spawn_error() {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        let cfg = BashLocalConfig {
            bash: "/nonexistent/conch-bash".into(),
            ..BashLocalConfig::default()
        };
        let exec = BashLocal::new(cfg, sub).unwrap();
        let proc = exec.start(exec.resolve(ShellExecRequest::new("echo hi")).unwrap()).await;
        proc.wait().await;
        assert_eq!(proc.status(), ShellProcessStatus::Killed);
        let out = proc.read_output().text;
        assert!(out.contains("/nonexistent/conch-bash"), "the spawn error is the output: {out}");
        // Foreground run of the same spec is an infrastructure error instead.
        let err =
            exec.run(exec.resolve(ShellExecRequest::new("echo hi")).unwrap()).await.unwrap_err();
        assert_eq!(err.code(), conch_seams::ErrorCode::SpawnFailed);
    }

    /// The shell suite takes the limits from the executor's configuration; bash-local's own
    /// defaults are these.
    #[test]
    fn the_default_config_fills_the_documented_limits() {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        let exec = BashLocal::new(BashLocalConfig::default(), sub).unwrap();
        let spec = exec.resolve(ShellExecRequest::new("true")).unwrap();
        assert_eq!(spec.timeout, Duration::from_secs(120), "default timeout");
        assert_eq!(spec.output_max_bytes, 64_000, "default output bytes");
        assert_eq!(spec.spill_cap, 64 * 1024 * 1024, "default spill cap");
        assert_eq!(spec.grace, Duration::from_secs(3), "default grace");
        let spec = exec.resolve(ShellExecRequest::new("true").with_timeout_ms(10_000_000)).unwrap();
        assert_eq!(spec.timeout, Duration::from_secs(600), "timeout is capped");
    }

    fn with_cap(max_command_bytes: usize) -> BashLocal {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        BashLocal::new(BashLocalConfig { max_command_bytes, ..BashLocalConfig::default() }, sub)
            .unwrap()
    }

    #[tokio::test]
    async fn a_command_over_the_cap_is_refused_naming_the_cap_and_the_key() {
        let exec = with_cap(1000);
        let fits = format!("echo fits #{}", "x".repeat(1000 - "echo fits #".len()));
        let ok = exec.resolve(ShellExecRequest::new(fits));
        let r = exec.run(ok.expect("1000 bytes is at the cap")).await.unwrap();
        assert_eq!(r.output.text, "fits\n");
        let err = exec.resolve(ShellExecRequest::new("x".repeat(1001))).unwrap_err();
        assert_eq!(err.code(), conch_seams::ErrorCode::InvalidArgument);
        assert!(
            err.message().contains(
                "command is 1001 bytes; the limit is 1000 (bash-local max_command_bytes)"
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_command_at_the_default_cap_runs() {
        // 1 MiB of argv fits under ARG_MAX next to the environment.
        let exec = with_cap(BashLocalConfig::default().max_command_bytes);
        let head = "echo $#; #";
        let chars = (1_048_576 - head.len()) / 2;
        let cmd = format!(
            "{head}{}{}",
            "é".repeat(chars),
            "y".repeat(1_048_576 - head.len() - 2 * chars)
        );
        assert_eq!(cmd.len(), 1_048_576);
        let r = exec.run(exec.resolve(ShellExecRequest::new(cmd)).unwrap()).await.unwrap();
        assert_eq!((r.status.code, r.output.text.as_str()), (Some(0), "0\n"));
    }
}

mod terminal_bash {
    use std::sync::Arc;

    use conch_provider_local::{LocalConfig, LocalSubprocess};
    use conch_provider_terminal_shell::{TerminalShell, TerminalShellConfig};

    fn make() -> Arc<TerminalShell> {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        let config = TerminalShellConfig {
            idle_silence_ms: 1000,
            dispose_grace_ms: 500,
            ..TerminalShellConfig::default()
        };
        Arc::new(TerminalShell::new(config, sub).unwrap())
    }

    conch_conformance::terminal_suite!(make);
}

// The same suites for PowerShell 7. They need a real `pwsh` on PATH (never a stand-in);
// without one each suite prints one `skipped: pwsh not found on PATH (N cases)` line.

mod pwsh_local {
    use std::sync::Arc;

    use conch_provider_local::{LocalConfig, LocalSubprocess};
    use conch_provider_shell::{PwshLocal, PwshLocalConfig};

    fn make() -> Arc<PwshLocal> {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        Arc::new(PwshLocal::new(PwshLocalConfig::default(), sub).unwrap())
    }

    conch_conformance::shell_suite!(gate: conch_conformance::pwsh_on_path, make);
}

mod terminal_pwsh {
    use std::sync::Arc;

    use conch_provider_local::{LocalConfig, LocalSubprocess};
    use conch_provider_terminal_shell::{TerminalShell, TerminalShellConfig};

    fn make() -> Arc<TerminalShell> {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        let config = TerminalShellConfig {
            shell_dialect: conch_seams::Dialect::Pwsh,
            // pwsh compiles its first commands silently for a while: a window bash's 1 s
            // would mistake for idleness.
            idle_silence_ms: 4000,
            dispose_grace_ms: 500,
            ..TerminalShellConfig::default()
        };
        Arc::new(TerminalShell::new(config, sub).unwrap())
    }

    conch_conformance::terminal_suite!(gate: conch_conformance::pwsh_on_path, make);
}
