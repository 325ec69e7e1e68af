//! RXP/1, the wire vocabulary shared by `conch sandboxd` (`conch_frontend_sandboxd`) and the
//! `remote-sandbox` client (`conch_provider_remote`). `docs/protocol.md` is the prose
//! description; this crate is the one definition both sides compile against. It holds the
//! serde wire types and their helpers (base64, the binary frame codec, random ids) and no
//! HTTP or WebSocket library, so neither side links the other's.
//!
//! Control calls are HTTP with JSON bodies; bytes travel base64 in JSON and raw in binary
//! WebSocket frames. Every field is sent explicitly (a clean exit says `"code": 0`).
//!
//! JSON control bodies, tagged WebSocket text messages, and binary data frames
//! `[1][stream][id_len][id][offset][bytes]`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine as _;
use conch_seams::{
    CollectedOutput, ErrorBody, ExitStatus, FileStat, ForegroundTarget, Leftover, Probe, Signal,
    SpawnSpec, SpillRef, StreamId, SubprocessCapabilities, TerminalObservation, TerminalSize,
    TerminalSpawnSpec, WatchEvent, WriteSpec,
};
use serde::{Deserialize, Serialize};

/// The protocol name and version; a server speaking another one is refused.
pub const PROTOCOL: &str = "rxp/1";
/// Header that names the client (its lease) on every HTTP request.
pub const CLIENT_HEADER: &str = "x-conch-client";
/// Header with the boot id a client learned from `GET /v1/info`: a daemon with another boot
/// id (it restarted, and every process the client knew is gone) refuses the request with
/// `remote_unavailable` and reason `BOOT_CHANGED` instead of serving it as if nothing
/// happened. Optional: a request without it is not checked.
pub const BOOT_HEADER: &str = "x-conch-boot";

/// Base64 of bytes in JSON.
pub mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes bytes as standard base64.
    ///
    /// # Errors
    /// Never for JSON.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    /// Parses standard base64.
    ///
    /// # Errors
    /// Text that is not base64.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(s).map_err(serde::de::Error::custom)
    }
}

/// Encodes bytes as base64 text.
pub fn encode(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// What a server can do, beyond the subprocess capabilities of the provider it hosts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Capabilities {
    /// The hosted provider's capabilities.
    pub subprocess: SubprocessCapabilities,
    /// Processes are leased to their client and reaped when it goes quiet.
    pub leases: bool,
    /// Stdin writes are addressed by offset (a resent chunk is typed once).
    pub stdin_offsets: bool,
    /// Streams resume from a byte offset after a reconnect.
    pub resume: bool,
    /// The hosted files provider, when the daemon's composition has one (the `/v1/files`
    /// endpoints answer `unsupported` otherwise). Absent from an older daemon's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<FilesInfo>,
}

/// What the daemon's files provider is and can do (`capabilities.files` of `GET /v1/info`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FilesInfo {
    /// The hosted files provider's name (`files-local`, `files-sandbox`).
    pub provider: String,
    /// Watches work (`watch` messages on the WebSocket).
    pub watch: bool,
    /// The directory relative paths are resolved against, on the daemon.
    pub default_dir: PathBuf,
    /// The most bytes one upload chunk (`PUT /v1/files/uploads/{id}`) may carry.
    pub max_chunk_bytes: u64,
}

/// Limits the server enforces and advertises.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Limits {
    /// Largest HTTP request body (bytes); past it the server answers 413.
    pub max_body_bytes: u64,
    /// Largest WebSocket message the server accepts or sends (bytes).
    pub max_frame_bytes: u64,
    /// Live processes and terminals one client may hold.
    pub max_procs: u64,
    /// Output bytes the server retains per stream for replay after a reconnect.
    pub retain_bytes: u64,
    /// A client silent for this long loses its processes (killed as trees).
    pub lease_ms: u64,
    /// How often the server sends heartbeats; a peer silent for two intervals is dead.
    pub heartbeat_ms: u64,
}

