"""The static scan and a torch reference helper that the kernel never calls (HarnessGym kernels
keep one for their own benchmark): a warning, unless the entry path or import-time code uses it."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_settings
from harnesslab.tools.integrity.scan import scan_sources
from harnesslab.tools.integrity.verify import guarded_verify
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task.spec import load_task, tasks_root

BASELINE = (load_task("rmsnorm_gate").workspace_template / "kernel.py").read_text()
HELPER = """

def torch_reference(x, gate, weight, eps=1e-5):
    x32 = x.float()
    rms = torch.rsqrt(torch.mean(x32 * x32, dim=-1, keepdim=True) + eps)
    return (x32 * rms * weight.float() * torch.nn.functional.silu(gate.float())).to(x.dtype)
"""


def scan(source: str):
    from harnesslab.tools.integrity.scan import DEFAULT_METHODS  # noqa: PLC0415

    return scan_sources(
        {"kernel.py": source.encode()},
        entry_function="rmsnorm_gate",
        forbidden_calls=["torch.rsqrt", "torch.mean"],
        forbidden_methods=DEFAULT_METHODS,
    )


def test_an_unused_torch_reference_helper_is_a_warning_not_a_reject():
    report = scan(BASELINE + HELPER)
    # Before: torch.rsqrt, torch.mean and torch.nn.functional.silu were hard rejects.
    assert report.rejects == []
    unused = [f for f in report.warnings if f.code == "unused_reference"]
    assert unused and all("torch_reference()" in f.detail for f in unused)


@pytest.mark.parametrize(
    "use",
    [
        "\n\ndef rmsnorm_gate(x, gate, weight, eps=1e-5):\n    return torch_reference(x, gate, weight)\n",
        "\n\nREF = torch_reference\n",  # import-time code reaches it: so may the entry
    ],
)
def test_a_helper_the_entry_path_or_import_reaches_is_still_rejected(use):
    source = BASELINE + HELPER + use
    report = scan(source)
    assert {f.code for f in report.rejects} >= {"forbidden_call"}


def test_attack_patterns_in_an_unused_function_stay_rejects():
    source = BASELINE + "\n\ndef never_called():\n    import subprocess\n    return subprocess\n"
    assert {f.code for f in scan(source).rejects} == {"subprocess"}


def test_a_kernel_with_an_unused_helper_passes_guarded_verify(tmp_path: Path):
    # rmsnorm_gate with 2 hidden cases instead of 6: the verify costs a third.
    task = tmp_path / "rmsnorm_small"
    shutil.copytree(
        tasks_root() / "rmsnorm_gate", task, ignore=shutil.ignore_patterns("__pycache__")
    )
    toml = (
        (task / "task.toml").read_text().replace('name = "rmsnorm_gate"', 'name = "rmsnorm_small"')
    )
    (task / "task.toml").write_text(toml.replace("count = 6", "count = 2"))
    settings = make_settings(tmp_path)
    ws = init_workspace(str(task), tmp_path / "ws", settings)
    (ws.root / "kernel.py").write_text(BASELINE + HELPER)

    async def go():
        launcher = make_launcher(tmp_path)
        try:
            with anyio.fail_after(240):
                return await guarded_verify(ws, launcher, settings, checks=1)
        finally:
            await launcher.aclose()

    verdict = anyio.run(go)
    assert verdict.verdict == "passed", verdict.reasons
    assert any(w["code"] == "unused_reference" for w in verdict.warnings)
