//! The provisioner seam: a sandbox made on an engine for one runtime, handed over as an
//! endpoint and a token, and removed when the runtime is done with it.
//!
//! A provisioner makes the world; it does not run anything in it. What runs there goes
//! through the usual seams over the sandbox's daemon (`remote-provisioned` connects
//! `remote-sandbox`'s client to the endpoint), so tools behave as in every other world.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use async_trait::async_trait;

use crate::Result;

/// What one sandbox is asked for.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SandboxRequest {
    /// Whose it is (an MCP session, a batch run, an E2B sandbox): a label on the sandbox.
    pub owner: String,
    /// Extra labels, as the engine keeps them.
    pub labels: BTreeMap<String, String>,
    /// Environment for the sandbox's daemon and, through it, the defaults of its commands.
    pub env: BTreeMap<String, String>,
}

impl SandboxRequest {
    /// A request for `owner`.
    pub fn new(owner: impl Into<String>) -> Self {
        Self { owner: owner.into(), ..Self::default() }
    }
}

/// A sandbox that answers: where its daemon listens and the token it wants.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Provisioned {
    /// The engine's id for it.
    pub id: String,
    /// The RXP daemon's base URL, `http://HOST:PORT`.
    pub rxp_url: String,
    /// SWE-ReX's API, `http://HOST:PORT`, when the sandbox serves it.
    pub swerex_url: Option<String>,
    /// E2B's envd, `http://HOST:PORT`, when the sandbox serves it.
    pub envd_url: Option<String>,
    /// The bearer token (RXP), key (SWE-ReX) and access token (envd) of this sandbox.
    pub token: String,
    /// Where the sandbox's workspace is, inside it.
    pub workspace: PathBuf,
}

impl Provisioned {
    /// A sandbox `id` whose RXP daemon is at `rxp_url`, wanting `token`.
    pub fn new(
        id: impl Into<String>,
        rxp_url: impl Into<String>,
        token: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            rxp_url: rxp_url.into(),
            swerex_url: None,
            envd_url: None,
            token: token.into(),
            workspace: PathBuf::from("/"),
        }
    }
}

impl fmt::Debug for Provisioned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provisioned")
            .field("id", &self.id)
            .field("rxp_url", &self.rxp_url)
            .field("swerex_url", &self.swerex_url)
            .field("envd_url", &self.envd_url)
            .field("token", &"<redacted>")
            .field("workspace", &self.workspace)
            .finish()
    }
}

/// Makes and removes sandboxes on an engine.
///
/// # Contract
/// - `create` returns only once the sandbox's daemon answers at `rxp_url` (or fails, leaving
///   nothing behind).
/// - A sandbox outlives its maker by a bounded time at most: when the process that made it
///   dies without removing it, the provider or the sandbox itself removes it (say how).
/// - `remove` is idempotent; `shutdown` removes every sandbox this provider made.
#[async_trait]
pub trait Provisioner: Send + Sync + fmt::Debug + 'static {
    /// Provider name for diagnostics.
    fn provider_name(&self) -> &'static str;
    /// Makes a sandbox and waits until it answers.
    ///
    /// # Errors
    /// `connection_failed` (no engine), `not_found` (no image), `timeout` (never answered),
    /// `limit_exceeded` (the provider's cap).
    async fn create(&self, request: SandboxRequest) -> Result<Provisioned>;
    /// Removes the sandbox `id` (stopping whatever runs there); a gone one is no error.
    ///
    /// # Errors
    /// `connection_failed` (no engine).
    async fn remove(&self, id: &str) -> Result<()>;
    /// Removes every sandbox this provider made.
    async fn shutdown(&self);
}
