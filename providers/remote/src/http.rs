//! Control calls: JSON over HTTP with typed errors, retried while the server is unreachable.
//!
//! Every RXP/1 call is safe to repeat (ids are client-chosen, stdin and signals carry
//! offsets and operation numbers), so a call that fails in transport, or that a proxy or a
//! busy server answers with 429/502/503/504 and no typed body, is sent again with
//! exponential backoff until `give_up` has passed; then it fails as `remote_unavailable`.
//! A daemon known to be gone ([`Health`]) fails a call at once instead, and so does one that
//! was replaced (another boot id).
//!
//! Calls are retried until a give-up deadline and report every attempt to the shared verdict on the
//! daemon (`health.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use conch_seams::{Error, ErrorCode, ErrorReason, Result};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::health::{Attempt, Health, REFUSED_RETRY, is_refusal};
use conch_provider_remote_proto::{BOOT_HEADER, CLIENT_HEADER, ErrorReply};

/// Everything a control call needs.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    pub(crate) client: reqwest::Client,
    pub(crate) base: String,
    pub(crate) token: Option<String>,
    pub(crate) client_id: String,
    /// The daemon's boot id once known: sent with every call, so a restarted daemon refuses
    /// instead of serving calls about processes it never had.
    pub(crate) boot_id: Option<String>,
    pub(crate) give_up: Duration,
    /// The setting `give_up` comes from, for messages (`give_up_ms`, or
    /// `connect_timeout_ms` for the build-time call).
    pub(crate) give_up_setting: &'static str,
    pub(crate) max_backoff: Duration,
    /// The shared verdict on the daemon: every attempt reports to it.
    pub(crate) health: Arc<Health>,
}

/// First retry delay; doubles up to the configured maximum.
const FIRST_BACKOFF: Duration = Duration::from_millis(25);

impl Http {
    /// Calls `method path` with an optional JSON body. `extra` lengthens the per-attempt
    /// timeout for calls that legitimately take long (a teardown's grace).
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
        extra: Duration,
    ) -> Result<T> {
        let body = match body {
            Some(b) => Some((
                Bytes::from(serde_json::to_vec(b).map_err(|e| {
                    Error::internal(format!("encoding a request body failed: {e}"))
                })?),
                "application/json",
            )),
            None => None,
        };
        let endpoint = endpoint_of(&method, path);
        let raw = self.exchange(method, path, body, extra).await?;
        serde_json::from_slice(&raw.bytes).map_err(|e| {
            Error::new(
                ErrorCode::Protocol,
                format!("the daemon's answer to {endpoint} is not what RXP/1 defines: {e}"),
            )
            .with_provider(super::NAME)
        })
    }

    /// Calls `method path` with an optional body of the given content type and returns the
    /// successful answer's headers and bytes (the file endpoints' raw ranges and chunks);
    /// retried, and its errors typed, as [`Http::call`].
    pub(crate) async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
        extra: Duration,
    ) -> Result<Raw> {
        if let Some(dead) = self.health.dead() {
            return Err(dead);
        }
        let started = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        let url = format!("{}{path}", self.base);
        let endpoint = endpoint_of(&method, path);
        // The last refusal the daemon itself gave (a 503, say): when the final try is cut by
        // the deadline instead, the error still says what the daemon last answered.
        let mut last_answer: Option<String> = None;
        loop {
            // Subscribed before the attempt, so a verdict reached meanwhile is not missed.
            let verdict = self.health.changed();
            tokio::pin!(verdict);
            // Each try gets what is left of the give-up deadline, not a whole one: a daemon
            // that starts hanging late in the retries stretched a call to almost twice
            // give_up_ms (found by `a_daemon_that_hangs_late_in_the_retries_...` in
            // tests/it/remote/client_errors.rs). The check below leaves at least one backoff.
            let left = self.give_up.saturating_sub(started.elapsed());
            let mut req = self
                .client
                .request(method.clone(), &url)
                .header(CLIENT_HEADER, &self.client_id)
                .timeout(left + extra);
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            if let Some(b) = &self.boot_id {
                req = req.header(BOOT_HEADER, b);
            }
            if let Some((b, content_type)) = &body {
                req = req.header(reqwest::header::CONTENT_TYPE, *content_type).body(b.clone());
            }
            let sent = tokio::select! {
                r = req.send() => r,
                () = &mut verdict => match self.health.verdict() {
                    Some(e) => return Err(e),
                    None => continue,
                },
            };
            let why = match sent {
                Ok(resp) => {
                    self.health.reached();
                    match self.answer(resp, &endpoint).await {
                        Answer::Done(r) => {
                            if let Err(e) = &r {
                                self.health.answered_with(e);
                            }
                            return r;
                        }
                        Answer::Retry(why) => {
                            last_answer = Some(why.clone());
                            why
                        }
                    }
                }
                Err(e) => {
                    let why = without_url(&e);
                    let attempt = if e.is_connect() && is_refusal(&e) {
                        Attempt::Refused
                    } else {
                        Attempt::Failed
                    };
                    if let Some(gone) = self.health.failed(attempt, &why) {
                        return Err(gone);
                    }
                    why
                }
            };
            // While refusals pile up the verdict is near: retry soon rather than back off.
            let pause = if self.health.refusing() { backoff.min(REFUSED_RETRY) } else { backoff };
            if started.elapsed() + pause > self.give_up {
                let why = match &last_answer {
                    Some(answer) if *answer != why => {
                        format!("{why} (the daemon's last answer before it: {answer})")
                    }
                    _ => why,
                };
                return Err(unavailable(
                    &self.base,
                    self.give_up_setting,
                    self.give_up,
                    started.elapsed(),
                    &why,
                ));
            }
            tracing::debug!(endpoint = %endpoint, cause = %why, "retrying a control call");
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = &mut verdict => {
                    if let Some(e) = self.health.verdict() {
                        return Err(e);
                    }
                }
            }
            backoff = (backoff * 2).min(self.max_backoff);
        }
    }

    async fn answer(&self, resp: reqwest::Response, endpoint: &str) -> Answer<Raw> {
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                return Answer::Retry(format!("reading the answer failed: {}", without_url(&e)));
            }
        };
        if status.is_success() {
            return Answer::Done(Ok(Raw { headers, bytes }));
        }
        if let Ok(reply) = serde_json::from_slice::<ErrorReply>(&bytes) {
            if reply.error.code == ErrorCode::Unauthenticated {
                // The daemon's words name its own flag; the client's say which setting here
                // holds the token.
                let why = reply.error.message.split(';').next().unwrap_or_default().to_owned();
                let e = if self.boot_id.is_some() {
                    replaced(&self.base, endpoint)
                } else {
                    unauthenticated(endpoint)
                };
                return Answer::Done(Err(e.with_context("daemon", why)));
            }
            return Answer::Done(Err(Error::from_body(reply.error)));
        }
        match status {
            StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => {
                Answer::Retry(format!("HTTP {status} from {endpoint}"))
            }
            StatusCode::UNAUTHORIZED if self.boot_id.is_some() => {
                Answer::Done(Err(replaced(&self.base, endpoint)))
            }
            StatusCode::UNAUTHORIZED => Answer::Done(Err(unauthenticated(endpoint))),
            _ => Answer::Done(Err(Error::new(
                ErrorCode::Protocol,
                format!("{endpoint} answered HTTP {status} without an RXP/1 error body"),
            )
            .with_provider(super::NAME))),
        }
    }
}

