"""Disk full in the trusted store and the stage, on a real size-limited filesystem (a tmpfs this
test mounts; skipped where mounting is refused). A full disk is a named fault (DiskFull: the
folder, what is free, what was needed; infrastructure, never the candidate's), leaves nothing
half-written (no checkpoint without its manifest, no half a ledger line), and the next call
works once space is freed."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harnesslab.tools.errors import DiskFull
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.evaluation.sweep import sweep
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.checkpoints import Checkpoints
from harnesslab.tools.state.storage import append_jsonl
from harnesslab.tools.state.workspace import init_workspace

SMALL = "1024x1024_fp16"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs at tmp_path/disk (root only; skipped where mount is refused)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(disk: Path, leave: int) -> Path:
    """Fill `disk` until `leave` bytes are free; the filler file (delete it to free space)."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    with filler.open("ab") as fh:
        fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def no_partial_checkpoint(folder: Path) -> None:
    for entry in folder.iterdir() if folder.is_dir() else []:
        assert not entry.name.endswith(".tmp"), entry
        if entry.name != "best":
            assert (entry / "manifest.json").is_file(), f"{entry} has no manifest"


def test_an_append_that_does_not_fit_is_cut_back_and_named(small_disk: Path) -> None:
    ledger = small_disk / "store" / "history.jsonl"
    append_jsonl(ledger, {"id": 1})
    before = ledger.read_bytes()
    fill(small_disk, 8192)  # room for part of the record: a write that stops half-way
    with pytest.raises(DiskFull) as err:
        append_jsonl(ledger, {"id": 2, "pad": "x" * 100_000})
    assert str(ledger.parent) in err.value.message and err.value.blame == "infrastructure"
    assert ledger.read_bytes() == before  # no half a record


def test_a_restore_on_a_full_disk_leaves_no_checkpoint_without_its_manifest(
    small_disk: Path, tmp_path: Path
) -> None:
    settings = Settings(state_dir=small_disk / "state")
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    ckpt = Checkpoints(ws)
    first = ckpt.save()
    (ws.root / "kernel.py").write_text((ws.root / "kernel.py").read_text() + "\n# edit\n")
    filler = fill(small_disk, 4096)
    with pytest.raises(DiskFull) as err:
        ckpt.restore(first)  # saves the current files first: no room for them
    assert "checkpoints" in err.value.message and "free" in err.value.message
    no_partial_checkpoint(ws.checkpoints_dir)
    filler.unlink()
    assert ckpt.restore(first)["restored"] == first
    no_partial_checkpoint(ws.checkpoints_dir)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_full_store_records_nothing_and_the_next_call_works_once_space_is_freed(
    small_disk: Path, tmp_path: Path
) -> None:
    settings = Settings(state_dir=small_disk / "state", interpret="always")
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    launcher = Launcher(settings)
    try:
        assert (await run_objective(ws, launcher, cases=[SMALL])).status == "passed"
        records = ws.ledger().records()
        (ws.root / "kernel.py").write_text((ws.root / "kernel.py").read_text() + "\n# v2\n")
        filler = fill(small_disk, 28 << 10)  # what the issue left: 28 KB
        with pytest.raises(DiskFull) as err:
            await run_objective(ws, launcher, cases=[SMALL])
        assert str(settings.state_dir) in err.value.message
        assert ws.ledger().records() == records
        no_partial_checkpoint(ws.checkpoints_dir)
        (ws.root / "kernel.py").write_text((ws.root / "kernel.py").read_text() + "\n# v3\n")
        # A sweep compiles in each sandbox's own scratch (a tmpfs), so only staging the new
        # candidate needs the stage's disk: fill it to the last byte.
        fill(small_disk, 0)
        with pytest.raises(DiskFull):  # a sweep: a named fault, never "compile_error"
            await sweep(ws, launcher, space={"num_warps": [2, 4]}, cases=[SMALL], compile_workers=2)
        assert ws.ledger().records() == records
        filler.unlink()
        again = await run_objective(ws, launcher, cases=[SMALL])
        assert again.status == "passed", again.reason
        assert [r["status"] for r in ws.ledger().records()] == ["passed", "passed"]
        assert json.loads((ws.checkpoints_dir / again.candidate / "manifest.json").read_text())
    finally:
        await launcher.aclose()


# Appended to the kernel: the compile of num_warps=4 fills the disk under its Triton cache (the
# stage's disk) and fails on it, while num_warps=2 compiles and is timed.
FILLS_THE_DISK = """
import os as _os

if CONFIG["num_warps"] == 4:
    with open(_os.path.join(_os.environ["TRITON_CACHE_DIR"], "fill"), "wb") as _fh:
        while True:
            _fh.write(b"\\0" * (1 << 20))
            _fh.flush()
"""


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_compile_that_fills_the_stage_is_the_hosts_fault_not_a_compile_error(
    small_disk: Path, tmp_path: Path
) -> None:
    settings = Settings(state_dir=small_disk / "state", interpret="always")
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    (ws.root / "kernel.py").write_text((ws.root / "kernel.py").read_text() + FILLS_THE_DISK)
    launcher = Launcher(settings)
    try:
        with pytest.raises(DiskFull) as err:
            await sweep(ws, launcher, space={"num_warps": [2, 4]}, cases=[SMALL], compile_workers=2)
    finally:
        await launcher.aclose()
    assert "stage" in err.value.message
    assert ws.ledger().records() == []  # no sweep recorded, no config blamed
