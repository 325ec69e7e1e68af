//! `/execute` through the shell seam and the file endpoints through the files seam, so
//! both obey the composition's sandbox.
//!
//! `execute` follows `subprocess.run`: an argv list runs that program (`exec`, no shell
//! parsing), a string with `shell: true` is a shell command line, and `env` replaces the whole
//! environment. Differences, all stated in `docs/swerex.md`: the shell is bash, not `/bin/sh`;
//! the timeout (none: the cap) is capped by the executor's `max_timeout_ms`, and a command past it is killed
//! with its whole process tree (swe-rex kills only the direct child); output past
//! [`MAX_OUTPUT`] per stream keeps its newest bytes.

use std::path::Path;
use std::sync::Arc;

use conch_seams::{Files, ShellExecRequest, ShellExecutor, WriteMode, WriteSpec};

use crate::error::{Raised, class};
use crate::models::{Command, CommandLine, CommandResponse, ReadFile, WriteFile};
use crate::session::quote;

/// Output bytes kept per stream of one `execute`.
pub(crate) const MAX_OUTPUT: usize = 64 << 20;
/// Largest file `read_file` returns.
pub(crate) const MAX_READ: u64 = 256 << 20;

/// The shell command line for a `Command`, as `subprocess.run` would run it.
fn command_line(c: &Command) -> Option<String> {
    let line = match (&c.command, c.shell) {
        (CommandLine::Text(t), true) => t.clone(),
        // `Popen([cmd, a, b], shell=True)` runs `sh -c cmd a b`; `a` becomes `$0`, which a
        // bash line cannot set, so it is dropped and the rest are `$1`….
        (CommandLine::Argv(v), true) => {
            let (first, rest) = v.split_first()?;
            let args: Vec<String> = rest.iter().skip(1).map(|a| quote(a)).collect();
            if args.is_empty() {
                first.clone()
            } else {
                format!("set -- {}\n{first}", args.join(" "))
            }
        }
        (CommandLine::Argv(v), false) => {
            if v.is_empty() {
                return None;
            }
            format!("exec {}", v.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "))
        }
        // A string without a shell is the program's name, as in `subprocess.run`.
        (CommandLine::Text(t), false) => format!("exec {}", quote(t)),
    };
    Some(match &c.env {
        // `env` replaces the environment: the command starts under `env -i` with exactly it.
        Some(env) => {
            let vars: Vec<String> = env.iter().map(|(k, v)| quote(&format!("{k}={v}"))).collect();
            format!("exec env -i {} bash -c {}", vars.join(" "), quote(&line))
        }
        None => line,
    })
}

pub(crate) async fn execute(
    shell: &Arc<dyn ShellExecutor>,
    c: Command,
) -> Result<CommandResponse, Raised> {
    let Some(line) = command_line(&c) else {
        return Err(Raised::new(class::VALUE, "the command list is empty"));
    };
    // An empty shell line runs nothing and succeeds, as `sh -c ''` does.
    if line.trim().is_empty() {
        return Ok(CommandResponse {
            stdout: String::new(),
            stderr: String::new(),
            exit_code: Some(0),
        });
    }
    let mut req = ShellExecRequest::new(line).with_output_max_bytes(MAX_OUTPUT);
    req.separate_stderr = !c.merge_output_streams;
    req.workdir = c.cwd.as_deref().map(Into::into);
    // No timeout is the executor's cap (`max_timeout_ms`), the longest a call may run.
    req.timeout_ms = Some(match c.timeout {
        Some(t) => ((t.max(0.0) * 1000.0).ceil().min(u64::MAX as f64) as u64).max(1),
        None => u64::MAX,
    });
    let spec = shell.resolve(req)?;
    let ran = shell.run(spec).await?;
    let stdout = ran.output.text;
    let stderr = ran.stderr.map(|e| e.text).unwrap_or_default();
    if ran.timed_out {
        return Err(Raised::new(
            class::TIMEOUT,
            format!(
                "Timeout ({}s) exceeded while running command",
                c.timeout.unwrap_or(ran.timeout_ms as f64 / 1000.0)
            ),
        )
        .with("stdout", stdout)
        .with("stderr", stderr));
    }
    // A signal death is `-N`, as Python's returncode has it.
    let exit_code = ran.status.code.or_else(|| {
        let name = ran.status.signal.as_deref()?;
        nix_signal_number(name).map(|n| -n)
    });
    if c.check && exit_code != Some(0) {
        let shown = match &c.command {
            CommandLine::Text(t) => format!("{t:?}"),
            CommandLine::Argv(v) => format!("{v:?}"),
        };
        let mut msg = format!(
            "Command {shown} failed with exit code {}. Stdout:\n{stdout:?}\nStderr:\n{stderr:?}",
            exit_code.map_or_else(|| "None".into(), |c| c.to_string())
        );
        if !c.error_msg.is_empty() {
            msg = format!("{}: {msg}", c.error_msg);
        }
        return Err(Raised::new(class::NON_ZERO, msg));
    }
    Ok(CommandResponse { stdout, stderr, exit_code })
}

/// The number of a signal named as `ExitStatus::signal` names it (`SIGKILL`).
fn nix_signal_number(name: &str) -> Option<i32> {
    const NAMES: [&str; 15] = [
        "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE",
        "SIGKILL", "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM",
    ];
    NAMES.iter().position(|n| *n == name).and_then(|i| i32::try_from(i + 1).ok())
}

/// `read_file`: the file as text, with Python's universal newlines (`\r\n` and `\r` read
/// as `\n`, as `Path.read_text` does). UTF-8 only; `errors` is `strict` (the default),
/// `replace`, `ignore` or `backslashreplace`.
pub(crate) async fn read_file(files: &Arc<dyn Files>, r: ReadFile) -> Result<String, Raised> {
    if let Some(enc) = r.encoding.as_deref() {
        let e = enc.to_ascii_lowercase().replace('_', "-");
        if !matches!(e.as_str(), "utf-8" | "utf8" | "ascii" | "us-ascii") {
            return Err(Raised::new(
                class::VALUE,
                format!("encoding {enc:?} is not supported (conch reads UTF-8 text)"),
            ));
        }
    }
    let bytes = conch_seams::files::read_all(files.as_ref(), Path::new(&r.path), MAX_READ).await?;
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => match r.errors.as_deref().unwrap_or("strict") {
            "replace" => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            "ignore" => lossy_with(e.as_bytes(), |_| String::new()),
            "backslashreplace" => lossy_with(e.as_bytes(), |b| format!("\\x{b:02x}")),
            _ => {
                return Err(Raised::new(
                    class::VALUE,
                    format!("{:?} is not valid UTF-8: {}", r.path, e.utf8_error()),
                ));
            }
        },
    };
    Ok(text.replace("\r\n", "\n").replace('\r', "\n"))
}

