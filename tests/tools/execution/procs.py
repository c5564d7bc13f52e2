"""Process-group helpers of the executor tests: a command that leaves a background child in its
group, and polls for that group to appear and to be gone."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import anyio

# Writes its process group to {pgfile}, then sleeps with a background sleeper in the group.
SLEEPERS = "ps -o pgid= -p $$ > {pgfile}; sleep 300 & sleep 300"


def live_group(pgid: int) -> list[str]:
    """Processes of group pgid that are not zombies, as ps lines."""
    table = subprocess.run(
        ["ps", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    rows = (line.split(None, 3) for line in table.splitlines())
    return [" ".join(r) for r in rows if len(r) >= 3 and int(r[1]) == pgid and r[2][0] != "Z"]


async def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not predicate():
            await anyio.sleep(0.05)


async def read_pgid(pgfile: Path) -> int:
    await wait_until(lambda: pgfile.is_file() and pgfile.read_text().strip())
    return int(pgfile.read_text())
