//! The remote substrate: `conch sandboxd` ([`server`]) hosts a local subprocess provider's
//! world over RXP/1 ([`proto`], `docs/protocol.md`), and the `remote-sandbox` provider
//! ([`client`]) implements the subprocess seam against it, so every consumer above the seam
//! runs unchanged on a remote machine.

pub mod client;
pub mod proto;
pub mod server;
