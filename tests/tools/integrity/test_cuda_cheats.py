"""The CUDA C++ cheat corpus (tools/integrity/cheats/gpu/cuda/<name>/kernel.py + kernel.cu), as far
as a machine without a GPU can judge it: each folder names what the static scan must say
(`static:`), what the launcher's PTX check must refuse at load (`load:`), what the guarded verify
must say on a GPU (`gpu:`, judged by tests/gpu/test_cuda_gpu.py once CUDA launches are recorded),
and its honest twin (`twin:`), which must pass all of it."""

from __future__ import annotations

import ast
import importlib.util
import tomllib
import uuid
from importlib import resources
from pathlib import Path

import pytest
import torch

from harnesslab.tests.tools.gpu.cuda_support import compiler, staged
from harnesslab.tools.integrity.reasons import REASONS
from harnesslab.tools.integrity.scan import scan_sources
from harnesslab.tools.task.spec import load_task

CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "gpu" / "cuda"
FOLDERS = sorted(p for p in CORPUS.iterdir() if (p / "kernel.py").is_file())
TASK = load_task("rmsnorm_gate")


def expectation(folder: Path) -> dict[str, str]:
    doc = ast.get_docstring(ast.parse((folder / "kernel.py").read_text())) or ""
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in doc.splitlines())
            if k.strip() in ("static", "load", "gpu", "runtime", "twin")}  # fmt: skip


def test_every_folder_names_known_codes_and_an_honest_twin() -> None:
    assert len(FOLDERS) >= 10
    for folder in FOLDERS:
        exp = expectation(folder)
        assert {"static", "gpu"} <= set(exp), folder.name
        for key in ("static", "load", "gpu", "runtime"):
            for code in exp.get(key, "pass").split("|"):
                assert code in REASONS or code in ("pass", "harmless"), (folder.name, code)
        honest = folder.name.startswith("honest_")
        assert honest == (exp["gpu"] == "pass"), folder.name
        if not honest:
            assert (CORPUS / exp["twin"] / "kernel.cu").is_file(), folder.name


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_the_static_scan_says_what_each_folder_expects(folder: Path) -> None:
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".py", ".cu")}
    rules = tomllib.loads((TASK.root / "task.toml").read_text())["integrity"]
    report = scan_sources(files, entry_function=TASK.entry_function,
                          forbidden_calls=rules["forbidden_calls"],
                          forbidden_methods=rules["forbidden_methods"])  # fmt: skip
    want = expectation(folder)["static"]
    got = {f.code for f in report.rejects}
    assert (got == set()) if want == "pass" else (want in got), (folder.name, report.findings)


def import_kernel(folder: Path):
    spec = importlib.util.spec_from_file_location(f"cheat_{uuid.uuid4().hex}", folder / "kernel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_the_launcher_refuses_at_load_exactly_what_each_folder_expects(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler()
    hc = staged("harnesslab_cuda")
    monkeypatch.setitem(hc._SETTINGS, "cache_dir", str(tmp_path))
    want = expectation(folder).get("load")
    if want is None:
        mod = import_kernel(folder)  # compiles
        if folder.name.startswith("honest_") and not torch.cuda.is_available():
            x = torch.randn(2, 64).half()
            with pytest.raises(hc.GpuRequired):
                mod.rmsnorm_gate(x, x, torch.ones(64).half())
        return
    with pytest.raises(hc.KernelPolicyError) as err:
        import_kernel(folder)
    assert err.value.code == want