/// A successful answer: its headers and body.
#[derive(Debug)]
pub(crate) struct Raw {
    pub(crate) headers: reqwest::header::HeaderMap,
    pub(crate) bytes: Bytes,
}

fn endpoint_of(method: &Method, path: &str) -> String {
    format!("{method} {}", path.split('?').next().unwrap_or(path))
}

enum Answer<T> {
    Done(Result<T>),
    Retry(String),
}

/// A reqwest error's text without the URL (which may carry query values; the message
/// names the daemon already).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(&format!(" for url ({url})"), "").replace(url.as_str(), "the daemon");
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// The error of a daemon that stayed unreachable: `setting` names the limit (`give_up`),
/// `tried` is how long the attempts took (the last retry would have passed the limit).
pub(crate) fn unavailable(
    base: &str,
    setting: &str,
    limit: Duration,
    tried: Duration,
    why: &str,
) -> Error {
    Error::new(
        ErrorCode::RemoteUnavailable,
        format!(
            "the sandbox daemon at {base} did not answer within {setting} ({} ms; gave up \
             after {} ms, as the next retry would have passed it); last cause: {why}",
            limit.as_millis(),
            tried.as_millis()
        ),
    )
    .with_provider(super::NAME)
}

/// A token refused after it was accepted: a running daemon's token never changes, so the
/// daemon at this address is another one (the address was given to a new container, say) or
/// this one restarted with another token. Either way the client's work there is gone.
pub(crate) fn replaced(base: &str, endpoint: &str) -> Error {
    Error::new(
        ErrorCode::RemoteUnavailable,
        format!(
            "the sandbox daemon at {base} refused this client's token on {endpoint}, which it \
             accepted before: another daemon answers there now (the address was reused, or the \
             daemon restarted with another token), so the processes this client ran cannot be \
             reached; rebuild the runtime"
        ),
    )
    .with_reason(ErrorReason::RemoteGone)
    .with_provider(super::NAME)
}

pub(crate) fn unauthenticated(endpoint: &str) -> Error {
    Error::new(
        ErrorCode::Unauthenticated,
        format!(
            "the sandbox daemon refused {endpoint}: wrong or missing token; set `token_file` \
             (or CONCH_PLUGINS__REMOTE_SANDBOX__TOKEN) to the daemon's --token-file contents"
        ),
    )
    .with_provider(super::NAME)
}