/// `GET /v1/info`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Info {
    /// [`PROTOCOL`].
    pub protocol: String,
    /// Changes every time the server starts: a client that sees it change knows that every
    /// process and retained byte it knew of is gone.
    pub boot_id: String,
    /// `conch-sandboxd <version>`.
    pub server: String,
    /// The hosted subprocess provider's name.
    pub provider: String,
    /// What it can do.
    pub capabilities: Capabilities,
    /// What it enforces.
    pub limits: Limits,
}

/// `POST /v1/procs`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StartProc {
    /// Client-chosen id: starting the same id again returns the same process.
    pub id: String,
    /// The spawn.
    pub spec: SpawnSpec,
}

/// `POST /v1/terms`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StartTerm {
    /// Client-chosen id, as for [`StartProc`].
    pub id: String,
    /// The PTY spawn.
    pub spec: TerminalSpawnSpec,
}

/// The answer to a start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Started {
    /// The id.
    pub id: String,
    /// Pid of the direct child in the server's world.
    pub pid: Option<u32>,
    /// False when the id already existed and this is that process.
    pub created: bool,
}

/// `GET /v1/which`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Which {
    /// The resolved path on the server's PATH.
    pub path: Option<String>,
}

/// `POST /v1/procs/{id}/stdin` and `POST /v1/terms/{id}/input`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Input {
    /// Input offset of `data[0]`: bytes below what the server accepted are skipped, so a
    /// resent chunk is written once.
    pub offset: u64,
    /// The bytes.
    #[serde(with = "b64")]
    pub data: Vec<u8>,
    /// Close stdin after the bytes (processes only).
    pub eof: bool,
}

/// The answer to an input write.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Accepted {
    /// Input bytes accepted so far (the offset the next write starts at).
    pub next_offset: u64,
}

/// Where a stream's spill stands, as the server sees it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SpillState {
    /// The complete spill on the server, while there is one.
    pub spill: Option<SpillRef>,
    /// The server evicted a complete spill.
    pub evicted: bool,
}

/// `GET /v1/procs/{id}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcStatus {
    /// The id.
    pub id: String,
    /// The settlement status, once settled.
    pub settled: Option<ExitStatus>,
    /// What was stopped because it outlived the child.
    pub leftovers: Vec<Leftover>,
    /// Summaries of the collected streams.
    pub streams: BTreeMap<String, CollectedOutput>,
}

/// `POST /v1/terms/{id}/observe`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObserveReq {
    /// How much to look at.
    pub probe: Probe,
}

/// `POST /v1/terms/{id}/signal`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SignalReq {
    /// Client-chosen operation number: a resent request with the number of the last one
    /// gets that one's answer instead of a second delivery.
    pub op: u64,
    /// The signal, by name.
    pub signal: Signal,
    /// Which foreground group it may reach.
    pub target: ForegroundTarget,
}

/// `POST /v1/terms/{id}/resize`.
pub type ResizeReq = TerminalSize;

/// `POST /v1/terms/{id}/terminate`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TerminateReq {
    /// Time between TERM and KILL.
    pub grace_ms: u64,
}

/// The server's observation: `delivered_bytes` counts PTY bytes the server took in, which
/// the client compares with what it handed out.
pub type Observation = TerminalObservation;

/// A typed error body, with the HTTP status beside it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorReply {
    /// The error.
    pub error: ErrorBody,
}

/// Stream numbers in binary frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// A process's stdout.
    Stdout,
    /// A process's stderr.
    Stderr,
    /// A terminal's output.
    Pty,
}

