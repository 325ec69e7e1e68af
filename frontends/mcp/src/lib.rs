//! conch's MCP front end: one composition's tools served to one MCP client over stdio.
//!
//! The session is one [`Owner`]: every call runs as it, its background jobs and terminals
//! belong to it, and when the client closes stdin (or the binary is told to stop) the owner
//! is disposed, which cancels and awaits all of them, before [`serve_stdio`] returns.
//!
//! This is the only crate that uses rmcp, so the MCP library can be swapped without touching
//! a tool. Tools are dynamic (whatever the composition built), so the handler lists and
//! calls them by hand rather than through rmcp's tool macros.
//!
//! What maps to what:
//! - `tools/list`: every tool with its input schema. No output schema: the tool seam has no
//!   typed outputs yet, so `structuredContent` is sent without one.
//! - `tools/call`: a tool error is a result with `isError: true` whose text is
//!   `error[<code>]: <message>` and whose `structuredContent` is the error's JSON; an unknown
//!   tool is a JSON-RPC error (-32602, as the MCP spec shows it).
//! - `notifications/cancelled`: cancels that call's [`ToolContext`]; the tool kills what it
//!   ran as a tree and returns, and rmcp drops the response, so none is sent.
//! - progress: with a `progressToken`, `notifications/progress` every 500 ms while the call
//!   runs; `progress` is the elapsed milliseconds (strictly growing), and the message adds
//!   the output bytes when the tool reports them through its progress sink.
//! - call order: one owner's calls to a serial tool (the persistent shell) start in the
//!   order their requests arrived (see `arrival`); other calls run concurrently.
//! - job completion notices: sent at once as `notifications/message` (level `notice`,
//!   logger `conch.jobs`) and appended to the next tool result as `[notice] ...` text.
//!
//! rmcp is pinned (`=3.11.0`) and used by no other crate, so the MCP library can be swapped without
//! touching a tool. `serve_stdio` runs one session as one `Owner` over rmcp's reactor-driven
//! `stdio_pipes` transport; the `ServerHandler` is written by hand (tools are whatever the
//! composition built) and runs calls through `Runtime::call_with` with a `ToolContext` whose cancel
//! token the request's MCP cancellation trips. The owner's `NoticeSink` queues job notices for the
//! next result and forwards each as a `notifications/message`. `InitializeFirst`, a wrapper around
//! rmcp's transport, answers a request sent before `initialize` with "initialize first" (-32600)
//! itself, since rmcp would read it as a request of the stateless 2026 lifecycle and answer about
//! missing `_meta` fields. An `EofWatch` around stdin, or the caller's shutdown future
//! (SIGTERM/SIGINT in the binary), disposes the owner before rmcp is stopped.

mod arrival;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use conch_registry::Runtime;
use conch_seams::{
    Error as ToolError, ErrorCode, Notice, NoticeSink, Owner, Progress, ProgressSink, ToolContext,
    ToolOutput,
};
use conch_sync::LockExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ProtocolVersion, ServerCapabilities, ServerConfig, Tool as McpTool,
};
#[allow(deprecated)] // MCP logging is deprecated by the 2026 spec; conch speaks 2025-11-25.
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam, SetLevelRequestParams};
use rmcp::service::{RequestContext, RoleServer, ServiceExt};
use rmcp::{ErrorData as McpError, ServerHandler};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How often a call that carries a progress token reports progress.
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);

/// The logger name of job completion notices sent as MCP log messages.
pub const NOTICE_LOGGER: &str = "conch.jobs";

/// What the server says about itself in `initialize`.
#[derive(Clone, Debug)]
pub struct ServerIdentity {
    /// Implementation name (`conch`).
    pub name: String,
    /// Implementation version.
    pub version: String,
    /// The composition's source name, shown in the instructions.
    pub composition: String,
}

/// How a session ended (every job and terminal of its owner is gone either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client closed stdin (or the transport failed).
    InputClosed,
    /// The caller's shutdown future fired (SIGTERM in the binary).
    Shutdown,
}

/// Why a session could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The client's first messages were not a valid MCP handshake.
    #[error("MCP handshake failed: {0}")]
    Handshake(String),
    /// The session task itself failed (a bug).
    #[error("the MCP session task failed: {0}")]
    Session(String),
}

impl ServeError {
    /// Stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ServeError::Handshake(_) => ErrorCode::Protocol,
            ServeError::Session(_) => ErrorCode::Internal,
        }
    }
}

