"""profile_kernel's library half: Nsight Compute on one dev case on the GPU host.

The runner's `profile_target` mode calls the candidate `repeats` times between
cudaProfilerStart/Stop after warm-up calls, so `ncu --profile-from-start off` sees only the
candidate's steady-state launches (no compile, no reference, no input generation). ncu writes
CSV into a log file on the executor; it is read back, parsed into compact metrics per kernel and
a one-line bottleneck classification. `--clock-control none` keeps the GPU's normal boost
clocks, so durations match what run_objective measures.

On a step task (decode_step) it is a per-kernel time breakdown of one decode step instead
(`profile_step`): the runner's step_profile mode (tools/gpu/step_profile.py) profiles a dev
trace's last steps with torch.profiler after the earlier ones warmed up, and the report names the
kernel that dominates the step. On the CPU the interpreter's breakdown has the result's shape
only (meaningful is false): torch's operators, no interpreted Triton kernel among them.
"""

from __future__ import annotations

import statistics
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import EnvironmentProblem, UsageError
from ..execution import Executor, Launcher
from ..gpu.ncu import NCU_METRICS, parse_ncu_csv
from ..progress import Progress, report
from ..state import Workspace
from ..task import kind_of
from .request import kernel_request

_FIND_NCU = (
    "command -v ncu || for p in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; "
    'do [ -x "$p" ] && echo "$p" && break; done'
)
# Below this a launch is dominated by fixed costs (launch latency, ramp-up, tail): the fix is
# fewer, bigger launches, not faster memory access. ~5 us is a few launch latencies on an H100.
LAUNCH_BOUND_US = 5.0
HIGH_PCT = 60.0
# To us and GB/s. ncu 2025.3 with --print-units base writes "ns" and "byte/s"; older versions
# spell units out ("nsecond", "byte/second").
_SCALE = {
    **dict.fromkeys(("ns", "nsecond"), 1e-3),
    **dict.fromkeys(("us", "usecond"), 1.0),
    **dict.fromkeys(("ms", "msecond"), 1e3),
    **dict.fromkeys(("s", "second"), 1e6),
    **dict.fromkeys(("byte/s", "byte/second"), 1e-9),
    **dict.fromkeys(("Kbyte/s", "Kbyte/second"), 1e-6),
    **dict.fromkeys(("Mbyte/s", "Mbyte/second"), 1e-3),
    **dict.fromkeys(("Gbyte/s", "Gbyte/second"), 1.0),
    **dict.fromkeys(("Tbyte/s", "Tbyte/second"), 1e3),
}


class KernelProfile(BaseModel):
    kernel: str
    launches: int
    duration_us: float | None = Field(description="median gpu__time_duration per launch")
    dram_throughput_pct: float | None = None
    achieved_gbps: float | None = Field(default=None, description="DRAM bytes per second")
    sm_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    registers_per_thread: float | None = None
    occupancy_limit_registers: float | None = Field(
        default=None, description="blocks per SM allowed by the register use"
    )
    local_memory_instructions: float | None = Field(
        default=None, description="local loads+stores executed: register spills if > 0"
    )
    grid_size: float | None = None
    block_size: float | None = None
    total_us: float | None = Field(
        default=None, description="a step task's profile: this kernel's device time per step"
    )
    share_pct: float | None = Field(
        default=None, description="a step task's profile: its share of the step's time"
    )


class ProfileReport(BaseModel):
    case: str
    host: str
    bottleneck: str = Field(description="one-line classification with the numbers behind it")
    main: KernelProfile = Field(description="the kernel with the largest total time")
    others: list[KernelProfile] = Field(default_factory=list)
    metrics: list[str] = Field(default=list(NCU_METRICS), description="ncu metrics collected")
    profiler: Literal["ncu", "torch.profiler"] = Field(
        default="ncu", description="ncu on one kernel case; torch.profiler on a decode step"
    )
    meaningful: bool = Field(
        default=True, description="false on the CPU interpreter: the breakdown's shape only"
    )
    step_us: float | None = Field(
        default=None, description="a step task's profile: the profiled time per step"
    )
    context: int | None = Field(
        default=None,
        description="a step task's profile: the longest context a profiled step attended",
    )


def _metric(launch: dict[str, Any], name: str, scaled: bool = False) -> float | None:
    value, unit = launch["metrics"].get(name, (None, ""))
    if value is None:
        return None
    return value * _SCALE.get(unit, 1.0) if scaled else value


