//! The stream connection: one WebSocket per provider carries every attached id's output and
//! events, and is rebuilt transparently when it drops.
//!
//! # Invariants
//! - After every (re)connect the server's `boot_id` is checked first: a different one means
//!   every process this provider knew is gone, and every pending wait fails `BOOT_CHANGED`
//!   (the provider stays failed: its ids name nothing any more).
//! - Each live id is re-attached from its replica's next offsets, so a reconnect loses and
//!   duplicates nothing the server still retains; what it no longer retains arrives as an
//!   explicit gap.
//! - A server silent for two of its heartbeat intervals is treated as gone (dead peer), and
//!   so is one that cannot be reached; after `give_up` of that, every pending wait fails
//!   `remote_unavailable`. Reconnecting goes on with capped exponential backoff, for ids
//!   started later.
//! - Reconnects that are refused (nothing listens) feed the [`Health`] verdict: once the
//!   daemon is known gone, every pending wait fails `REMOTE_GONE` at once, without waiting
//!   for `give_up`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use conch_seams::{Error, ErrorCode, ErrorReason};
use conch_sync::LockExt;

use super::health::{Attempt, Health, REFUSED_RETRY};
use futures::{SinkExt as _, StreamExt as _};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;

use super::files::WatchSlot;
use super::mirror::Mirror;
use conch_provider_remote_proto::{self as proto, ClientMsg, ServerMsg};

/// Ids this provider streams, by id.
pub(crate) type Mirrors = Arc<Mutex<HashMap<String, Weak<Mirror>>>>;

/// Watches of the files provider, by watch id.
pub(crate) type Watches = Arc<Mutex<HashMap<String, Arc<WatchSlot>>>>;

pub(crate) fn lock(m: &Mirrors) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Mirror>>> {
    m.locked()
}

/// What the provider asks of the connection task.
#[derive(Debug)]
pub(crate) enum Cmd {
    /// Start streaming this id (now, if connected; otherwise at the next connect).
    Attach(String),
    /// Stop streaming it.
    Detach(String),
    /// Subscribe this watch (now, if connected; otherwise at the next connect).
    Watch(String),
    /// End it.
    Unwatch(String),
}

/// How the connection task reaches the daemon.
#[derive(Debug, Clone)]
pub(crate) struct Dial {
    pub(crate) ws_url: String,
    pub(crate) token: Option<String>,
    pub(crate) client_id: String,
    pub(crate) boot_id: String,
    pub(crate) base: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) give_up: Duration,
    pub(crate) max_frame: usize,
}

/// The first wait before reconnecting; it doubles up to `reconnect_max_backoff_ms`.
const FIRST_BACKOFF: Duration = Duration::from_millis(25);

/// Why a session ended.
enum End {
    /// Reconnect; the attempt's kind feeds the health verdict.
    Lost(String, Attempt),
    /// Stop for good (provider stopped, or the server is another one now).
    Stop,
}

