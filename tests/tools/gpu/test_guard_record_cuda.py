"""CUDA C++ launches in the guarded verify's record/replay, without a GPU: a real kernel.py and
.cu (NVRTC compiles the cubin here), the candidate process's real recorder and observer
(guard_record.Recorder wrapping harnesslab_cuda._launch, guard_child's TorchFunctionMode), the
trusted side's schema check (guard_schema.validate) and the replay process's resolution of the
recording into driver launches (replay.Replayer); only the CUDA driver is a fake, the one thing
that needs a GPU. tests/gpu/test_cuda_gpu.py runs the same path on a real one."""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import struct
import types
import uuid
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu.cuda_support import compiler, rmsnorm_gate_cuda, staged

hc = staged("harnesslab_cuda")
cudadrv = staged("cudadrv")
guard_record = staged("guard_record")
guard_child = staged("guard_child")
guard_schema = staged("guard_schema")
replay = staged("replay")

CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "gpu" / "cuda"
REVERSE = r"""extern "C" __global__ void rev(const float* x, float* y, int n) {
  extern __shared__ float s[];  // n floats
  const int t = threadIdx.y * blockDim.x + threadIdx.x, threads = blockDim.x * blockDim.y;
  for (int i = t; i < n; i += threads) s[i] = x[i];
  __syncthreads();
  for (int i = t; i < n; i += threads) y[i] = s[n - 1 - i];
}
"""
REVERSE_PY = """import torch
from harnesslab_cuda import load

K = load("rev.cu", "rev")


def reverse(x):
    y = torch.empty_like(x)
    K[1, (32, 8), 4 * x.numel()](x, y, x.numel())
    return y
"""


class FakeLib:
    """libcuda's launch entry point, counting calls (no GPU here)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> int:
            self.calls.append(name)
            return 0

        return call


def fake_driver() -> Any:
    drv = object.__new__(cudadrv.Driver)
    drv.lib, drv._fns = FakeLib(), {}
    return drv


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(Recorder, Observer, Watch mode class, launches the 'GPU' ran), with every hook the
    recorder installs restored afterwards. The launcher's own `_launch` is replaced by what a
    GPU would do (the driver's launch through cudadrv.Driver, faked) before the recorder wraps
    it, as guard_child wraps the real one."""
    compiler()  # skips without NVRTC
    from triton.backends.nvidia.driver import CudaLauncher  # noqa: PLC0415
    from triton.compiler.compiler import CompiledKernel  # noqa: PLC0415

    monkeypatch.setitem(hc._SETTINGS, "cache_dir", str(tmp_path / "nvrtc-cache"))
    for owner, name in ((CompiledKernel, "_init_handles"), (CudaLauncher, "__call__"),
                        (hc, "_launch"), (cudadrv.Driver, "fn")):  # fmt: skip
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored at teardown
    ran: list[Any] = []
    drv = fake_driver()

    def gpu_launch(ln: Any) -> None:
        ran.append(ln)
        drv.launch(1, ln.grid, ln.block, ln.shared, ln.stream, None)

    monkeypatch.setattr(hc, "_launch", gpu_launch)
    cand = tmp_path / "cand"
    obs = guard_child.Observer(torch, str(cand))
    rec = guard_record.Recorder(obs)
    watch = guard_child._function_mode(torch, obs, types.SimpleNamespace(recorder=rec))
    return rec, obs, watch, ran


