//! E2B's sandbox API, the subset the SDK's `Sandbox` lifecycle uses (`conch e2b --api-key`):
//! `POST /sandboxes` (and `/v2/sandboxes`), `GET /sandboxes` (and `/v2/sandboxes`),
//! `GET`/`DELETE /sandboxes/{id}`, `POST /sandboxes/{id}/timeout` and
//! `POST /sandboxes/{id}/connect` (and `/v2/…/connect`), each checked against `X-API-Key`.
//! Every other path is envd, routed to one sandbox by its `E2b-Sandbox-Id` header, so
//! `E2B_API_URL` and `E2B_SANDBOX_URL` both name this one listener.
//!
//! Steps, and why:
//! - A sandbox is a world of its own: an empty workspace directory (mode 0700) under the
//!   server's sandboxes directory, a runtime built for it by [`Worlds`] (files rooted there,
//!   a sandbox composition's policy rooted there), and an [`Envd`] with its own process
//!   table, its own `envdAccessToken` (checked by that envd on every call, `/health` aside)
//!   and the workspace as the home and default directory of its processes.
//! - The table maps an id to a live sandbox. A kill (a `DELETE`, the timeout, the server's
//!   shutdown) first takes the sandbox out of the table, so no new call reaches it, cancels
//!   the calls in flight (an upload stops, answered as for a gone sandbox), stops every
//!   process tree it started and waits for each, waits for every call to let go, tears its
//!   runtime down and removes its workspace. The teardown runs as a task of its own, so a
//!   client that drops the `DELETE` cannot cut it short; the `DELETE` answers when it is done.
//! - Each sandbox has one deadline task: it sleeps until the end time, which `timeout` and
//!   `connect` may move, and kills the sandbox when it comes.
//! - A call for an unknown sandbox gets what E2B's proxy answers, `502` with a message that
//!   says the sandbox "was not found", which the SDK reads as a sandbox that is gone.
//!
//! Isolation is that of the composition's world. The API keeps each sandbox's process table,
//! files root and token apart. Under a sandbox composition the server's sandboxes directory
//! is a hidden path of every sandbox's policy (the runners cover it, `files-sandbox` refuses
//! it) and holds each command's private `TMPDIR`, so a sandbox's commands and file calls
//! reach no other sandbox's workspace or `TMPDIR` (watches but for the race `files-sandbox`'s
//! guard states). Unconfined (`standard`), a command reaches whatever the server's user can.
//!
//! Limits, stated in docs/e2b.md: no templates (only `base`), pause, resume, snapshots,
//! forks, metrics, logs, volumes, MCP, network rules or auto-pause; a create that asks for
//! one is refused, never ignored.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use conch_nonce::{random_hex, same_secret};
use conch_sync::LockExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Envd, Seams};

/// The only template served: the composition's world.
pub const TEMPLATE: &str = "base";
/// A sandbox's lifetime when `POST /sandboxes` gives none (E2B's API default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest lifetime a `timeout` may ask for (E2B's longest, 24 hours).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The envd version reported: the protocol this front end speaks, so the SDK itself refuses
/// what it does not (file metadata came in 0.6.2).
pub const ENVD_VERSION: &str = "0.6.1";
/// The `clientID` of every sandbox.
const CLIENT_ID: &str = "conch";

/// What a world is built for.
#[derive(Clone, Debug)]
pub struct WorldSpec {
    /// The sandbox's id.
    pub id: String,
    /// Its workspace: an empty directory made for it, removed when it is killed.
    pub workspace: PathBuf,
    /// `allow_internet_access` as asked (`None`: the composition's own setting).
    pub internet: Option<bool>,
}

/// Ends a world: awaited when its sandbox is killed.
pub type Teardown = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// One sandbox's world: the seams its envd serves, and how to end it.
pub struct World {
    /// What its envd is served from (`defaults` are replaced by the sandbox's own).
    pub seams: Seams,
    /// Stops what the world's runtime still holds, after its envd stopped its processes.
    pub teardown: Teardown,
    /// The workspace as the world's commands see it, when that is not the spec's directory
    /// (a container's `/workspace`): their `HOME` and default directory.
    pub inside: Option<PathBuf>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("seams", &self.seams).finish_non_exhaustive()
    }
}

