"""The sandbox's views (policy `bind`): a folder mounted at another path in the sandbox's mount
namespace, with the policy's paths naming that other path; refused where no mount namespace can
be made, or where it would undo the private /proc or the scratch tmpfs. Qualification shows a
generated server's custom tools the clean room this way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnesslab.tools.gpu.isolation import sandbox, sandbox_mounts
from harnesslab.tools.gpu.isolation import sandbox_policy as sp

LOOK = """
import json, os
out = {"cwd": os.getcwd(), "files": sorted(os.listdir("."))}
open("out/x.txt", "w").write("written through the view")
try:
    open("a.txt", "w").write("x")
    out["wrote_outside_write_set"] = True
except OSError:
    out["wrote_outside_write_set"] = False
tmp = os.environ["TMPDIR"]
scratch = os.path.dirname(tmp)
out["scratch_is_tmpfs"] = any(
    line.split()[4] == scratch and line.split(" - ")[1].startswith("tmpfs ")
    for line in open("/proc/self/mountinfo")
)
print(json.dumps(out))
"""


def run(code: str, **fields) -> subprocess.CompletedProcess[str]:
    launch = sp.command(
        sys.executable, sandbox.__file__, sp.Policy(**fields), [sys.executable, "-I", "-c", code]
    )
    return subprocess.run(
        launch.argv, input=launch.stdin.decode(), capture_output=True, text=True, timeout=60
    )


def folders(tmp_path: Path) -> tuple[Path, Path]:
    room, ws = tmp_path / "room", tmp_path / "ws"
    (room / "out").mkdir(parents=True)
    (room / "a.txt").write_text("the room's")
    (ws / "out").mkdir(parents=True)
    (ws / "real.txt").write_text("the workspace's")
    return room, ws


def needs_mounts() -> None:
    if not sandbox.probe()["namespaces"]:
        pytest.skip("no user namespaces here: the sandbox cannot mount a view")


def test_a_bound_folder_is_seen_and_written_at_the_other_path_only(tmp_path: Path) -> None:
    needs_mounts()
    room, ws = folders(tmp_path)
    res = run(
        LOOK,
        bind=((str(room), str(ws)),),
        read=[str(ws)],
        write=[str(ws / "out")],
        cwd=str(ws),
        scratch_root=str(tmp_path / "scratch"),
        require=True,
        report=False,
    )
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout.splitlines()[-1])
    assert seen == {
        "cwd": str(ws),
        "files": ["a.txt", "out"],
        "wrote_outside_write_set": False,
        "scratch_is_tmpfs": True,  # the views do not undo the scratch tmpfs
    }
    assert (room / "out" / "x.txt").read_text() == "written through the view"
    assert not (ws / "out" / "x.txt").exists()  # the workspace itself is untouched
    assert sorted(p.name for p in ws.iterdir()) == ["out", "real.txt"]


def test_binds_apply_in_order_so_a_later_target_may_lie_in_an_earlier_one(tmp_path: Path) -> None:
    needs_mounts()
    room, ws = folders(tmp_path)
    (room / "bundle").mkdir()
    other = tmp_path / "bundle-src"
    other.mkdir()
    (other / "server.py").write_text("")
    code = "import os; print(sorted(os.listdir('bundle')))"
    binds = ((str(room), str(ws)), (str(other), str(ws / "bundle")))
    res = run(code, bind=binds, read=[str(ws)], cwd=str(ws), report=False,
              scratch_root=str(tmp_path / "scratch"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['server.py']"


def test_a_symlinked_bind_target_is_refused_before_the_target_runs(tmp_path: Path) -> None:
    needs_mounts()
    room, ws = folders(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(ws)
    marker = tmp_path / "ran"
    res = run(f"open({str(marker)!r}, 'w')", bind=((str(room), str(link)),),
              write=[str(tmp_path)], scratch_root=str(tmp_path / "scratch"))  # fmt: skip
    assert res.returncode == 126 and "link" in res.stderr, res.stderr  # ELOOP on the link
    assert not marker.exists()


def test_a_bind_without_a_mount_namespace_is_refused_before_the_target_runs(
    tmp_path: Path,
) -> None:
    room, ws = folders(tmp_path)
    marker = tmp_path / "ran"
    res = run(
        f"open({str(marker)!r}, 'w')",
        bind=((str(room), str(ws)),),
        namespaces=False,
        write=[str(ws / "out")],
        scratch_root=str(tmp_path / "scratch"),
    )
    assert res.returncode == 126 and "needs a mount namespace" in res.stderr
    assert not marker.exists()


@pytest.mark.parametrize("target", ["scratch_root", "/proc/self"])
def test_a_bind_over_proc_or_the_scratch_folder_is_refused(tmp_path: Path, target: str) -> None:
    room, _ = folders(tmp_path)
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()
    target = str(scratch_root) if target == "scratch_root" else target
    marker = tmp_path / "ran"
    res = run(f"open({str(marker)!r}, 'w')", bind=((str(room), target),),
              write=[str(tmp_path)], scratch_root=str(scratch_root))  # fmt: skip
    assert res.returncode == 126 and "not running the target" in res.stderr, res.stderr
    assert not marker.exists()


def test_a_bind_target_that_is_holds_or_lies_in_the_scratch_folder_is_refused() -> None:
    scratch = "/s/root/sbx-1"
    refused = [scratch, "/s/root", "/s", "/", f"{scratch}/home", "/proc", "/proc/1/root"]
    for target in refused:
        assert sandbox_mounts.bind_refusal([("/src", target)], scratch), target
    for target in ("/s/root/sbx-10", "/s/rooted", "/work/ws", "/processes"):
        assert sandbox_mounts.bind_refusal([("/src", target)], scratch) == "", target


@pytest.mark.parametrize(
    "bind",
    [[["relative", "/abs"]], [["/a", "/b", "/c"]], [["/a"]], ["/a:/b"], {"/a": "/b"}, [[1, "/b"]]],
)
def test_a_policy_with_a_malformed_bind_is_refused(bind: object) -> None:
    with pytest.raises(ValueError, match="bind"):
        sp.Policy.from_json(json.dumps({"bind": bind}))


def test_a_bind_survives_the_policy_frame_as_pairs() -> None:
    policy = sp.Policy(bind=(("/a", "/b"), ("/c", "/d")))
    assert sp.Policy.from_json(policy.to_json()) == policy
