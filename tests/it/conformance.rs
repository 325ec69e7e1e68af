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

    use conch_provider_bash::{BashLocal, BashLocalConfig};
    use conch_provider_local::{LocalConfig, LocalSubprocess};

    fn make() -> Arc<BashLocal> {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        Arc::new(BashLocal::new(BashLocalConfig::default(), sub).unwrap())
    }

    conch_conformance::shell_suite!(make);
}

mod bash_local_specific {
    use std::sync::Arc;

    use conch_provider_bash::{BashLocal, BashLocalConfig};
    use conch_provider_local::{LocalConfig, LocalSubprocess};
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
}

mod terminal_bash {
    use std::sync::Arc;

    use conch_provider_local::{LocalConfig, LocalSubprocess};
    use conch_provider_terminal_bash::{TerminalBash, TerminalBashConfig};

    fn make() -> Arc<TerminalBash> {
        let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
        let config = TerminalBashConfig {
            idle_silence_ms: 1000,
            dispose_grace_ms: 500,
            ..TerminalBashConfig::default()
        };
        Arc::new(TerminalBash::new(config, sub).unwrap())
    }

    conch_conformance::terminal_suite!(make);
}
