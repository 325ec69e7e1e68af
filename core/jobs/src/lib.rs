//! The `jobs` provider: [`JobRegistry`], a producer-neutral, process-local control plane for
//! background work.
//!
//! A producer (a background shell, a sub-agent, anything with a cancel hook and a `done`
//! future) hands the registry its hooks once it has actually started; the registry owns the
//! id, the status, the exact-owner fence, waiters, completion notices and teardown. It never
//! deletes a record on settlement: records stay visible to `job_list` until the owner is
//! disposed or the registry shuts down, because "a job finished" is a fact the model may ask
//! about later.
//!
//! The registry checks the per-owner cap before the producer runs, and the first settlement wins. A
//! deleted record releases its producer's output (`JobOutput::release`; a spill a result may have
//! named is kept, and only the spill limits evict it). The cancel hook is async: `Jobs::kill`
//! returns once the cancellation was delivered, and one that could not be force-fails the record
//! and is returned as the error.
//!
//! [`RoutingSink`] is the notice-routing policy a front end may give its owner (the CLI does):
//! inject while busy, follow up while idle, within a wake budget.
#![deny(missing_docs)]

mod job;
mod notices;
mod registry;

pub use notices::{DEFAULT_WAKE_BUDGET, NoticeRoute, RoutingSink, TurnGuard};
pub use registry::{DEFAULT_JOB_CAP, JobRegistry, PROVIDER};

use std::sync::Arc;

use conch_registry::{
    BuildContext, PluginEntry, PluginOutput, SeamHandle, SeamId, register_plugin,
};
use serde::Deserialize;

/// `jobs` plugin config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Active jobs one owner may have at once.
    pub cap_per_owner: usize,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self { cap_per_owner: DEFAULT_JOB_CAP }
    }
}

impl conch_registry::PluginConfig for JobsConfig {
    fn validate(&self) -> Result<(), conch_registry::ConfigIssue> {
        if self.cap_per_owner == 0 {
            return Err(conch_registry::ConfigIssue::new("cap_per_owner", "must be at least 1"));
        }
        Ok(())
    }
}

fn build(ctx: &BuildContext<'_>) -> conch_seams::Result<PluginOutput> {
    let config: JobsConfig = ctx.config()?;
    let registry = JobRegistry::new(config.cap_per_owner);
    let for_teardown = Arc::clone(&registry);
    Ok(PluginOutput::seam(SeamHandle::Jobs(registry)).with_teardown(move || {
        Box::pin(async move { conch_seams::Jobs::shutdown(for_teardown.as_ref()).await })
    }))
}

register_plugin!(PluginEntry {
    name: PROVIDER,
    provides: Some(SeamId::Jobs),
    requires: &[],
    description: "the jobs registry: <kind>-N ids, owner fence, cap, notices, teardown",
    build,
});

/// Explicit registration hook so a binary can force this crate to link.
pub fn register() {}

#[cfg(test)]
mod tests;
