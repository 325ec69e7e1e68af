//! One spawned local process: stream pumps, exit watcher, kill escalation.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use conch_output::{Collector, CollectorConfig};
use conch_seams::{
    CollectedOutput, Error, ErrorCode, ExitStatus, OutputSpec, Process, Result, SpawnSpec,
    StdinSpec, StreamId, StreamRead, signal_name,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::NAME;

/// Shared state of one process.
#[derive(Debug)]
pub(crate) struct Inner {
    pid: u32,
    grace: Duration,
    stdout: Option<Arc<Collector>>,
    stderr: Option<Arc<Collector>>,
    stdin: tokio::sync::Mutex<Option<tokio::process::ChildStdin>>,
    /// Set when the child exited (before streams drained).
    exited: watch::Sender<Option<ExitStatus>>,
    /// Set when the child exited and every collected stream reached EOF.
    settled: watch::Sender<Option<ExitStatus>>,
    kill_started: AtomicBool,
    group_gone: watch::Sender<bool>,
}

impl Inner {
    /// Starts the TERM → grace → KILL escalation once.
    pub(crate) fn request_kill(self: &Arc<Self>) {
        if self.kill_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::clone(self);
        tokio::spawn(async move {
            // The child is its own group leader, so its pid is the pgid.
            let gone = crate::kill_tree(me.pid as i32, me.grace).await;
            if gone {
                me.group_gone.send_replace(true);
            }
        });
    }

    pub(crate) async fn wait_settled(&self) -> ExitStatus {
        let mut rx = self.settled.subscribe();
        loop {
            if let Some(s) = rx.borrow_and_update().clone() {
                return s;
            }
            if rx.changed().await.is_err() {
                return ExitStatus::default();
            }
        }
    }

    pub(crate) async fn wait_group_gone(&self) {
        let mut rx = self.group_gone.subscribe();
        loop {
            if *rx.borrow_and_update() || !crate::group_alive(self.pid as i32) {
                return;
            }
            // Either the kill task reports, or we re-probe: a group can also empty by itself.
            let _ = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
        }
    }
}

/// A local process handle.
#[derive(Debug)]
pub struct LocalProcess {
    pub(crate) inner: Arc<Inner>,
}

fn collector(spec: &OutputSpec, spill_dir: Option<&Path>) -> Option<Arc<Collector>> {
    match spec {
        OutputSpec::Collect { max_bytes, spill_cap } => {
            Some(Arc::new(Collector::new(CollectorConfig {
                max_bytes: *max_bytes,
                spill_cap: *spill_cap,
                spill_dir: spill_dir.map(Path::to_path_buf),
            })))
        }
        _ => None,
    }
}

fn spawn_failed(message: String) -> Error {
    Error::new(ErrorCode::SpawnFailed, message).with_provider(NAME).with_operation("spawn")
}

fn pump(
    mut reader: impl AsyncRead + Unpin + Send + 'static,
    sink: Arc<Collector>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => sink.push(&buf[..n]),
            }
        }
        sink.seal();
    })
}

pub(crate) fn to_exit(status: std::process::ExitStatus) -> ExitStatus {
    ExitStatus { code: status.code(), signal: status.signal().map(signal_name) }
}

