"""Guarded verify, GPU part (parent side): timing samples that are checked, the profiler's
kernel list, clocks. Staged beside guard.py and runner.py; standard library, torch, triton.

Timing follows runner.py's protocol (CUDA-graph replay of back-to-back calls over input sets
that together exceed 2.5x the L2, whole device synchronised inside the window) with what a
final verdict needs on top: before every sample the shared input buffers are refilled from a
pool (their own pristine contents plus one more set) in a random order, so a result cached by
address goes stale; the child poisons every output with NaN before the sample; after it, every
call's output is compared here, with a fused Triton kernel, against the expected values of the
set its buffer held. The parent's wall clock around each sample, less the same request with an
empty window, bounds what the child may claim; both sides busy-wait around a sample (an empty
request wakes the child first), so no CPU wake-up latency lands in that wall clock.
"""

from __future__ import annotations

import statistics
from typing import Any

ALLOWED_HELPERS = ("memset", "fill", "Memset")  # kernel names a wrapper may add (zeroing)
SAMPLES = 16  # timed samples per child and case (runner.py's plain eval takes 30)
MAX_CALLS = 512  # calls per sample (one CUDA graph), bounded so slots fit in memory


def time_samples(run, sets, extra, spec, tol, device_us: float, load_codes) -> dict[str, Any]:
    """CUDA-graph samples in each child over the shared buffers, refilled from a pool of
    sets (the buffers' own pristine contents plus one more) in a random order before every
    sample; every call's output is checked here."""
    torch, kids, dev = run.torch, run.kids, run.env.device  # "cuda" (tests: the interpreter)
    n_sets = len(sets)
    calls = max(n_sets, min(MAX_CALLS, int(-(-1000.0 // max(device_us, 1.0)))))
    calls = min(-(-calls // n_sets) * n_sets, max(n_sets, (2 << 30) // _nbytes(torch, spec)))
    pool = [(s[2], s[3]) for s in [*sets, extra]]
    slots = {k.role: torch.empty((calls, *spec[0]), dtype=spec[1], device=dev) for k in kids}
    out: dict[str, Any] = {}
    for kid in kids:
        kid.ask("slots", slots[kid.role])
        reply, _ = kid.ask("capture", calls, n_sets)
        out[kid.role] = {
            "method": reply.get("method"),
            "capture_error": reply.get("error"),
            "samples_us": [],
            "parent_wall_us": [],
            "wake_wall_us": [],  # evidence: the empty request just before each sample
            "bad_calls": 0,
            "checked_calls": 0,
            "calls_per_sample": calls,
            "input_sets": n_sets,
            "codes": load_codes(reply),
        }
    # The cost of a sample request with an empty window: what the wall clock may add.
    spin = dev == "cuda"  # busy-waiting only where wall clocks are compared (a GPU)
    overhead = {
        k.role: statistics.median(k.ask("replay", True, spin=spin)[1] for _ in range(5))
        for k in kids
    }
    bad = torch.zeros(calls, dtype=torch.int32, device=dev)
    for s in range(SAMPLES + 1):  # sample 0 of each child is a warm-up (still checked)
        for kid in kids[:: 1 if s % 2 == 0 else -1]:
            perm = run.rng.sample(range(len(pool)), n_sets)
            for j, p in enumerate(perm):  # refill: a cache keyed on addresses goes stale
                for buf, src in zip(sets[j][0], pool[p][0], strict=True):
                    if isinstance(buf, torch.Tensor):
                        buf.copy_(src)
            run.env.sync()
            _, wake_us = kid.ask("replay", True, spin=spin)  # wakes the child; not timed
            timed, wall_us = kid.ask("replay", spin=spin)
            reply, _ = kid.ask("collect")
            bad.zero_()
            for k in range(calls):
                _count_bad(slots[kid.role][k], pool[perm[k % n_sets]][1], tol, bad[k : k + 1])
            rec = out[kid.role]
            rec["bad_calls"] += int((bad > 0).sum()) + calls - int(reply.get("copied", 0))
            rec["checked_calls"] += calls
            rec["codes"] += load_codes(reply)
            if int(reply.get("distinct", calls)) < calls:
                rec["codes"].append(
                    [
                        "output_reused",
                        f"{reply.get('distinct')} distinct outputs for {calls} calls in one sample",
                    ]
                )
            if s > 0:
                rec["samples_us"].append(float(timed.get("us", 0.0)) / calls)
                rec["parent_wall_us"].append(wall_us - overhead[kid.role])
                rec["wake_wall_us"].append(wake_us)
    for j, s in enumerate(sets):  # leave the buffers as the check calls saw them
        for buf, src in zip(s[0], pool[j][0], strict=True):
            if isinstance(buf, torch.Tensor):
                buf.copy_(src)
    for role, rec in out.items():
        rec["overhead_us"] = overhead[role]
    return out


def kernel_list(kernels: Any, names: set[str]) -> dict[str, Any]:
    """The profiler's kernels for one call: only kernel.py's Triton kernels and fills."""
    kernels = [k for k in kernels or [] if isinstance(k, list) and len(k) == 3]
    foreign = sorted(
        {
            str(n)
            for n, _, _ in kernels
            if not any(str(n).startswith(m) for m in names)
            and not any(h in str(n) for h in ALLOWED_HELPERS)
        }
    )
    host = sorted({str(n) for n, _, _ in kernels if "HtoD" in str(n) or "DtoH" in str(n)})
    streams = sorted({int(s) for _, s, _ in kernels})
    codes = []
    if foreign:
        codes.append(["foreign_kernel", f"kernels not from kernel.py ran: {foreign[:6]}"])
    if host:
        codes.append(["host_compute", f"host transfers during the call: {host[:4]}"])
    if len(streams) > 1:
        codes.append(["side_stream", f"kernels ran on {len(streams)} streams"])
    device_us = sum(float(t or 0) for _, _, t in kernels)
    return {
        "kernels": [str(k[0])[:80] for k in kernels][:20],
        "streams": streams,
        "codes": codes,
        "device_us": device_us,
    }


def _nbytes(torch, spec) -> int:
    numel = 1
    for d in spec[0]:
        numel *= int(d)
    return max(1, numel * torch.finfo(spec[1]).bits // 8)


def _count_bad(out, expected, tol, counter) -> None:
    """counter += number of elements of `out` outside tolerance of `expected` (NaN/Inf count)."""
    import triton

    n = out.numel()
    _bad_kernel()[(triton.cdiv(n, 4096),)](
        out, expected, counter, n, float(tol["atol"]), float(tol["rtol"]), BLOCK=4096
    )


_KERNEL: list[Any] = []


def _bad_kernel():
    if not _KERNEL:
        import triton
        import triton.language as tl

        @triton.jit
        def count_bad(out_ptr, exp_ptr, counter_ptr, n, atol, rtol, BLOCK: tl.constexpr):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            o = tl.load(out_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            e = tl.load(exp_ptr + offs, mask=mask, other=0.0)
            d = tl.abs(o - e)
            bad = ((d > atol + rtol * tl.abs(e)) | (d != d)) & mask
            tl.atomic_add(counter_ptr, tl.sum(bad.to(tl.int32), axis=0))

        _KERNEL.append(count_bad)
    return _KERNEL[0]


def clocks() -> dict[str, str]:
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if not exe:
        return {}
    fields = "clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,pstate"
    try:
        line = (
            subprocess.run(
                [exe, f"--query-gpu={fields}", "--format=csv,noheader", "-i", "0"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    return dict(zip(fields.split(","), (v.strip() for v in line.split(",")), strict=False))
