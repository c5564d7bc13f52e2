"""The tasks' CUDA C++ versions (`[languages.cuda]`, workspace_cuda/, task_cuda.md,
solutions/cuda_*.py + .cu): a CUDA workspace is made, bound and reopened as CUDA; its baseline
and the reference solutions compile with NVRTC for sm_90 and pass the static scan; without a GPU
an eval compiles and says plainly that running needs one. Running them is tests/gpu/'s."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import uuid
from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_settings
from harnesslab.tests.tools.gpu.cuda_support import compiler, staged
from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.integrity.scan import integrity_rules, scan_sources
from harnesslab.tools.state.workspace import Workspace, init_workspace, open_workspace
from harnesslab.tools.task.spec import TaskSpec, list_tasks, load_task

CUDA_TASKS = [t for t in list_tasks() if "cuda" in load_task(t).languages]
# Widths a planner must handle: the dev cases', the final domains', the probes' (odd ones too).
DIMS = [1, 1000, 1001, 1024, 1536, 2048, 3000, 4096, 5120, 6144, 8192, 11008, 14336, 16384,
        32768, 40000, 65536]  # fmt: skip
BATCHES = [1, 192, 768, 4096, 65536]  # rows, for a planner that takes them (shape classes)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_the_cuda_tasks_are_the_three_bandwidth_tasks() -> None:
    assert set(CUDA_TASKS) == {"rmsnorm_gate", "softmax", "swiglu"}


@pytest.mark.parametrize("name", CUDA_TASKS)
def test_the_cuda_template_holds_exactly_its_editable_files_and_config(name: str) -> None:
    spec = load_task(name).for_language("cuda")
    assert spec.language == "cuda" and "kernel.cu" in spec.editable
    # (a run that imported the template's kernel.py leaves a bytecode cache there: init drops it)
    files = {p.name for p in spec.workspace_template.iterdir()} - {"__pycache__"}
    assert files == set(spec.editable)
    assert (
        spec.brief_path().name == "task_cuda.md"
        and "harnesslab_cuda" in spec.brief_path().read_text()
    )
    config = json.loads((spec.workspace_template / "kernel_config.json").read_text())
    assert set(config) == set(spec.space)
    spec.validate_config(config, source="kernel_config.json")
    assert set(spec.solutions()) == {f"cuda_{name}"} and "fast" in load_task(name).solutions()


def test_init_in_cuda_binds_the_language_and_a_reopened_workspace_keeps_it(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings, language="cuda")
    assert {"kernel.cu", "kernel.py", "kernel_config.json", "task.md"} <= {
        p.name for p in ws.root.iterdir()
    }
    assert (ws.root / "task.md").read_text() == ws.task.brief_path().read_text()
    again = open_workspace(tmp_path / "ws", settings)
    assert again.task.language == "cuda" and set(again.editable_files()) == set(ws.task.editable)
    assert again.task.space == load_task("rmsnorm_gate").languages["cuda"].space
    plain = open_workspace(init_workspace("rmsnorm_gate", tmp_path / "t", settings).root, settings)
    assert plain.task.language == "triton" and "kernel.cu" not in plain.task.editable


def test_the_cli_init_takes_the_language(tmp_path: Path, monkeypatch, capsys) -> None:
    from harnesslab.servers.cli import main

    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    assert main(["init", "--task", "softmax", "--lang", "cuda", "-w", str(tmp_path / "ws")]) == 0
    assert (tmp_path / "ws" / "kernel.cu").is_file()
    capsys.readouterr()
    assert main(["init", "--task", "matmul", "--lang", "cuda", "-w", str(tmp_path / "m")]) == 2
    assert "no 'cuda' version" in capsys.readouterr().err
    assert not (tmp_path / "m" / "kernel.cu").exists()


def test_a_language_the_task_does_not_have_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no 'cuda' version"):
        init_workspace("matmul", tmp_path / "ws", make_settings(tmp_path), language="cuda")
    with pytest.raises(UsageError, match="use one of: triton, cuda"):
        load_task("softmax").for_language("mojo")


def candidate_files(spec: TaskSpec) -> list[dict[str, bytes]]:
    base = {n: (spec.workspace_template / n).read_bytes() for n in spec.editable}
    sols = [{p.name: p.read_bytes(), p.with_suffix(".cu").name: p.with_suffix(".cu").read_bytes()}
            for p in spec.solutions().values()]  # fmt: skip
    return [base, *sols]


@pytest.mark.parametrize("name", CUDA_TASKS)
def test_the_cuda_baseline_and_solutions_pass_the_static_scan(name: str) -> None:
    spec = load_task(name).for_language("cuda")
    rules = integrity_rules(Workspace(spec.root, spec, None))  # type: ignore[arg-type]
    for files in candidate_files(spec):
        report = scan_sources(files, entry_function=spec.entry_function,
                              forbidden_calls=rules.get("forbidden_calls", ()),
                              forbidden_methods=rules.get("forbidden_methods", ()))  # fmt: skip
        assert report.rejects == [] and any(f.endswith(".cu") for f in report.files), files.keys()


def import_path(path: Path):
    spec = importlib.util.spec_from_file_location(f"cuda_{uuid.uuid4().hex}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("name", CUDA_TASKS)
def test_the_cuda_baseline_and_every_solution_variant_compile_for_sm_90(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every instantiation the solution's planner picks for the widths above (and batches,
    where it takes rows; fp16 and bf16, 16-byte and scalar paths), compiled in one NVRTC
    program through the launcher (which also runs the PTX policy check); and the baseline at
    its config and at the widest vectors."""
    compiler()
    hc = staged("harnesslab_cuda")
    monkeypatch.setitem(hc._SETTINGS, "cache_dir", str(tmp_path / "cache"))
    spec = load_task(name).for_language("cuda")
    import_path(spec.workspace_template / "kernel.py")  # compiles both dtypes at import
    cfg = json.loads((spec.workspace_template / "kernel_config.json").read_text())
    (tmp_path / "ws").mkdir()
    for f in spec.editable:
        (tmp_path / "ws" / f).write_bytes((spec.workspace_template / f).read_bytes())
    (tmp_path / "ws" / "kernel_config.json").write_text(json.dumps({**cfg, "vec": 8}))
    import_path(tmp_path / "ws" / "kernel.py")
    for sol in spec.solutions().values():
        mod = import_path(sol)
        wanted: list[str] = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(mod, "load", lambda src, expr, _w=wanted, **kw: _w.append(expr))
            for dtype in mod.CTYPES:
                for vec in (8, 1):
                    if hasattr(mod, "plan"):
                        takes_rows = "rows" in inspect.signature(mod.plan).parameters
                        for dim, rows in itertools.product(DIMS, BATCHES if takes_rows else [0]):
                            if dim % vec == 0:  # (variant, chunks, block, template knobs)
                                plan = (
                                    mod.plan(dim, vec, rows) if takes_rows else mod.plan(dim, vec)
                                )
                                mod.kernel(dtype, vec, plan[0], plan[1], *plan[3:6])
                    else:
                        mod.kernel(dtype, vec)
        # The module's own load, called from the module (the source is found beside it).
        exec(f"def load_all(names):\n    return load({sol.with_suffix('.cu').name!r}, names)",
             mod.__dict__)  # fmt: skip
        kernels = mod.load_all(sorted(set(wanted)))
        assert len(kernels) >= 4 and all(k.compiled.image[:4] == b"\x7fELF" for k in kernels)


@pytest.mark.slow
@pytest.mark.anyio
async def test_without_a_gpu_eval_of_a_cuda_workspace_compiles_and_says_it_needs_one(
    tmp_path: Path,
) -> None:
    compiler()
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", make_settings(tmp_path), language="cuda")
    res = await run_objective(ws, make_launcher(tmp_path), cases=["1024x1024_fp16"])
    assert res.status == "failed" and res.meaningful is False
    reason = res.cases[0].reason
    assert "needs a CUDA GPU" in reason and "compiled for sm_90" in reason, reason
