"""The launcher: stages files for the GPU-side runner (staging.py), runs it on an executor slot
(one GPU of one host) under that GPU's lock, and streams its JSON events back.

A slot is (executor, GPU index). Two timing runs never overlap on one GPU: every runner call
holds its slot's lock. Calls run in a fresh runner process (the guarded verify always does);
warm workers plug in behind the same `call()` so callers never change.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict

from ..errors import ExecutorError, killed_from_outside, signal_name, signal_of
from ..gpu import wire
from ..gpu.isolation import sandbox_policy as sp
from ..settings import Settings
from ..task.spec import TaskSpec
from .backends import build_executors
from .compile_pool import CompilePool
from .disk import stage_full
from .executor import Ending, Executor, LocalExecutor
from .gpu_lock import OnWait, held_channels, hold_gpu, lock_file
from .runner_policy import (
    DEV_TRITON_CACHE,
    ImportRoots,
    candidates_of,
    dev_cache_of,
    runner_policy,
)
from .slot import Slot, Worker
from .staging import HARNESS, Stage, harness_digests, runner_digest, runner_source
from .warm import TRANSPORT_LOST, Served, call_worker

EventSink = Callable[[dict[str, Any]], Awaitable[None] | None]


# Modes that import agent code run inside the sandbox ("step": a step task's dev traces, the
# candidate's step called in the runner's process; "step_profile": its torch.profiler breakdown,
# in-process, so the full sandbox, not profile_target's relaxed one for ncu's injection);
# "verify" and "step_verify" are the trusted parents, which sandbox their own children.
SANDBOXED_MODES = ("evaluate", "step", "sweep", "probe", "profile_target", "step_profile")


def sandbox_level(report: dict[str, Any]) -> str:
    """ "full" (Landlock + PID and network namespaces), "partial", or "none"."""
    level = report.get("level")
    return level if level in ("full", "partial") else "none"


class RunnerCall(BaseModel):
    """What one runner invocation produced. `limit`: the sandbox limit that ended it (memory,
    pids, cpu, file_size, scratch), as the sandbox's outer process counted it."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    result: dict[str, Any] | None
    events: list[dict[str, Any]]
    exit_code: int | None
    timed_out: bool
    stderr_tail: str
    host: str
    gpu_index: int
    wall_s: float
    sandbox: dict[str, Any] = {}
    phases_s: dict[str, float] = {}  # host side of the call: stage, lock, sync, runner round trip
    limit: str = ""

    def failure(self) -> str:
        if self.limit:
            return f"resource_limit: {self.limit} (the sandbox's limit ended the runner)"
        if self.timed_out:
            return f"runner timed out after {self.wall_s:.0f}s and was killed"
        tail = self.stderr_tail.strip().splitlines()[-1:] or ["no output"]
        sig = signal_of(self.exit_code)
        how = f"was killed by {signal_name(sig)}" if sig else f"exited with {self.exit_code}"
        return f"runner {how}: {tail[0][:300]}"

    def fault(self) -> ExecutorError | None:
        """The infrastructure fault that ended this call, if one did: the runner killed from
        outside (the out-of-memory killer, an operator) before it gave a result. Callers raise
        it instead of recording a result of the candidate (tools/errors.py: blame). A runner the
        sandbox's own limit ended (its trusted exit report says which) is the candidate's."""
        if self.result is not None or self.timed_out or self.limit:
            return None
        return killed_from_outside(self.exit_code, what="the runner", host=self.host)


class _nullcontext:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


