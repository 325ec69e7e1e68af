//! The WebSocket half of RXP/1: one connection per client multiplexes every stream it attached.
//!
//! # Invariants
//! - A connection only carries what it attached, from the offsets the client named: bytes it
//!   already has are never resent, bytes no longer retained are announced as a `gap`, never
//!   skipped silently. Replay comes from memory, or from the stream's complete spill file
//!   when memory no longer holds the offset.
//! - Frames leave in order through one bounded queue, so a slow client slows its pumps
//!   (TCP backpressure) instead of growing server memory; output keeps being retained by
//!   the process either way.
//! - A connection silent for two of the client's heartbeat intervals is dropped; its
//!   processes live on under their lease.

use std::collections::HashMap;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State as AxState;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use conch_seams::{Error, ErrorCode, Result, StreamId, StreamRead};
use futures::{SinkExt as _, StreamExt as _};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::api::client_of;
use super::{Entry, Held, State};
use conch_provider_remote_proto::{self as proto, ClientMsg, ServerMsg, SpillState, Stream};

/// Largest data payload per frame (well under the frame limit).
const CHUNK: usize = 256 << 10;
/// Frames queued per connection before pumps wait for the socket.
const QUEUE: usize = 64;
/// How long a new connection has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn upgrade(
    AxState(state): AxState<Arc<State>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let client = match client_of(&state, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let max = state.cfg.max_frame_bytes.max(CHUNK + 4096);
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move { session(state, client, socket).await })
}

type Tx = mpsc::Sender<Message>;

async fn send_msg(tx: &Tx, msg: &ServerMsg) -> bool {
    match serde_json::to_string(msg) {
        Ok(text) => tx.send(Message::Text(text.into())).await.is_ok(),
        Err(_) => false,
    }
}

async fn session(state: Arc<State>, client: String, socket: WebSocket) {
    let (mut sink, mut incoming) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Message>(QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if sink.send(m).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });

    // Hello first: the protocol, and the client's heartbeat interval.
    let hello = tokio::time::timeout(HELLO_TIMEOUT, incoming.next()).await;
    let client_hb = match hello {
        Ok(Some(Ok(Message::Text(t)))) => match serde_json::from_str::<ClientMsg>(&t) {
            Ok(ClientMsg::Hello { protocol, heartbeat_ms }) if protocol == proto::PROTOCOL => {
                Duration::from_millis(heartbeat_ms.clamp(50, 600_000))
            }
            Ok(ClientMsg::Hello { protocol, .. }) => {
                let why = format!("this daemon speaks {}, not {protocol}", proto::PROTOCOL);
                return close_bad(tx, writer, &why).await;
            }
            _ => return close_bad(tx, writer, "the first message must be hello").await,
        },
        _ => return close_bad(tx, writer, "no hello").await,
    };
    let hb = state.cfg.heartbeat;
    let ms = u64::try_from(hb.as_millis()).unwrap_or(u64::MAX);
    // Logged before the answer, so the line precedes anything the client does with it.
    tracing::debug!(client = %client, "stream connection open");
    if !send_msg(&tx, &ServerMsg::Hello { boot_id: state.boot_id.clone(), heartbeat_ms: ms }).await
    {
        return;
    }

    let mut attached: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut watches: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut last_rx = Instant::now();
    let mut ticker = tokio::time::interval(hb.min(client_hb));
    let mut closing = state.closing();
    let closed = async move {
        let _ = closing.wait_for(|c| *c).await;
    };
    tokio::pin!(closed);
    loop {
        tokio::select! {
            m = incoming.next() => {
                let Some(Ok(m)) = m else { break };
                last_rx = Instant::now();
                state.touch(&client);
                match m {
                    Message::Text(t) => match serde_json::from_str::<ClientMsg>(&t) {
                        Ok(ClientMsg::Attach { id, from }) => {
                            if let Some(old) = attached.remove(&id) {
                                old.abort();
                            }
                            match state.get(&client, &id) {
                                Ok(e) => {
                                    let task = tokio::spawn(pump_entry(e, from, tx.clone()));
                                    attached.insert(id, task);
                                }
                                Err(e) => {
                                    let msg = ServerMsg::Error { id: Some(id), error: e.to_body() };
                                    if !send_msg(&tx, &msg).await { break }
                                }
                            }
                        }
                        Ok(ClientMsg::Detach { id }) => {
                            if let Some(old) = attached.remove(&id) {
                                old.abort();
                            }
                        }
                        Ok(ClientMsg::Hb) => {}
                        Ok(ClientMsg::Watch { id, path, recursive }) => {
                            if let Some(old) = watches.remove(&id) {
                                old.abort();
                            }
                            match state.files.provider() {
                                Ok(files) => {
                                    let task = tokio::spawn(pump_watch(files, id.clone(), path, recursive, tx.clone()));
                                    watches.insert(id, task);
                                }
                                Err(e) => {
                                    let msg = ServerMsg::Error { id: Some(id), error: e.to_body() };
                                    if !send_msg(&tx, &msg).await { break }
                                }
                            }
                        }
                        Ok(ClientMsg::Unwatch { id }) => {
                            if let Some(old) = watches.remove(&id) {
                                old.abort();
                            }
                        }
                        Ok(ClientMsg::Hello { .. }) | Err(_) => {
                            // A confused client gets told, and the connection goes on.
                            let e = Error::new(ErrorCode::Protocol, "unexpected or malformed message");
                            if !send_msg(&tx, &ServerMsg::Error { id: None, error: e.to_body() }).await {
                                break;
                            }
                        }
                    },
                    Message::Close(_) => {
                        // Keep receiving until the peer's stream ends: tungstenite answers the
                        // close itself, and dropping now would reset the connection.
                        while let Some(Ok(_)) = incoming.next().await {}
                        break;
                    }
                    Message::Binary(_) => {
                        let e = Error::new(ErrorCode::Protocol, "clients send no binary frames");
                        if !send_msg(&tx, &ServerMsg::Error { id: None, error: e.to_body() }).await {
                            break;
                        }
                    }
                    Message::Ping(_) | Message::Pong(_) => {}
                }
            }
            _ = ticker.tick() => {
                if last_rx.elapsed() > client_hb * 2 {
                    tracing::info!(client = %client, "client silent for two heartbeats; dropping its stream connection");
                    break;
                }
                if !send_msg(&tx, &ServerMsg::Hb).await { break }
            }
            () = &mut closed => break,
        }
    }
    for (_, t) in attached.drain().chain(watches.drain()) {
        t.abort();
    }
    drop(tx);
    writer.abort();
    tracing::debug!(client = %client, "stream connection closed");
}

