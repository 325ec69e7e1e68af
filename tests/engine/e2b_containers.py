"""The e2b SDK, unmodified, against `conch --composition docker e2b --api-key`: every
`Sandbox.create()` is a container of the conch image (E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY are set by the caller).

Prints `sandbox NAME ID` for each sandbox (the caller checks its container with the
engine), `ok CHECK` after each check, and `killed NAME` after each kill; exits non-zero at
the first failure.
"""

import os
import subprocess
import sys

from e2b import Sandbox


def network_of(sbx) -> str:
    """The engine's network names for the container labelled as `sbx`'s."""
    out = subprocess.run(
        ["docker", "ps", "--filter", f"label=conch.owner=e2b-{sbx.sandbox_id}",
         "--format", "{{.Networks}}"],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


def main() -> None:
    a = Sandbox.create(timeout=300)
    b = Sandbox.create(timeout=300)
    c = Sandbox.create(timeout=300, allow_internet_access=False)
    for name, s in (("a", a), ("b", b), ("c", c)):
        print(f"sandbox {name} {s.sandbox_id}", flush=True)
    ha = a.commands.run("cat /etc/hostname").stdout.strip()
    hb = b.commands.run("cat /etc/hostname").stdout.strip()
    assert ha and hb and ha != hb, (ha, hb)
    print("ok hosts", flush=True)
    r = a.commands.run("id -u; pwd; echo $HOME")
    assert r.stdout.split() == ["1000", "/workspace", "/workspace"], r.stdout
    print("ok user", flush=True)
    a.files.write("secret.txt", "only a's")
    assert a.files.read("/workspace/secret.txt") == "only a's"
    assert "secret.txt" not in [e.name for e in b.files.list("/workspace")]
    r = b.commands.run("ls -A /workspace; ps -eo args")
    assert "secret.txt" not in r.stdout, r.stdout
    print("ok apart", flush=True)
    assert network_of(a) == "conch-sandbox-bridge", network_of(a)
    assert network_of(c) == "conch-sandbox-none", network_of(c)
    print("ok networks", flush=True)
    for name, s in (("a", a), ("b", b), ("c", c)):
        s.kill()
        print(f"killed {name}", flush=True)


main()
sys.stdout.flush()
# The SDK's native transport can abort at interpreter teardown after its clients were used
# (see tests/e2b/waits.py); every check has passed by now.
os._exit(0)
