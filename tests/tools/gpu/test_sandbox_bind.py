"""The sandbox's views (policy "bind"): a folder mounted at another path in the sandbox's mount
namespace, with the policy's paths naming that other path; refused where no mount namespace can
be made. Qualification shows a generated server's custom tools the clean room this way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnesslab.tools.gpu import sandbox

LOOK = """
import json, os
out = {"cwd": os.getcwd(), "files": sorted(os.listdir("."))}
open("out/x.txt", "w").write("written through the view")
try:
    open("a.txt", "w").write("x")
    out["wrote_outside_write_set"] = True
except OSError:
    out["wrote_outside_write_set"] = False
print(json.dumps(out))
"""


def run(policy: dict, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", sandbox.__file__, "--policy", json.dumps(policy), "--",
         sys.executable, "-I", "-c", code],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def folders(tmp_path: Path) -> tuple[Path, Path]:
    room, ws = tmp_path / "room", tmp_path / "ws"
    (room / "out").mkdir(parents=True)
    (room / "a.txt").write_text("the room's")
    (ws / "out").mkdir(parents=True)
    (ws / "real.txt").write_text("the workspace's")
    return room, ws


def test_a_bound_folder_is_seen_and_written_at_the_other_path_only(tmp_path: Path) -> None:
    if not sandbox.probe()["namespaces"]:
        pytest.skip("no user namespaces here: the sandbox cannot mount a view")
    room, ws = folders(tmp_path)
    policy = {
        "bind": [[str(room), str(ws)]],
        "read": [str(ws)],
        "write": [str(ws / "out")],
        "cwd": str(ws),
        "scratch_root": str(tmp_path / "scratch"),
        "require": True,
    }
    res = run(policy, LOOK)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout.splitlines()[-1])
    assert seen == {"cwd": str(ws), "files": ["a.txt", "out"], "wrote_outside_write_set": False}
    assert (room / "out" / "x.txt").read_text() == "written through the view"
    assert not (ws / "out" / "x.txt").exists()  # the workspace itself is untouched
    assert sorted(p.name for p in ws.iterdir()) == ["out", "real.txt"]


def test_a_bind_without_a_mount_namespace_is_refused_before_the_target_runs(
    tmp_path: Path,
) -> None:
    room, ws = folders(tmp_path)
    marker = tmp_path / "ran"
    policy = {
        "bind": [[str(room), str(ws)]],
        "namespaces": False,
        "write": [str(ws / "out")],
        "scratch_root": str(tmp_path / "scratch"),
    }
    res = run(policy, f"open({str(marker)!r}, 'w')")
    assert res.returncode == 126 and "needs a mount namespace" in res.stderr
    assert not marker.exists()