/// Serves `runtime`'s tools over this process's stdin/stdout until the client closes stdin
/// or `shutdown` completes, then disposes the session's owner (cancelling and awaiting
/// every call, job and terminal it has) before returning. The caller shuts the runtime down.
///
/// Nothing but protocol frames is written to stdout: this crate prints nothing (rmcp logs
/// through `tracing`, which the binary never points at stdout) and the providers never let a
/// child inherit stdin or stdout.
///
/// # Errors
/// [`ServeError`] when the handshake fails or the session task panics; the owner is
/// disposed in that case too.
pub async fn serve_stdio(
    runtime: Arc<Runtime>,
    identity: ServerIdentity,
    shutdown: impl Future<Output = ()>,
) -> Result<SessionEnd, ServeError> {
    let (reader, writer) = rmcp::transport::stdio_pipes();
    let input_closed = CancellationToken::new();
    let reader = EofWatch { inner: reader, eof: input_closed.clone() };
    serve((reader, writer), input_closed, runtime, identity, shutdown).await
}

/// The server's side of a transport that answers a request sent before `initialize` with
/// "initialize first" itself, before rmcp sees it: rmcp would take it for a request of the
/// stateless 2026 lifecycle and complain about missing `_meta` fields, which tells a client
/// that merely skipped the handshake nothing useful. Pings, `server/discover` and requests
/// that do carry an inline protocol version still go to rmcp, as does everything once
/// `initialize` has passed.
struct InitializeFirst<T> {
    inner: T,
    initialized: bool,
    /// Names of the composition's serial tools, and their queues.
    serial: Vec<String>,
    arrivals: Arc<arrival::Arrivals>,
}

/// The JSON-RPC error a request before `initialize` gets.
fn initialize_first_error(method: &str) -> McpError {
    McpError::invalid_request(
        format!(
            "initialize first: `{method}` arrived before the `initialize` request; send \
             `initialize`, then `notifications/initialized`, then other requests"
        ),
        Some(serde_json::json!({ "code": ErrorCode::Protocol.as_str(), "method": method })),
    )
}

impl<T> rmcp::transport::Transport<RoleServer> for InitializeFirst<T>
where
    T: rmcp::transport::Transport<RoleServer>,
{
    type Error = T::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<rmcp::service::RxJsonRpcMessage<RoleServer>> {
        use rmcp::model::{ClientRequest, GetMeta, JsonRpcMessage, ServerJsonRpcMessage};
        loop {
            let mut message = self.inner.receive().await?;
            // Read in arrival order: a call to a serial tool takes its place in the queue now.
            if let JsonRpcMessage::Request(request) = &mut message
                && let ClientRequest::CallToolRequest(call) = &mut request.request
                && self.serial.iter().any(|s| *s == call.params.name)
            {
                let ticket = self.arrivals.take(&call.params.name);
                call.extensions.insert(ticket);
            }
            if self.initialized {
                return Some(message);
            }
            let JsonRpcMessage::Request(request) = &message else { return Some(message) };
            match &request.request {
                ClientRequest::InitializeRequest(_) => {
                    self.initialized = true;
                    return Some(message);
                }
                ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => {
                    return Some(message);
                }
                other if other.get_meta().protocol_version().is_some() => return Some(message),
                other => {
                    let error = initialize_first_error(other.method());
                    let reply = ServerJsonRpcMessage::error(error, Some(request.id.clone()));
                    // A client that cannot be answered is gone; its next read says so.
                    let _ = self.inner.send(reply).await;
                }
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

async fn serve<R, W>(
    transport: (R, W),
    input_closed: CancellationToken,
    runtime: Arc<Runtime>,
    identity: ServerIdentity,
    shutdown: impl Future<Output = ()>,
) -> Result<SessionEnd, ServeError>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (notice_tx, notice_rx) = mpsc::unbounded_channel();
    let notices = Arc::new(Notices { pending: Mutex::new(Vec::new()), tx: notice_tx });
    let owner = Owner::new("mcp", Arc::clone(&notices) as Arc<dyn NoticeSink>);
    let handler = Handler {
        inner: Arc::new(Inner {
            runtime,
            owner: Arc::clone(&owner),
            notices,
            identity,
            min_level: Mutex::new(None),
        }),
    };
    let service_ct = CancellationToken::new();
    let mut shutdown = std::pin::pin!(shutdown);

    let (reader, writer) = transport;
    let transport = InitializeFirst {
        inner: rmcp::transport::async_rw::AsyncRwTransport::new_server(reader, writer),
        initialized: false,
        serial: handler
            .inner
            .runtime
            .tools()
            .iter()
            .filter(|t| t.serial())
            .map(|t| t.name().to_string())
            .collect(),
        arrivals: Arc::default(),
    };
    let started = tokio::select! {
        r = handler.clone().serve_with_ct(transport, service_ct.clone()) => r,
        () = &mut shutdown => {
            service_ct.cancel();
            owner.dispose().await;
            return Ok(SessionEnd::Shutdown);
        }
    };
    let running = match started {
        Ok(running) => running,
        Err(e) => {
            owner.dispose().await;
            // A client that left before initializing is an ordinary end, not a failure.
            return if input_closed.is_cancelled() {
                Ok(SessionEnd::InputClosed)
            } else {
                Err(ServeError::Handshake(e.to_string()))
            };
        }
    };

    let forwarder = tokio::spawn(forward_notices(
        notice_rx,
        running.peer().clone(),
        Arc::clone(&handler.inner),
    ));
    let waiting = running.waiting();
    let mut waiting = std::pin::pin!(waiting);
    let (end, finished) = tokio::select! {
        r = &mut waiting => (SessionEnd::InputClosed, Some(r)),
        () = input_closed.cancelled() => (SessionEnd::InputClosed, None),
        () = &mut shutdown => (SessionEnd::Shutdown, None),
    };
    // The owner first: its calls in flight are cancelled (each kills its processes and
    // returns), and its jobs and terminals are cancelled and awaited.
    owner.dispose().await;
    let joined = match finished {
        Some(r) => r,
        None => {
            // rmcp drains responses still in flight (bounded by its own timeout), then stops.
            service_ct.cancel();
            waiting.await
        }
    };
    forwarder.abort();
    joined.map_err(|e| ServeError::Session(e.to_string()))?;
    Ok(end)
}

/// An `AsyncRead` that cancels `eof` when its reader reaches end of input (or fails), so the
/// session can dispose its owner at once rather than after rmcp's response drain.
#[derive(Debug)]
struct EofWatch<R> {
    inner: R,
    eof: CancellationToken,
}

impl<R: AsyncRead + Unpin> AsyncRead for EofWatch<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.eof.cancel();
            }
            Poll::Ready(Err(_)) => self.eof.cancel(),
            _ => {}
        }
        polled
    }
}

