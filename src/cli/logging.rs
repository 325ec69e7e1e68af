//! Log output for every command: `tracing` events and spans on stderr (stdout carries
//! results), filtered by `CONCH_LOG` (an `EnvFilter` directive such as `debug` or
//! `conch_provider_local=debug`; default `warn`, `info` for `conch sandboxd`, and for
//! `conch mcp` `warn,rmcp=error`). A span is
//! written when it closes, with its fields and timings.
//!
//! What is logged is chosen where it is logged: names, ids, pids and codes, never an
//! environment map, a managed `CONCH_*` value or a token.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event, with the current span and the span list.
    Json,
}

/// The variable holding the filter.
pub const VAR: &str = "CONCH_LOG";

/// Installs the process's subscriber. A filter that does not parse falls back to `default`
/// and says so (as the first log line) instead of failing the command.
pub fn init(format: LogFormat, default: &str) {
    let mut bad = None;
    let filter = match std::env::var(VAR) {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
            bad = Some(format!("{VAR}={v:?} is not a valid filter ({e}); using {default:?}"));
            EnvFilter::new(default)
        }),
        _ => EnvFilter::new(default),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_span_events(FmtSpan::CLOSE);
    // Only fails when a subscriber is already installed (a caller of `cli::main` set its
    // own); that one stays.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(true).try_init(),
    };
    if let Some(bad) = bad {
        tracing::warn!("{bad}");
    }
}
