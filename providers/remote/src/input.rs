//! Offset-addressed input (a process's stdin, a terminal's keyboard) sent exactly once.
//!
//! # Invariants
//! - Bytes handed to [`Input::send`] go out at the offset that follows every byte sent
//!   before them, and that offset is never reused for other bytes: the daemon skips what it
//!   already accepted below an offset, so reusing one would silently drop the new bytes as a
//!   "resend".
//! - A send runs to its end in a task of its own, even when the caller stops waiting (a
//!   cancelled terminal send, a timed-out tool call): a request the daemon may already have
//!   carried out always gets its answer recorded.
//! - After a send that failed for good (the daemon unreachable past `give_up_ms`), nobody
//!   knows how much of it was accepted: the next send first asks the daemon (an empty
//!   write) and continues from what it says, so the failed bytes are neither resent nor
//!   assumed.

use std::sync::Arc;
use std::time::Duration;

use conch_seams::Result;
use reqwest::Method;
use tokio::sync::Mutex;

use super::Shared;
use conch_provider_remote_proto::{self as proto, Accepted};

#[derive(Debug, Default)]
struct State {
    /// Bytes the daemon accepted so far, as far as this side knows.
    offset: u64,
    /// A send failed after its request may have reached the daemon.
    unsure: bool,
}

/// One input stream of a remote process or terminal.
#[derive(Debug, Clone, Default)]
pub(crate) struct Input {
    state: Arc<Mutex<State>>,
}

impl Input {
    /// Sends `data` (and closes the stream after it when `eof`) to `path`, in order after
    /// every earlier send.
    pub(crate) async fn send(
        &self,
        shared: &Arc<Shared>,
        path: String,
        data: Vec<u8>,
        eof: bool,
    ) -> Result<()> {
        let mut state = Arc::clone(&self.state).lock_owned().await;
        let shared = Arc::clone(shared);
        let task = tokio::spawn(async move {
            let call = |offset: u64, data: Vec<u8>, eof: bool| {
                let body = proto::Input { offset, data, eof };
                let (shared, path) = (Arc::clone(&shared), path.clone());
                async move {
                    shared
                        .http
                        .call::<Accepted>(Method::POST, &path, Some(&body), Duration::ZERO)
                        .await
                }
            };
            if state.unsure {
                // An empty write at offset 0 is always in range and writes nothing: its
                // answer is what the daemon accepted.
                state.offset = call(0, Vec::new(), false).await?.next_offset;
                state.unsure = false;
            }
            match call(state.offset, data, eof).await {
                Ok(a) => {
                    state.offset = a.next_offset;
                    Ok(())
                }
                Err(e) => {
                    state.unsure = true;
                    Err(e)
                }
            }
        });
        task.await.map_err(|e| conch_seams::Error::internal(format!("input task failed: {e}")))?
    }
}
