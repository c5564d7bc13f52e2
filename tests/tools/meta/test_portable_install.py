"""A toolkit installed with `pip install --target` and found through PYTHONPATH (as with
environment modules on a cluster) qualifies a generated server, evaluates and verifies: every
child it starts with `python -I` (the server, its sandboxed self-test and custom tools worker,
pytest of its tests, the sandboxed runner, the guarded verify's parent and children) gets the
toolkit's import roots explicitly (tools/gpu/isolation/sandbox_policy.py BOOT). On an H100 the
same server failed every qualification with "startup: ExceptionGroup" and "own_tests: pytest
exited 2" (issue 28, item 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import harnesslab.tools
from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.gpu.isolation.sandbox_policy import import_roots
from harnesslab.tools.meta.qualification import environment_check
from harnesslab.tools.meta.qualify_checks import Check

REPO = Path(harnesslab.tools.__file__).resolve().parents[1]
QUALIFY = """
import json, sys
from pathlib import Path
import anyio
import harnesslab.tools
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.meta.genserver import generate
from harnesslab.tools.meta.qualification import qualify_workspace_server
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.integrity.verify import guarded_verify

tmp = Path(sys.argv[1])
settings = Settings(state_dir=tmp / "state")
ws = init_workspace("rmsnorm_gate", tmp / "ws", settings)
tool = {"custom": {"function": "f", "file": "fix.py"}, "probe_args": {"flag": True}}
generate(ws, {"name": "portable", "description": "A server of a --target install.",
              "tools": [tool]},
         {"fix.py": "async def f(flag: bool = False) -> dict:\\n    return {'flag': flag}\\n"})
report = anyio.run(lambda: qualify_workspace_server(ws, "portable", settings, timeout_s=240))


async def runs():
    launcher = Launcher(settings)
    try:
        dev = await run_objective(ws, launcher, cases=["1024x1024_fp16"])
        return dev, await guarded_verify(ws, launcher, settings)
    finally:
        await launcher.aclose()


dev, final = anyio.run(runs)
print(json.dumps({"toolkit": harnesslab.tools.__file__, "passed": report.passed,
                  "reason": report.reason(), "dev": [dev.status, dev.reason],
                  "verify": [final.verdict, final.reasons]}))
"""


@pytest.mark.slow
@pytest.mark.skipif(sandbox.probe()["level"] != "full", reason="no Landlock or namespaces here")
def test_a_target_install_on_pythonpath_qualifies_a_generated_server(tmp_path: Path) -> None:
    if not (REPO / "pyproject.toml").is_file():
        pytest.skip("the toolkit's source tree is not beside the installed package")
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         str(REPO)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.skip(f"pip cannot build the toolkit here: {built.stderr.strip()[-300:]}")
    # The dependencies from this environment, through PYTHONPATH too; the interpreter itself
    # is the bare one under the venv, so nothing comes from a venv's site configuration.
    deps = [r for r in import_roots() if not r.startswith(sys.base_prefix.rstrip("/") + "/")]
    python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    env = {
        "HOME": os.environ.get("HOME", "/root"),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join([str(site), *deps]),
    }
    (tmp_path / "run").mkdir()
    out = subprocess.run(
        [str(python), "-c", QUALIFY, str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["toolkit"].startswith(str(site))  # the --target copy, not this checkout
    assert result["passed"], result["reason"]
    assert result["dev"][0] == "passed", result["dev"]  # the sandboxed runner
    assert result["verify"][0] == "passed", result["verify"]  # the guard and its children


def test_a_module_the_toolkit_has_but_a_child_cannot_import_is_the_environments_fault() -> None:
    traceback = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'mcp'"
    startup = Check(name="startup", passed=False, evidence=f"ExceptionGroup\n{traceback}")
    env = environment_check([Check(name="syntax", passed=True, evidence=""), startup])
    assert env is not None and env.evidence.startswith("environment: cannot import mcp")
    agents = Check(name="self_test", passed=False, evidence="No module named 'hl_not_installed'")
    assert environment_check([agents]) is None  # the server imports what nobody has: its bug
