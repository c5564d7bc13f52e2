"""The kernel lab, host side: run the benchmark matrix where the GPU is, fetch results.json, and
build the report from it (tools/lab/report.py; claims in tools/lab/claims.py).

The GPU side is tools/gpu/kernel_lab/lab.py, self-contained like runner.py: it is staged with runner.py
and the task folders (tools/ and tasks/ side by side, the layout it expects) onto the executors
of the launcher's slots (this machine, GPU hosts over SSH, a Slurm allocation), run there with
the tasks dealt over every slot, each part under its GPU's lock so no timing run overlaps it,
and the parts' results.json are read back and merged. Without a GPU the same script
runs on the Triton interpreter and every timing is marked not meaningful.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from ..errors import EnvironmentProblem, ExecutorError, UsageError
from ..execution.launcher import Launcher, Slot
from ..gpu import LAB, copy_flat, wire
from ..state.storage import atomic_write_text
from ..task import TaskSpec, kind_of, load_task
from ..task.spec import tasks_root

LAB_FILES = LAB
SCHEMA = "harnesslab.lab/1"
# Startup, the copy-bandwidth measurement and a profiler run that overruns its share.
MARGIN_S = 180.0
ProgressSink = Callable[[dict[str, Any]], Awaitable[None] | None]


class LabOptions(BaseModel):
    """What to run. Budgets are wall-clock seconds on the GPU host."""

    tasks: list[str] = Field(
        default_factory=list, description="task names; empty: every kernel and step task"
    )
    quick: bool = Field(default=False, description="the smallest case and 4 claim cases per task")
    max_cases: int = Field(
        default=0, ge=0, description="first N matrix cases per task (step tasks: traces; 0: all)"
    )
    repeats: int = Field(default=3, ge=1, le=10, description="measurements of each claim row")
    ncu: bool = Field(default=True, description="Nsight Compute on the best strategy per task")
    compile: bool = Field(default=True, description="include the torch.compile strategy")
    tune: bool = Field(default=False, description="also time each solution's TUNE_SPACE")
    budget_s: float = Field(default=330.0, gt=0, description="stop starting new work after this")


def kernel_task_names(names: list[str]) -> list[str]:
    """Validated task names; every shipped task the lab benchmarks when `names` is empty."""
    if not names:
        root = tasks_root()
        names = sorted(p.name for p in root.iterdir() if (p / "task.toml").is_file())
        return [n for n in names if _in_lab(load_task(n))]
    for name in names:
        if not _in_lab(task := load_task(name)):
            raise UsageError(
                f"task {name!r} is a {task.kind} task; the lab benchmarks kernel and step tasks.",
                next_step="pass kernel or step task names to --tasks, or none for all of them",
            )
    return list(names)


def _in_lab(task: TaskSpec) -> bool:
    return kind_of(task).in_lab(task)


def stage_lab(folder: Path, tasks: list[str]) -> Path:
    """A fresh copy of the GPU side: folder/tools/{runner,lab,lab_step,ncu,...}.py,
    folder/tasks/<name>/."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "tools").mkdir(parents=True)
    copy_flat(folder / "tools", LAB_FILES)
    for name in tasks:
        shutil.copytree(
            load_task(name).root,
            folder / "tasks" / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "__init__.py"),
        )
    return folder


def lab_argv(
    python: str, root: str, out: str, opts: LabOptions, interpret: str, tasks: list[str]
) -> list[str]:
    argv = [python, f"{root}/tools/lab.py", "--out", out, "--tasks", ",".join(tasks),
            "--repeats", str(opts.repeats), "--budget-s", str(opts.budget_s),
            "--interpret", interpret]  # fmt: skip
    argv += ["--quick"] * opts.quick + ["--no-ncu"] * (not opts.ncu) + ["--tune"] * opts.tune
    argv += ["--no-compile"] * (not opts.compile)
    if opts.max_cases:
        argv += ["--max-cases", str(opts.max_cases)]
    return argv


async def run_lab(
    launcher: Launcher,
    opts: LabOptions,
    out_dir: Path,
    *,
    on_progress: ProgressSink | None = None,
) -> dict[str, Any]:
    """Run tools/gpu/kernel_lab/lab.py where the GPUs are and return its results (also written to
    out_dir/results.json). With several slots (GPUs of several hosts, or of a Slurm allocation)
    the tasks are dealt over them, one lab process per GPU, and the parts merged; each holds
    its slot's GPU lock for its whole run (minutes of GPU time: about 5 on an H100 for every
    task; seconds to a minute per task on the interpreter). Every row names the host and GPU
    it was measured on."""
    tasks = kernel_task_names(opts.tasks)
    slots = launcher.slots[: len(tasks)] if len(launcher.slots) > 1 else [launcher.pick()]
    shares = [tasks[i :: len(slots)] for i in range(len(slots))]
    local = stage_lab(launcher.stage.parent / "lab" / "tree", tasks)
    syncs = {id(s.executor): anyio.Lock() for s in slots}
    parts: list[dict[str, Any]] = [{} for _ in slots]
    started = time.perf_counter()

    async def part(i: int) -> None:
        slot = slots[i]
        async with launcher.hold(slot):
            async with syncs[id(slot.executor)]:
                await slot.executor.connect()
                await slot.executor.sync_tree(local, slot.executor.path("lab", "tree"))
            parts[i] = await _run_part(launcher, slot, shares[i], opts, on_progress)

    async with anyio.create_task_group() as tg:
        for i in range(len(slots)):
            tg.start_soon(part, i)
    results = _merge(parts)
    results["info"]["host_wall_s"] = time.perf_counter() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out_dir / "results.json", json.dumps(results, indent=1)
    )  # reports rebuild from it
    return results


