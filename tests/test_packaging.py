"""The distribution: `pip install` builds it without a wall of setuptools warnings, and the wheel
ships every subpackage, the staged GPU side, the cheat corpus, and every task template and skill
as package data."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("servers", "tools", "skills", "tasks", "tests")
JUNK = shutil.ignore_patterns("node_modules", "__pycache__", "*.pyc", ".harnesslab")


def test_the_wheel_builds_without_setuptools_warnings_and_ships_the_task_files(tmp_path):
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed in this environment (pip install setuptools)")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=JUNK)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
    res = subprocess.run(
        [*argv, str(src), "-w", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stdout + res.stderr
    assert "Warning" not in log, [ln for ln in log.splitlines() if "Warning" in ln][:5]
    (wheel,) = (tmp_path / "dist").glob("harnesslab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for task in (p.name for p in (ROOT / "tasks").iterdir() if (p / "task.toml").is_file()):
        for rel in ("task.toml", "task.md", "reference.py", "workspace/kernel.py"):
            assert f"harnesslab/tasks/{task}/{rel}" in names, (task, rel)
    assert "harnesslab/skills/kernel-optimization/SKILL.md" in names
    assert "harnesslab/tools/gpu/runner.py" in names and "harnesslab/servers/cli.py" in names
    # Every subpackage, the staged GPU side (read with importlib.resources and copied to the
    # GPU host), the cheat corpus qualification runs, and the backend guide.
    from harnesslab.tools import gpu  # noqa: PLC0415

    for staged in {*gpu.STAGED, *gpu.LAB}:
        assert f"harnesslab/tools/gpu/{staged}" in names, staged
    packages = ("task", "authoring", "state", "execution", "evaluation", "integrity", "meta",
                "loop", "lab", "dashboard")  # fmt: skip
    for package in packages:
        assert f"harnesslab/tools/{package}/__init__.py" in names, package
    for static in ("dashboard.js", "dashboard.css", "favicon.svg"):  # the dashboard's, no CDN
        assert f"harnesslab/servers/dashboard_static/{static}" in names, static
    assert "harnesslab/tools/meta/custom_worker.py" in names
    assert "harnesslab/tools/execution/README.md" in names
    corpus = [n for n in names if n.startswith("harnesslab/tools/integrity/cheats/")]
    assert {n.split("/")[4] for n in corpus} == {"cpu", "gpu", "honest", "step"}
    assert not any("__pycache__" in n for n in names)