/// Runs the connection until `stop` is cancelled or the command channel closes.
pub(crate) async fn run(
    dial: Dial,
    mirrors: Mirrors,
    watches: Watches,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    stop: CancellationToken,
    health: Arc<Health>,
) {
    let mut backoff = FIRST_BACKOFF;
    let mut down_since: Option<Instant> = None;
    let mut gave_up = false;
    let mut last_why = String::from("no stream connection yet");
    loop {
        // Pending waits must fail once the daemon has been unreachable for `give_up`, even
        // while an attempt is stuck: a peer that accepts TCP and then says nothing (a hung
        // daemon, a black-holed network) holds an attempt for `connect_timeout`, which may
        // be far longer. So the deadline runs beside the attempt, counted from the loss (or
        // from this attempt, when none succeeded yet), and only while it has not come up.
        let since = *down_since.get_or_insert_with(Instant::now);
        let up = AtomicBool::new(false);
        let mut armed = !gave_up;
        let outcome = {
            let links = Links { mirrors: &mirrors, watches: &watches };
            let attempt = session(&dial, links, &mut cmds, &stop, &health, &mut down_since, &up);
            tokio::pin!(attempt);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    r = &mut attempt => break r,
                    () = tokio::time::sleep_until((since + dial.give_up).into()), if armed => {
                        armed = false;
                        if !up.load(Ordering::SeqCst) {
                            gave_up = true;
                            let why = format!("{last_why}; reconnecting is still under way");
                            tracing::warn!(cause = %why, "sandbox daemon unreachable past give_up_ms; failing pending calls");
                            fail_pending(&dial, &mirrors, &watches, since.elapsed(), &why);
                        }
                    }
                }
            }
        };
        match outcome {
            End::Stop => return,
            End::Lost(why, attempt) => {
                let since = *down_since.get_or_insert_with(Instant::now);
                if let Some(gone) = health.failed(attempt, &why) {
                    // Known gone: again after every attempt, so ids started meanwhile fail too.
                    health.fail_pending(&gone);
                    for w in lock_watches(&watches).values() {
                        w.fail(&gone);
                    }
                } else if since.elapsed() >= dial.give_up {
                    if !gave_up {
                        tracing::warn!(cause = %why, "sandbox daemon unreachable past give_up_ms; failing pending calls");
                    }
                    gave_up = true;
                    // Again after every attempt: ids started meanwhile fail too.
                    fail_pending(&dial, &mirrors, &watches, since.elapsed(), &why);
                } else {
                    gave_up = false;
                    tracing::debug!(cause = %why, "stream connection lost; reconnecting");
                }
                last_why = why;
                // A connection that came up and then dropped starts the backoff over: the
                // doubling is for a daemon that keeps refusing, not for one cut now and then.
                if up.load(Ordering::SeqCst) {
                    backoff = FIRST_BACKOFF;
                }
                // While refusals pile up the verdict is near: retry soon rather than back off.
                let pause = if health.refusing() { backoff.min(REFUSED_RETRY) } else { backoff };
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                backoff = (backoff * 2).min(dial.max_backoff);
                // Commands that arrived while down are covered by the attach-all on connect.
                while let Ok(cmd) = cmds.try_recv() {
                    drop(cmd);
                }
                if cmds.is_closed() {
                    return;
                }
            }
        }
    }
}

/// Fails every pending wait `remote_unavailable` (reconnecting goes on, for ids started
/// later).
fn fail_pending(dial: &Dial, mirrors: &Mirrors, watches: &Watches, down_for: Duration, why: &str) {
    let e = super::http::unavailable(&dial.base, "give_up_ms", dial.give_up, down_for, why);
    for m in live(mirrors) {
        if !m.finished() {
            m.fail(&e);
        }
    }
    for w in lock_watches(watches).values() {
        w.fail(&e);
    }
}

pub(crate) fn lock_watches(
    w: &Watches,
) -> std::sync::MutexGuard<'_, HashMap<String, Arc<WatchSlot>>> {
    w.locked()
}

/// What a session routes messages to.
#[derive(Clone, Copy)]
struct Links<'a> {
    mirrors: &'a Mirrors,
    watches: &'a Watches,
}

fn watch_msg(id: &str, w: &WatchSlot) -> Message {
    let msg = ClientMsg::Watch { id: id.to_owned(), path: w.path.clone(), recursive: w.recursive };
    Message::Text(serde_json::to_string(&msg).unwrap_or_default().into())
}

pub(crate) fn live(mirrors: &Mirrors) -> Vec<Arc<Mirror>> {
    let mut map = lock(mirrors);
    map.retain(|_, w| w.strong_count() > 0);
    map.values().filter_map(Weak::upgrade).collect()
}

fn attach_msg(m: &Mirror) -> Message {
    let msg = ClientMsg::Attach { id: m.id.clone(), from: m.offsets() };
    Message::Text(serde_json::to_string(&msg).unwrap_or_default().into())
}