/// The owner's notice sink: queues each notice for the next tool result and hands it to the
/// forwarder, which sends it as an MCP log message.
#[derive(Debug)]
struct Notices {
    pending: Mutex<Vec<Notice>>,
    tx: mpsc::UnboundedSender<Notice>,
}

impl Notices {
    fn take(&self) -> Vec<Notice> {
        std::mem::take(&mut *self.pending.locked())
    }
}

impl NoticeSink for Notices {
    fn deliver(&self, notice: Notice) {
        // An MCP client has no turn to inject into, so no notice is routed: each rides on the
        // next result and is announced at once as a log message.
        self.pending.locked().push(notice.clone());
        let _ = self.tx.send(notice);
    }
}

#[allow(deprecated)]
async fn forward_notices(
    mut rx: mpsc::UnboundedReceiver<Notice>,
    peer: rmcp::Peer<RoleServer>,
    inner: Arc<Inner>,
) {
    while let Some(notice) = rx.recv().await {
        if !inner.logs(LoggingLevel::Notice) {
            continue;
        }
        let mut param = LoggingMessageNotificationParam::new(
            LoggingLevel::Notice,
            serde_json::json!({ "source_id": notice.source_id, "text": notice.text }),
        );
        param.logger = Some(NOTICE_LOGGER.into());
        if peer.notify_logging_message(param).await.is_err() {
            // The transport is gone; the notices stay queued for no one.
            break;
        }
    }
}

#[derive(Clone, Debug)]
struct Handler {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    runtime: Arc<Runtime>,
    owner: Arc<Owner>,
    notices: Arc<Notices>,
    identity: ServerIdentity,
    /// The client's `logging/setLevel`, if it sent one (rank, see [`level_rank`]).
    min_level: Mutex<Option<u8>>,
}

#[allow(deprecated)]
fn level_rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

impl Inner {
    #[allow(deprecated)]
    fn logs(&self, level: LoggingLevel) -> bool {
        let min = *self.min_level.locked();
        min.is_none_or(|m| level_rank(level) >= m)
    }

    /// The MCP listing of one tool.
    fn describe(tool: &dyn conch_seams::Tool) -> McpTool {
        let schema = match tool.input_schema() {
            serde_json::Value::Object(o) => o,
            // Every conch tool's schema is a schemars object; anything else would be a bug,
            // and an empty object schema still lets the client call the tool.
            _ => JsonObject::from_iter([("type".to_string(), "object".into())]),
        };
        McpTool::new_with_raw(
            tool.name().to_string(),
            Some(tool.description().to_string().into()),
            Arc::new(schema),
        )
    }