async fn close_bad(tx: Tx, writer: JoinHandle<()>, why: &str) {
    let e = Error::new(ErrorCode::Protocol, why.to_owned());
    let _ = send_msg(&tx, &ServerMsg::Error { id: None, error: e.to_body() }).await;
    drop(tx);
    let _ = writer.await;
}

/// One watch's events, in order, through the connection's queue: a client that lags slows
/// this pump, and the provider's own bounded queue turns what it cannot hold into an
/// `overflow` event.
async fn pump_watch(
    files: Arc<dyn conch_seams::Files>,
    id: String,
    path: std::path::PathBuf,
    recursive: bool,
    tx: Tx,
) {
    let err = |id: &str, e: Error| ServerMsg::Error { id: Some(id.into()), error: e.to_body() };
    let mut watch = match files.watch(&path, recursive).await {
        Ok(w) => w,
        Err(e) => {
            let _ = send_msg(&tx, &err(&id, e)).await;
            return;
        }
    };
    if !send_msg(&tx, &ServerMsg::Watching { id: id.clone() }).await {
        return;
    }
    loop {
        let msg = match watch.next_event().await {
            Ok(Some(event)) => ServerMsg::FileEvent { id: id.clone(), event },
            Ok(None) => {
                let _ = send_msg(&tx, &ServerMsg::WatchEnd { id }).await;
                return;
            }
            Err(e) => {
                let _ = send_msg(&tx, &err(&id, e)).await;
                return;
            }
        };
        if !send_msg(&tx, &msg).await {
            return;
        }
    }
}

