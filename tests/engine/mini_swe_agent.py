"""mini-swe-agent's `swerex_docker` environment, unmodified, on the conch image: it starts
the image through SWE-ReX's DockerDeployment (pull="never"), runs commands as the agent
does (`execute` with a cwd, merged output, a return code), sees its submission marker, and
stops the container.

Usage: python mini_swe_agent.py IMAGE   (prints `ok ...` lines; exits non-zero on failure)
"""

import os
import sys

from minisweagent.environments.extra.swerex_docker import SwerexDockerEnvironment
from minisweagent.exceptions import Submitted

env = SwerexDockerEnvironment(
    image=sys.argv[1], cwd="/tmp", deployment_extra_kwargs={"pull": "never"}
)
try:
    out = env.execute({"command": "pwd; echo err >&2; exit 3"})
    assert out["output"].split() == ["/tmp", "err"], out
    assert out["returncode"] == 3, out
    print("ok execute", flush=True)
    out = env.execute({"command": "cd / && ls -d workspace"}, cwd="/")
    assert out["output"].strip() == "workspace" and out["returncode"] == 0, out
    print("ok cwd", flush=True)
    try:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
        raise AssertionError("no submission seen")
    except Submitted as s:
        assert s.messages[0]["extra"]["submission"] == "the patch\n", s.messages
    print("ok submitted", flush=True)
finally:
    import asyncio

    asyncio.run(env.deployment.stop())
print("ok stopped", flush=True)
sys.stdout.flush()
os._exit(0)