    /// Runs one call to its end: linked to the request's cancellation, reporting progress
    /// when the client asked for it.
    async fn run_call(
        &self,
        name: &str,
        args: serde_json::Value,
        request: &RequestContext<RoleServer>,
    ) -> Result<ToolOutput, ToolError> {
        let sink = Arc::new(LatestProgress::default());
        let ctx = ToolContext::new(Arc::clone(&self.owner))
            .with_progress(Arc::clone(&sink) as Arc<dyn ProgressSink>);
        let token = request.meta.get_progress_token();
        let started = Instant::now();
        let call = self.runtime.call_with(&ctx, name, args);
        let mut call = std::pin::pin!(call);
        let mut ticks = tokio::time::interval_at(
            tokio::time::Instant::now() + PROGRESS_INTERVAL,
            PROGRESS_INTERVAL,
        );
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sent = 0.0_f64;
        loop {
            tokio::select! {
                r = &mut call => return r,
                // The client cancelled (or the session is stopping): the tool aborts, kills
                // what it started, and returns; rmcp sends no response for it.
                () = request.ct.cancelled(), if !ctx.cancel.is_cancelled() => ctx.cancel.cancel(),
                _ = ticks.tick(), if token.is_some() && !ctx.cancel.is_cancelled() => {
                    let Some(token) = token.clone() else { continue };
                    // Milliseconds rounded up, and never equal to the last report: progress
                    // must grow with every notification.
                    let elapsed = started.elapsed().as_millis() as f64;
                    let progress = if elapsed > last_sent { elapsed } else { last_sent + 1.0 };
                    last_sent = progress;
                    let message = progress_message(started.elapsed(), sink.output_bytes());
                    // A progress note that cannot be sent is not worth failing the call for.
                    let _ = request.peer.notify_progress(progress_param(token, progress, message)).await;
                }
            }
        }
    }
}

fn progress_param(
    token: ProgressToken,
    progress: f64,
    message: String,
) -> ProgressNotificationParam {
    let mut p = ProgressNotificationParam::new(token, progress);
    p.message = Some(message);
    p
}

fn progress_message(elapsed: Duration, output_bytes: Option<u64>) -> String {
    let secs = elapsed.as_secs_f64();
    match output_bytes {
        Some(b) => format!("running for {secs:.1}s; {b} bytes of output so far"),
        None => format!("running for {secs:.1}s"),
    }
}

/// The newest progress a tool reported, read by the progress ticker.
#[derive(Debug, Default)]
struct LatestProgress {
    output_bytes: Mutex<Option<u64>>,
}

impl LatestProgress {
    fn output_bytes(&self) -> Option<u64> {
        *self.output_bytes.locked()
    }
}

impl ProgressSink for LatestProgress {
    fn progress(&self, progress: Progress) {
        let mut b = self.output_bytes.locked();
        *b = Some(b.unwrap_or(0).max(progress.output_bytes));
    }
}

/// The MCP result of a finished call, with the owner's queued notices appended.
fn to_result(r: Result<ToolOutput, ToolError>, notices: Vec<Notice>) -> CallToolResult {
    let mut result = match r {
        Ok(out) => {
            let mut result = CallToolResult::success(vec![ContentBlock::text(out.text)]);
            // structuredContent must be an object; conch's tools only ever return objects.
            result.structured_content = out.structured.filter(serde_json::Value::is_object);
            result
        }
        Err(e) => {
            let mut result = CallToolResult::error(vec![ContentBlock::text(format!(
                "error[{}]: {e}",
                e.code()
            ))]);
            result.structured_content = Some(e.to_json());
            result
        }
    };
    for n in notices {
        result.content.push(ContentBlock::text(format!("[notice] {}", n.text)));
    }
    result
}