impl Stream {
    fn byte(self) -> u8 {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
            Stream::Pty => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Stream::Stdout),
            1 => Some(Stream::Stderr),
            2 => Some(Stream::Pty),
            _ => None,
        }
    }

    /// The collected stream it is, for a process.
    pub fn of(id: StreamId) -> Self {
        match id {
            StreamId::Stdout => Stream::Stdout,
            StreamId::Stderr => Stream::Stderr,
        }
    }

    /// The collected stream it names, for a process stream.
    pub fn stream_id(self) -> Option<StreamId> {
        match self {
            Stream::Stdout => Some(StreamId::Stdout),
            Stream::Stderr => Some(StreamId::Stderr),
            Stream::Pty => None,
        }
    }
}

/// Client → server text messages.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ClientMsg {
    /// First message on a connection.
    Hello {
        /// [`PROTOCOL`].
        protocol: String,
        /// The client's heartbeat interval: the server drops a connection silent for two.
        heartbeat_ms: u64,
    },
    /// Streams a process's or terminal's output from these offsets (missing streams: 0).
    Attach {
        /// The id.
        id: String,
        /// Next offset per stream.
        from: BTreeMap<Stream, u64>,
    },
    /// Stops streaming one id on this connection.
    Detach {
        /// The id.
        id: String,
    },
    /// Heartbeat (also renews the client's lease).
    Hb,
    /// Watches a directory on the daemon's files provider; events arrive as `file_event`
    /// messages with this id, in order, until `watch_end` (or an `error` with this id).
    Watch {
        /// Client-chosen watch id (a watch with this id on this connection is replaced).
        id: String,
        /// The directory.
        path: PathBuf,
        /// Its subdirectories too.
        recursive: bool,
    },
    /// Ends a watch.
    Unwatch {
        /// The watch id.
        id: String,
    },
}

/// Server → client text messages.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ServerMsg {
    /// Answer to `hello`.
    Hello {
        /// The server's boot id.
        boot_id: String,
        /// The server's heartbeat interval.
        heartbeat_ms: u64,
    },
    /// Bytes `[from, to)` of a stream are no longer retained and will never be sent.
    Gap {
        /// The id.
        id: String,
        /// The stream.
        stream: Stream,
        /// First lost offset.
        from: u64,
        /// First offset after the loss.
        to: u64,
    },
    /// The stream ended at `at`; every byte before it was sent.
    Eof {
        /// The id.
        id: String,
        /// The stream.
        stream: Stream,
        /// Its final length.
        at: u64,
    },
    /// The spill state of a stream changed.
    Spill {
        /// The id.
        id: String,
        /// The stream.
        stream: Stream,
        /// The state.
        state: SpillState,
    },
    /// The direct child (or the terminal's leader) exited.
    Exited {
        /// The id.
        id: String,
        /// Its exit code or signal.
        status: ExitStatus,
    },
    /// The process settled: its streams ended (sent after their `eof`s).
    Settled {
        /// The id.
        id: String,
        /// The child's exit code or signal.
        status: ExitStatus,
        /// What was stopped because it outlived the child.
        leftovers: Vec<Leftover>,
    },
    /// The process group is proven gone.
    GroupGone {
        /// The id.
        id: String,
    },
    /// Something about one id (or the connection) failed.
    Error {
        /// The id, when it is about one.
        id: Option<String>,
        /// The error.
        error: ErrorBody,
    },
    /// Sent at the daemon's heartbeat interval, so a client can tell a quiet connection from a
    /// dead one.
    Hb,
    /// The watch is in place: every change after this message is reported.
    Watching {
        /// The watch id.
        id: String,
    },
    /// One event of a watch, in order (`overflow` when events were dropped).
    FileEvent {
        /// The watch id.
        id: String,
        /// What happened.
        event: WatchEvent,
    },
    /// The watch ended (its directory is gone, or the provider shut down); no more events.
    WatchEnd {
        /// The watch id.
        id: String,
    },
}

/// Header of a file or export read's answer: the file's size when it was read (for an
/// export, the archive's size once it is complete; absent before).
pub const SIZE_HEADER: &str = "x-conch-file-size";
/// Header of a file or export read's answer: `true` when the bytes reach the end.
pub const EOF_HEADER: &str = "x-conch-eof";

