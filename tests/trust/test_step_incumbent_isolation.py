"""A step candidate against the incumbent timed beside it (tools/gpu/verify/step_guard.py: two
sandboxed step processes, an arena each): from its own sandbox it looks for the incumbent's
process (a step_child.py other than itself), tries to open that process's arena (the memfd
`hl-arena` among its descriptors) to write garbage over its State, and to kill it, at import
and again at every step. Each sandbox has its own PID namespace and /proc (the incumbent is not
there to find), seccomp denies the cross-process memory calls, Landlock scopes signals: the
candidate's verdict passes on its honest outputs and the incumbent is timed and checked on
every trace, with no error. The attack only ever targets step_child.py processes, so where
isolation failed it would hit the verify's own incumbent, never the machine that runs the test.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import verify_step
from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.task import load_task

PROBE = sandbox.probe()
pytestmark = [
    pytest.mark.skipif(PROBE["level"] != "full", reason="no Landlock or namespaces here"),
    pytest.mark.slow("two step verifies (30-60 s on a loaded 2-core box)"),
]
BASELINE = (load_task("decode_step").workspace_template / "kernel.py").read_text()
CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "step"

ATTACK = '''

import mmap as _mmap
import os as _os
import signal as _signal

HITS = {"seen": 0, "opened": 0, "killed": 0}


def _mine():
    """This process and its ancestors (its own sandbox's outer and reaper name step_child.py)."""
    pid, out = _os.getpid(), set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _others():
    """Other step_child.py processes this one can see (the incumbent's, if isolation failed)."""
    mine = _mine()
    for name in _os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine or int(name) == 1:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if b"step_child.py" in fh.read():
                    yield int(name)
        except OSError:
            pass


def _attack():
    for pid in list(_others()):
        HITS["seen"] += 1
        try:
            fds = _os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if "hl-arena" not in _os.readlink(path):
                    continue
                handle = _os.open(path, _os.O_RDWR)
                size = _os.fstat(handle).st_size
                with _mmap.mmap(handle, size) as mem:
                    mem[:size] = bytes([0xFF]) * size  # NaN over its weights, cache, slots
                HITS["opened"] += 1
            except OSError:
                pass
        try:
            _os.kill(pid, _signal.SIGKILL)
            HITS["killed"] += 1
        except OSError:
            pass


_attack()
_honest = step


def step(state, tokens):
    _attack()
    return _honest(state, tokens)
'''


def test_a_candidate_can_neither_find_write_nor_kill_the_incumbent_beside_it(
    tmp_path: Path,
) -> None:
    ws, first = verify_step(tmp_path, BASELINE)
    assert first.verdict == "passed", first.reasons
    _, v = verify_step(tmp_path, BASELINE + ATTACK, ws)
    assert v.verdict == "passed", v.reasons
    inc = v.incumbent
    assert inc is not None and inc["hash"] == first.evidence["candidate"]
    assert inc["error"] is None, inc  # its process was not killed, its outputs not spoiled
    assert all(r["incumbent_passed"] and r["incumbent_us"] for r in inc["cases"]), inc
    assert v.evidence["sandbox"]["incumbent"]["level"] == "full"