/// `bytes` as text, each invalid byte replaced by `sub(byte)`.
fn lossy_with(mut bytes: &[u8], sub: impl Fn(u8) -> String) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (good, rest) = bytes.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                let bad = e.error_len().unwrap_or(rest.len()).max(1);
                for b in &rest[..bad] {
                    out.push_str(&sub(*b));
                }
                bytes = &rest[bad..];
            }
        }
    }
}

/// `write_file`: replaces the file (parents made), atomically.
pub(crate) async fn write_file(files: &Arc<dyn Files>, w: WriteFile) -> Result<(), Raised> {
    replace_file(files, Path::new(&w.path), w.content.as_bytes()).await
}

/// Replaces `path` with `data`, atomically, making its parents (`write_file`, and `upload`
/// without `unzip`).
pub(crate) async fn replace_file(
    files: &Arc<dyn Files>,
    path: &Path,
    data: &[u8],
) -> Result<(), Raised> {
    let mut spec = WriteSpec::new(path, WriteMode::Truncate).atomic();
    spec.create_parents = true;
    conch_seams::files::write_all(files.as_ref(), spec, data).await?;
    Ok(())
}

/// `upload` with `unzip`: the archive's entries, written as a tar through the files seam's
/// import (which refuses `..`, absolute names and writes through symlinks) into `target`.
/// A zip's symlink entry lands as a file holding its target, as Python's `extractall` does.
/// The tar is made while it is written, a chunk at a time, so memory stays bounded whatever
/// the entries inflate to; past [`MAX_UNZIPPED`] bytes the upload is refused.
pub(crate) async fn unzip_into(
    files: &Arc<dyn Files>,
    target: &Path,
    zip_bytes: axum::body::Bytes,
) -> Result<(), Raised> {
    let mut sink = files.import_tar(target).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let producer = tokio::task::spawn_blocking(move || {
        zip_to_tar(zip_bytes, Chunks { tx, buf: Vec::with_capacity(CHUNK) })
    });
    // A write that fails drops the receiver, which stops the producer at its next chunk.
    while let Some(chunk) = rx.recv().await {
        sink.write(&chunk).await?;
    }
    producer.await.map_err(|e| Raised::new(class::SWEREX, format!("unzip: {e}")))??;
    sink.finish().await?;
    Ok(())
}