/// Why a world was not built.
#[derive(Debug)]
pub enum WorldError {
    /// The request asked for what this server cannot give (`400`).
    Refused(String),
    /// The server failed (`500`).
    Failed(String),
}

/// Builds the world each new sandbox runs in.
pub trait Worlds: Send + Sync + 'static {
    /// A fresh world for `spec`. Runs on the blocking pool, within the server's runtime.
    ///
    /// # Errors
    /// [`WorldError`]: the request's fault or the server's.
    fn build(&self, spec: &WorldSpec) -> Result<World, WorldError>;
}

/// The sandbox API's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The key every API call carries as `X-API-Key`.
    pub api_key: String,
    /// Where each sandbox's workspace is made (one directory per sandbox).
    pub dir: PathBuf,
    /// How many sandboxes may live at once; past it `POST /sandboxes` answers `429`.
    pub max_sandboxes: usize,
}

/// The sandboxes one server runs.
pub struct Sandboxes {
    settings: Settings,
    worlds: Box<dyn Worlds>,
    table: Mutex<BTreeMap<String, Arc<Sandbox>>>,
    /// Creations under way, counted against `max_sandboxes` with the table.
    creating: Mutex<usize>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for Sandboxes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandboxes").field("dir", &self.settings.dir).finish_non_exhaustive()
    }
}

struct Sandbox {
    id: String,
    token: String,
    metadata: BTreeMap<String, String>,
    internet: Option<bool>,
    started: SystemTime,
    end: watch::Sender<SystemTime>,
    envd: Arc<Envd>,
    router: Router,
    workspace: PathBuf,
    teardown: Mutex<Option<Teardown>>,
    /// Held shared by every envd call in flight, taken whole by the teardown: the workspace
    /// is removed only once no call can still write in it.
    calls: tokio::sync::RwLock<()>,
    /// Cancelled first at a kill: calls in flight (an upload) stop instead of finishing into
    /// a workspace about to go.
    killed: CancellationToken,
}

impl Sandbox {
    fn end(&self) -> SystemTime {
        *self.end.borrow()
    }

    /// `Sandbox` (what create and connect answer).
    fn created(&self) -> Value {
        json!({
            "templateID": TEMPLATE,
            "sandboxID": self.id,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.token,
            "domain": null,
        })
    }

    /// `ListedSandbox`, and with `detail` `SandboxDetail`.
    fn listed(&self, detail: bool) -> Value {
        let mut v = json!({
            "templateID": TEMPLATE,
            "sandboxID": self.id,
            "clientID": CLIENT_ID,
            "startedAt": crate::proto::timestamp(millis(self.started)),
            "endAt": crate::proto::timestamp(millis(self.end())),
            "cpuCount": std::thread::available_parallelism().map_or(1, |n| n.get()),
            // Not limited per sandbox; E2B's schema has no way to say so.
            "memoryMB": 0,
            "diskSizeMB": 0,
            "state": "running",
            "envdVersion": ENVD_VERSION,
            "metadata": self.metadata,
        });
        if detail {
            v["envdAccessToken"] = json!(self.token);
            v["domain"] = Value::Null;
            if let Some(i) = self.internet {
                v["allowInternetAccess"] = json!(i);
            }
        }
        v
    }
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// E2B's API error body: `{"code": status, "message": ...}`.
fn api_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "code": status.as_u16(), "message": message.into() })))
        .into_response()
}

/// A refusal, answered as [`api_error`] answers it.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        api_error(self.0, self.1)
    }
}

fn bad_request(message: impl Into<String>) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, message.into())
}

fn not_found(id: &str) -> Response {
    api_error(StatusCode::NOT_FOUND, format!("sandbox \"{}\" not found", shown(id)))
}

