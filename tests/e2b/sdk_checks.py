"""Drives `conch e2b` with the real `e2b` SDK (pinned in tests/e2b/setup.sh), through its
public API only, sync and async, in the SDK's debug mode (E2B_DEBUG=true and
E2B_SANDBOX_URL, set by the caller).

    python sdk_checks.py SCRATCH_DIR [CHECK...]

Runs every check (or the ones named), prints `ok <name>` after each that passed, and exits
non-zero at the first that failed, with its traceback. SCRATCH_DIR is a directory on the
machine the sandbox's world is in (the test runs both on one host), so a check can tell
from outside whether a process is gone.
"""

import asyncio
import base64
import hashlib
import json
import os
import struct
import sys
import time

import httpx

from e2b import AsyncSandbox, CommandExitException, Sandbox, TimeoutException
from e2b.exceptions import FileNotFoundException, NotFoundException
from e2b.sandbox.commands.command_handle import PtySize

from waits import LIMIT, gone, until  # this script's directory

SCRATCH = sys.argv[1]


def path(*parts):
    return os.path.join(SCRATCH, *parts)


def check_run_streams(sbx):
    r = sbx.commands.run("echo hello; echo oops >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("hello\n", "oops\n", 0), r


def check_exit_code(sbx):
    try:
        sbx.commands.run("echo partial; exit 3")
    except CommandExitException as e:
        assert e.exit_code == 3 and e.stdout == "partial\n", e
    else:
        raise AssertionError("a non-zero exit raises CommandExitException")


def check_envs_and_cwd(sbx):
    os.makedirs(path("cwd"), exist_ok=True)
    r = sbx.commands.run('echo "$FOO"; pwd', envs={"FOO": "bar baz"}, cwd=path("cwd"))
    assert r.stdout == f"bar baz\n{path('cwd')}\n", r


def check_timeout_stops_the_tree(sbx):
    marker = path("timeout.pid")
    started = time.monotonic()
    try:
        # 5 s: time enough for the child to start and name itself on a loaded machine.
        sbx.commands.run(f"sleep 300 & echo $! > {marker}; wait", timeout=5)
    except TimeoutException:
        pass
    except CommandExitException as e:
        # Both ends keep the same deadline: the server's end (the tree stopped) may arrive
        # before the client's own timer fires.
        assert e.exit_code == -1 and "timeout" in (e.error or ""), e
    else:
        raise AssertionError("a command past its timeout does not succeed")
    assert time.monotonic() - started < LIMIT
    with open(marker) as f:
        child = int(f.read())
    until("the timed-out command's background child is stopped", lambda: gone(child))


def check_broken_utf8(sbx):
    r = sbx.commands.run(r"printf 'a\xffb\xe4\xbd\xa0\n'")
    assert r.stdout == "a\ufffdb\u4f60\n", repr(r.stdout)


def check_many_lines_exact(sbx):
    r = sbx.commands.run("seq 1 200000")
    want = "".join(f"{i}\n" for i in range(1, 200001))
    assert r.stdout == want, (len(r.stdout), len(want))


def check_a_slow_reader_loses_nothing(sbx):
    # Far more output than the server keeps in memory, produced while this client reads
    # none of it: the stream reads what fell out of memory back from the spill file.
    h = sbx.commands.run("seq 1 3000000", background=True)
    until("the command has finished", lambda: h.pid not in [p.pid for p in sbx.commands.list()])
    r = h.wait()
    want = "".join(f"{i}\n" for i in range(1, 3000001))
    assert len(r.stdout) == len(want) and r.stdout == want, (len(r.stdout), len(want))


def check_background_kill_leaves_nothing(sbx):
    h = sbx.commands.run("sleep 400 & echo $!; setsid sleep 401 & echo $!; wait", background=True)
    pids = []
    for out, _err, _pty in h:
        if out:
            pids += [int(p) for p in out.split()]
        if len(pids) == 2:
            break
    assert h.kill() is True
    for pid in [h.pid] + pids:
        until(f"pid {pid} is stopped", lambda: gone(pid))
    try:
        h.wait()
    except CommandExitException as e:
        assert e.exit_code != 0, e
    assert h.pid not in [p.pid for p in sbx.commands.list()]


def check_connect_and_stdin(sbx):
    h = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    again = sbx.commands.connect(h.pid)
    sbx.commands.send_stdin(h.pid, "abc\n")
    r = again.wait()
    assert r.stdout == "got:abc\n", r
    assert h.wait().exit_code == 0


def check_close_stdin(sbx):
    h = sbx.commands.run("cat; echo done", background=True, stdin=True)
    h.send_stdin("x\n")
    h.close_stdin()
    r = h.wait()
    assert r.stdout == "x\ndone\n", r


def check_list(sbx):
    h = sbx.commands.run("sleep 200", background=True)
    found = [p for p in sbx.commands.list() if p.pid == h.pid]
    assert len(found) == 1, sbx.commands.list()
    assert found[0].cmd == "/bin/bash" and found[0].args[-1] == "sleep 200", found[0]
    assert sbx.commands.kill(h.pid) is True
    assert sbx.commands.kill(999_999_999) is False


def check_pty(sbx):
    out = bytearray()
    h = sbx.pty.create(PtySize(rows=24, cols=80), cwd=SCRATCH)
    sbx.pty.resize(h.pid, PtySize(rows=33, cols=101))
    sbx.pty.send_stdin(h.pid, b"stty size; echo pty-$((6*7))\n")
    sbx.pty.send_stdin(h.pid, b"exit\n")
    h.wait(on_pty=lambda data: out.extend(data))
    text = out.decode(errors="replace")
    assert "33 101" in text and "pty-42" in text, text
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    assert sbx.pty.kill(h.pid) is True
    until("the killed PTY's shell is gone", lambda: gone(h.pid))


def check_files_roundtrip(sbx):
    info = sbx.files.write(path("dir", "a.txt"), "hello\n")
    assert info.path == path("dir", "a.txt"), info
    assert sbx.files.read(path("dir", "a.txt")) == "hello\n"
    data = bytes(range(256)) * 3
    sbx.files.write(path("dir", "b.bin"), data)
    assert bytes(sbx.files.read(path("dir", "b.bin"), format="bytes")) == data
    big = os.urandom(50 << 20)
    sbx.files.write(path("big.bin"), big)
    back = sbx.files.read(path("big.bin"), format="bytes")
    assert hashlib.sha256(back).digest() == hashlib.sha256(big).digest(), len(back)
    streamed = b"".join(sbx.files.read(path("big.bin"), format="stream"))
    assert streamed == big
    # The raw-body upload, plain and gzip-compressed.
    sbx.files.write(path("raw.txt"), "raw body\n", use_octet_stream=True)
    assert sbx.files.read(path("raw.txt")) == "raw body\n"
    zipped = "compressible line\n" * 100_000
    sbx.files.write(path("gz.txt"), zipped, gzip=True)
    assert sbx.files.read(path("gz.txt")) == zipped
    try:
        sbx.files.read(path("missing.txt"))
    except FileNotFoundException:
        pass
    else:
        raise AssertionError("reading a missing file raises FileNotFoundException")


def check_files_tree(sbx):
    d = path("tree")
    assert sbx.files.make_dir(d) is True
    assert sbx.files.make_dir(d) is False
    sbx.files.write(path("tree", "one.txt"), "1")
    sbx.files.write(path("tree", "sub", "two.txt"), "22")
    assert sbx.files.exists(path("tree", "one.txt"))
    info = sbx.files.get_info(path("tree", "sub", "two.txt"))
    assert info.size == 2 and info.type.value == "file", info
    names = sorted(e.name for e in sbx.files.list(d))
    assert names == ["one.txt", "sub"], names
    deep = sorted(e.path for e in sbx.files.list(d, depth=2))
    assert path("tree", "sub", "two.txt") in deep, deep
    moved = sbx.files.rename(path("tree", "one.txt"), path("tree", "uno.txt"))
    assert moved.path == path("tree", "uno.txt"), moved
    assert not sbx.files.exists(path("tree", "one.txt"))
    sbx.files.remove(d)
    assert not sbx.files.exists(d)


def check_envd_semantics_kept(sbx):
    # Found by a review against envd: each answered differently before.
    sbx.files.remove(path("never-there"))  # envd's RemoveAll: nothing to remove is fine
    info = sbx.files.write(path("dots", "..", "flat.txt"), "x")
    assert info.path == path("flat.txt") and not os.path.exists(path("dots")), info
    assert sbx.files.exists(path("flat.txt", "child")) is False
    h = sbx.commands.run("echo done", background=True)
    assert h.wait().stdout == "done\n"
    assert sbx.commands.kill(h.pid) is False, "a finished command is not found"
    late = sbx.commands.connect(h.pid)  # envd keeps the end for a late connect
    assert late.wait().exit_code == 0
    try:
        sbx.commands.send_stdin(h.pid, "x")
    except NotFoundException:
        pass
    else:
        raise AssertionError("input to a finished command is refused as not found")


def check_watch_sees_the_file_itself_written(sbx):
    d = path("watched-write")
    sbx.files.make_dir(d)
    sbx.files.write(os.path.join(d, "x.txt"), "0")
    h = sbx.files.watch_dir(d)
    sbx.files.write(os.path.join(d, "x.txt"), "1")
    seen = []

    def written():
        seen.extend(h.get_new_events())
        return any(e.name == "x.txt" and e.type.value == "write" for e in seen)

    until("a WRITE of x.txt", written)
    assert all(e.name == "x.txt" for e in seen), [(e.name, e.type) for e in seen]
    h.stop()


def check_evicted_spill_is_an_error_not_a_gap(sbx):
    # Run against a server whose spill limit is far below the output: once the command has
    # finished, its spill is evicted, and a reader that read nothing yet is told so. 79 MB,
    # far more than the socket buffers and the server's queue can hold for the stream.
    h = sbx.commands.run("seq 1 10000000", background=True)
    until("the command has finished", lambda: h.pid not in [p.pid for p in sbx.commands.list()])
    try:
        h.wait()
    except Exception as e:  # the SDK passes data_loss on as a generic exception
        assert "fell" in str(e) and "bytes of stdout behind" in str(e), repr(e)
    else:
        raise AssertionError("a stream behind an evicted spill ended as if complete")


def check_watch_dir(sbx):
    d = path("watched")
    sbx.files.make_dir(d)
    h = sbx.files.watch_dir(d)
    sbx.files.write(path("watched", "new.txt"), "x")
    seen = []

    def arrived():
        seen.extend(h.get_new_events())
        return any(e.name == "new.txt" and e.type.value == "create" for e in seen)

    until("the watch reports the new file", arrived)
    h.stop()


def connect_events(pid, headers):
    """`Connect` to `pid` over raw Connect (JSON codec), yielding each event; conch's own
    header is not something the SDK can send."""
    url = os.environ["E2B_SANDBOX_URL"] + "/process.Process/Connect"
    body = json.dumps({"process": {"pid": pid}}).encode()
    framed = b"\0" + struct.pack(">I", len(body)) + body
    headers = {"Content-Type": "application/connect+json", **headers}
    with httpx.stream("POST", url, content=framed, headers=headers, timeout=LIMIT) as r:
        assert r.status_code == 200, r.status_code
        buf = b""
        for chunk in r.iter_bytes():
            buf += chunk
            while len(buf) >= 5 and len(buf) >= 5 + struct.unpack(">I", buf[1:5])[0]:
                flags, n = buf[0], struct.unpack(">I", buf[1:5])[0]
                message, buf = json.loads(buf[5 : 5 + n]), buf[5 + n :]
                if flags & 2:
                    assert "error" not in message, message
                    return
                yield message["event"]


def check_connect_replay_with_conch_header(sbx):
    h = sbx.commands.run("echo early; sleep 300", background=True)
    for out, _err, _pty in h:
        if out and "early" in out:
            break
    # Asked for, the output still kept comes first.
    for event in connect_events(h.pid, {"X-Conch-Replay": "all"}):
        if "data" in event:
            assert base64.b64decode(event["data"]["stdout"]) == b"early\n", event
            break
    # By default, as envd does, only what comes next: here nothing before the end.
    live = connect_events(h.pid, {})
    assert "start" in next(live)
    assert sbx.commands.kill(h.pid) is True
    rest = list(live)
    assert [e for e in rest if "data" in e] == [], rest
    assert rest[-1]["end"]["exitCode"] == -1 and rest[-1]["end"]["exited"] is False, rest


def check_keepalives_at_the_asked_interval(sbx):
    h = sbx.commands.run("sleep 3; echo late", background=True)
    events = list(connect_events(h.pid, {"Keepalive-Ping-Interval": "1"}))
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end", kinds
    assert "keepalive" in kinds[: kinds.index("data")], kinds


async def async_checks():
    sbx = await AsyncSandbox.create()
    r = await sbx.commands.run("echo async-$((1+1))")
    assert r.stdout == "async-2\n", r
    h = await sbx.commands.run("sleep 300", background=True)
    assert await h.kill() is True
    out = bytearray()
    got = asyncio.Event()

    def on_data(data):
        out.extend(data)
        if b"async-pty-9" in out:
            got.set()

    pty = await sbx.pty.create(PtySize(rows=20, cols=70), on_data=on_data)
    await sbx.pty.send_stdin(pty.pid, b"echo async-pty-$((3*3))\n")
    await asyncio.wait_for(got.wait(), LIMIT)
    await sbx.pty.kill(pty.pid)
    d = path("async-watched")
    await sbx.files.make_dir(d)
    events = asyncio.Queue()
    w = await sbx.files.watch_dir(d, on_event=events.put_nowait)
    await sbx.files.write(os.path.join(d, "f.txt"), "y")
    while True:
        e = await asyncio.wait_for(events.get(), LIMIT)
        if e.name == "f.txt":
            break
    await w.stop()
    assert await sbx.files.read(os.path.join(d, "f.txt")) == "y"


def check_async(_sbx):
    asyncio.run(async_checks())


CHECKS = [
    check_run_streams,
    check_exit_code,
    check_envs_and_cwd,
    check_timeout_stops_the_tree,
    check_broken_utf8,
    check_many_lines_exact,
    check_a_slow_reader_loses_nothing,
    check_background_kill_leaves_nothing,
    check_connect_and_stdin,
    check_close_stdin,
    check_list,
    check_pty,
    check_files_roundtrip,
    check_files_tree,
    check_watch_dir,
    check_envd_semantics_kept,
    check_watch_sees_the_file_itself_written,
    check_connect_replay_with_conch_header,
    check_keepalives_at_the_asked_interval,
    check_async,
]


# Named explicitly only: they need a server set up for them.
ONLY_WHEN_NAMED = [check_evicted_spill_is_an_error_not_a_gap]


def main():
    wanted = sys.argv[2:]
    sbx = Sandbox.create()
    for check in CHECKS + ONLY_WHEN_NAMED:
        if check in ONLY_WHEN_NAMED and check.__name__[len("check_"):] not in wanted:
            continue
        name = check.__name__[len("check_"):]
        if wanted and name not in wanted:
            continue
        check(sbx)
        print(f"ok {name}", flush=True)


if __name__ == "__main__":
    main()
    # Every check passed. The SDK's native HTTP transport (pyqwest) sometimes aborts
    # (SIGABRT, nothing on stderr) while the interpreter tears down after both its sync and
    # async clients were used: 2 of 25 runs under load, never with one check alone. That is
    # the client's exit, not a verdict on conch, so the script ends without that teardown.
    sys.stdout.flush()
    os._exit(0)