/// `POST /v1/files/stat`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PathReq {
    /// The path (relative ones are resolved against the provider's default directory).
    pub path: PathBuf,
}

/// `POST /v1/files/read`: the answer is the raw bytes, with [`SIZE_HEADER`] and
/// [`EOF_HEADER`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReadReq {
    /// The file.
    pub path: PathBuf,
    /// The offset of the first byte wanted.
    pub offset: u64,
    /// The most bytes wanted (the provider returns at most 8 MiB).
    pub max_bytes: u64,
}

/// `POST /v1/files/mkdir`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct MkdirReq {
    /// The directory.
    pub path: PathBuf,
    /// Make missing parents (an existing directory is then no error).
    pub parents: bool,
    /// Client-chosen operation id: a resend with the id of an operation the daemon already
    /// ran (or is running) gets that run's answer instead of a second run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
}

/// `POST /v1/files/rename`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RenameReq {
    /// The old path.
    pub from: PathBuf,
    /// The new path.
    pub to: PathBuf,
    /// Replace an existing `to`.
    pub overwrite: bool,
    /// Client-chosen operation id: a resend with the id of an operation the daemon already
    /// ran (or is running) gets that run's answer instead of a second run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
}

/// `POST /v1/files/remove`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoveReq {
    /// The path.
    pub path: PathBuf,
    /// Remove a directory with its content.
    pub recursive: bool,
    /// Client-chosen operation id: a resend with the id of an operation the daemon already
    /// ran (or is running) gets that run's answer instead of a second run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
}

/// What an upload feeds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum UploadKind {
    /// A file write.
    Write {
        /// Where and how.
        spec: WriteSpec,
    },
    /// A tar archive unpacked into a directory.
    Tar {
        /// The directory (made when missing).
        path: PathBuf,
    },
    /// Output a terminal had to cut, kept by the hosted subprocess provider as one of its
    /// spills (`Subprocess::keep_spill`), so a result can name the whole of it in the
    /// daemon's world. Needs no files provider; at most [`MAX_SPILL_UPLOAD`] bytes.
    Spill,
}

/// The most bytes a spill upload ([`UploadKind::Spill`]) may carry: the spill cap of the
/// streams a provider collects (past it a provider keeps no spill anyway).
pub const MAX_SPILL_UPLOAD: u64 = 64 << 20;

/// `POST /v1/files/uploads`: opens an upload (idempotent by id).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct UploadReq {
    /// Client-chosen id: opening an id this client holds answers that upload.
    pub id: String,
    /// What it feeds.
    pub kind: UploadKind,
}

/// Where an upload stands.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct UploadState {
    /// The id.
    pub id: String,
    /// Bytes accepted so far: the offset the next chunk must start at.
    pub next_offset: u64,
    /// False when the id already existed.
    pub created: bool,
}

/// `POST /v1/files/uploads/{id}/finish`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FinishReq {
    /// Every byte the client sent: a finish with fewer accepted is refused (with
    /// `next_offset`), so a lost chunk never finishes a short file.
    pub size: u64,
}

/// The answer to a finish (a repeated finish gets the same answer).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Finished {
    /// The written file's facts (a write).
    pub stat: Option<FileStat>,
    /// How many entries were unpacked (a tar import).
    pub entries: Option<u64>,
    /// Where the spill was kept, on the daemon (a spill upload; `None` there when the
    /// provider keeps no spills).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill: Option<PathBuf>,
}

/// `POST /v1/files/exports`: stages a tar archive of `path` on the daemon (idempotent by id).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExportReq {
    /// Client-chosen id.
    pub id: String,
    /// The tree to archive.
    pub path: PathBuf,
}

/// The answer to an export's start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExportState {
    /// The id.
    pub id: String,
    /// False when the id already existed.
    pub created: bool,
}

/// Binary frame layout: `[kind=1][stream][id_len u16 BE][id][offset u64 BE][bytes…]`.
const DATA_KIND: u8 = 1;