/// A client's text as an answer echoes it: at most 100 characters.
fn shown(text: &str) -> String {
    match text.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

impl Sandboxes {
    /// A server with no sandboxes yet; `worlds` builds each one's world.
    pub fn new(settings: Settings, worlds: Box<dyn Worlds>) -> Arc<Self> {
        Arc::new(Self {
            settings,
            worlds,
            table: Mutex::new(BTreeMap::new()),
            creating: Mutex::new(0),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        })
    }

    /// Kills every sandbox (their processes stopped and awaited, their workspaces removed)
    /// and refuses new ones.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let all: Vec<Arc<Sandbox>> =
            std::mem::take(&mut *self.table.locked()).into_values().collect();
        for s in all {
            self.tear_down(s).await;
        }
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Ends `sandbox`, already out of the table, in a task of its own; waits for it.
    async fn tear_down(&self, sandbox: Arc<Sandbox>) {
        let task = self.tasks.spawn(async move {
            sandbox.killed.cancel();
            sandbox.envd.shutdown().await;
            // Every call in flight has seen the cancellation and let go.
            let _no_calls = sandbox.calls.write().await;
            let teardown = sandbox.teardown.locked().take();
            if let Some(t) = teardown {
                t().await;
            }
            let ws = sandbox.workspace.clone();
            let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&ws)).await;
            match removed {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(id = %sandbox.id, "removing its workspace: {e}"),
                Err(e) => tracing::warn!(id = %sandbox.id, "removing its workspace: {e}"),
            }
            tracing::info!(id = %sandbox.id, "sandbox killed");
        });
        if let Err(e) = task.await {
            tracing::warn!("a sandbox's teardown failed: {e}");
        }
    }

    /// Takes `id` out of the table and ends it; `false` when no such sandbox lives.
    async fn kill(&self, id: &str) -> bool {
        let Some(s) = self.table.locked().remove(id) else { return false };
        self.tear_down(s).await;
        true
    }

    /// The `401` for a request without this server's key as `X-API-Key` (`None`: it has it).
    fn key_refusal(&self, headers: &axum::http::HeaderMap) -> Option<Response> {
        let given = headers.get("x-api-key");
        if given.is_some_and(|g| same_secret(g.as_bytes(), self.settings.api_key.as_bytes())) {
            return None;
        }
        let why = if given.is_some() {
            "Invalid API key"
        } else {
            "this API needs an API key (X-API-Key)"
        };
        Some(api_error(StatusCode::UNAUTHORIZED, why))
    }

    fn find(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.table.locked().get(id).cloned()
    }

    /// Sleeps until `sandbox`'s end (which may move), then kills it if it is still this one.
    fn watch_deadline(self: &Arc<Self>, sandbox: &Arc<Sandbox>) {
        let me = Arc::clone(self);
        let mut end = sandbox.end.subscribe();
        let id = sandbox.id.clone();
        let weak = Arc::downgrade(sandbox);
        self.tasks.spawn(async move {
            loop {
                let at = *end.borrow_and_update();
                let left = at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
                tokio::select! {
                    () = tokio::time::sleep(left) => {
                        if *end.borrow() != at {
                            continue;
                        }
                        let current = me.table.locked().get(&id).cloned();
                        // Killed and perhaps another sandbox under the same id: not ours.
                        if current.is_some_and(|c| weak.upgrade().is_some_and(|w| Arc::ptr_eq(&c, &w))) {
                            tracing::info!(%id, "sandbox past its timeout");
                            me.kill(&id).await;
                        }
                        return;
                    }
                    r = end.changed() => if r.is_err() { return },
                    () = me.stop.cancelled() => return,
                }
            }
        });
    }

    async fn create(self: &Arc<Self>, body: &[u8]) -> Response {
        let req: CreateRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return api_error(StatusCode::BAD_REQUEST, format!("request body: {e}")),
        };
        if let Err(why) = req.refusal() {
            return api_error(StatusCode::BAD_REQUEST, why);
        }
        let lifetime = match lifetime(req.timeout) {
            Ok(t) => t.unwrap_or(DEFAULT_TIMEOUT),
            Err(r) => return r.into_response(),
        };
        {
            let live = self.table.locked().len();
            let mut creating = self.creating.locked();
            if live + *creating >= self.settings.max_sandboxes {
                return api_error(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "this server runs at most {} sandboxes at once; kill one first",
                        self.settings.max_sandboxes
                    ),
                );
            }
            *creating += 1;
        }
        let r = self.make(req, lifetime).await;
        *self.creating.locked() -= 1;
        match r {
            Ok(s) => (StatusCode::CREATED, axum::Json(s.created())).into_response(),
            Err(r) => r,
        }
    }

    async fn make(
        self: &Arc<Self>,
        req: CreateRequest,
        lifetime: Duration,
    ) -> Result<Arc<Sandbox>, Response> {
        let id = format!("i{}", random_hex::<10>());
        let workspace = self.settings.dir.join(&id);
        let spec =
            WorldSpec { id: id.clone(), workspace: workspace.clone(), internet: req.internet };
        let me = Arc::clone(self);
        let built = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(&spec.workspace).map_err(|e| {
                WorldError::Failed(format!("cannot make {}: {e}", spec.workspace.display()))
            })?;
            me.worlds.build(&spec).inspect_err(|_| {
                let _ = std::fs::remove_dir_all(&spec.workspace);
            })
        })
        .await;
        let world = match built {
            Ok(Ok(w)) => w,
            Ok(Err(WorldError::Refused(why))) => {
                return Err(api_error(StatusCode::BAD_REQUEST, why));
            }
            Ok(Err(WorldError::Failed(why))) => {
                tracing::warn!(%id, "building a sandbox: {why}");
                return Err(api_error(StatusCode::INTERNAL_SERVER_ERROR, why));
            }
            Err(e) => return Err(api_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        };
        let inside = world.inside.clone().unwrap_or_else(|| workspace.clone());
        let mut env = vec![("HOME".to_owned(), inside.display().to_string())];
        env.extend(req.env_vars.into_iter().flatten());
        let mut seams = world.seams;
        seams.defaults = crate::ProcessDefaults { cwd: Some(inside), env };
        let token = random_hex::<16>();
        let envd = Envd::new(seams, Some(token.clone()));
        let started = SystemTime::now();
        let sandbox = Arc::new(Sandbox {
            id: id.clone(),
            token,
            metadata: req.metadata.unwrap_or_default(),
            internet: req.internet,
            started,
            end: watch::Sender::new(started + lifetime),
            router: crate::router(Arc::clone(&envd)),
            envd,
            workspace,
            teardown: Mutex::new(Some(world.teardown)),
            calls: tokio::sync::RwLock::new(()),
            killed: CancellationToken::new(),
        });
        {
            let mut t = self.table.locked();
            // Checked under the lock `shutdown` empties the table with.
            if !self.stop.is_cancelled() {
                t.insert(id.clone(), Arc::clone(&sandbox));
                drop(t);
                self.watch_deadline(&sandbox);
                tracing::info!(%id, "sandbox created");
                return Ok(sandbox);
            }
        }
        self.tear_down(sandbox).await;
        Err(api_error(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"))
    }

    fn list(&self, q: &ListQuery) -> Response {
        let wanted = match q.metadata.as_deref().map(parse_metadata_filter).transpose() {
            Ok(w) => w.unwrap_or_default(),
            Err(why) => return api_error(StatusCode::BAD_REQUEST, why),
        };
        if let Some(states) = &q.state {
            for s in states.split(',').filter(|s| !s.is_empty()) {
                if s != "running" && s != "paused" {
                    return api_error(
                        StatusCode::BAD_REQUEST,
                        format!("state {s:?}: expected running or paused"),
                    );
                }
            }
        }
        let running_wanted =
            q.state.as_deref().is_none_or(|s| s.split(',').any(|s| s == "running"));
        let mut all: Vec<Arc<Sandbox>> = self.table.locked().values().cloned().collect();
        all.retain(|s| running_wanted && wanted.iter().all(|(k, v)| s.metadata.get(k) == Some(v)));
        all.sort_by(|a, b| (a.started, &a.id).cmp(&(b.started, &b.id)));
        if q.order.as_deref() == Some("desc") {
            all.reverse();
        }
        if let Some(after) = q.next_token.as_deref().filter(|t| !t.is_empty()) {
            match all.iter().position(|s| s.id == after) {
                Some(i) => drop(all.drain(..=i)),
                None => {
                    return api_error(
                        StatusCode::BAD_REQUEST,
                        "nextToken: no such position (the sandbox it named is gone)",
                    );
                }
            }
        }
        let limit = q.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let next = (all.len() > limit).then(|| all[limit - 1].id.clone());
        all.truncate(limit);
        let body: Vec<Value> = all.iter().map(|s| s.listed(false)).collect();
        let mut r = axum::Json(body).into_response();
        if let Some(n) = next
            && let Ok(v) = n.parse()
        {
            r.headers_mut().insert("x-next-token", v);
        }
        r
    }
}

/// `timeout` in seconds, checked.
fn lifetime(timeout: Option<i64>) -> Result<Option<Duration>, Refusal> {
    match timeout {
        None => Ok(None),
        Some(t) if t < 0 => Err(bad_request("timeout must not be negative")),
        Some(t) => {
            let t = Duration::from_secs(t.unsigned_abs());
            if t > MAX_TIMEOUT {
                return Err(bad_request(format!(
                    "timeout is at most {} seconds",
                    MAX_TIMEOUT.as_secs()
                )));
            }
            Ok(Some(t))
        }
    }
}

/// The `metadata` parameter as E2B's API reads it: unescaped once more as a whole, then
/// split into `key=value` pairs, each unescaped again (the SDK quotes each key and value,
/// then url-encodes the pairs into the parameter).
fn parse_metadata_filter(text: &str) -> Result<Vec<(String, String)>, String> {
    percent_decode(text)?
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("metadata filter {p:?}: expected key=value"))?;
            Ok((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                let byte = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(byte.ok_or_else(|| format!("{s:?}: a bad percent escape"))?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?}: not UTF-8"))
}

/// `NewSandbox` / `NewSandboxV2`, with what is not served kept to be refused.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateRequest {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    internet: Option<bool>,
    auto_pause: Option<bool>,
    auto_resume: Option<Value>,
    mcp: Option<Value>,
    network: Option<Value>,
    iam: Option<Value>,
    volume_mounts: Option<Vec<Value>>,
}

impl CreateRequest {
    fn refusal(&self) -> Result<(), String> {
        if self.template_id != TEMPLATE {
            return Err(format!(
                "template {:?} is not served: conch runs one world per server (template {TEMPLATE:?})",
                self.template_id
            ));
        }
        let unserved = [
            (self.auto_pause == Some(true), "autoPause (pause and resume)"),
            (self.auto_resume.as_ref().is_some_and(|v| !v.is_null()), "autoResume"),
            (self.mcp.as_ref().is_some_and(|v| !v.is_null()), "mcp"),
            (self.network.as_ref().is_some_and(|v| !v.is_null()), "network rules"),
            (self.iam.as_ref().is_some_and(|v| !v.is_null()), "iam"),
            (self.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()), "volumeMounts"),
        ];
        match unserved.iter().find(|(asked, _)| *asked) {
            Some((_, what)) => Err(format!("{what} is not served by conch")),
            None => Ok(()),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    order: Option<String>,
    next_token: Option<String>,
    limit: Option<usize>,
}

#[derive(Deserialize, Default)]
struct TimeoutBody {
    timeout: Option<i64>,
}

/// The API routes behind the key, and envd for every other path, routed by sandbox.
pub fn api_router(sandboxes: Arc<Sandboxes>) -> Router {
    let api = Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(detail).delete(delete))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .layer(middleware::from_fn_with_state(Arc::clone(&sandboxes), api_key));
    api.fallback(to_envd).with_state(sandboxes)
}

async fn api_key(State(s): State<Arc<Sandboxes>>, req: Request, next: Next) -> Response {
    match s.key_refusal(req.headers()) {
        Some(refused) => crate::answer_unread(req, refused).await,
        None => next.run(req).await,
    }
}

async fn create(State(s): State<Arc<Sandboxes>>, body: Bytes) -> Response {
    s.create(&body).await
}

async fn list(
    State(s): State<Arc<Sandboxes>>,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    match q {
        Ok(Query(q)) => s.list(&q),
        Err(e) => api_error(StatusCode::BAD_REQUEST, e.body_text()),
    }
}

async fn detail(State(s): State<Arc<Sandboxes>>, UrlPath(id): UrlPath<String>) -> Response {
    match s.find(&id) {
        Some(sb) => axum::Json(sb.listed(true)).into_response(),
        None => not_found(&id),
    }
}

async fn delete(State(s): State<Arc<Sandboxes>>, UrlPath(id): UrlPath<String>) -> Response {
    if s.kill(&id).await { StatusCode::NO_CONTENT.into_response() } else { not_found(&id) }
}

fn timeout_body(body: &[u8]) -> Result<TimeoutBody, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(TimeoutBody::default());
    }
    serde_json::from_slice(body).map_err(|e| bad_request(format!("request body: {e}")))
}

