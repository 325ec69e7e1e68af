//! The terminals service (owner-scoped PTY session registry); see lib docs once implemented.