/// Encodes one data frame.
pub fn encode_data(id: &str, stream: Stream, offset: u64, data: &[u8]) -> Vec<u8> {
    let id = id.as_bytes();
    let mut out = Vec::with_capacity(12 + id.len() + data.len());
    out.push(DATA_KIND);
    out.push(stream.byte());
    out.extend_from_slice(&u16::try_from(id.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(&id[..id.len().min(usize::from(u16::MAX))]);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// One decoded data frame.
#[derive(Debug, PartialEq, Eq)]
pub struct DataFrame<'a> {
    /// The id.
    pub id: &'a str,
    /// The stream.
    pub stream: Stream,
    /// Stream offset of `data[0]`.
    pub offset: u64,
    /// The bytes.
    pub data: &'a [u8],
}

/// Decodes a data frame; `None` for anything malformed.
pub fn decode_data(frame: &[u8]) -> Option<DataFrame<'_>> {
    let (&kind, rest) = frame.split_first()?;
    if kind != DATA_KIND {
        return None;
    }
    let (&stream, rest) = rest.split_first()?;
    let stream = Stream::from_byte(stream)?;
    let len = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
    let id = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
    let rest = rest.get(2 + len..)?;
    let offset = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    Some(DataFrame { id, stream, offset, data: &rest[8..] })
}

/// A random 128-bit id in hex (boot ids, client ids).
pub fn random_id() -> String {
    conch_nonce::random_hex::<16>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_frames_round_trip_and_garbage_is_refused() {
        let f = encode_data("p-1", Stream::Stderr, 1 << 40, b"bytes");
        let d = decode_data(&f).unwrap();
        assert_eq!(
            d,
            DataFrame { id: "p-1", stream: Stream::Stderr, offset: 1 << 40, data: b"bytes" }
        );
        for cut in 0..f.len() - 5 {
            assert!(decode_data(&f[..cut]).is_none() || cut >= 15, "cut at {cut}");
        }
        assert!(decode_data(&[2, 0, 0, 0]).is_none());
        assert!(decode_data(&[1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_none());
    }

    #[test]
    fn messages_are_tagged_and_explicit() {
        let m = ServerMsg::Exited { id: "a".into(), status: ExitStatus::code(0) };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({"t": "exited", "id": "a", "status": {"code": 0, "signal": null}})
        );
        let c: ClientMsg =
            serde_json::from_str(r#"{"t":"attach","id":"x","from":{"stdout":5}}"#).unwrap();
        assert_eq!(
            c,
            ClientMsg::Attach { id: "x".into(), from: BTreeMap::from([(Stream::Stdout, 5)]) }
        );
    }

    #[test]
    fn file_messages_are_tagged_as_the_protocol_page_shows() {
        let w = ClientMsg::Watch { id: "w1".into(), path: "/srv".into(), recursive: true };
        assert_eq!(
            serde_json::to_value(&w).unwrap(),
            serde_json::json!({"t": "watch", "id": "w1", "path": "/srv", "recursive": true})
        );
        let e = ServerMsg::FileEvent {
            id: "w1".into(),
            event: WatchEvent::Created { path: "/srv/a".into() },
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"t": "file_event", "id": "w1",
                "event": {"kind": "created", "path": "/srv/a"}})
        );
        let u: UploadReq = serde_json::from_value(serde_json::json!({"id": "u1",
            "kind": {"kind": "tar", "path": "/srv/x"}}))
        .unwrap();
        assert_eq!(u.kind, UploadKind::Tar { path: "/srv/x".into() });
        // An older daemon's info has no `files`: still parsed.
        let c: Capabilities = serde_json::from_value(serde_json::json!({
            "subprocess": SubprocessCapabilities::default(),
            "leases": true, "stdin_offsets": true, "resume": true}))
        .unwrap();
        assert_eq!(c.files, None);
    }
}
