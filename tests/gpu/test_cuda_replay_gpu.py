"""The CUDA C++ record/replay path on a GPU, without the sandbox and the verify around it: a
candidate's launches through harnesslab_cuda recorded by the real recorder and observer
(guard_record, guard_child), checked by guard_schema.validate, and replayed by replay.Replayer in
this process on a buffer laid out here; the replayed output must equal the candidate's own,
bit for bit. When tests/gpu/test_cuda_gpu.py's guarded verify of a CUDA candidate fails, this
says whether the recording and the replay are at fault or the machinery around them."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu.cuda_support import compiler, rmsnorm_gate_cuda, staged
from harnesslab.tests.tools.gpu.test_guard_record_cuda import CORPUS, REVERSE, REVERSE_PY, candidate

hc = staged("harnesslab_cuda")
cudadrv = staged("cudadrv")
guard_record = staged("guard_record")
guard_child = staged("guard_child")
guard_schema = staged("guard_schema")
replay = staged("replay")
ALIGN = 256


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    compiler()
    from triton.backends.nvidia.driver import CudaLauncher  # noqa: PLC0415
    from triton.compiler.compiler import CompiledKernel  # noqa: PLC0415

    monkeypatch.setitem(hc._SETTINGS, "cache_dir", str(tmp_path / "nvrtc-cache"))
    for owner, name in ((CompiledKernel, "_init_handles"), (CudaLauncher, "__call__"),
                        (hc, "_launch"), (cudadrv.Driver, "fn")):  # fmt: skip
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored at teardown
    obs = guard_child.Observer(torch, str(tmp_path / "cand"))
    rec = guard_record.Recorder(obs)
    watch = guard_child._function_mode(torch, obs, types.SimpleNamespace(recorder=rec))
    return rec, obs, watch


def record(rec: Any, obs: Any, watch: Any, fn: Any, *args: Any) -> tuple[dict[str, Any], Any]:
    fn(*args)  # warm-up, as guard_child's record op does
    torch.cuda.synchronize()
    rec.begin([a for a in args if isinstance(a, torch.Tensor)])
    obs.reset()
    obs.stream, obs.recording = torch.cuda.current_stream().cuda_stream, True
    try:
        with watch():
            out = fn(*args)
        torch.cuda.synchronize()
    finally:
        obs.recording = False
    return rec.finish(out), out


def replayed(valid: dict[str, Any], inputs: list[torch.Tensor]) -> torch.Tensor:
    """The validated recording replayed by replay.Replayer on one buffer: inputs copied in,
    everything else NaN-poisoned (0xFF), the output read back from where the recording says."""
    sizes = {name: (inputs[int(name[2:])].numel() * inputs[int(name[2:])].element_size()
                    if name.startswith("in") else n) for name, n in valid["sizes"].items()}  # fmt: skip
    where, off = {}, 0
    for name, n in sizes.items():
        where[name] = off
        off += (max(n, 1) + ALIGN - 1) // ALIGN * ALIGN + ALIGN
    arena = torch.full((off,), 0xFF, dtype=torch.uint8, device="cuda")
    for i, t in enumerate(inputs):
        n = sizes[f"in{i}"]
        arena[where[f"in{i}"] : where[f"in{i}"] + n].view(t.dtype).copy_(t.reshape(-1))
    torch.cuda.synchronize()
    rep = replay.Replayer()
    rep.arenas["A"] = (arena.data_ptr(), off)
    rep.load_kernels(list(valid["kernels"].values()))
    rep.program("p", valid["steps"], [{k: ["A", where[k], n] for k, n in sizes.items()}])
    rep.run("p", [0])
    o = valid["output"]
    dtype = getattr(torch, o["dtype"])
    start = where[o["buf"]] + o["offset"]
    raw = arena[start : start + sizes[o["buf"]] - o["offset"]]
    return (
        raw[: raw.numel() // dtype.itemsize * dtype.itemsize]
        .view(dtype)
        .as_strided(o["shape"], o["strides"])
    )


def check(rec, obs, watch, fn, *args) -> dict[str, Any]:
    r, out = record(rec, obs, watch, fn, *args)
    assert r["unsupported"] == [] and obs.codes == set() and obs.own_launches >= 1, (r, obs.codes)
    valid = guard_schema.validate(r, sum(isinstance(a, torch.Tensor) for a in args))
    again = replayed(valid, [a for a in args if isinstance(a, torch.Tensor)])
    assert torch.equal(again, out)
    return r


def test_the_honest_rows_kernel_replays_to_the_candidates_own_output(recorder, tmp_path) -> None:
    folder = CORPUS / "honest_rows"
    mod = candidate(tmp_path / "cand", {"kernel.py": folder / "kernel.py",
                                        "kernel.cu": folder / "kernel.cu"})  # fmt: skip
    x, gate = (torch.randn(7, 3000, device="cuda").half() for _ in range(2))
    w = torch.randn(3000, device="cuda").half()
    check(*recorder, mod.rmsnorm_gate, x, gate, w, 1e-5)


def test_a_2d_block_with_100_kb_of_shared_memory_replays(recorder, tmp_path) -> None:
    mod = candidate(tmp_path / "cand", {"kernel.py": REVERSE_PY, "rev.cu": REVERSE})
    r = check(*recorder, mod.reverse, torch.randn(25_000, device="cuda"))
    assert r["steps"][0]["block"] == [32, 8, 1] and r["steps"][0]["shared"] == 100_000


@pytest.mark.parametrize("which", ["baseline", "solution"])
def test_the_rmsnorm_gate_cuda_baseline_and_solution_replay(recorder, tmp_path, which) -> None:
    spec, files = rmsnorm_gate_cuda(which)
    fn = getattr(candidate(tmp_path / "cand", files), spec.entry_function)
    for rows, dim in ((5, 1024), (3, 1001), (2, 8192)):
        x, gate = (torch.randn(rows, dim, device="cuda").bfloat16() for _ in range(2))
        check(*recorder, fn, x, gate, torch.randn(dim, device="cuda").bfloat16(), 1e-6)
