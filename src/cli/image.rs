//! `conch image build`: the conch image on the local Docker engine (`conch_provider_docker`),
//! and `conch health`, the image's health check.

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use conch_provider_docker::image::{self, BuildSpec};

/// `conch image`'s subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ImageCommand {
    /// Build `conch-sandbox:<version>` (and `:latest`) offline from this host's shell tools,
    /// their libraries and a conch binary; print the image's id, tags and size.
    Build(BuildArgs),
}

/// `conch image build`'s flags.
#[derive(clap::Args, Debug)]
pub struct BuildArgs {
    /// The conch binary to put in the image (default: this one).
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// The repository name.
    #[arg(long, default_value = image::REPO)]
    pub repo: String,
    /// The version tag (default: this conch's version); `latest` is tagged too.
    #[arg(long)]
    pub tag: Option<String>,
}

/// Runs `conch image …`.
pub async fn run(command: ImageCommand) -> anyhow::Result<()> {
    let ImageCommand::Build(args) = command;
    let conch = match args.binary {
        Some(b) => b,
        None => std::env::current_exe().context("finding this conch binary")?,
    };
    let version = args.tag.unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
    let docker = conch_provider_docker::connect()?;
    let spec = BuildSpec { conch: &conch, repo: &args.repo, version: &version };
    let built = image::build(&docker, &spec).await?;
    println!("{}", built.id);
    for tag in &built.tags {
        println!("tagged {tag}");
    }
    println!("size {} bytes ({:.1} MiB)", built.size, built.size as f64 / f64::from(1 << 20));
    if !built.missing.is_empty() {
        println!("not on this host, so not in the image: {}", built.missing.join(" "));
    }
    Ok(())
}

/// `conch health URL...`: healthy when every URL answers 2xx, or 401 or 403 (a server that
/// wants its key on every path, as SWE-ReX's does, is up).
pub fn health(urls: &[String]) -> anyhow::Result<()> {
    if urls.is_empty() {
        bail!("give at least one http:// URL to check");
    }
    for url in urls {
        let status = get_status(url).with_context(|| format!("checking {url}"))?;
        if !(200..300).contains(&status) && status != 401 && status != 403 {
            bail!("{url} answered {status}");
        }
    }
    Ok(())
}

/// One `GET` over plain HTTP/1.0 with a 2 s budget per step; the status code.
fn get_status(url: &str) -> anyhow::Result<u16> {
    let rest = url.strip_prefix("http://").context("only http:// URLs are checked")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .with_context(|| format!("{authority}: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("{authority} resolves to no address"))?;
    let budget = Duration::from_secs(2);
    let mut conn = TcpStream::connect_timeout(&addr, budget)?;
    conn.set_read_timeout(Some(budget))?;
    conn.set_write_timeout(Some(budget))?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n")?;
    let mut head = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        let n = conn.read(&mut head[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let line = String::from_utf8_lossy(&head[..got]);
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer: {line:?}"))
}
