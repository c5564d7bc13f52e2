"""CUDA inside the sandbox as the toolkit starts it: its limits (memory and pids by a cgroup, or
none on a GPU host without one: never RLIMIT_AS/RLIMIT_DATA, which count the address space CUDA
reserves), /sys narrowed to what the CUDA driver and NVML read, a minimal PATH. A torch CUDA op
and a compiled Triton kernel must run; a memory bomb on the host side must still end at the
limit where a cgroup holds it.

    python -m pytest -q tests/gpu/test_sandbox_cuda.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.gpu.isolation import sandbox_policy as sp

CUDA_WORK = """
import json, torch, triton, triton.language as tl

@triton.jit
def _double(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
_double[(1 << 10,)](x, x.numel(), BLOCK=1024)
torch.cuda.synchronize()
ok = bool((x[:5].cpu() == torch.tensor([0.0, 2.0, 4.0, 6.0, 8.0])).all())
print(json.dumps({"ok": ok, "device": torch.cuda.get_device_name()}))
"""


def run(
    code: str, tmp_path: Path, **limits
) -> tuple[subprocess.CompletedProcess[str], dict, dict | None]:
    roots = sp.import_roots()
    src = tmp_path / "src"  # a file, not -c: Triton's jit reads its kernels' source
    src.mkdir()
    (src / "work.py").write_text(code)
    policy = sp.Policy(
        read=[str(src)],
        scratch_root=str(tmp_path / "scratch"),
        require=True,
        env_allow=["CUDA_VISIBLE_DEVICES"],
        limits=sp.Limits(**limits),
        **sp.python_policy(roots),
    )
    launch = sp.command(
        sys.executable, sandbox.__file__, policy,
        sp.python_argv(sys.executable, [str(src / "work.py")]),
    )  # fmt: skip
    proc = subprocess.run(launch.argv, input=launch.stdin.decode(), capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    start, end, _ = sp.take_reports(proc.stdout, launch.token)
    return proc, start, end


def test_cuda_and_a_triton_kernel_run_under_the_sandboxs_limits(tmp_path: Path) -> None:
    proc, start, end = run(CUDA_WORK, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"ok": true' in proc.stdout, proc.stdout + proc.stderr[-2000:]
    by = start["limits"]["by"]
    assert by["memory"] in ("cgroup-v1", "cgroup-v2", "none")  # never an rlimit with a GPU
    assert end is not None and end["limits_hit"] == []
    print(start["limits"])  # what enforced each limit on this host (for BENCHMARKS.md)


def test_a_host_memory_bomb_next_to_cuda_ends_at_the_memory_limit(tmp_path: Path) -> None:
    if sandbox.probe()["cgroup"] == "none":
        pytest.skip("no cgroup here: on a GPU host memory is then unlimited (reported as none)")
    bomb = CUDA_WORK + "\nheld = []\nwhile True:\n    held.append(bytearray(256 << 20))\n"
    proc, _, end = run(bomb, tmp_path, memory_mb=4096)
    assert '"ok": true' in proc.stdout, proc.stderr[-3000:]
    assert end is not None and end["limits_hit"] == ["memory"], (end, proc.stderr[-2000:])