def summarize(launches: list[dict[str, Any]]) -> list[KernelProfile]:
    """Per kernel name, the median of each metric over its launches; biggest total time first."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for launch in launches:
        by_name.setdefault(launch["kernel"], []).append(launch)

    def med(group: list[dict[str, Any]], name: str, scaled: bool = False) -> float | None:
        values = [v for g in group if (v := _metric(g, name, scaled)) is not None]
        return statistics.median(values) if values else None

    out = []
    for name, group in by_name.items():
        ld = med(group, "smsp__sass_inst_executed_op_local_ld.sum")
        st = med(group, "smsp__sass_inst_executed_op_local_st.sum")
        out.append(
            KernelProfile(
                kernel=name[:200],
                launches=len(group),
                duration_us=med(group, "gpu__time_duration.sum", True),
                dram_throughput_pct=med(
                    group, "dram__throughput.avg.pct_of_peak_sustained_elapsed"
                ),
                achieved_gbps=med(group, "dram__bytes.sum.per_second", True),
                sm_throughput_pct=med(group, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                achieved_occupancy_pct=med(
                    group, "sm__warps_active.avg.pct_of_peak_sustained_active"
                ),
                theoretical_occupancy_pct=med(group, "sm__maximum_warps_per_active_cycle_pct"),
                registers_per_thread=med(group, "launch__registers_per_thread"),
                occupancy_limit_registers=med(group, "launch__occupancy_limit_registers"),
                local_memory_instructions=None
                if ld is None and st is None
                else (ld or 0) + (st or 0),
                grid_size=med(group, "launch__grid_size"),
                block_size=med(group, "launch__block_size"),
            )
        )
    out.sort(key=lambda k: -(k.duration_us or 0.0) * k.launches)
    return out


def classify(k: KernelProfile) -> str:
    """One line: what bounds this kernel, with the numbers, and what to try."""

    def f(x: float | None, fmt: str = "{:.0f}") -> str:
        return "?" if x is None else fmt.format(x)

    dram, sm, occ = k.dram_throughput_pct, k.sm_throughput_pct, k.achieved_occupancy_pct
    numbers = (
        f"{f(k.duration_us, '{:.2f}')} us, DRAM {f(dram)}% of peak ({f(k.achieved_gbps)} GB/s), "
        f"SM {f(sm)}%, occupancy {f(occ)}%, {f(k.registers_per_thread)} regs/thread"
    )
    if k.duration_us is not None and k.duration_us < LAUNCH_BOUND_US:
        line = (
            f"launch-bound: {numbers}; the kernel is too short for its fixed costs: more work "
            "per program (rows_per_program) or fewer launches"
        )
    elif dram is not None and dram >= HIGH_PCT:
        line = (
            f"memory-bound: {numbers}; near the DRAM roofline: only fewer bytes moved helps "
            "(fuse, avoid re-reads, keep stores coalesced)"
        )
    elif sm is not None and sm >= HIGH_PCT:
        line = f"compute-bound: {numbers}; cut instructions per element (fp32 math, cheap sigmoid)"
    else:
        line = (
            f"latency/occupancy-bound: {numbers}; neither DRAM nor SM is busy: more bytes in "
            "flight (more warps or rows per program, wider loads) or fewer registers"
        )
    if k.local_memory_instructions:
        line += f"; {k.local_memory_instructions:.0f} local-memory instructions: registers spill"
    return line


async def find_ncu(executor: Executor) -> str:
    res = await executor.run(["sh", "-c", _FIND_NCU], timeout_s=30)
    path = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
    if not path:
        raise EnvironmentProblem(
            f"ncu not found on {executor.host}.",
            next_step="install Nsight Compute on the GPU host (it ships with the CUDA toolkit as "
            "/usr/local/cuda/bin/ncu) or put ncu on PATH; meanwhile use run_objective timings",
        )
    return path


async def profile_kernel(
    ws: Workspace,
    launcher: Launcher,
    *,
    case: str | None = None,
    repeats: int = 3,
    progress: Progress | None = None,
) -> ProfileReport:
    """Profile the workspace's candidate on the dev case `case` (None: the kind's default) with
    the task kind's profiler (PROFILE_BY_KIND)."""
    kind = kind_of(ws.task)
    kind.require_runner(ws.task, "profile_kernel")
    profile = PROFILE_BY_KIND[kind.name]
    return await profile(ws, launcher, case=case, repeats=repeats, progress=progress)


