//! conch on a container engine: the conch image, built offline from the host's own programs
//! and imported through the Docker Engine API (`bollard`), so the image needs no registry.
//!
//! `rootfs.rs` gathers the image's files, `image.rs` imports and tags them, and
//! `provision.rs` is the `provision-docker` plugin: a container of the image per sandbox.
#![deny(missing_docs)]

pub mod image;
pub mod provision;
pub mod rootfs;

pub use bollard::Docker;

/// Connects to the engine the way the docker CLI does (`DOCKER_HOST`, else the local socket).
///
/// # Errors
/// `connection_failed` when `DOCKER_HOST` cannot be used.
pub fn connect() -> conch_seams::Result<Docker> {
    Docker::connect_with_defaults().map_err(image::engine)
}
