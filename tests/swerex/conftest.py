"""conch's conftest for running SWE-ReX's own server tests against any server command.

SWE-ReX (swe-rex 1.4.0 on PyPI) ships tests/test_execution.py, tests/test_server.py and
tests/test_remote_deployment.py in its sdist, but not the tests/conftest.py they import.
This file is conch's own stand-in for it, written from what those modules use:

- ``RemoteServer`` (``.port``, ``.headers``), ``TEST_API_KEY``;
- ``_Action`` (= ``swerex.runtime.abstract.BashAction``), ``_Command`` (= ``Command``);
- fixtures ``remote_server``, ``remote_runtime`` and ``runtime_with_default_session``.

The server is whatever the environment variable ``SWEREX_SERVER`` names: a JSON list of
strings, the argv of the server, in which ``{port}`` and ``{token}`` are replaced by a free
loopback port and by ``TEST_API_KEY``.  For example::

    SWEREX_SERVER='["conch","swerex-remote","--host","127.0.0.1","--port","{port}","--auth-token","{token}"]'

One server serves the whole pytest session.  It counts as ready once ``GET /is_alive`` with
the key answers 200; it must keep serving after ``POST /close`` (test_remote_deployment calls
it through ``RemoteDeployment.stop()``).  At the end it gets SIGTERM, then SIGKILL after 10 s.

Optional environment:

- ``SWEREX_SERVER_HOME_INHERIT=1``: give the server the caller's ``HOME``.  By default the
  server runs with ``HOME`` set to an empty scratch directory, so that the caller's
  ``~/.bashrc`` (which interactive bash sessions read) cannot change what the tests see.
- ``SWEREX_SERVER_TERM``: the ``TERM`` the server gets.  By default it gets none, as
  swerex-remote has inside the containers SWE-ReX starts it in.  This matters: with a
  terminal type such as ``xterm``, bash 5.2's readline turns on bracketed paste, and swe-rex's
  own server then returns stray ``\r\n`` around session output (15 of the tests fail).
- ``SWEREX_SERVER_START_TIMEOUT``: seconds to wait for readiness (default 60).

tests/swerex/run.sh assembles SWE-ReX's test modules with this file and runs pytest.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from swerex.exceptions import SessionDoesNotExistError, SessionExistsError
from swerex.runtime.abstract import (
    BashAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
)
from swerex.runtime.remote import RemoteRuntime

__all__ = [
    "TEST_API_KEY",
    "RemoteServer",
    "_Action",
    "_Command",
    "remote_runtime",
    "remote_server",
    "runtime_with_default_session",
]

TEST_API_KEY = "conch-swerex-suite-key"
"""The key the server is started with (``{token}``) and the tests authenticate with."""

_Action = BashAction
_Command = Command

_ENV_SERVER = "SWEREX_SERVER"
_HOST = "127.0.0.1"
_START_TIMEOUT_S = float(os.environ.get("SWEREX_SERVER_START_TIMEOUT", "60"))
_POLL_INTERVAL_S = 0.1
_TERM_GRACE_S = 10.0
_LOG_TAIL_CHARS = 4000

# Where the last server's logs are, for the terminal summary.
_server_logs: list[Path] = []


@dataclass
class RemoteServer:
    """A running server: its port and the headers that authenticate to it."""

    port: int
    token: str = TEST_API_KEY
    argv: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = field(default=None, repr=False)
    stdout_path: Path | None = None
    stderr_path: Path | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.token}

    @property
    def url(self) -> str:
        return f"http://{_HOST}:{self.port}"


def _server_template() -> list[str]:
    raw = os.environ.get(_ENV_SERVER)
    if not raw:
        msg = (
            f"{_ENV_SERVER} is not set: it must be a JSON list of strings, the server's argv, "
            'with {port} and {token} placeholders, e.g. \'["swerex-remote","--host","127.0.0.1",'
            '"--port","{port}","--auth-token","{token}"]\''
        )
        raise pytest.UsageError(msg)
    try:
        argv = json.loads(raw)
    except json.JSONDecodeError as e:
        msg = f"{_ENV_SERVER} is not valid JSON ({e}): {raw!r}"
        raise pytest.UsageError(msg) from None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        msg = f"{_ENV_SERVER} must be a non-empty JSON list of strings, got {raw!r}"
        raise pytest.UsageError(msg)
    if not any("{port}" in a for a in argv):
        msg = f"{_ENV_SERVER} has no {{port}} placeholder, so the server's port is unknown: {raw!r}"
        raise pytest.UsageError(msg)
    return argv


def pytest_configure(config: pytest.Config) -> None:
    # Fail once, up front, on a missing or malformed server template.
    _server_template()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if _server_logs:
        terminalreporter.write_line("server logs: " + " ".join(str(p) for p in _server_logs))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return s.getsockname()[1]


def _tail(path: Path | None) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="backslashreplace")
    if len(text) > _LOG_TAIL_CHARS:
        text = "[...]\n" + text[-_LOG_TAIL_CHARS:]
    return text


def _describe(server: RemoteServer) -> str:
    return (
        f"argv: {server.argv}\n"
        f"--- server stderr ({server.stderr_path}) ---\n{_tail(server.stderr_path)}"
        f"--- server stdout ({server.stdout_path}) ---\n{_tail(server.stdout_path)}"
    )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after the grace period; always reaps the process."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=_TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        proc.wait()


def _wait_ready(server: RemoteServer) -> None:
    """Poll GET /is_alive until 200; fail at once if the process exits, or at the deadline."""
    proc = server.process
    assert proc is not None
    deadline = time.monotonic() + _START_TIMEOUT_S
    last = "no answer yet"
    with requests.Session() as http:
        while True:
            code = proc.poll()
            if code is not None:
                pytest.fail(
                    f"server exited with status {code} before answering /is_alive\n{_describe(server)}",
                    pytrace=False,
                )
            try:
                r = http.get(f"{server.url}/is_alive", headers=server.headers, timeout=2)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}: {r.text[:200]!r}"
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {e}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _stop(proc)
                pytest.fail(
                    f"server did not answer GET /is_alive with 200 within {_START_TIMEOUT_S:g} s "
                    f"(last: {last})\n{_describe(server)}",
                    pytrace=False,
                )
            # Sleep by waiting on the process, so that an early exit is seen at once.
            try:
                proc.wait(timeout=min(_POLL_INTERVAL_S, remaining))
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture(scope="session")
def remote_server(tmp_path_factory: pytest.TempPathFactory):
    template = _server_template()
    workdir = tmp_path_factory.mktemp("swerex-server")
    home = workdir / "home"
    cwd = workdir / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = dict(os.environ)
    if os.environ.get("SWEREX_SERVER_HOME_INHERIT") != "1":
        env["HOME"] = str(home)
    env.pop("TERM", None)
    if os.environ.get("SWEREX_SERVER_TERM"):
        env["TERM"] = os.environ["SWEREX_SERVER_TERM"]

    port = _free_port()
    argv = [a.replace("{port}", str(port)).replace("{token}", TEST_API_KEY) for a in template]
    server = RemoteServer(
        port=port,
        argv=argv,
        stdout_path=workdir / "server.stdout",
        stderr_path=workdir / "server.stderr",
    )
    _server_logs[:] = [server.stdout_path, server.stderr_path]
    spawn_error = None
    with server.stdout_path.open("wb") as out, server.stderr_path.open("wb") as err:
        try:
            server.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            spawn_error = f"cannot start the server {argv}: {e}"
    if spawn_error:
        pytest.fail(spawn_error, pytrace=False)
    try:
        _wait_ready(server)
        yield server
    finally:
        died = server.process.poll()
        _stop(server.process)
    if died is not None:
        pytest.fail(
            f"server exited with status {died} during the run (it must keep serving, including after /close)\n"
            f"{_describe(server)}",
            pytrace=False,
        )


@pytest.fixture
def remote_runtime(remote_server: RemoteServer) -> RemoteRuntime:
    # RemoteRuntime opens a new HTTP client per request, so nothing to close here; its close()
    # would POST /close, which is the server's "close every session", not a client teardown.
    return RemoteRuntime(port=remote_server.port, auth_token=TEST_API_KEY)


@pytest.fixture
async def runtime_with_default_session(remote_runtime: RemoteRuntime):
    try:
        await remote_runtime.create_session(CreateBashSessionRequest())
    except SessionExistsError:
        # An earlier test left "default" open; do not let that fail this one too.
        warnings.warn("a session 'default' was left open by an earlier test; closing it", stacklevel=1)
        await remote_runtime.close_session(CloseBashSessionRequest())
        await remote_runtime.create_session(CreateBashSessionRequest())
    yield remote_runtime
    try:
        await remote_runtime.close_session(CloseBashSessionRequest())
    except SessionDoesNotExistError:
        pass