/// Where a pump reads from: a process stream or a terminal's retained output.
enum Source<'a> {
    Proc(&'a dyn conch_seams::Process, StreamId),
    Term(&'a super::TermEntry),
}

impl Source<'_> {
    fn read(&self, offset: u64, max: usize) -> Result<StreamRead> {
        match self {
            Source::Proc(p, s) => p.read(*s, offset, max),
            Source::Term(t) => Ok(t.out.read(offset, max)),
        }
    }

    async fn readable(&self, offset: u64) -> Result<()> {
        match self {
            Source::Proc(p, s) => p.readable(*s, offset).await,
            Source::Term(t) => {
                let mut rx = t.progress.subscribe();
                loop {
                    if t.out.total_bytes() > offset || t.out.is_sealed() {
                        return Ok(());
                    }
                    if rx.changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// Bytes `[from, to)` of a complete spill file (the server's own path).
fn read_spill(path: &std::path::Path, from: u64, to: u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(from))?;
    let want = usize::try_from(to - from).unwrap_or(CHUNK).min(CHUNK);
    let mut buf = vec![0; want];
    let mut got = 0;
    while got < want {
        match f.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// Streams one source from `offset` until its EOF. Returns false when the connection is gone.
async fn pump(id: &str, stream: Stream, src: Source<'_>, mut offset: u64, tx: &Tx) -> bool {
    let mut spill: Option<SpillState> = None;
    loop {
        let r = match src.read(offset, CHUNK) {
            Ok(r) => r,
            Err(e) => {
                return send_msg(tx, &ServerMsg::Error { id: Some(id.into()), error: e.to_body() })
                    .await;
            }
        };
        let state = SpillState { spill: r.spill.clone(), evicted: r.spill_evicted };
        if spill.as_ref() != Some(&state) {
            let msg = ServerMsg::Spill { id: id.into(), stream, state: state.clone() };
            if !send_msg(tx, &msg).await {
                return false;
            }
            spill = Some(state);
        }
        if r.lossy {
            // Memory no longer holds `offset`: the complete spill still may.
            let from_spill = r
                .spill
                .as_ref()
                .and_then(|s| read_spill(&s.path, offset, r.start_offset).ok())
                .filter(|b| !b.is_empty());
            if let Some(bytes) = from_spill {
                let next = offset + bytes.len() as u64;
                let frame = proto::encode_data(id, stream, offset, &bytes);
                if tx.send(Message::Binary(frame.into())).await.is_err() {
                    return false;
                }
                offset = next;
                continue;
            }
            let gap = ServerMsg::Gap { id: id.into(), stream, from: offset, to: r.start_offset };
            if !send_msg(tx, &gap).await {
                return false;
            }
        }
        if !r.data.is_empty() {
            let frame = proto::encode_data(id, stream, r.start_offset, &r.data);
            if tx.send(Message::Binary(frame.into())).await.is_err() {
                return false;
            }
            offset = r.next_offset;
            continue;
        }
        offset = r.next_offset;
        if r.sealed {
            return send_msg(tx, &ServerMsg::Eof { id: id.into(), stream, at: offset }).await;
        }
        if let Err(e) = src.readable(offset).await {
            return send_msg(tx, &ServerMsg::Error { id: Some(id.into()), error: e.to_body() })
                .await;
        }
    }
}

/// Everything one attach streams: output, then exit, settlement and the group's end.
async fn pump_entry(e: Arc<Entry>, from: std::collections::BTreeMap<Stream, u64>, tx: Tx) {
    let id = e.id.as_str();
    let at = |s: Stream| from.get(&s).copied().unwrap_or(0);
    let err = |e: Error| ServerMsg::Error { id: Some(id.into()), error: e.to_body() };
    match &e.held {
        Held::Proc(p) => {
            let proc = p.proc.as_ref();
            let streams = async {
                let mut ok = true;
                let pumps = [StreamId::Stdout, StreamId::Stderr]
                    .into_iter()
                    .zip(p.collected)
                    .filter(|(_, c)| *c)
                    .map(|(s, _)| {
                        pump(id, Stream::of(s), Source::Proc(proc, s), at(Stream::of(s)), &tx)
                    });
                for r in futures::future::join_all(pumps).await {
                    ok &= r;
                }
                ok
            };
            let exited = async {
                match proc.wait_exit().await {
                    Ok(status) => send_msg(&tx, &ServerMsg::Exited { id: id.into(), status }).await,
                    Err(e) => send_msg(&tx, &err(e)).await,
                }
            };
            let (streams_ok, exit_ok) = tokio::join!(streams, exited);
            if !(streams_ok && exit_ok) {
                return;
            }
            let settled = match proc.wait().await {
                Ok(status) => {
                    ServerMsg::Settled { id: id.into(), status, leftovers: proc.leftovers() }
                }
                Err(e) => err(e),
            };
            if !send_msg(&tx, &settled).await {
                return;
            }
            let gone = match proc.wait_group_gone().await {
                Ok(()) => ServerMsg::GroupGone { id: id.into() },
                Err(e) => err(e),
            };
            let _ = send_msg(&tx, &gone).await;
        }
        Held::Term(t) => {
            let output = pump(id, Stream::Pty, Source::Term(t), at(Stream::Pty), &tx);
            let exited = async {
                match t.term.wait().await {
                    Ok(status) => send_msg(&tx, &ServerMsg::Exited { id: id.into(), status }).await,
                    Err(e) => send_msg(&tx, &err(e)).await,
                }
            };
            let _ = tokio::join!(output, exited);
        }
    }
}