/// Spawns `spec`.
pub(crate) fn spawn(spec: SpawnSpec, spill_dir: Option<&Path>) -> Result<LocalProcess> {
    let Some(program) = spec.argv.first() else {
        return Err(Error::invalid("argv is empty").with_provider(NAME).with_operation("spawn"));
    };
    if !spec.cwd.is_dir() {
        return Err(spawn_failed(format!(
            "working directory `{}` does not exist",
            spec.cwd.display()
        )));
    }
    if matches!(spec.stdout, OutputSpec::MergeIntoStdout) {
        return Err(Error::invalid("stdout cannot merge into itself").with_provider(NAME));
    }
    let env = conch_env::child_env(&spec.env);
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&spec.argv[1..])
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(&env)
        .process_group(0)
        .kill_on_drop(false);

    let stdout_sink = collector(&spec.stdout, spill_dir);
    let stderr_sink = collector(&spec.stderr, spill_dir);
    let merged = matches!(spec.stderr, OutputSpec::MergeIntoStdout) && stdout_sink.is_some();
    // A merged stream uses one OS pipe for both fds, so interleaving is the child's order.
    let mut merged_reader: Option<std::io::PipeReader> = None;
    if merged {
        let (r, w) = std::io::pipe().map_err(|e| Error::io("create output pipe", e))?;
        let w2 = w.try_clone().map_err(|e| Error::io("clone output pipe", e))?;
        cmd.stdout(Stdio::from(OwnedFd::from(w))).stderr(Stdio::from(OwnedFd::from(w2)));
        merged_reader = Some(r);
    } else {
        cmd.stdout(if stdout_sink.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stderr(if stderr_sink.is_some() { Stdio::piped() } else { Stdio::null() });
    }
    cmd.stdin(match spec.stdin {
        StdinSpec::Null => Stdio::null(),
        _ => Stdio::piped(),
    });

    let spawned = cmd.spawn();
    // Dropping the command closes the parent's copies of the merged pipe's write end.
    drop(cmd);
    let mut child = spawned.map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::NotFound {
            "command not found"
        } else {
            "cannot execute"
        };
        spawn_failed(format!("{what}: `{program}`: {e}"))
    })?;
    let pid = child.id().unwrap_or(0);

    let mut pumps = Vec::new();
    if let Some(r) = merged_reader {
        let fd = OwnedFd::from(r);
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
            .map_err(|e| Error::io("register output pipe", e))?;
        if let Some(sink) = &stdout_sink {
            pumps.push(pump(rx, Arc::clone(sink)));
        }
    } else {
        if let (Some(out), Some(sink)) = (child.stdout.take(), &stdout_sink) {
            pumps.push(pump(out, Arc::clone(sink)));
        }
        if let (Some(err), Some(sink)) = (child.stderr.take(), &stderr_sink) {
            pumps.push(pump(err, Arc::clone(sink)));
        }
    }
    let mut stdin = child.stdin.take();
    if let StdinSpec::Bytes(bytes) = spec.stdin.clone()
        && let Some(mut w) = stdin.take()
    {
        tokio::spawn(async move {
            // A child that exits without reading gives EPIPE; that is its choice.
            let _ = w.write_all(&bytes).await;
            let _ = w.shutdown().await;
        });
    }

    let inner = Arc::new(Inner {
        pid,
        grace: spec.grace,
        stdout: stdout_sink,
        stderr: stderr_sink,
        stdin: tokio::sync::Mutex::new(stdin),
        exited: watch::Sender::new(None),
        settled: watch::Sender::new(None),
        kill_started: AtomicBool::new(false),
        group_gone: watch::Sender::new(false),
    });

    let me = Arc::clone(&inner);
    let cancel = spec.cancel.clone();
    tokio::spawn(async move {
        let status = tokio::select! {
            s = child.wait() => s,
            () = cancel.cancelled() => {
                me.request_kill();
                child.wait().await
            }
        };
        let status = status.map(to_exit).unwrap_or_default();
        me.exited.send_replace(Some(status.clone()));
        for p in pumps {
            let _ = p.await;
        }
        me.settled.send_replace(Some(status));
    });
    // Cancellation after exit (while streams still drain) must still reach the group.
    let me = Arc::clone(&inner);
    let cancel = spec.cancel;
    tokio::spawn(async move {
        let mut settled = me.settled.subscribe();
        tokio::select! {
            () = cancel.cancelled() => me.request_kill(),
            _ = settled.wait_for(Option::is_some) => {}
        }
    });
    Ok(LocalProcess { inner })
}

impl LocalProcess {
    fn sink(&self, stream: StreamId) -> Option<&Arc<Collector>> {
        match stream {
            StreamId::Stdout => self.inner.stdout.as_ref(),
            StreamId::Stderr => self.inner.stderr.as_ref(),
        }
    }
}

#[async_trait]
impl Process for LocalProcess {
    fn pid(&self) -> Option<u32> {
        Some(self.inner.pid)
    }

    async fn wait(&self) -> ExitStatus {
        self.inner.wait_settled().await
    }

    fn try_status(&self) -> Option<ExitStatus> {
        self.inner.settled.borrow().clone()
    }

    fn read(&self, stream: StreamId, offset: u64, max_bytes: usize) -> Result<StreamRead> {
        self.sink(stream).map(|s| s.read(offset, max_bytes)).ok_or_else(|| {
            Error::invalid(format!("{stream:?} is not collected")).with_provider(NAME)
        })
    }

    fn collected(&self, stream: StreamId) -> Option<CollectedOutput> {
        self.sink(stream).map(|s| s.summary())
    }

    async fn write_stdin(&self, data: &[u8]) -> Result<()> {
        let mut guard = self.inner.stdin.lock().await;
        let Some(w) = guard.as_mut() else {
            return Err(Error::invalid("stdin is not an open pipe").with_provider(NAME));
        };
        w.write_all(data).await.map_err(|e| Error::io("write stdin", e).with_provider(NAME))?;
        w.flush().await.map_err(|e| Error::io("flush stdin", e).with_provider(NAME))
    }

    fn close_stdin(&self) {
        if let Ok(mut guard) = self.inner.stdin.try_lock() {
            guard.take();
        } else {
            let inner = Arc::clone(&self.inner);
            tokio::spawn(async move {
                inner.stdin.lock().await.take();
            });
        }
    }

    fn kill(&self) {
        self.inner.request_kill();
    }

    async fn wait_group_gone(&self) {
        self.inner.wait_group_gone().await;
    }
}
