//! Integration tests: conformance suites per provider, registry/composition resolution, and
//! the model-facing tools over real processes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod compositions;
mod conformance;
mod conformance_command;
mod file_tools;
mod files;
mod isolation;
mod pwsh;
mod reaper;
mod sandbox;
mod sandbox_terminals;

mod remote;
mod sandbox_tools;
mod spills;
mod terminals;
mod tidy;
mod tools;
mod transport;

use std::sync::Arc;

use conch_env::ShellEnv;
use conch_jobs::RoutingSink;
use conch_registry::Runtime;
use conch_seams::{NoticeSink, Owner};

/// Builds a runtime from YAML with a private CONCH_HOME.
pub(crate) fn runtime(yaml: &str) -> Runtime {
    conch::build_runtime_from_yaml("test.yaml", yaml, ShellEnv::new("/tmp/conch-test-home".into()))
        .unwrap_or_else(|e| panic!("composition builds: {e}"))
}

/// The embedded standard composition.
pub(crate) fn standard() -> Runtime {
    runtime(conch::EMBEDDED.iter().find(|(n, _)| *n == "standard").unwrap().1)
}

/// A fresh owner with a collecting sink.
pub(crate) fn owner(session: &str) -> (Arc<Owner>, Arc<RoutingSink>) {
    let sink = Arc::new(RoutingSink::default());
    (Owner::new(session, Arc::clone(&sink) as Arc<dyn NoticeSink>), sink)
}
