"""What the SDK checks (sdk_checks.py, api_checks.py) wait with: every wait is for an event
(an exit, an event arriving, a sandbox's end), bounded by LIMIT."""

import time

LIMIT = 60.0


def gone(pid):
    """True once `pid` no longer runs (a zombie counts as gone: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone before the open, or between the open and the read.
        return True


def until(what, cond):
    deadline = time.monotonic() + LIMIT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {LIMIT} s")
        time.sleep(0.02)
