//! `conch image build`: the conch image, made offline through the Docker Engine API.
//!
//! Steps, and why:
//! - The root filesystem ([`Rootfs`]) is written to a temporary tar file first, then streamed
//!   to the engine's import (`POST /images/create?fromSrc=-`): nothing is pulled (no registry
//!   need answer) and no Dockerfile runs, so the build needs neither network nor BuildKit.
//! - The image's configuration comes with the import (`changes`): the user (uid 1000), the
//!   working directory `/workspace`, `PATH`, the ports, the health check and the command. The
//!   command is set with `CMD`, not `ENTRYPOINT`, because SWE-ReX's Docker deployment runs its
//!   own command (`/bin/sh -c "swerex-remote --auth-token …"`) in the image.
//! - The command is `conch sandboxd` serving RXP on 7070, SWE-ReX's API on 8000 and envd on
//!   49983 under the `swerex` composition; the token comes from `CONCH_TOKEN` (or
//!   `CONCH_TOKEN_FILE`), so an image never holds one.
//! - The import is tagged `<repo>:<version>`, then `<repo>:latest`.

use std::path::Path;

use bollard::Docker;
use bollard::query_parameters::{CreateImageOptionsBuilder, TagImageOptionsBuilder};
use conch_seams::{Error, ErrorCode, Result};
use futures::StreamExt as _;

use crate::rootfs::{Rootfs, USER_ID};

/// The image's repository name.
pub const REPO: &str = "conch-sandbox";

/// The ports the image's command serves: RXP, SWE-ReX's API, envd.
pub const PORTS: [u16; 3] = [7070, 8000, 49983];

/// What to build.
#[derive(Clone, Debug)]
pub struct BuildSpec<'a> {
    /// The conch binary copied into the image (Linux, the host's libc).
    pub conch: &'a Path,
    /// The repository name (`conch-sandbox`).
    pub repo: &'a str,
    /// The version tag (the binary's version); `latest` is tagged too.
    pub version: &'a str,
}

/// A built image.
#[derive(Clone, Debug)]
pub struct Built {
    /// The engine's image id.
    pub id: String,
    /// The tags it got (`repo:version`, `repo:latest`).
    pub tags: Vec<String>,
    /// Its size as the engine reports it (bytes).
    pub size: u64,
    /// Programs the host lacked, left out of the image.
    pub missing: Vec<&'static str>,
}

/// The import's configuration lines (Dockerfile instructions the engine applies).
pub fn changes() -> Vec<String> {
    let [rxp, swerex, envd] = PORTS;
    vec![
        format!("USER {USER_ID}:{USER_ID}"),
        "WORKDIR /workspace".into(),
        "ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".into(),
        "ENV HOME=/home/conch".into(),
        "ENV LANG=C.UTF-8".into(),
        format!("EXPOSE {rxp} {swerex} {envd}"),
        format!(
            "HEALTHCHECK --interval=2s --timeout=2s --start-period=30s \
             --retries=3 CMD [\"/usr/local/bin/conch\",\"health\",\"http://127.0.0.1:{rxp}/health\",\
             \"http://127.0.0.1:{swerex}/\",\"http://127.0.0.1:{envd}/health\"]"
        ),
        format!(
            "CMD [{}]",
            command(None).iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(",")
        ),
    ]
}

/// The image's command: `conch sandboxd` serving all three protocols under the `swerex`
/// composition, exiting after `idle_exit_ms` without a client when given.
pub fn command(idle_exit_ms: Option<u64>) -> Vec<String> {
    let [rxp, swerex, envd] = PORTS;
    let mut argv: Vec<String> = [
        "/usr/local/bin/conch",
        "--composition",
        "swerex",
        "sandboxd",
        "--listen",
        &format!("0.0.0.0:{rxp}"),
        "--swerex-port",
        &swerex.to_string(),
        "--envd-port",
        &envd.to_string(),
    ]
    .map(str::to_owned)
    .into();
    if let Some(ms) = idle_exit_ms {
        argv.extend(["--idle-exit-ms".to_owned(), ms.to_string()]);
    }
    argv
}

/// Builds the image on `docker`'s engine from the host's programs and `spec.conch`.
///
/// # Errors
/// `io` when the root filesystem cannot be gathered or staged; `connection_failed` when the
/// engine does not answer; `internal` when it refuses the import or the tag.
pub async fn build(docker: &Docker, spec: &BuildSpec<'_>) -> Result<Built> {
    let conch = spec.conch.to_path_buf();
    let (staged, missing) = tokio::task::spawn_blocking(move || -> Result<_> {
        let fs = Rootfs::from_host(&conch)?;
        let mut file = tempfile::tempfile().map_err(|e| Error::io("a temporary file", e))?;
        fs.write_tar(std::io::BufWriter::new(&mut file))?;
        Ok((file, fs.missing().to_vec()))
    })
    .await
    .map_err(|e| Error::internal(format!("gathering the root filesystem: {e}")))??;
    let body = {
        use std::io::Seek as _;
        let mut file = staged;
        file.rewind().map_err(|e| Error::io("the staged root filesystem", e))?;
        let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
        bollard::body_try_stream(stream)
    };
    let options = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(spec.repo)
        .tag(spec.version)
        .changes(changes())
        .build();
    let mut progress = docker.create_image(Some(options), Some(body), None);
    while let Some(step) = progress.next().await {
        let step = step.map_err(engine)?;
        if let Some(e) = step.error_detail.and_then(|d| d.message) {
            return Err(Error::internal(format!("the engine refused the import: {e}")));
        }
    }
    let versioned = format!("{}:{}", spec.repo, spec.version);
    let tag = TagImageOptionsBuilder::new().repo(spec.repo).tag("latest").build();
    docker.tag_image(&versioned, Some(tag)).await.map_err(engine)?;
    let inspect = docker.inspect_image(&versioned).await.map_err(engine)?;
    Ok(Built {
        id: inspect.id.unwrap_or_default(),
        tags: vec![versioned, format!("{}:latest", spec.repo)],
        size: inspect.size.map_or(0, |s| u64::try_from(s).unwrap_or(0)),
        missing,
    })
}

/// An engine error as a seam error: unreachable engines are `connection_failed`.
pub fn engine(e: bollard::errors::Error) -> Error {
    use bollard::errors::Error as E;
    let code = match &e {
        E::DockerResponseServerError { status_code: 404, .. } => ErrorCode::NotFound,
        E::DockerResponseServerError { status_code: 409, .. } => ErrorCode::AlreadyExists,
        E::DockerResponseServerError { .. } => ErrorCode::Internal,
        E::IOError { .. } | E::HyperResponseError { .. } | E::RequestTimeoutError => {
            ErrorCode::ConnectionFailed
        }
        _ => ErrorCode::Internal,
    };
    Error::new(code, format!("the Docker engine: {e}")).with_provider("docker")
}