class Launcher:
    def __init__(self, settings: Settings, executors: list[Executor] | None = None) -> None:
        self.settings = settings
        self.staging = Stage(settings.state_dir / "stage")
        self.stage = self.staging.root
        if executors is None:
            executors = [LocalExecutor(settings.state_dir)]
        # One slot per GPU each executor offers: settings.gpus per host, or every GPU of an
        # allocation (Slurm); callers that fan out (sweeps, the lab) spread over all of them.
        self.slots = [Slot(ex, g) for ex in executors for g in ex.gpu_indices(settings)]
        self.last_env: dict[str, Any] | None = None
        self.compile_pool = CompilePool(self)  # sweeps' warm compile workers
        self._roots = ImportRoots()

    def probably_interpreted(self) -> bool:
        """Whether runs land on the Triton CPU interpreter (no compile phase is worth having).
        Known from the last runner result; before any, guessed from settings and nvidia-smi."""
        if self.settings.interpret != "auto":
            return self.settings.interpret == "always"
        if self.last_env is not None:
            return bool(self.last_env.get("interpret"))
        local = all(ex.on_this_machine for ex in self.executors)
        return local and shutil.which("nvidia-smi") is None

    @property
    def executors(self) -> list[Executor]:
        seen: dict[int, Executor] = {}
        for s in self.slots:
            seen.setdefault(id(s.executor), s.executor)
        return list(seen.values())

    def host_cpus(self) -> int:
        """Cores of the machine the runner runs on (from its last result; before any, here)."""
        cpus = (self.last_env or {}).get("cpu_count")
        return cpus if isinstance(cpus, int) and cpus > 0 else (os.cpu_count() or 2)

    def parallel_capacity(self) -> int | None:
        """Commands that can start at once beside the warm workers the executors hold, one
        channel per executor kept free for a kill (None: no executor bounds it). A sweep that
        asked for more compile processes would wait a whole wave for the last one."""
        total = 0
        for ex in self.executors:
            if ex.max_parallel is None:
                return None
            held = sum(1 for s in self.slots if s.executor is ex and s.worker is not None)
            held += sum(1 for i in self.compile_pool.workers
                        if self.compile_pool.slot_of(i).executor is ex)  # fmt: skip
            held += held_channels(ex)  # GPU lock holders (tools/execution/gpu_lock.py)
            held += ex.channels_held()  # its own helpers (the SSH sync helper)
            total += max(1, ex.max_parallel - held - 1)
        return total

    # -- staging (staging.py) ------------------------------------------------------------------
    def stage_candidate(self, files: dict[str, bytes], digest: str, scope: str = "") -> str:
        """Stage a candidate (Stage.stage_candidate); the stage-relative path."""
        return self.staging.stage_candidate(files, digest, scope)

    def remote(self, slot: Slot, rel: str) -> str:
        return slot.executor.path("stage", rel)

    def pinned(self, slot: Slot) -> Launcher:
        """A view of this launcher whose only slot is `slot`: the same executors, stage, sync
        locks, warm workers and compile pool, so every call made through it (a guarded verify,
        a command task's final objective) runs on that GPU. For callers that run several jobs
        at once, one per GPU (compare's trials, the loop's scoring). Close the launcher it came
        from, never the view."""
        view = copy.copy(self)
        view.slots = [slot]
        return view

    def pick(self, prefer: int | None = None) -> Slot:
        if prefer is not None:
            return self.slots[prefer % len(self.slots)]
        free = [s for s in self.slots if not s.lock.locked()]
        return min(free or self.slots, key=lambda s: s.calls)

    # -- calls --------------------------------------------------------------------------------
    def harness(self, slot: Slot, name: str = "runner.py") -> str:
        return slot.executor.path("stage", HARNESS, name)

    def limits(self) -> sp.Limits:
        return sp.Limits.from_dict(self.settings.sandbox_limits())

    async def import_roots(self, slot: Slot) -> list[str]:
        """The import roots of the runner's interpreter on `slot`'s host (runner_policy)."""
        return await self._roots.of(
            slot.executor, self._python(slot), self.harness(slot, "sandbox_policy.py")
        )

    def runner_argv(
        self, slot: Slot, mode: str, task: TaskSpec, *, worker: bool, roots: list[str],
        candidates: str = "candidates",
    ) -> sp.Launch:  # fmt: skip
        """How the runner starts: `-I` (no user site, no PYTHON* variables) through the import
        bootstrap (`roots` first on sys.path), `-B` (no bytecode written; the runner deletes
        any beside the staged files before it imports them), the request on stdin. Modes that
        import agent code start inside the sandbox (runner_policy: `candidates` is what it may
        read of the staged candidates)."""
        py = self._python(slot)
        program = sp.python_argv(py, [self.harness(slot), "--worker" if worker else "-"])
        if mode not in SANDBOXED_MODES:
            return sp.Launch(argv=program, stdin=b"", token="")
        policy = runner_policy(
            lambda *parts: slot.executor.path("stage", *parts), task.name, candidates, roots,
            self.limits(), profile=mode == "profile_target",
        )  # fmt: skip
        return sp.command(py, self.harness(slot, "sandbox.py"), policy, program)

    dev_cache_of = staticmethod(dev_cache_of)
    candidates_of = staticmethod(candidates_of)

    async def sandboxed_argv(
        self, slot: Slot, argv: list[str], *, read: list[str], write: list[str], cwd: str,
        env: dict[str, str] | None = None, require: bool = False, installed_bytecode: bool = False,
    ) -> sp.Launch:  # fmt: skip
        """`argv` started inside the sandbox on the slot's executor: read access to `read` (and
        what Python, torch and triton need, their import roots included), write access to
        `write` and a private scratch, the sandbox's limits. For agent-written commands that are
        not the runner (a command task's objective). `env` is set in the target; `require`
        refuses to run where no sandbox can be applied (a verdict needs one);
        `installed_bytecode` lets it read the interpreter's own bytecode (for a folder with no
        __pycache__ the agent planted that could decide anything)."""
        policy = sp.Policy(
            read=read,
            write=write,
            scratch_root=slot.executor.path("stage", "scratch"),
            require=require,
            cwd=cwd,
            env=dict(env or {}),
            installed_bytecode=installed_bytecode,
            limits=self.limits(),
            **sp.python_policy(await self.import_roots(slot)),
        )
        return sp.command(self._python(slot), self.harness(slot, "sandbox.py"), policy, argv)

    async def call(
        self,
        request: dict[str, Any],
        *,
        task: TaskSpec,
        timeout_s: float | None = None,
        on_event: EventSink | None = None,
        slot: Slot | None = None,
        exclusive: bool = True,
        phased: bool = False,
        argv_prefix: list[str] | None = None,
        fresh: bool = False,
    ) -> RunnerCall:
        """Run one request on a slot, holding that GPU's lock (a warm worker when enabled).

        `request` may use the placeholders "@stage/<rel>" for staged paths; they are resolved to
        executor-side paths here. The request travels on the runner's stdin (or inline to a
        warm worker): hidden cases are never written to a file on the GPU host.
        `exclusive=False` (compile-only work, no timing) skips the GPU lock so compiles overlap
        with each other and with a timing run. `phased=True` (the guarded verify) hands the
        GPU's lock file to the runner, which holds it shared while it works and exclusively
        while it times (tools/gpu/verify/phase_lock.py), so verifies overlap their untimed work.
        `argv_prefix` wraps the runner in another program
        on the executor (profile_kernel runs it under ncu) and always uses a fresh process, as
        does `fresh=True` (the guarded verify)."""
        slot = slot or self.pick()
        timeout_s = timeout_s or self.settings.eval_timeout_s
        t_begin = time.perf_counter()
        events: list[dict[str, Any]] = []
        sandbox: dict[str, Any] = {}
        tokens: list[str] = []  # of the sandbox this call's runner runs in
        ended: list[dict[str, Any]] = []  # its exit report

        async def line_in(line: str) -> None:
            end = next((e for t in tokens if (e := sp.exit_report(line, t))), None)
            if end is not None:
                ended.append(end)
                return
            ev = wire.json_object(line)  # the runner shares its stdout with the candidate
            if ev is not None:
                if ev.get("event") == "sandbox":
                    sandbox.update({k: v for k, v in ev.items() if k != "event"})
                    return
                if ev.get("event") == "sandbox_exit":
                    return  # not this sandbox's: the target printed it
                events.append(ev)
                if on_event is not None and ev.get("event") not in ("result", "ready"):
                    maybe = on_event(ev)
                    if maybe is not None:
                        await maybe

        async def waiting(message: str) -> None:  # a pending allocation, a GPU held elsewhere
            await line_in(json.dumps({"event": "waiting", "message": message}))

        # Remote executors resolve their root folder here; Slurm waits for its allocation.
        await slot.executor.connect(on_wait=waiting)
        self.staging.stage_task(task)
        phases = {"stage": time.perf_counter() - t_begin}
        req, env = self.prepare(slot, request, task)
        candidates = candidates_of(request)
        mode = str(req.get("mode", "evaluate"))
        # Compiles (not exclusive), profiles (argv_prefix) and guarded runs (fresh) never use the
        # warm worker.
        warm = (  # a health check rides on a warm worker that exists, and never starts one
            self.settings.warm_workers
            and exclusive
            and not fresh
            and not argv_prefix
            and slot.warm_supported
            and (mode in SANDBOXED_MODES or (mode == "health" and slot.worker is not None))
        )
        held_file = lock_file(slot.executor, slot.gpu_index, self.settings) if phased else None
        if held_file is not None:
            req["gpu_lock"] = {"file": held_file, "gpu": slot.gpu_index}
        exit_code: int | None = 0
        timed_out = False
        stderr_tail = ""
        started = time.perf_counter()
        hold = exclusive and held_file is None
        async with self.hold(slot, on_wait=waiting) if hold else _nullcontext():
            phases["gpu_lock"] = time.perf_counter() - started
            slot.calls += 1
            await self.staging.sync(slot.executor)
            started = time.perf_counter()
            phases["sync"] = started - t_begin - phases["stage"] - phases["gpu_lock"]
            outcome = None
            roots = await self.import_roots(slot)
            env.update(sp.import_env(roots))
            if warm:
                outcome = await call_worker(
                    self, slot, req, env, timeout_s, line_in, task, candidates[1], tokens
                )
                if slot.worker is not None:
                    sandbox.update(slot.worker.sandbox)
            if outcome is not None:
                timed_out, stderr_tail, ended_code = outcome
                got_result = any(e.get("event") == "result" for e in events)
                exit_code = 0 if got_result and not timed_out else ended_code
            else:  # fresh process (or a backend without interactive processes)
                launch = self.runner_argv(
                    slot, mode, task, worker=False, roots=roots, candidates=candidates[0]
                )
                tokens.append(launch.token)
                res = await slot.executor.run(
                    [*(argv_prefix or []), *launch.argv],
                    cwd=slot.executor.path("stage"),
                    env=env,
                    timeout_s=timeout_s,
                    stdin=launch.stdin + json.dumps(req).encode(),
                    on_line=line_in,
                )
                exit_code, timed_out = res.exit_code, res.timed_out
                stderr_tail = res.stderr_tail()
        phases["runner_round_trip"] = time.perf_counter() - started
        # The runner spoke of a full disk: measured here, a full stage is the host's fault.
        said = [stderr_tail, *map(json.dumps, events)]
        if (full := await stage_full(slot.executor, slot.executor.path("stage"), said)) is not None:
            raise full
        result = next((ev for ev in reversed(events) if ev.get("event") == "result"), None)
        if result is not None and isinstance(result.get("env"), dict):
            self.last_env = result["env"]
            # What the sandbox's outer (trusted) process reported, never the runner's own claim.
            result["env"]["sandbox"] = sandbox_level(sandbox)
        return RunnerCall(
            result=result,
            events=events,
            exit_code=exit_code,
            timed_out=timed_out,
            stderr_tail=stderr_tail,
            host=slot.executor.host,
            gpu_index=slot.gpu_index,
            wall_s=time.perf_counter() - started,
            sandbox=sandbox,
            phases_s=phases,
            limit=sp.limit_hit(ended[-1] if ended else None),
        )

    @asynccontextmanager
    async def hold(self, slot: Slot, *, on_wait: OnWait | None = None) -> AsyncIterator[None]:
        """Hold `slot`'s GPU for timing: the in-process slot lock, then the GPU's lock file on
        its host (tools/execution/gpu_lock.py), so no other process times on it meanwhile."""
        async with (
            slot.lock,
            hold_gpu(slot.executor, slot.gpu_index, self.settings, on_wait=on_wait),
        ):
            yield

    def prepare(
        self, slot: Slot, request: dict[str, Any], task: TaskSpec
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The request as the runner on `slot` reads it (staged paths resolved, the harness
        hashes it must check) and the environment it runs with."""
        req = json.loads(json.dumps(request))
        req.setdefault("request_id", uuid.uuid4().hex[:12])
        req.setdefault("case_timeout_s", self.settings.case_timeout_s)
        req["reference"] = self.remote(slot, f"tasks/{task.name}/reference.py")
        req["harness_sha256"] = harness_digests()
        req["sandbox_required"] = not self.settings.allow_unsandboxed
        req["sandbox_limits"] = self.settings.sandbox_limits()
        for key in ("candidate_dir", "baseline_dir", "triton_cache"):
            if isinstance(req.get(key), str) and req[key].startswith("@stage/"):
                req[key] = self.remote(slot, req[key][len("@stage/") :])
        env = {
            "CUDA_VISIBLE_DEVICES": str(slot.gpu_index),
            "HARNESSLAB_RUNNER_INTERPRET": {"auto": "auto", "always": "1", "never": "never"}[
                self.settings.interpret
            ],
            "HARNESSLAB_WORKER_IDLE_S": str(self.settings.worker_idle_s),
            "PYTHONUNBUFFERED": "1",
            # The trusted side's Triton cache, apart from every candidate's: nothing a
            # candidate compiles can land where the verifier's own kernels are looked up.
            "TRITON_CACHE_DIR": slot.executor.path("stage", "tcache", "_trusted"),
        }
        return req, env

    def worker_stale(self, worker: Worker, task: TaskSpec, scope: str = "candidates") -> bool:
        """A warm worker that must be replaced before its next request: gone already (its
        connection or allocation lost while idle), too many calls, an older runner, another
        task or workspace (`scope`: the staged candidates it may read), or idle long enough
        that it is about to exit by itself."""
        return (
            not worker.proc.alive()
            or worker.served >= self.settings.worker_max_calls
            or worker.digest != runner_digest()
            or worker.task != task.name
            or worker.scope != scope
            or time.monotonic() - worker.last_used > self.settings.worker_idle_s * 0.9
        )

    async def start_worker(
        self, slot: Slot, mode: str, task: TaskSpec, env: dict[str, str], timeout_s: float,
        log: str, scope: str = "candidates",
    ) -> Worker:  # fmt: skip
        """A warm runner (`runner.py --worker`, inside the sandbox) on `slot`'s executor that
        may read the staged candidates under `scope` (one workspace's), once it said "ready".
        ExecutorError when it did not start (no request was sent: started is False);
        NotImplementedError: the backend has no interactive processes."""
        roots = await self.import_roots(slot)
        launch = self.runner_argv(slot, mode, task, worker=True, roots=roots, candidates=scope)
        proc = await slot.executor.start(
            launch.argv,
            cwd=slot.executor.path("stage"),
            env={**env, **sp.import_env(roots)},
            stderr_path=slot.executor.path("stage", log),
        )
        worker = Worker(proc, runner_digest(), task.name, scope, launch.token)
        ready = False
        limit_s = min(timeout_s, 180)
        try:
            await proc.send_line(launch.stdin_line)  # the policy, before any request
        except (OSError, ExecutorError, anyio.BrokenResourceError, anyio.ClosedResourceError) as e:
            await proc.kill()
            if isinstance(e, ExecutorError) and e.kind in TRANSPORT_LOST:
                e.started = False  # its connection or allocation went: the caller starts anew
                raise
            raise ExecutorError(
                f"{slot.label}: the warm runner's sandbox did not take its policy ({e}).",
                kind="remote_env",
                started=False,
                next_step="retry; remote_health_check says what the host lacks",
            ) from e
        try:
            with anyio.move_on_after(limit_s) as waited:
                while True:  # the sandbox's report comes first, then the runner's "ready"
                    line = await proc.receive_line()
                    if line is None:
                        break
                    if '"sandbox"' in line:
                        worker.sandbox = wire.json_object(line) or {}
                        worker.sandbox.pop("event", None)
                        continue
                    if '"ready"' in line:
                        ready = True
                        break
        except BaseException:  # the caller was cancelled: nothing is left running
            with anyio.CancelScope(shield=True):
                await proc.kill()
            raise
        if not ready and waited.cancelled_caught:  # the host is slow, or the call's limit short
            await proc.kill()
            raise ExecutorError(
                f"{slot.label}: the warm runner did not start within {limit_s:g} s (its log on "
                f"the host: {slot.executor.path('stage', log)}).",
                kind="timeout",
                started=False,
                next_step="retry; if it repeats, the host is loaded or eval_timeout_s is short",
            )
        if not ready:
            ending = await proc.ended()
            await proc.kill()
            if ending.lost is not None:
                ending.lost.started = False
                raise ending.lost
            how = "" if ending.code is None else f", exit {ending.code}"
            raise ExecutorError(
                f"{slot.label}: the warm runner did not start{how} (its log on the host: "
                f"{slot.executor.path('stage', log)}).",
                kind="remote_env",
                started=False,
                next_step="remote_health_check says what the host lacks; the log says why",
            )
        return worker

    async def serve(self, worker: Worker, req: dict[str, Any], timeout_s: float, line_in) -> Served:
        """One request on a warm worker. A worker that did not finish is killed (the caller
        drops it); so is one whose caller is cancelled. A worker whose connection or allocation
        went away raises that fault (ExecutorError, started: the request had reached it); one
        that was gone before the request reached it raises started=False."""
        worker.served += 1
        try:
            await worker.proc.send_line(json.dumps(req))
            done = False
            with anyio.move_on_after(timeout_s) as scope:
                while True:
                    line = await worker.proc.receive_line()
                    if line is None:
                        break
                    await line_in(line)
                    if line.startswith('{"event": "result"'):
                        done = True
                        break
            worker.last_used = time.monotonic()
            ending = Ending()
            if not done:
                if not scope.cancelled_caught:
                    ending = await worker.proc.ended()
                await worker.proc.kill()
            if ending.lost is not None:
                raise ending.lost
            return Served(done, scope.cancelled_caught, ending.code)
        except BaseException:
            await worker.proc.kill()
            raise

    def _python(self, slot: Slot) -> str:
        return slot.executor.python(self.settings)

    def python(self, slot: Slot) -> str:
        """The interpreter the toolkit runs on `slot`'s host: what a command task's {python}
        names."""
        return self._python(slot)

    async def aclose(self) -> None:
        await self.compile_pool.aclose()
        for slot in self.slots:
            if slot.worker is not None:
                await slot.worker.proc.kill()
                slot.worker = None
        for ex in self.executors:
            try:
                await ex.aclose()
            except ExecutorError:
                pass


def build_launcher(settings: Settings) -> Launcher:
    """The launcher over the executors of the configured backend (tools/execution/backends.py):
    local by default, SSH (one executor per host) when settings.gpu_host is set."""
    return Launcher(settings, build_executors(settings))


__all__ = [
    "DEV_TRITON_CACHE",
    "Launcher",
    "RunnerCall",
    "Slot",
    "build_launcher",
    "runner_digest",
    "runner_source",
]