async def _run_part(
    launcher: Launcher,
    slot: Slot,
    tasks: list[str],
    opts: LabOptions,
    on_progress: ProgressSink | None,
) -> dict[str, Any]:
    """lab.py on one slot for `tasks` (the tree is synced, the GPU held); its results.json."""
    executor = slot.executor
    remote = executor.path("lab", "tree")
    remote_out = executor.path("lab", "out", uuid.uuid4().hex[:12])
    python = executor.python(launcher.settings)
    argv = lab_argv(python, remote, remote_out, opts, launcher.settings.interpret, tasks)
    env = {"CUDA_VISIBLE_DEVICES": str(slot.gpu_index), "PYTHONUNBUFFERED": "1"}

    async def line_in(line: str) -> None:
        if on_progress is not None and line.startswith("{"):
            event = wire.json_object(line)
            if event is None:
                return
            maybe = on_progress(event)
            if maybe is not None:
                await maybe

    res = await executor.run(argv, cwd=remote, env=env, timeout_s=opts.budget_s + MARGIN_S,
                             on_line=line_in)  # fmt: skip
    fetched = await executor.run(
        ["sh", "-c", 'cat -- "$1/results.json"; rc=$?; rm -rf -- "$1"; exit $rc', "sh", remote_out],
        timeout_s=120,
        max_output_bytes=64 << 20,
    )
    if fetched.exit_code != 0:
        why = "timed out" if res.timed_out else f"exited with {res.exit_code}"
        raise ExecutorError(
            f"the lab run on {executor.host} {why} and left no results.json: "
            f"{res.stderr_tail(5)[-600:]}",
            kind="crashed",
            next_step="check torch/triton on the GPU host (harnesslab serve --self-test) and retry",
        )
    try:
        results = json.loads(fetched.stdout)
    except json.JSONDecodeError as exc:
        raise EnvironmentProblem(
            f"results.json from {executor.host} is not valid JSON ({exc}).",
            next_step="retry; if it persists, run tools/gpu/kernel_lab/lab.py on the host by hand",
        ) from exc
    info = results.setdefault("info", {})
    # Where it ran: the machine and GPU the lab process saw (a cluster's node), then the executor.
    where = {"host": info.get("host") or executor.host, "gpu_index": info.get("gpu_index")}
    for row in results.get("rows", []):
        row.update(where)
    info["host"] = executor.host
    info["parts"] = [{**where, "tasks": tasks}]
    if res.timed_out or res.exit_code != 0:
        info["incomplete"] = (
            f"the run {'timed out' if res.timed_out else f'exited with {res.exit_code}'}: "
            f"{res.stderr_tail(3)[-400:]}"
        )
        info["parts"][0]["incomplete"] = info["incomplete"]
    return results


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One results file from the per-GPU parts: the first part's info and phases, every part's
    tasks, rows, profiles and tuning; `info.parts` says which GPU ran which tasks."""
    merged = parts[0]
    for other in parts[1:]:
        merged.setdefault("tasks", {}).update(other.get("tasks", {}))
        merged.setdefault("rows", []).extend(other.get("rows", []))
        merged.setdefault("ncu", {}).update(other.get("ncu", {}))
        merged.setdefault("tuning", []).extend(other.get("tuning", []))
        merged["info"]["parts"] += other["info"]["parts"]
        if "incomplete" in other["info"]:
            merged["info"].setdefault("incomplete", other["info"]["incomplete"])
        merged["wall_s"] = max(merged.get("wall_s", 0.0), other.get("wall_s", 0.0))
    return merged


def load_results(path: Path) -> dict[str, Any]:
    """A results.json written by tools/gpu/kernel_lab/lab.py (checked for the fields the report needs)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"cannot read {path}: {exc}", next_step="pass a results.json from a lab run"
        ) from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or "rows" not in data:
        raise UsageError(
            f"{path} is not a lab results file (schema {SCHEMA}).",
            next_step="pass the results.json that `harnesslab lab` or gpu/kernel_lab/lab.py wrote",
        )
    return data


__all__ = ["LabOptions", "kernel_task_names", "lab_argv", "load_results", "run_lab", "stage_lab"]
