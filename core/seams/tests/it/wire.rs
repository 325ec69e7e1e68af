//! Round trips of the wire vocabulary through JSON (the `serde` feature).

use std::time::Duration;

use conch_seams::*;

fn round_trip<T>(v: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let text = serde_json::to_string(v).expect("serializes");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text} deserializes: {e}"))
}

#[test]
fn a_spawn_request_round_trips_without_its_cancel_token() {
    let spec = SpawnSpec::new(vec!["bash".into(), "-c".into(), "echo hi".into()], "/tmp")
        .with_stdin(StdinSpec::bytes(b"input".to_vec()))
        .with_stdout(OutputSpec::Collect { max_bytes: 64_000, spill_cap: 1 << 26 })
        .with_stderr(OutputSpec::MergeIntoStdout)
        .with_grace(Duration::from_millis(1500))
        .with_env("A", Some("1".into()))
        .with_env("B", None)
        .with_after_exit(AfterExit::StopLeftovers { drain: Duration::from_millis(250) });
    let json = serde_json::to_value(&spec).unwrap();
    assert_eq!(json["grace_ms"], 1500);
    assert_eq!(json["after_exit"], serde_json::json!({"mode": "stop_leftovers", "drain_ms": 250}));
    assert_eq!(
        json["stdout"],
        serde_json::json!({"kind": "collect", "max_bytes": 64000, "spill_cap": 67108864})
    );
    assert_eq!(json["env"]["B"], serde_json::Value::Null, "null unsets");
    assert!(json.get("cancel").is_none(), "the cancel token is local to the caller");
    let back: SpawnSpec = round_trip(&spec);
    assert_eq!(back.argv, spec.argv);
    assert_eq!(back.cwd, spec.cwd);
    assert_eq!(back.stdin, spec.stdin);
    assert_eq!(back.stdout, spec.stdout);
    assert_eq!(back.stderr, spec.stderr);
    assert_eq!(back.grace, spec.grace);
    assert_eq!(back.env, spec.env);
    assert_eq!(back.after_exit, spec.after_exit);
    assert!(!back.cancel.is_cancelled());
}

#[test]
fn statuses_reads_and_terminal_specs_round_trip() {
    let exit = ExitStatus::signal("SIGKILL");
    assert_eq!(round_trip(&exit), exit);
    // Every field is explicit on the wire: a clean exit says `"code": 0`.
    assert_eq!(
        serde_json::to_value(ExitStatus::code(0)).unwrap(),
        serde_json::json!({"code": 0, "signal": null})
    );
    let read = StreamRead {
        data: b"abc".to_vec(),
        start_offset: 7,
        next_offset: 10,
        lossy: true,
        spill: Some(SpillRef {
            world: World::Remote { name: "http://10.0.0.2:7070".into() },
            path: "/tmp/conch-spill-x/stream-y".into(),
        }),
        spill_evicted: false,
        sealed: false,
    };
    assert_eq!(round_trip(&read), read);
    let out = CollectedOutput {
        text: "t".into(),
        total_bytes: 9,
        omitted_bytes: 8,
        spill: None,
        spill_evicted: true,
        starts_mid_line: true,
    };
    assert_eq!(round_trip(&out), out);
    assert_eq!(serde_json::to_value(&out).unwrap()["spill_evicted"], true);
    // A peer that predates eviction sends no flag: nothing was evicted.
    let old = serde_json::json!({"text": "t", "total_bytes": 1, "omitted_bytes": 0, "spill": null});
    assert!(!serde_json::from_value::<CollectedOutput>(old).unwrap().spill_evicted);
    let left = Leftover { pid: 42, name: "sleep".into(), held_output: true };
    assert_eq!(round_trip(&left), left);
    let mut t = TerminalSpawnSpec::in_default_dir(vec!["bash".into()]);
    t.size = TerminalSize { rows: 30, cols: 90 };
    t.env.insert("TERM".into(), Some("dumb".into()));
    let back: TerminalSpawnSpec = round_trip(&t);
    assert_eq!((back.argv, back.cwd, back.env, back.size), (t.argv, t.cwd, t.env, t.size));
    let obs = TerminalObservation {
        foreground: Some(12),
        leader_owns_foreground: false,
        stdin: StdinWait::Unavailable,
        delivered_bytes: 9,
        output_pending: true,
        cpu: Some(ForegroundCpu { busy: true, ticks: 31 }),
    };
    assert_eq!(round_trip(&obs), obs);
    // A daemon that predates the CPU sample sends none: nothing is known about it.
    let mut old = serde_json::to_value(obs).unwrap();
    old.as_object_mut().unwrap().remove("cpu");
    assert_eq!(serde_json::from_value::<TerminalObservation>(old).unwrap().cpu, None);
    assert_eq!(serde_json::to_value(Signal::Winch).unwrap(), "SIGWINCH");
    assert_eq!(round_trip(&Signal::Tstp), Signal::Tstp);
    assert!(serde_json::from_str::<Signal>("\"SIGSEGV\"").is_err(), "only sendable signals parse");
    let status = SessionStatus::Exited(ExitStatus::code(7));
    assert_eq!(round_trip(&status), status);
}

#[test]
fn an_error_body_rebuilds_the_error_from_the_wire() {
    let e = Error::new(ErrorCode::NotFound, "no terminal session `pty-9`")
        .with_reason(ErrorReason::NoSession)
        .with_provider("terminals")
        .with_operation("send")
        .with_context("session", "pty-9");
    let json = serde_json::to_value(e.to_body()).unwrap();
    assert_eq!(json["code"], "not_found");
    assert_eq!(json["reason"], "NO_SESSION");
    let back = Error::from_body(serde_json::from_value(json).unwrap());
    assert_eq!(back.code(), ErrorCode::NotFound);
    assert_eq!(back.reason(), Some(ErrorReason::NoSession));
    assert_eq!(back.to_string(), e.to_string());
    assert_eq!(back.provider(), "terminals");
    // A code this build does not know is a typed failure, not a silent default.
    let unknown = serde_json::json!({"code": "brand_new_code", "message": "x"});
    assert!(serde_json::from_value::<ErrorBody>(unknown).is_err());
}

#[test]
fn enforcement_travels_as_the_words_a_reader_sees() {
    let e = Enforcement::new("landlock ABI 7 + seccomp").without_mount_layer("no userns");
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json, serde_json::Value::from(e.to_string()));
    assert!(e.to_string().starts_with("landlock ABI 7 + seccomp; no mount layer (no userns): "));
}
