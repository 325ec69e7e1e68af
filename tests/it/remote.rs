//! The remote substrate: every conformance suite over `remote-sandbox` against a real
//! `sandboxd` on 127.0.0.1 (and both files suites over `files-remote`), plus the daemon's own
//! promises (auth, limits, leases, resume).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use conch_frontend_sandboxd::rxp::{self, ServerConfig, State};
use conch_provider_local::{LocalConfig, LocalSubprocess};
use conch_provider_remote::{RemoteConfig, RemoteSubprocess};

mod client_errors;
mod daemon;
mod faults;
mod files;
mod security;

/// A daemon hosting a fresh subprocess-local on an ephemeral port, in a thread and runtime
/// of its own (so a test's current-thread runtime can block in `connect`). It lives until
/// the test process exits, or until `stop` is sent.
pub(crate) struct Daemon {
    pub(crate) addr: SocketAddr,
    pub(crate) state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    pub(crate) fn start(cfg: ServerConfig) -> Self {
        Self::start_at("127.0.0.1:0", cfg)
    }

    /// A daemon on `addr` (a fixed loopback port, to stand in for a restarted daemon).
    pub(crate) fn start_at(addr: &str, cfg: ServerConfig) -> Self {
        Self::start_hosting(addr, cfg, None)
    }

    /// A daemon on `addr` that also hosts `files` on `/v1/files`.
    pub(crate) fn start_hosting(
        addr: &str,
        cfg: ServerConfig,
        files: Option<Arc<dyn conch_seams::Files>>,
    ) -> Self {
        let listener = std::net::TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (state_tx, state_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let sub = Arc::new(LocalSubprocess::new(LocalConfig::default()));
                let state = State::with_files(sub, files, cfg);
                state_tx.send(Arc::clone(&state)).unwrap();
                rxp::serve(listener, state, async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
            });
        });
        let state = state_rx.recv().unwrap();
        Self { addr, state, stop: Some(tx), thread: Some(thread) }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts the daemon down (every process killed and reaped) and waits for it.
    pub(crate) fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// A client config for this daemon.
    pub(crate) fn client_config(&self) -> RemoteConfig {
        RemoteConfig {
            url: self.url(),
            token: self.state_token(),
            heartbeat_ms: 500,
            reconnect_max_backoff_ms: 200,
            give_up_ms: 10_000,
            ..RemoteConfig::default()
        }
    }

    fn state_token(&self) -> Option<String> {
        TOKEN.with(|t| t.borrow().clone())
    }

    pub(crate) fn client(&self) -> Arc<RemoteSubprocess> {
        Arc::new(RemoteSubprocess::connect(&self.client_config()).unwrap())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Leaked daemons (the conformance ones) keep serving; a dropped handle stops it.
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

thread_local! {
    /// The token the next `client_config` of this thread uses.
    static TOKEN: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

pub(crate) fn with_token<T>(token: Option<&str>, f: impl FnOnce() -> T) -> T {
    let old = TOKEN.with(|t| t.replace(token.map(str::to_owned)));
    let r = f();
    TOKEN.with(|t| *t.borrow_mut() = old);
    r
}

/// A fresh daemon (kept for the rest of the test process) and a client of it.
pub(crate) fn remote() -> Arc<RemoteSubprocess> {
    let d = Daemon::start(ServerConfig {
        heartbeat: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let client = d.client();
    std::mem::forget(d);
    client
}

mod subprocess_remote {
    conch_conformance::subprocess_suite!(super::remote);

    mod terminal_process {
        conch_conformance::terminal_process_suite!(super::super::remote);
    }
}

mod bash_remote {
    use std::sync::Arc;

    use conch_provider_shell::{BashLocal, BashLocalConfig};

    fn make() -> Arc<BashLocal> {
        Arc::new(BashLocal::new(BashLocalConfig::default(), super::remote()).unwrap())
    }

    conch_conformance::shell_suite!(make);
}

mod terminal_bash_remote {
    use std::sync::Arc;

    use conch_provider_terminal_shell::{TerminalShell, TerminalShellConfig};

    fn make() -> Arc<TerminalShell> {
        let config = TerminalShellConfig {
            idle_silence_ms: 1000,
            dispose_grace_ms: 500,
            ..TerminalShellConfig::default()
        };
        Arc::new(TerminalShell::new(config, super::remote()).unwrap())
    }

    conch_conformance::terminal_suite!(make);
}

/// `files-remote` over a fresh daemon hosting `files` (kept for the case), and what keeps
/// it all alive: the client (dropping it closes the connection) and the daemon.
fn remote_files(
    files: conch_provider_files::HostFiles,
) -> (Arc<dyn conch_seams::Files>, (Arc<RemoteSubprocess>, Daemon)) {
    let d = Daemon::start_hosting(
        "127.0.0.1:0",
        ServerConfig { heartbeat: Duration::from_millis(500), ..ServerConfig::default() },
        Some(Arc::new(files)),
    );
    let sub = d.client();
    let remote: Arc<dyn conch_seams::Files> =
        Arc::new(conch_provider_remote::RemoteFiles::new(&sub));
    (remote, (sub, d))
}

/// The files suite over `files-remote`, with the daemon hosting `files-local`.
mod files_remote {
    use std::path::PathBuf;
    use std::sync::Arc;

    use conch_provider_files::HostFiles;
    use conch_seams::Files;

    type Keep = (tempfile::TempDir, (Arc<conch_provider_remote::RemoteSubprocess>, super::Daemon));

    fn make() -> (Arc<dyn Files>, PathBuf, Keep) {
        let t = tempfile::tempdir().unwrap();
        let (files, keep) = super::remote_files(HostFiles::local(t.path()));
        let base = t.path().to_owned();
        (files, base, (t, keep))
    }

    conch_conformance::files_suite!(make);
}

/// The files sandbox suite over `files-remote`, with the daemon hosting `files-sandbox`: a
/// denial crosses the wire with its code and marker, and nothing escapes.
mod files_remote_sandbox {
    use std::sync::Arc;

    use conch_provider_files::HostFiles;
    use conch_seams::{Files, SandboxMode, SandboxPolicy};

    type Keep = (tempfile::TempDir, (Arc<conch_provider_remote::RemoteSubprocess>, super::Daemon));

    fn make() -> (Arc<dyn Files>, SandboxPolicy, Keep) {
        let t = tempfile::tempdir().unwrap();
        let policy = SandboxPolicy::new(SandboxMode::WorkspaceWrite, t.path());
        let (files, keep) = super::remote_files(HostFiles::sandboxed(t.path(), &policy));
        (files, policy, (t, keep))
    }

    conch_conformance::files_sandbox_suite!(make);
}