async fn session(
    dial: &Dial,
    links: Links<'_>,
    cmds: &mut mpsc::UnboundedReceiver<Cmd>,
    stop: &CancellationToken,
    health: &Health,
    down_since: &mut Option<Instant>,
    up: &AtomicBool,
) -> End {
    let mut req = match dial.ws_url.as_str().into_client_request() {
        Ok(r) => r,
        Err(e) => return End::Lost(e.to_string(), Attempt::Failed),
    };
    let Links { mirrors, watches } = links;
    let headers = req.headers_mut();
    if let Some(t) = &dial.token
        && let Ok(v) = format!("Bearer {t}").parse()
    {
        headers.insert("authorization", v);
    }
    if let Ok(v) = dial.client_id.parse() {
        headers.insert(proto::CLIENT_HEADER, v);
    }
    let cfg = WebSocketConfig::default()
        .max_message_size(Some(dial.max_frame))
        .max_frame_size(Some(dial.max_frame));
    let connect = tokio_tungstenite::connect_async_with_config(req, Some(cfg), true);
    let mut ws = match tokio::time::timeout(dial.connect_timeout, connect).await {
        Ok(Ok((ws, _))) => ws,
        Ok(Err(e)) => {
            if let tokio_tungstenite::tungstenite::Error::Http(resp) = &e
                && resp.status() == 401
            {
                // The stream connects only after the info call was accepted: a refusal now
                // is another daemon at the address.
                health.die(&super::http::replaced(&dial.base, "GET /v1/ws"));
                return End::Stop;
            }
            let attempt = match &e {
                tokio_tungstenite::tungstenite::Error::Io(io) if super::health::is_refusal(io) => {
                    Attempt::Refused
                }
                _ => Attempt::Failed,
            };
            return End::Lost(format!("connecting failed: {e}"), attempt);
        }
        Err(_) => {
            return End::Lost("connecting timed out (connect_timeout_ms)".into(), Attempt::Failed);
        }
    };
    // Something answered at the daemon's address: whatever happens next, it is not gone.
    health.reached();
    let hb_ms = u64::try_from(dial.heartbeat.as_millis()).unwrap_or(u64::MAX);
    let hello = ClientMsg::Hello { protocol: proto::PROTOCOL.into(), heartbeat_ms: hb_ms };
    let hello = Message::Text(serde_json::to_string(&hello).unwrap_or_default().into());
    if let Err(e) = ws.send(hello).await {
        return End::Lost(format!("sending hello failed: {e}"), Attempt::Failed);
    }
    let server_hb = match tokio::time::timeout(dial.connect_timeout, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => match serde_json::from_str::<ServerMsg>(&t) {
            Ok(ServerMsg::Hello { boot_id, heartbeat_ms }) => {
                if boot_id != dial.boot_id {
                    let e = Error::new(
                        ErrorCode::RemoteUnavailable,
                        format!(
                            "the sandbox daemon at {} restarted (boot id {boot_id}, was {}): \
                             every process it ran is gone; rebuild the runtime",
                            dial.base, dial.boot_id
                        ),
                    )
                    .with_reason(ErrorReason::BootChanged)
                    .with_provider(super::NAME);
                    tracing::warn!("sandbox daemon restarted; its processes are gone");
                    health.die(&e);
                    return End::Stop;
                }
                Duration::from_millis(heartbeat_ms.max(10))
            }
            Ok(ServerMsg::Error { error, .. }) => {
                health.die(&Error::from_body(error));
                return End::Stop;
            }
            _ => return End::Lost("the daemon did not answer hello".into(), Attempt::Failed),
        },
        _ => return End::Lost("the daemon did not answer hello".into(), Attempt::Failed),
    };
    *down_since = None;
    up.store(true, Ordering::SeqCst);
    for m in live(mirrors) {
        // Only ids the daemon confirmed: one whose start is still in flight is attached by
        // its own `Cmd::Attach` once the start returns.
        if m.is_started()
            && !m.finished()
            && let Err(e) = ws.send(attach_msg(&m)).await
        {
            return End::Lost(format!("attaching failed: {e}"), Attempt::Failed);
        }
    }
    // Watches again: what changed while the connection was down was not seen, which the
    // slot reports as an overflow (rescan) once the daemon confirms it.
    let subscribed: Vec<(String, Arc<WatchSlot>)> =
        lock_watches(watches).iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect();
    // Each watch is subscribed once per connection: a watch made while this connection was
    // being set up is both in the table read above and queued as a `Cmd::Watch`. Sent twice,
    // the daemon would confirm it twice, and a second confirmation reads as a reconnect's
    // (an overflow, dropping the events that follow it until the consumer sees it).
    let mut watching: HashSet<String> = HashSet::new();
    for (id, w) in subscribed {
        if let Err(e) = ws.send(watch_msg(&id, &w)).await {
            return End::Lost(format!("watching failed: {e}"), Attempt::Failed);
        }
        watching.insert(id);
    }
    let mut last_rx = Instant::now();
    let mut tick = tokio::time::interval(dial.heartbeat.min(server_hb));
    let mut last_hb = Instant::now();
    loop {
        tokio::select! {
            m = ws.next() => {
                let m = match m {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => return End::Lost(format!("stream connection failed: {e}"), Attempt::Failed),
                    None => return End::Lost("the daemon closed the stream connection".into(), Attempt::Failed),
                };
                last_rx = Instant::now();
                match m {
                    Message::Binary(b) => {
                        if let Some(f) = proto::decode_data(&b) {
                            let m = lock(mirrors).get(f.id).and_then(Weak::upgrade);
                            if let Some(m) = m {
                                m.data(f.stream, f.offset, f.data);
                            }
                        } else {
                            tracing::warn!("malformed data frame from the daemon; ignored");
                        }
                    }
                    Message::Text(t) => match serde_json::from_str::<ServerMsg>(&t) {
                        Ok(ServerMsg::Hb | ServerMsg::Hello { .. }) => {}
                        Ok(ServerMsg::Error { id: None, error }) => {
                            tracing::warn!(error = %Error::from_body(error), "daemon reported a stream error");
                        }
                        Ok(ServerMsg::Watching { id }) => {
                            if let Some(w) = lock_watches(watches).get(&id) {
                                w.established();
                            }
                        }
                        Ok(ServerMsg::FileEvent { id, event }) => {
                            if let Some(w) = lock_watches(watches).get(&id) {
                                w.push(event);
                            }
                        }
                        Ok(ServerMsg::WatchEnd { id }) => {
                            if let Some(w) = lock_watches(watches).get(&id) {
                                w.end();
                            }
                        }
                        Ok(ServerMsg::Error { id: Some(id), error }) if lock_watches(watches).contains_key(&id) => {
                            if let Some(w) = lock_watches(watches).get(&id) {
                                w.fail(&Error::from_body(error));
                            }
                        }
                        Ok(msg) => {
                            let id = msg_id(&msg).map(str::to_owned);
                            let m = id.and_then(|id| lock(mirrors).get(&id).and_then(Weak::upgrade));
                            if let Some(m) = m {
                                m.message(msg);
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "malformed message from the daemon; ignored"),
                    },
                    Message::Close(_) => {
                        while let Some(Ok(_)) = ws.next().await {}
                        return End::Lost("the daemon closed the stream connection".into(), Attempt::Failed);
                    }
                    Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                }
            }
            cmd = cmds.recv() => {
                let msg = match cmd {
                    None => {
                        let _ = ws.close(None).await;
                        return End::Stop;
                    }
                    Some(Cmd::Attach(id)) => {
                        let m = lock(mirrors).get(&id).and_then(Weak::upgrade);
                        match m {
                            Some(m) => attach_msg(&m),
                            None => continue,
                        }
                    }
                    Some(Cmd::Detach(id)) => {
                        Message::Text(serde_json::to_string(&ClientMsg::Detach { id }).unwrap_or_default().into())
                    }
                    Some(Cmd::Watch(id)) => {
                        let w = lock_watches(watches).get(&id).cloned();
                        match w {
                            Some(w) if watching.insert(id.clone()) => watch_msg(&id, &w),
                            _ => continue,
                        }
                    }
                    Some(Cmd::Unwatch(id)) => {
                        watching.remove(&id);
                        Message::Text(serde_json::to_string(&ClientMsg::Unwatch { id }).unwrap_or_default().into())
                    }
                };
                if let Err(e) = ws.send(msg).await {
                    return End::Lost(format!("sending failed: {e}"), Attempt::Failed);
                }
            }
            _ = tick.tick() => {
                if last_rx.elapsed() > server_hb * 2 {
                    return End::Lost("the daemon sent nothing for two heartbeat intervals".into(), Attempt::Failed);
                }
                if last_hb.elapsed() >= dial.heartbeat / 2 {
                    last_hb = Instant::now();
                    let hb = Message::Text(serde_json::to_string(&ClientMsg::Hb).unwrap_or_default().into());
                    if let Err(e) = ws.send(hb).await {
                        return End::Lost(format!("sending a heartbeat failed: {e}"), Attempt::Failed);
                    }
                }
            }
            () = stop.cancelled() => {
                let _ = ws.close(None).await;
                return End::Stop;
            }
        }
    }
}

fn msg_id(m: &ServerMsg) -> Option<&str> {
    match m {
        ServerMsg::Gap { id, .. }
        | ServerMsg::Eof { id, .. }
        | ServerMsg::Spill { id, .. }
        | ServerMsg::Exited { id, .. }
        | ServerMsg::Settled { id, .. }
        | ServerMsg::GroupGone { id } => Some(id),
        ServerMsg::Error { id, .. } => id.as_deref(),
        ServerMsg::Hello { .. }
        | ServerMsg::Hb
        | ServerMsg::Watching { .. }
        | ServerMsg::FileEvent { .. }
        | ServerMsg::WatchEnd { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts of what a client sends: a peer on 127.0.0.1 that answers the hello and
    /// records everything else until it sees `unwatch` of `last`.
    async fn record_until_unwatch(listener: tokio::net::TcpListener, last: &str) -> Vec<ClientMsg> {
        let (tcp, _) = listener.accept().await.expect("the client connects");
        let mut ws = tokio_tungstenite::accept_async(tcp).await.expect("a WebSocket");
        let mut seen = Vec::new();
        while let Some(Ok(m)) = ws.next().await {
            let Message::Text(t) = m else { continue };
            match serde_json::from_str::<ClientMsg>(&t).expect("an RXP/1 message") {
                ClientMsg::Hello { .. } => {
                    let hello = ServerMsg::Hello { boot_id: "b1".into(), heartbeat_ms: 60_000 };
                    let text = serde_json::to_string(&hello).expect("json");
                    ws.send(Message::Text(text.into())).await.expect("hello sent");
                }
                ClientMsg::Hb => {}
                ClientMsg::Unwatch { id } if id == last => break,
                other => seen.push(other),
            }
        }
        seen
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_made_while_the_connection_starts_is_subscribed_once() {
        // The first use of a client is a watch: the slot is in the table, and its command is
        // queued, before the connection exists. The connection's setup subscribes what the
        // table holds; the queued command must not subscribe it a second time (a second
        // confirmation reads as a reconnect's, and the events after it are dropped).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let peer = tokio::spawn(async move { record_until_unwatch(listener, "sentinel").await });
        let dial = Dial {
            ws_url: format!("ws://{addr}/v1/ws"),
            token: None,
            client_id: "c1".into(),
            boot_id: "b1".into(),
            base: format!("http://{addr}"),
            connect_timeout: Duration::from_secs(30),
            heartbeat: Duration::from_secs(60),
            max_backoff: Duration::from_millis(100),
            give_up: Duration::from_secs(30),
            max_frame: 1 << 20,
        };
        let mirrors = Mirrors::default();
        let watches = Watches::default();
        let slot = Arc::new(WatchSlot::new("/w".into(), false));
        lock_watches(&watches).insert("w1".into(), Arc::clone(&slot));
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Cmd::Watch("w1".into())).expect("queued");
        tx.send(Cmd::Unwatch("sentinel".into())).expect("queued");
        let stop = CancellationToken::new();
        let health = Health::new(dial.base.clone(), Arc::clone(&mirrors));
        let conn = tokio::spawn(run(dial, mirrors, Arc::clone(&watches), rx, stop.clone(), health));
        let seen = peer.await.expect("the peer recorded");
        stop.cancel();
        let _ = conn.await;
        let watches_sent =
            seen.iter().filter(|m| matches!(m, ClientMsg::Watch { id, .. } if id == "w1"));
        assert_eq!(watches_sent.count(), 1, "subscribed once: {seen:?}");
    }
}