async def profile_ncu(
    ws: Workspace, launcher: Launcher, *, case: str | None, repeats: int, progress: Progress | None
) -> ProfileReport:
    """A kernel task's profile: Nsight Compute on the dev case `case` (None: the largest by
    rows x dim)."""
    if not case:
        case = max(
            ws.task.dev_cases, key=lambda c: c.shape.get("rows", 1) * c.shape.get("dim", 1)
        ).name
    (selected,) = kind_of(ws.task).select(ws.task, [case], "case")
    if launcher.probably_interpreted():
        raise EnvironmentProblem(
            "no GPU: profile_kernel needs a CUDA GPU; use run_objective timings.",
            next_step="serve with --gpu-host user@h100 to profile on a remote GPU",
        )
    slot = launcher.pick()
    executor = slot.executor
    ncu = await find_ncu(executor)
    candidate = ws.snapshot()
    staged = launcher.stage_candidate(candidate.files, candidate.digest, scope=ws.store.root.name)
    folder = executor.path("profiles")
    log_path = f"{folder}/{uuid.uuid4().hex[:12]}.csv"
    prefix = ["sh", "-c", 'mkdir -p "$1" && shift && exec "$@"', "sh", folder, ncu]
    prefix += [
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--csv",
        "--page",
        "details",
    ]
    prefix += ["--print-units", "base", "--metrics", ",".join(NCU_METRICS), "--log-file", log_path]
    request = {
        "mode": "profile_target",
        "candidate_dir": f"@stage/{staged}",
        "entry": ws.task.entry,
        "config_file": ws.task.config_file,
        "tolerances": {k: v.model_dump() for k, v in ws.task.tolerances.items()},
        "cases": [selected.model_dump()],
        "repeats": repeats,
        "seed": 0,
    }
    await report(progress, 0, 2, f"ncu on {case} ({repeats} launches)")
    call = await launcher.call(request, task=ws.task, slot=slot, argv_prefix=prefix)
    log = await executor.run(
        ["sh", "-c", 'cat -- "$1"; rm -f -- "$1"', "sh", log_path], timeout_s=60
    )
    text = log.stdout
    if "ERR_NVGPUCTRPERM" in text + call.stderr_tail:
        raise EnvironmentProblem(
            f"ncu on {executor.host} may not read the GPU performance counters.",
            next_step="run as root or set NVreg_RestrictProfilingToAdminUsers=0 on the host",
        )
    if (fault := call.fault()) is not None:  # killed from outside: not the candidate's
        raise fault
    if (call.result or {}).get("status") != "passed":
        reason = (call.result or {}).get("reason") or call.failure()
        raise UsageError(
            f"the candidate failed under the profiler on {case}: {reason}",
            next_step="fix it with run_objective first; profile a passing candidate",
        )
    kernels = summarize(parse_ncu_csv(text))
    if not kernels:
        tail = (text.strip().splitlines() or [call.stderr_tail or "no output"])[-1]
        raise EnvironmentProblem(
            f"ncu profiled no kernel on {executor.host} ({tail[:300]}).",
            next_step="check that the candidate launches a GPU kernel and that ncu works there",
        )
    await report(progress, 2, 2, "profiled")
    return ProfileReport(
        case=case,
        host=executor.host,
        bottleneck=classify(kernels[0]),
        main=kernels[0],
        others=kernels[1:8],
    )


async def profile_step(
    ws: Workspace, launcher: Launcher, *, case: str | None, repeats: int, progress: Progress | None
) -> ProfileReport:
    """A step task's profile: the per-kernel breakdown of one step of the dev trace `case`
    (None: the first), `repeats` steps profiled (the trace's last), in the runner's sandboxed
    process."""
    kind = kind_of(ws.task)
    trace = case or kind.select(ws.task, None)[0].name
    kind.check_cases(ws.task, [trace], "case")
    candidate = ws.snapshot()
    request = kernel_request(ws, launcher, candidate, "step_profile", seed=0, repeats=repeats,
                             **kind.runner_cases(ws.task, [trace]))  # fmt: skip
    await report(progress, 0, 1, f"torch.profiler on {trace} ({repeats} steps)")
    call = await launcher.call(request, task=ws.task)
    if (fault := call.fault()) is not None:  # killed from outside: not the candidate's
        raise fault
    result = call.result or {}
    if result.get("status") != "passed":
        raise UsageError(
            f"the step failed under the profiler on {trace}: "
            f"{result.get('reason') or call.failure()}",
            next_step="fix it with run_objective first; profile a passing step",
        )
    kernels = [KernelProfile(kernel=k["kernel"], launches=round(k["launches"]),
                             duration_us=k["total_us"] / k["launches"] if k["launches"] else None,
                             total_us=k["total_us"], share_pct=k["share_pct"])
               for k in result.get("kernels") or []]  # fmt: skip
    if not kernels:
        raise EnvironmentProblem(
            f"torch.profiler recorded no kernel in a step of {trace}.",
            next_step="check that the step launches its work where the profiler sees it "
            "(torch.profiler with CUDA activity); meanwhile use run_objective's buckets",
        )
    await report(progress, 1, 1, "profiled")
    env = result.get("env") or {}
    meaningful = bool(result.get("meaningful"))
    top = kernels[0]
    line = (
        f"{top.kernel} dominates the step: {top.share_pct:.0f}% of {result.get('step_us', 0):.1f}"
        f" us per step ({top.launches} launches, {top.total_us:.1f} us)"
    )
    if not meaningful:
        line += "; CPU interpreter: torch's operators by CPU time, not the GPU's kernels"
    return ProfileReport(
        case=trace,
        host=str(env.get("host") or ""),
        bottleneck=line,
        main=top,
        others=kernels[1:8],
        metrics=[],
        profiler="torch.profiler",
        meaningful=meaningful,
        step_us=result.get("step_us"),
        context=result.get("context"),
    )


# profile_kernel's profiler per kind of task it applies to (TaskKind.applies).
PROFILE_BY_KIND = {"kernel": profile_ncu, "step": profile_step}


__all__ = [
    "NCU_METRICS",
    "PROFILE_BY_KIND",
    "KernelProfile",
    "ProfileReport",
    "classify",
    "parse_ncu_csv",
    "profile_kernel",
    "profile_ncu",
    "profile_step",
]
