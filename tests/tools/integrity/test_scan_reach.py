"""The static scan and a torch reference helper that the kernel never calls (HarnessGym kernels
keep one for their own benchmark): a warning, unless the entry path or import-time code uses it."""

from __future__ import annotations

import ast
from pathlib import Path

import anyio
import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_settings, small_rmsnorm
from harnesslab.tools.integrity.scan import scan_sources
from harnesslab.tools.integrity.scan_reach import unreachable_functions
from harnesslab.tools.integrity.verify import guarded_verify
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task.spec import load_task

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
    task = small_rmsnorm(tmp_path / "rmsnorm_small")
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


# -- the call graph itself (scan_reach.unreachable_functions), rule by rule -------------------
def unreachable(src: str, entry: str = "entry") -> dict[str, tuple[int, int]]:
    return unreachable_functions(ast.parse(src), entry)


def test_without_the_entry_function_every_function_may_be_called() -> None:
    assert unreachable("def helper():\n    return 1\n") == {}


def test_an_unused_function_is_named_with_the_lines_of_its_body() -> None:
    src = "def entry():\n    return 1\n\n\ndef unused(x=1):\n    y = x\n    return y\n"
    assert unreachable(src) == {"unused": (6, 7)}


def test_what_the_entry_uses_directly_or_through_others_is_reached() -> None:
    """Rule: reaching is transitive (entry -> a -> b, b -> a cycles end), through a bare name
    or an attribute (`self.c`, `mod.c`); what only an unreached function uses is unreached."""
    src = (
        "def entry(m):\n    return a() + m.c()\n"
        "def a():\n    return b()\n"
        "def b():\n    return a()\n"
        "def c():\n    return 0\n"
        "def dead():\n    return deader()\n"
        "def deader():\n    return 0\n"
    )
    assert set(unreachable(src)) == {"dead", "deader"}


def test_import_time_code_reaches_what_it_names() -> None:
    """Rule: module-level statements run at import: an assignment, a name in a string
    (`__all__`, getattr(mod, "f")); an async function is a function (what only its body names
    is not reached at import)."""
    src = (
        "def entry():\n    return 0\n"
        "def assigned():\n    return 0\n"
        "def exported():\n    return 0\n"
        "async def looked_up():\n    return 0\n"
        "async def dead():\n    return deader()\n"
        "def deader():\n    return 0\n"
        "REF = assigned\n__all__ = ['exported']\nimport sys\ngetattr(sys.modules[__name__], 'looked_up')\n"
    )
    assert set(unreachable(src)) == {"dead", "deader"}


def test_decorators_and_defaults_run_at_import_and_reach_what_they_name() -> None:
    """Rule: a decorator, a default and a keyword-only default (a keyword-only parameter
    without one is no use) are import-time code, even on an unreached function."""
    src = (
        "def entry():\n    return 0\n"
        "def deco(f):\n    return f\n"
        "def default():\n    return 0\n"
        "def kw_default():\n    return 0\n"
        "def body_only():\n    return 0\n"
        "@deco\n"
        "def dead(x=default(), *, k=kw_default, j):\n    return body_only()\n"
    )
    assert set(unreachable(src)) == {"dead", "body_only"}
