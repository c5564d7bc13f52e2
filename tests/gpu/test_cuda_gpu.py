"""CUDA C++ through harnesslab_cuda on a real GPU (tests/gpu/conftest.py marks these gpu and skips
them without one): each task's CUDA baseline (at several launch configs) and CUDA reference
solution match the task's reference on the dev cases, irregular widths, empty batches, unaligned
views and every probe; the launcher's checks against the driver (parameter sizes, dynamic shared
memory over 48 KiB, 2-D blocks, torch's current stream); and the guarded verify (its recorder
wraps harnesslab_cuda._launch, the replay runs the recorded cubins) of the CUDA baseline and
solution and of the CUDA cheat corpus. benchmarks/cuda_gpu.py times the same kernels."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import uuid
from importlib import resources
from pathlib import Path

import anyio
import pytest
import torch

from harnesslab.tests.tasks.kernel_check import load_reference
from harnesslab.tests.tools.gpu.cuda_support import compiler, staged
from harnesslab.tools.task.spec import TaskSpec, load_task

TASKS = ["rmsnorm_gate", "softmax", "swiglu"]
# (rows, dim): ragged widths (no vector width divides 1001), widths past the register paths,
# single rows and empty batches.
IRREGULAR = {
    "rmsnorm_gate": [(3, 1000), (5, 1001), (3, 3000), (2, 5120), (7, 8192), (1, 4096), (0, 4096),
                     (3, 20000), (2, 65536), (33, 1024), (9, 2)],
    "softmax": [(7, 1000), (3, 1001), (3, 3000), (2, 32768), (2, 40000), (2, 65536), (2, 100000),
                (5, 1), (0, 1024), (33, 1024), (9, 8)],
    "swiglu": [(3, 1000), (5, 1001), (5, 3000), (2, 14336), (1, 7), (0, 4096), (3, 3)],
}  # fmt: skip
BASELINE_CONFIGS = [{"block_size": 64, "vec": 1}, {"block_size": 1024, "vec": 8},
                    {"block_size": 128, "vec": 4}]  # fmt: skip
CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "gpu" / "cuda"
PLANS = Path(__file__).resolve().parents[2] / "benchmarks/variants/rmsnorm_gate_cuda_plans/plans.py"


def import_path(path: Path):
    spec = importlib.util.spec_from_file_location(f"cuda_{uuid.uuid4().hex}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def candidates(spec: TaskSpec, tmp: Path) -> dict[str, Path]:
    """label -> kernel.py: the CUDA baseline at its own config and at BASELINE_CONFIGS, and the
    CUDA solutions."""
    out = {"baseline": spec.workspace_template / "kernel.py"}
    own = json.loads((spec.workspace_template / "kernel_config.json").read_text())
    for n, cfg in enumerate(BASELINE_CONFIGS):
        folder = tmp / f"baseline{n}"
        shutil.copytree(spec.workspace_template, folder)
        (folder / "kernel_config.json").write_text(json.dumps({**own, **cfg}))
        out[f"baseline {cfg}"] = folder / "kernel.py"
    return {**out, **spec.solutions("cuda")}


def unaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values, contiguous, starting 2 bytes past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    view = buf[1 : 1 + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def check(ref, fn, args, kwargs, tol, what: str) -> None:
    saved = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    expected = ref.reference(*args, **kwargs)
    shape, dtype = ref.output_spec(*args, **kwargs)
    assert (tuple(out.shape), out.dtype) == (tuple(shape), dtype), what
    assert bool(out.isfinite().all()), f"{what}: NaN/Inf"
    err = (out.float() - expected).abs() / (tol["atol"] + tol["rtol"] * expected.abs())
    assert out.numel() == 0 or err.max().item() <= 1.0, f"{what}: {err.max().item():.2f}x tol"
    for a, s in zip(args, saved, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, s), f"{what}: an input changed"


def check_everywhere(spec: TaskSpec, ref, fn, label: str, more=()) -> None:
    """fn against the reference on the dev cases, IRREGULAR (and `more` (rows, dim)), each
    small one again at unaligned pointers, and every probe, in each dtype."""
    for dtype_name, t in spec.tolerances.items():
        tol, dtype = t.model_dump(), getattr(torch, dtype_name)
        shapes = [c.shape for c in spec.dev_cases if c.dtype == dtype_name]
        shapes += [{"rows": r, "dim": d} for r, d in (*IRREGULAR[spec.name], *more)]
        for shape in shapes:
            gen = torch.Generator(device="cuda").manual_seed(0)
            args, kwargs = ref.make_inputs(shape, dtype, "cuda", gen)
            check(ref, fn, args, kwargs, tol, f"{label} {dtype_name} {shape}")
            if shape["rows"] and shape["rows"] * shape["dim"] <= 1 << 22:
                moved = tuple(unaligned(a) if isinstance(a, torch.Tensor) else a for a in args)
                check(ref, fn, moved, kwargs, tol, f"{label} {dtype_name} {shape} unaligned")
        for name, probe in ref.PROBES.items():
            args, kwargs = probe(dtype, "cuda", torch.Generator().manual_seed(1))
            check(ref, fn, args, kwargs, tol, f"{label} {dtype_name} probe {name}")


@pytest.mark.parametrize("task", TASKS)
def test_cuda_kernels_match_the_reference_everywhere(task: str, tmp_path: Path) -> None:
    compiler()
    spec = load_task(task).for_language("cuda")
    ref = load_reference(spec)
    for label, path in candidates(spec, tmp_path).items():
        check_everywhere(spec, ref, getattr(import_path(path), spec.entry_function), label)


def test_every_plan_variant_of_the_cuda_rmsnorm_gate_solution_matches_the_reference() -> None:
    """The plans benchmarks/rmsnorm_cuda_variants_gpu.py times (cache hints, load order, launch
    bounds, threads per row, persistent rows): any of them may ship. HarnessGym's final shapes
    too, and 4096 rows of 8192 (a persistent block takes ~31 rows)."""
    compiler()
    staged("harnesslab_cuda")  # the solution imports it by plain name
    plans = import_path(PLANS)
    spec = load_task("rmsnorm_gate").for_language("cuda")
    ref = load_reference(spec)
    more = ((1536, 1024), (896, 2048), (448, 4096), (192, 8192), (4096, 8192), (512, 3000))
    for name in plans.VARIANTS:
        check_everywhere(spec, ref, plans.variant_module(name).rmsnorm_gate, name, more)


def launcher_kernel(tmp_path: Path, src: str, name: str, **kw):
    (tmp_path / "k.cu").write_text(src)
    (tmp_path / "k.py").write_text(
        "from harnesslab_cuda import load\n\n\ndef go(name, **kw):\n    return load('k.cu', name, **kw)\n"
    )
    return import_path(tmp_path / "k.py").go(name, **kw)


def test_the_driver_parameter_sizes_are_checked_against_the_declaration(tmp_path: Path) -> None:
    hc = staged("harnesslab_cuda")
    src = 'extern "C" __global__ void k(float* y, float s, int n) { if (n) y[0] = s; }\n'
    k = launcher_kernel(tmp_path, src, "k", signature="ptr, i64, i32")
    with pytest.raises(hc.LaunchError, match="parameter sizes are"):
        k[1, 1](torch.empty(1, device="cuda"), 3, 1)


def test_dynamic_shared_memory_over_48_kib_2d_blocks_and_the_current_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hc = staged("harnesslab_cuda")
    src = """extern "C" __global__ void rev(const float* x, float* y, int n) {
  extern __shared__ float s[];  // n floats
  const int t = threadIdx.y * blockDim.x + threadIdx.x, threads = blockDim.x * blockDim.y;
  for (int i = t; i < n; i += threads) s[i] = x[i];
  __syncthreads();
  for (int i = t; i < n; i += threads) y[i] = s[n - 1 - i];
}
"""
    k = launcher_kernel(tmp_path, src, "rev")
    n = 25_000  # 100 KB of shared memory
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    streams: list[int] = []
    original = hc._launch
    monkeypatch.setattr(hc, "_launch", lambda ln: (streams.append(ln.stream), original(ln)))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        k[1, (32, 8), 4 * n](x, y, n)
    side.synchronize()
    assert streams == [side.cuda_stream]
    assert torch.equal(y, x.flip(0))


def verify(ws, settings, **kw):
    from harnesslab.tools.execution.launcher import Launcher  # noqa: PLC0415
    from harnesslab.tools.integrity.verify import guarded_verify  # noqa: PLC0415

    async def go():
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(600):
                return await guarded_verify(ws, launcher, settings, **kw)
        finally:
            await launcher.aclose()

    return anyio.run(go)


@pytest.mark.parametrize("which", ["baseline", "solution"])
def test_the_cuda_rmsnorm_gate_passes_the_guarded_verify_five_times(tmp_path, which) -> None:
    from harnesslab.tools.settings import Settings  # noqa: PLC0415
    from harnesslab.tools.state.workspace import init_workspace  # noqa: PLC0415

    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings, language="cuda")
    if which == "solution":
        sol = ws.task.solutions()["cuda_rmsnorm_gate"]
        (ws.root / "kernel.py").write_text(
            sol.read_text().replace("cuda_rmsnorm_gate.cu", "kernel.cu")
        )
        shutil.copy(sol.with_suffix(".cu"), ws.root / "kernel.cu")
    for _ in range(5):
        v = verify(ws, settings)
        assert v.verdict == "passed" and v.certifies == "correctness_and_speed", v.reasons


def expectation(folder: Path) -> dict[str, str]:
    doc = ast.get_docstring(ast.parse((folder / "kernel.py").read_text())) or ""
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in doc.splitlines())}


def runs(exp: dict[str, str]) -> bool:
    """Whether the cheat's own code runs on the GPU (one the scan refuses, or that does not
    import, never meets an incumbent: no twin verify for it)."""
    return exp.get("static") == "pass" and exp.get("gpu") != "import_failed"


@pytest.mark.parametrize(
    "folder",
    sorted(p for p in CORPUS.iterdir() if (p / "kernel.py").is_file()),
    ids=lambda p: p.name,
)
def test_the_cuda_cheat_corpus_on_the_guarded_verify(tmp_path: Path, folder: Path) -> None:
    from harnesslab.tools.settings import Settings  # noqa: PLC0415
    from harnesslab.tools.state.workspace import init_workspace  # noqa: PLC0415

    exp = expectation(folder)
    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings, language="cuda")
    if "twin" in exp and runs(exp):  # the honest twin becomes the incumbent
        for f in ("kernel.py", "kernel.cu"):
            shutil.copy(CORPUS / exp["twin"] / f, ws.root / f)
        assert verify(ws, settings).verdict == "passed"
    for f in ("kernel.py", "kernel.cu"):
        shutil.copy(folder / f, ws.root / f)
    for key, enforce in (("gpu", True), ("runtime", False)):  # runtime: the scan not enforced
        if key not in exp:
            continue
        want = exp[key].split("|")
        v = verify(ws, settings, enforce_scan=enforce)
        if want == ["pass"] or (v.verdict == "passed" and "harmless" in want):
            assert v.verdict == "passed", (key, v.reasons)
        else:
            got = {r["code"] for r in v.reasons}
            assert v.verdict == "rejected" and got & set(want), (key, v.reasons)
