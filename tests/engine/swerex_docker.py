"""swe-rex's own DockerDeployment, unmodified, on the conch image: it starts a container
with `docker run ... IMAGE /bin/sh -c "swerex-remote --auth-token T"`, waits until the
server answers, runs a session command and an `execute`, and stops the container.

Usage: python swerex_docker.py IMAGE   (prints `ok ...` lines; exits non-zero on failure)
"""

import asyncio
import os
import sys

from swerex.deployment.docker import DockerDeployment
from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest


async def main(image: str) -> None:
    d = DockerDeployment(image=image, pull="never", startup_timeout=60)
    await d.start()
    try:
        r = d.runtime
        assert (await r.is_alive()).is_alive
        await r.create_session(CreateBashSessionRequest())
        out = await r.run_in_session(BashAction(command="cd /tmp && echo hi-$((6*7)) && id -u"))
        assert "hi-42" in out.output and "1000" in out.output, out
        print("ok session", flush=True)
        out = await r.run_in_session(BashAction(command="pwd"))
        assert out.output.strip() == "/tmp", out
        print("ok state", flush=True)
        ex = await r.execute(Command(command=["uname", "-s"]))
        assert ex.exit_code == 0 and ex.stdout.strip() == "Linux", ex
        print("ok execute", flush=True)
    finally:
        await d.stop()
    print("ok stopped", flush=True)


asyncio.run(main(sys.argv[1]))
sys.stdout.flush()
os._exit(0)