def candidate(folder: Path, files: dict[str, str | Path]) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        if isinstance(src, Path):
            shutil.copy(src, folder / name)
        else:
            (folder / name).write_text(src)
    spec = importlib.util.spec_from_file_location(f"cand_{uuid.uuid4().hex}", folder / "kernel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cpu_allocations(rec: Any) -> Any:
    """guard_child's mode records the allocations of CUDA tensors; here they are on the CPU,
    so this stands in for that one branch (the same table, the same recorder call)."""
    from torch.overrides import TorchFunctionMode  # noqa: PLC0415

    class Allocs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            fill = guard_child.ALLOCATORS.get(getattr(func, "__name__", ""))
            if rec.active and fill == "poison" and type(out) is torch.Tensor:
                rec.on_alloc(out, fill, out.dtype)
            return out

    return Allocs()


def record(rec: Any, obs: Any, watch: Any, fn: Any, *args: Any) -> dict[str, Any]:
    """One recorded call, as guard_child.Child.record makes it."""
    rec.begin([a for a in args if isinstance(a, torch.Tensor)])
    obs.reset()
    obs.stream, obs.recording = 0, True
    try:
        with watch(), cpu_allocations(rec):
            out = fn(*args)
    finally:
        obs.recording = False
    return rec.finish(out)


class FakeDriver:
    """What replay.Replayer asks of cudadrv.Driver, written down."""

    def __init__(self, param_sizes: dict[str, list[int]]) -> None:
        self.sizes = param_sizes
        self.loaded: list[tuple[bytes, str, int]] = []
        self.allowed: list[tuple[int, int]] = []
        self.launched: list[dict[str, Any]] = []

    def load_function(self, image: bytes, name: str, shared: int) -> tuple[int, int]:
        self.loaded.append((image, name, shared))
        return 100 + len(self.loaded), len(self.loaded)

    def param_sizes(self, fn: int) -> list[int]:
        return self.sizes[self.loaded[fn - 1][1]]

    def allow_shared(self, fn: int, nbytes: int) -> None:
        self.allowed.append((fn, nbytes))

    def launch(self, fn, grid, block, shared, stream, params, **kw) -> None:
        self.launched.append({"fn": fn, "grid": grid, "block": block, "shared": shared,
                              "stream": stream, "params": params, **kw})  # fmt: skip

    def synchronize(self) -> None:
        pass


def replayed(valid: dict[str, Any], sizes: dict[str, list[int]], base: int = 1 << 40):
    """The validated recording replayed by replay.Replayer on an arena at `base` (fake driver):
    (driver, binding)."""
    rep = object.__new__(replay.Replayer)
    rep.drv, rep.stream = FakeDriver(sizes), 77
    rep.kernels, rep.programs, rep.graphs = {}, {}, {}
    binding, off = {}, 0
    for name, n in valid["sizes"].items():
        binding[name] = ["A", off, n or 4096]  # an input's size is the parent's to choose
        off += (n or 4096) + 256
    rep.arenas = {"A": (base, off)}
    rep.load_kernels(list(valid["kernels"].values()))
    rep.program("p", valid["steps"], [binding])
    rep.run("p", [0])
    return rep.drv, binding


def words(params: Any, sizes: list[int]) -> list[int]:
    """The launch's parameter values as the driver reads them (little-endian, each its size)."""
    out = []
    for i, n in enumerate(sizes):
        raw = ctypes.string_at(params[i], n)
        out.append(int.from_bytes(raw, "little"))
    return out


def test_a_cuda_candidate_is_recorded_and_replayed_with_its_cubin_grid_block_and_arguments(
    recorder, tmp_path: Path
) -> None:
    rec, obs, watch, ran = recorder
    folder = CORPUS / "honest_rows"
    mod = candidate(tmp_path / "cand", {"kernel.py": folder / "kernel.py",
                                        "kernel.cu": folder / "kernel.cu"})  # fmt: skip
    x, gate = torch.randn(3, 300).half(), torch.randn(3, 300).half()
    w = torch.randn(300).half()
    r = record(rec, obs, watch, mod.rmsnorm_gate, x, gate, w, 1e-3)
    assert len(ran) == 1 and r["unsupported"] == []
    assert obs.codes == set() and obs.own_launches == 1  # its own kernel, nothing observed
    (kern,) = r["kernels"]
    (step,) = r["steps"]
    launch = ran[0]
    assert kern["lang"] == "cuda" and kern["name"] == launch.kernel.name
    assert base64_decode(kern["cubin"]) == launch.kernel.compiled.image
    assert base64_decode(kern["cubin"])[:4] == b"\x7fELF"  # a cubin NVRTC made here
    assert step["grid"] == [3, 1, 1] and step["block"] == [256, 1, 1] and step["shared"] == 0
    eps_bits = struct.unpack("<I", struct.pack("<f", 1e-3))[0]
    assert step["params"] == [
        {"k": "ptr", "buf": "in0", "offset": 0}, {"k": "ptr", "buf": "in1", "offset": 0},
        {"k": "ptr", "buf": "in2", "offset": 0}, {"k": "ptr", "buf": "a0", "offset": 0},
        {"k": "scalar", "type": "i32", "value": 300},
        {"k": "scalar", "type": "u32", "value": eps_bits},
    ]  # fmt: skip
    assert r["output"]["buf"] == "a0" and r["allocs"] == [{"nbytes": 3 * 300 * 2}]
    valid = guard_schema.validate(r, 3)
    layout = [8, 8, 8, 8, 4, 4]
    drv, binding = replayed(valid, {kern["name"]: layout})
    assert drv.loaded == [(launch.kernel.compiled.image, kern["name"], 0)]
    (done,) = drv.launched
    assert done["grid"] == (3, 1, 1) and done["block"] == (256, 1, 1) and done["shared"] == 0
    assert done["stream"] == 77
    addr = {name: (1 << 40) + off for name, (_, off, _) in binding.items()}
    assert words(done["params"], layout) == [addr["in0"], addr["in1"], addr["in2"], addr["a0"],
                                             300, eps_bits]  # fmt: skip


@pytest.mark.parametrize("which", ["baseline", "solution"])
def test_the_cuda_rmsnorm_gate_baseline_and_solution_record_cleanly(
    recorder, tmp_path: Path, which: str
) -> None:
    rec, obs, watch, ran = recorder
    spec, files = rmsnorm_gate_cuda(which)
    fn = getattr(candidate(tmp_path / "cand", files), spec.entry_function)
    x, gate = torch.randn(5, 1024).bfloat16(), torch.randn(5, 1024).bfloat16()
    w = torch.randn(1024).bfloat16()
    fn(x, gate, w, 1e-6)  # warm-up (the solution compiles its variant here)
    r = record(rec, obs, watch, fn, x, gate, w, 1e-6)
    assert r["unsupported"] == [] and obs.codes == set() and len(r["steps"]) == 1
    assert r["output"]["buf"] == "a0"
    valid = guard_schema.validate(r, 3)
    step = valid["steps"][0]
    assert [p.get("buf") for p in step["params"][:4]] == ["in0", "in1", "in2", "a0"]
    assert step["block"] == list(ran[-1].block) and step["grid"] == list(ran[-1].grid)


def base64_decode(text: str) -> bytes:
    import base64  # noqa: PLC0415

    return base64.b64decode(text)


def test_a_2d_block_and_dynamic_shared_memory_over_48_kib_are_replayed_as_launched(
    recorder, tmp_path: Path
) -> None:
    rec, obs, watch, _ = recorder
    mod = candidate(tmp_path / "cand", {"kernel.py": REVERSE_PY, "rev.cu": REVERSE})
    x = torch.randn(25_000)
    r = record(rec, obs, watch, mod.reverse, x)
    (step,) = r["steps"]
    assert step["block"] == [32, 8, 1] and step["shared"] == 100_000
    assert r["kernels"][0]["shared"] == 100_000
    drv, _ = replayed(guard_schema.validate(r, 1), {"rev": [8, 8, 4]})
    (done,) = drv.launched
    assert done["block"] == (32, 8, 1) and done["shared"] == 100_000
    assert drv.allowed == [(1, 100_000)]  # opted in past 48 KiB, as harnesslab_cuda._launch does


def test_a_driver_call_around_the_launcher_is_refused_as_unreplayable(
    recorder, tmp_path: Path
) -> None:
    rec, obs, watch, ran = recorder
    mod = candidate(tmp_path / "cand", {"kernel.py": REVERSE_PY, "rev.cu": REVERSE})
    around = fake_driver()

    def sneaky(x):
        y = mod.reverse(x)  # a recorded launch
        around.launch(1, (1, 1, 1), (32, 1, 1), 0, 0, None)  # and one the recorder never sees
        return y

    r = record(rec, obs, watch, sneaky, torch.randn(64))
    assert around.lib.calls == ["cuLaunchKernel"] and len(ran) == 1
    assert r["unsupported"] == ["unrecorded_launch"]
    with pytest.raises(guard_schema.Bad, match="around harnesslab_cuda's launcher") as bad:
        guard_schema.validate(r, 1)
    assert bad.value.code == "unreplayable"
    # the same call without the extra launch: nothing unsupported (the hook's own driver calls)
    assert record(rec, obs, watch, mod.reverse, torch.randn(64))["unsupported"] == []


def test_the_launch_hook_records_only_while_recording_and_a_foreign_source_is_seen(
    recorder, tmp_path: Path
) -> None:
    rec, obs, watch, ran = recorder
    mod = candidate(tmp_path / "elsewhere", {"kernel.py": REVERSE_PY, "rev.cu": REVERSE})
    mod.reverse(torch.randn(64))  # warm-up: runs, not recorded
    assert len(ran) == 1 and rec.steps == []
    r = record(rec, obs, watch, mod.reverse, torch.randn(64))
    assert len(r["steps"]) == 1 and "foreign_kernel" in obs.codes  # not the candidate's folder


def cuda_recording(**step: Any) -> dict[str, Any]:
    kern = {"id": "cu0_k", "name": "k", "cubin": "AA==", "shared": 0, "num_warps": 8,
            "lang": "cuda"}  # fmt: skip
    launch = {"op": "launch", "kernel": "cu0_k", "grid": [1, 1, 1], "params": [], **step}
    return {"kernels": [kern], "allocs": [], "steps": [launch], "output": None}


@pytest.mark.parametrize(
    "step",
    [{}, {"block": [256, 1, 1]}, {"block": [1024, 2, 1], "shared": 0},
     {"block": [256, 1], "shared": 0}, {"block": [256, 1, 1], "shared": -1},
     {"block": [0, 1, 1], "shared": 0}, {"block": [256, 1, 1], "shared": 1.5}],
)  # fmt: skip
def test_a_cuda_launch_without_a_well_formed_block_and_shared_memory_is_forged(step) -> None:
    with pytest.raises(guard_schema.Bad) as bad:
        guard_schema.validate(cuda_recording(**step), 0)
    assert bad.value.code == "forged_recording"


def test_a_cuda_launch_is_replayed_with_its_own_block_a_triton_launch_with_its_kernels() -> None:
    drv, _ = replayed(
        guard_schema.validate(cuda_recording(block=[16, 4, 2], shared=96), 0), {"k": []}
    )
    assert drv.launched[0]["block"] == (16, 4, 2) and drv.launched[0]["shared"] == 96
    r = cuda_recording(block=[1024, 1, 1], shared=0)
    del r["kernels"][0]["lang"]  # a Triton kernel's entry
    r["kernels"][0]["shared"] = 4096
    valid = guard_schema.validate(r, 0)
    assert "block" not in valid["steps"][0]
    drv, _ = replayed(valid, {"k": []})
    assert drv.launched[0]["block"] == 256 and drv.launched[0]["shared"] == 4096