/// The server's instructions: only what this composition's tools make true, so a model is
/// never told of jobs or tools it does not have.
fn instructions(composition: &str, runtime: &Runtime) -> String {
    let has = |name: &str| runtime.tool(name).is_some();
    let mut text = format!("conch serves the tools of the `{composition}` composition.");
    if has("job_output") {
        text.push_str(&format!(
            " Background jobs report their completion as a log message (logger \
             `{NOTICE_LOGGER}`) and as a `[notice]` line on the next tool result."
        ));
    }
    if has("terminal_open") {
        for shell in ["bash", "pwsh"].into_iter().filter(|s| has(s)) {
            text.push_str(&format!(
                " Use the `{shell}` tool for commands that need no interaction, and terminal \
                 sessions for interactive programs."
            ));
        }
    }
    text
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        #[allow(deprecated)]
        let capabilities = ServerCapabilities::builder().enable_tools().enable_logging().build();
        let id = &self.inner.identity;
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new(id.name.clone(), id.version.clone())
                    .with_title("conch: execution tools for agents"),
            )
            .with_instructions(instructions(&id.composition, &self.inner.runtime))
    }

    // The features used here (logging, `notifications/cancelled` for requests, the
    // initialize handshake) are those of the 2025 revisions.
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools =
            self.inner.runtime.tools().iter().map(|t| Inner::describe(t.as_ref())).collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.as_ref();
        if self.inner.runtime.tool(name).is_none() {
            let names: Vec<&str> = self.inner.runtime.tools().iter().map(|t| t.name()).collect();
            return Err(McpError::invalid_params(
                format!("unknown tool `{name}`; this server has: {}", names.join(", ")),
                Some(serde_json::json!({ "code": ErrorCode::NotFound.as_str() })),
            ));
        }
        let args = request.arguments.map(serde_json::Value::Object).unwrap_or_default();
        // A serial tool's call waits for the calls that arrived before it (or its cancel).
        if let Some(ticket) = context.extensions.get::<arrival::Ticket>() {
            tokio::select! {
                () = ticket.turn() => {}
                () = context.ct.cancelled() => {}
            }
        }
        let r = self.inner.run_call(name, args, &context).await;
        // A cancelled request gets no response, so its notices stay queued for the next one.
        let notices =
            if context.ct.is_cancelled() { Vec::new() } else { self.inner.notices.take() };
        Ok(to_result(r, notices).into())
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.inner.min_level.locked() = Some(level_rank(request.level));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn eof_watch_fires_at_end_of_input_and_not_before() {
        let (mut tx, rx) = tokio::io::duplex(64);
        let eof = CancellationToken::new();
        let mut watched = EofWatch { inner: rx, eof: eof.clone() };
        tx.write_all(b"{}\n").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(watched.read(&mut buf).await.unwrap(), 3);
        assert!(!eof.is_cancelled(), "data is not the end");
        drop(tx);
        assert_eq!(watched.read(&mut buf).await.unwrap(), 0);
        assert!(eof.is_cancelled());
    }

    #[test]
    fn a_tool_error_is_an_error_result_with_its_code_and_notices_follow_any_result() {
        let notice =
            || Notice { source_id: "bash-1".into(), text: "job bash-1 (x) completed".into() };
        let err = ToolError::new(ErrorCode::Cancelled, "the bash tool call was aborted");
        let r = to_result(Err(err), vec![notice()]);
        assert_eq!(r.is_error, Some(true));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["content"][0]["text"], "error[cancelled]: the bash tool call was aborted");
        assert_eq!(v["content"][1]["text"], "[notice] job bash-1 (x) completed");
        assert_eq!(v["structuredContent"]["code"], "cancelled");
        let ok = ToolOutput { text: "hi\n".into(), structured: Some(serde_json::json!([1])) };
        let v = serde_json::to_value(to_result(Ok(ok), Vec::new())).unwrap();
        assert_eq!(v["isError"], false);
        assert!(v.get("structuredContent").is_none(), "only objects are structured content");
    }

    #[test]
    #[allow(deprecated)]
    fn log_levels_rank_in_syslog_order() {
        let all = [
            LoggingLevel::Debug,
            LoggingLevel::Info,
            LoggingLevel::Notice,
            LoggingLevel::Warning,
            LoggingLevel::Error,
            LoggingLevel::Critical,
            LoggingLevel::Alert,
            LoggingLevel::Emergency,
        ];
        let ranks: Vec<u8> = all.into_iter().map(level_rank).collect();
        assert_eq!(ranks, (0..8).collect::<Vec<u8>>());
    }

    #[test]
    fn progress_notes_name_the_elapsed_time_and_bytes_when_known() {
        assert_eq!(progress_message(Duration::from_millis(1500), None), "running for 1.5s");
        assert_eq!(
            progress_message(Duration::from_millis(2000), Some(42)),
            "running for 2.0s; 42 bytes of output so far"
        );
        let sink = LatestProgress::default();
        assert_eq!(sink.output_bytes(), None);
        let at = |b| Progress { elapsed: Duration::ZERO, output_bytes: b, message: None };
        sink.progress(at(10));
        sink.progress(at(4));
        assert_eq!(sink.output_bytes(), Some(10), "never goes back");
    }
}