async fn set_timeout(
    State(s): State<Arc<Sandboxes>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> Response {
    let t = match timeout_body(&body)
        .and_then(|b| lifetime(b.timeout)?.ok_or_else(|| bad_request("timeout is required")))
    {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    match s.find(&id) {
        Some(sb) => {
            sb.end.send_replace(SystemTime::now() + t);
            StatusCode::NO_CONTENT.into_response()
        }
        None => not_found(&id),
    }
}

/// Connects to a running sandbox; a `timeout` only ever extends its life.
async fn connect(
    State(s): State<Arc<Sandboxes>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> Response {
    let t = match timeout_body(&body).and_then(|b| lifetime(b.timeout)) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    match s.find(&id) {
        Some(sb) => {
            if let Some(t) = t {
                let until = SystemTime::now() + t;
                sb.end.send_if_modified(|end| {
                    let later = until > *end;
                    if later {
                        *end = until;
                    }
                    later
                });
            }
            axum::Json(sb.created()).into_response()
        }
        None => not_found(&id),
    }
}

/// The sandbox an envd call is for, or the answer when there is none.
fn route(s: &Sandboxes, req: &Request<Body>) -> Result<Arc<Sandbox>, Box<Response>> {
    let headers = req.headers();
    if headers.get("e2b-sandbox-id").is_some_and(|v| v.to_str().is_err()) {
        return Err(Box::new(api_error(
            StatusCode::BAD_REQUEST,
            "the E2b-Sandbox-Id header is not text",
        )));
    }
    let Some(id) = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()) else {
        let path = req.uri().path();
        let envd =
            ["/process.Process/", "/filesystem.Filesystem/"].iter().any(|p| path.starts_with(p))
                || ["/files", "/health", "/envs", "/init", "/metrics"].contains(&path);
        if !envd {
            // The API's own paths are checked against the key even when not served.
            if let Some(refused) = s.key_refusal(headers) {
                return Err(Box::new(refused));
            }
            let why = format!("{} is not served by conch", shown(path));
            return Err(Box::new(api_error(StatusCode::NOT_FOUND, why)));
        }
        return Err(Box::new(api_error(
            StatusCode::BAD_REQUEST,
            "no E2b-Sandbox-Id header: an envd call names its sandbox (the SDK sends it when \
             E2B_SANDBOX_URL is set)",
        )));
    };
    s.find(id).ok_or_else(|| Box::new(gone(id)))
}

/// What E2B's proxy answers for a sandbox that is not there (the SDK reads it as gone).
fn gone(id: &str) -> Response {
    let mut r = (
        StatusCode::BAD_GATEWAY,
        axum::Json(json!({
            "code": 502,
            "message": format!("The sandbox {} was not found", shown(id)),
            "sandboxId": shown(id),
        })),
    )
        .into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
    r
}

/// An envd call: to the sandbox its `E2b-Sandbox-Id` names, whose envd checks its token.
async fn to_envd(State(s): State<Arc<Sandboxes>>, req: Request<Body>) -> Response {
    let sandbox = match route(&s, &req) {
        Ok(sandbox) => sandbox,
        Err(answer) => return crate::answer_unread(req, *answer).await,
    };
    let _call = sandbox.calls.read().await;
    // Found just before a kill took it out of the table: it is gone all the same.
    if sandbox.killed.is_cancelled() {
        return crate::answer_unread(req, gone(&sandbox.id)).await;
    }
    let mut router = sandbox.router.clone();
    tokio::select! {
        biased;
        // Killed meanwhile: what the call was doing stops here, and it says the sandbox is gone.
        () = sandbox.killed.cancelled() => gone(&sandbox.id),
        r = tower_service::Service::call(&mut router, req) => match r {
            Ok(r) => r,
            Err(never) => match never {},
        },
    }
}

/// Serves the sandbox API and every sandbox's envd on `listener` until `stop` resolves, then
/// kills every sandbox.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    sandboxes: Arc<Sandboxes>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopping = Arc::clone(&sandboxes);
    // Killed before the server drains: a stream follows its process until it ends.
    let stop = async move {
        stop.await;
        stopping.shutdown().await;
    };
    let r = crate::serve_router(listener, api_router(Arc::clone(&sandboxes)), stop).await;
    sandboxes.shutdown().await;
    r
}