/// Uncompressed bytes one `unzip` may write.
pub(crate) const MAX_UNZIPPED: u64 = 16 << 30;
/// The tar is handed over in pieces of this size.
const CHUNK: usize = 256 << 10;

/// A writer that hands full chunks to the async side.
struct Chunks {
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
    buf: Vec<u8>,
}

impl Chunks {
    fn send(&mut self) -> std::io::Result<()> {
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(full)
            .map_err(|_| std::io::Error::other("the upload's writer stopped"))
    }
}

impl std::io::Write for Chunks {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() { Ok(()) } else { self.send() }
    }
}

/// Writes the zip's entries to `out` as a tar archive.
fn zip_to_tar<W: std::io::Write>(zip_bytes: axum::body::Bytes, out: W) -> Result<(), Raised> {
    let bad = |e: &dyn std::fmt::Display| Raised::new(class::VALUE, format!("unzip: {e}"));
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(zip_bytes)).map_err(|e| bad(&e))?;
    let mut out = tar::Builder::new(out);
    let mut total = 0u64;
    for i in 0..archive.len() {
        let entry = archive.by_index(i).map_err(|e| bad(&e))?;
        let name = entry.name().map_err(|e| bad(&e))?.into_owned();
        let mut header = tar::Header::new_gnu();
        let mode = entry.unix_mode().map_or(0o644, |m| m & 0o7777);
        if entry.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(if mode == 0o644 { 0o755 } else { mode });
            header.set_size(0);
            out.append_data(&mut header, &name, std::io::empty()).map_err(|e| bad(&e))?;
            continue;
        }
        let size = entry.size();
        total = total.saturating_add(size);
        if total > MAX_UNZIPPED {
            return Err(Raised::new(
                class::VALUE,
                format!("unzip: the archive inflates past {MAX_UNZIPPED} bytes"),
            ));
        }
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(mode);
        header.set_size(size);
        // The tar layer refuses an entry whose data is not the size its header says.
        out.append_data(&mut header, &name, entry).map_err(|e| bad(&e))?;
    }
    let mut inner = out.into_inner().map_err(|e| bad(&e))?;
    inner.flush().map_err(|e| bad(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(command: CommandLine, shell: bool) -> Command {
        Command {
            command,
            timeout: None,
            shell,
            check: false,
            error_msg: String::new(),
            env: None,
            cwd: None,
            merge_output_streams: false,
        }
    }

    #[test]
    fn commands_are_built_as_subprocess_run_would_run_them() {
        let argv = |v: &[&str]| CommandLine::Argv(v.iter().map(|s| (*s).to_string()).collect());
        assert_eq!(
            command_line(&cmd(argv(&["echo", "-n", "it's"]), false)).unwrap(),
            "exec 'echo' '-n' 'it'\\''s'"
        );
        assert_eq!(
            command_line(&cmd(CommandLine::Text("a b".into()), false)).unwrap(),
            "exec 'a b'"
        );
        assert_eq!(
            command_line(&cmd(CommandLine::Text("echo $x".into()), true)).unwrap(),
            "echo $x"
        );
        assert_eq!(
            command_line(&cmd(argv(&["echo $1", "zero", "one"]), true)).unwrap(),
            "set -- 'one'\necho $1"
        );
        assert!(command_line(&cmd(argv(&[]), false)).is_none());
        let mut c = cmd(CommandLine::Text("env".into()), true);
        c.env = Some([("A".to_string(), "x y".to_string())].into());
        assert_eq!(command_line(&c).unwrap(), "exec env -i 'A=x y' bash -c 'env'");
    }

    #[test]
    fn invalid_bytes_are_replaced_as_python_does() {
        assert_eq!(lossy_with(b"a\xffb", |b| format!("\\x{b:02x}")), "a\\xffb");
        assert_eq!(lossy_with(b"a\xff", |_| String::new()), "a");
    }

    #[test]
    fn a_zip_becomes_a_tar_with_the_same_entries() {
        use std::io::Write;
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default();
        w.add_directory("d/", opts).unwrap();
        w.start_file("d/f.txt", opts).unwrap();
        w.write_all(b"hello").unwrap();
        let bytes = w.finish().unwrap().into_inner();
        let mut tar = Vec::new();
        zip_to_tar(bytes.into(), &mut tar).unwrap();
        let mut a = tar::Archive::new(tar.as_slice());
        let names: Vec<(String, u64)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.header().size().unwrap())
            })
            .collect();
        assert_eq!(names, vec![("d/".into(), 0), ("d/f.txt".into(), 5)]);
        assert!(zip_to_tar(b"not a zip".to_vec().into(), Vec::new()).is_err());
    }
}
