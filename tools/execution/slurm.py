"""The Slurm executor: GPU work as job steps of one allocation on a Slurm cluster.

Side of the trust boundary: trusted (it only decides where the staged, hash-checked harness runs).

Slurm's own client commands (sbatch, srun, squeue, scancel, sinfo) run on the login node through
a login executor: the SSH executor (same pool, host keys and sync) when `gpu_host` names the
login node, or the local executor when this server runs on the login node. Files are synced to
the login node's root folder, which the compute nodes must see at the same path (a shared home
or project filesystem, as on every Slurm cluster).

- The allocation is a holding batch job (`sbatch --gres=gpu:P --nodes=M`, partition, account,
  QoS, time limit and constraint from the settings) submitted on first use; while it is pending,
  `connect(on_wait=...)` says so with Slurm's own reason ("pending: Resources"); a reason
  that says it can never start as asked (PartitionConfig, BadConstraints, ...) cancels it at
  once with Slurm's words and the flag to change (slurm_request.py). Its script
  ends the job by itself once no step has run in it for `slurm_idle_s`, so even a server killed
  with SIGKILL leaves nothing in `squeue`; `aclose()` cancels it at once.
- Every command is a job step (`srun --jobid J --overlap`); warm runners are long-lived steps
  that talk JSON lines over srun's stdin and stdout, so a warm call costs what it costs over the
  login executor, with no srun in its path. A slot is one GPU of the allocation: the launcher
  names it as `CUDA_VISIBLE_DEVICES=k` (k = node * P + GPU), the step runs on node k // P and the
  wrapper narrows Slurm's CUDA_VISIBLE_DEVICES for the step to its (k % P)-th entry. Slurm keeps
  other jobs off these GPUs, so the GPU lock needs no lock file here (`gpus_reserved`); the
  launcher's slot lock keeps two timing runs of this process off one GPU.
- A timeout or a cancel kills the srun (the login executor's TERM, then KILL) and cancels its
  step (`scancel J.S`, found by the step's unique name); a call cancelled while the allocation it
  asked for is pending cancels that job. A step lost to a failed node, a preempted or expired
  job raises a classified ExecutorError (node_failure, preempted, allocation_lost) with a next
  step, and the next call gets a new allocation.
"""

from __future__ import annotations

import logging
import re
import shlex
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ..errors import ExecutorError
from ..settings import Settings
from .executor import (
    CommandResult,
    Ending,
    Executor,
    InteractiveProcess,
    LineSink,
    OnWait,
    start_failure,
)
from .health import HostHealth, Problem, probe_host
from .procgroup import emit
from .slurm_request import never_error, never_starts

log = logging.getLogger(__name__)

CLIENT_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 10.0  # a step on a live node starts in well under a second
RECHECK_AFTER_S = 30.0  # an allocation unused this long (or half the idle limit) is checked first
HEALTH_WAIT_S = 30.0  # how long remote_health_check waits for a pending allocation
POLL_S = (0.2, 2.0)  # first and longest pause between squeue polls while pending
JOB_NAME = "harnesslab"

# The step's wrapper. $1 = the slot's GPU on its node ("" for none), $2 = cwd ("" for none),
# $3... = argv. Slurm sets CUDA_VISIBLE_DEVICES to the node's GPUs of the step; the slot's is
# the $1-th of them (where Slurm sets none, e.g. count-only gres, $1 itself). The shell stays
# the task's leader (no exec), so a command killed by a signal reports 128+N.
_STEP = r"""g=$1 d=$2; shift 2
if [ -n "$g" ]; then
  i=0 pick=; for x in $(printf '%s' "${CUDA_VISIBLE_DEVICES-}" | tr , ' '); do
    [ "$i" = "$g" ] && pick=$x; i=$((i+1)); done
  export CUDA_VISIBLE_DEVICES="${pick:-$g}"
fi
if [ -n "$d" ]; then cd -- "$d" || exit 126; fi
"$@" """

# The holding job's script: $1 = idle limit in seconds, $2 = poll interval. It exits (ending the
# allocation) once no step but its own has run for the idle limit.
_HOLD = r"""idle=0
while :; do
  sleep "$2"
  if squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -qv -e '\.batch$' -e '\.extern$'
  then idle=0; else idle=$((idle + $2)); fi
  [ "$idle" -ge "$1" ] && exit 0
done"""

# squeue states of a job that will not run our steps any more, and how each is reported.
_LOST = {
    "NODE_FAIL": ("node_failure", "a node of the allocation failed"),
    "BOOT_FAIL": ("node_failure", "a node of the allocation failed to boot"),
    "PREEMPTED": ("preempted", "the allocation was preempted"),
    "TIMEOUT": ("allocation_lost", "the allocation reached its time limit (slurm_time)"),
    "DEADLINE": ("allocation_lost", "the allocation reached its deadline"),
    "CANCELLED": ("allocation_lost", "the allocation was cancelled"),
    "OUT_OF_MEMORY": ("allocation_lost", "the allocation ran out of memory"),
    "FAILED": ("allocation_lost", "the allocation's holding job failed"),
    "COMPLETED": ("allocation_lost", "the allocation ended (idle limit, slurm_idle_s)"),
}
# srun's own words for a step that died with its node or job (not the command's exit status).
_STEP_LOST = re.compile(
    r"srun: error: (Node failure|.*Job step aborted|.*[Uu]nable to create step|"
    r".*Invalid job id|.*job has been revoked|.*Job/step already completing)"
)
# srun's words that fit a step whose node died as well as one that merely ended oddly: a task
# killed by a signal (the OOM killer, itself, its node dying), or srun giving up on the step's
# completion (exit status 0!). A probe step decides (_node_answers).
_KILLED = re.compile(
    r"^srun: error: ([^:\n]+: tasks? [0-9,-]+: Killed|Timed out waiting for job step to complete)",
    re.M,
)
# srun's report of the task's exit status: the exit code says it already; not the command's stderr.
_EXIT_REPORT = re.compile(
    r"^srun: error: [^:\n]+: tasks? [0-9,-]+: (Exited with exit code \d+|Killed|Terminated)\n?",
    re.M,
)
_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


@dataclass
class Allocation:
    job_id: str
    nodes: list[str]
    submitted_for: int  # id of the connect() that submitted it (cancelled with that call)


def allocation_argv(settings: Settings, hold_script: str, poll_s: int) -> list[str]:
    """The sbatch command line of the holding job (see the module docstring)."""
    gpus = settings.slurm_gpus
    argv = [
        "sbatch", "--parsable", f"--job-name={JOB_NAME}", f"--nodes={settings.slurm_nodes}",
        "--ntasks-per-node=1", f"--cpus-per-task={gpus * settings.slurm_cpus_per_gpu}",
        f"--gres=gpu:{gpus}", f"--time={settings.slurm_time}", "--no-requeue",
        "--output=/dev/null", "--chdir=/tmp",
    ]  # fmt: skip
    for flag, value in (
        ("--partition", settings.slurm_partition),
        ("--account", settings.slurm_account),
        ("--qos", settings.slurm_qos),
        ("--constraint", settings.slurm_constraint),
    ):
        if value:
            argv.append(f"{flag}={value}")
    idle = max(1, round(settings.slurm_idle_s))
    script = " ".join(
        shlex.quote(w) for w in ["sh", "-c", hold_script, "hold", str(idle), str(poll_s)]
    )
    return [*argv, f"--wrap={script}"]


class SlurmExecutor(Executor):
    """Commands as job steps of one allocation; see the module docstring."""

    name = "slurm"
    gpus_reserved = True

    def __init__(self, login: Executor, settings: Settings) -> None:
        self.login = login
        self.settings = settings
        self.host = f"slurm:{login.host}"
        self.on_this_machine = login.on_this_machine
        self.max_parallel = login.max_parallel
        self.gpus_per_node = settings.slurm_gpus
        self._env = {"SLURM_CONF": settings.slurm_conf} if settings.slurm_conf else {}
        self._job: Allocation | None = None
        self._lock = anyio.Lock()
        self._last_used = time.monotonic()
        self._connects = 0
        self._closing = False

    # -- the allocation ---------------------------------------------------------------------

    def gpu_indices(self, settings: Settings) -> list[int]:
        return list(range(settings.slurm_nodes * settings.slurm_gpus))

    def python(self, settings: Settings) -> str:
        return self.login.python(settings)

    def path(self, *parts: str) -> str:
        return self.login.path(*parts)

    @property
    def job_id(self) -> str | None:
        """The allocation's job id (None: none yet, or it was released)."""
        return self._job.job_id if self._job else None

    async def connect(self, *, on_wait: OnWait | None = None) -> None:
        """Have a running allocation (submitting one if needed), reporting "pending: <reason>"
        through `on_wait` while Slurm has not started it. A caller cancelled while the
        allocation it submitted is pending cancels that job."""
        await self._ensure(on_wait, give_up_s=None)

    async def _ensure(self, on_wait: OnWait | None, give_up_s: float | None) -> bool:
        if self._closing:
            raise ExecutorError(f"{self.host}: the executor is closed.", kind="cancelled")
        await self.login.connect()
        async with self._lock:
            job = self._job
            if job is not None and job.nodes:
                recheck_s = min(RECHECK_AFTER_S, self.settings.slurm_idle_s / 2)
                if time.monotonic() - self._last_used < recheck_s:
                    return True
                state, _reason, _nodes = await self._job_state(job.job_id)
                if state == "RUNNING":
                    return True
                self._job = None  # ended (idle limit, time limit, failure): a new one below
            self._connects += 1
            me = self._connects
            if self._job is None:
                self._job = Allocation(await self._submit(), [], submitted_for=me)
                log.info("%s: submitted allocation %s", self.host, self._job.job_id)
            try:
                with anyio.move_on_after(give_up_s if give_up_s is not None else float("inf")):
                    await self._wait_running(self._job, on_wait)
                    self._last_used = time.monotonic()
                    return True
                return False
            except BaseException:
                job = self._job
                if job is not None and job.submitted_for == me and not job.nodes:
                    with anyio.CancelScope(shield=True):
                        await self._cancel_job(job.job_id)
                    self._job = None
                raise

    async def _submit(self) -> str:
        poll = max(1, min(30, round(self.settings.slurm_idle_s / 4)))
        argv = allocation_argv(self.settings, _HOLD, poll)
        res = await self._client(argv)
        job_id = res.stdout.strip().split(";")[0]
        if res.exit_code != 0 or not job_id.isdigit():
            raise ExecutorError(
                f"{self.host}: sbatch refused the allocation: {res.stderr_tail(3)}",
                kind="remote_env",
                started=False,
                stderr_tail=res.stderr_tail(),
                next_step="check partition, account, QoS, constraint and time limit "
                "(--slurm-partition ...; `sinfo` and `sacctmgr show assoc` on the login node)",
            )
        return job_id

    async def _wait_running(self, job: Allocation, on_wait: OnWait | None) -> None:
        told, pause = "", POLL_S[0]
        while True:
            state, reason, nodes = await self._job_state(job.job_id)
            if state == "RUNNING" and nodes:
                job.nodes = await self._hostnames(nodes)
                return
            if state == "PENDING" and never_starts(reason):  # waiting would end at a timeout
                self._job = None
                await self._cancel_job(job.job_id)
                argv = allocation_argv(self.settings, _HOLD, 1)
                raise await never_error(self._client, self.settings, self.host, job.job_id,
                                        reason, argv)  # fmt: skip
            if state in ("PENDING", "CONFIGURING", "RUNNING"):
                message = f"pending: {reason}" if state == "PENDING" else state.lower()
                if message != told and reason != "None":
                    told = message
                    log.info("%s: job %s %s", self.host, job.job_id, message)
                    if on_wait is not None:
                        await emit(on_wait, message)
                await anyio.sleep(pause)
                pause = min(pause * 2, POLL_S[1])
                continue
            self._job = None
            raise self._lost_error(job.job_id, state, reason, started=False)

    async def _job_state(self, job_id: str) -> tuple[str, str, str]:
        """(state, reason, node list) of the job; state "" once squeue no longer knows it."""
        res = await self._client(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"])
        fields = res.stdout.strip().split("|")
        if res.exit_code != 0 or len(fields) != 3:
            return "", "", ""
        return fields[0], fields[1], fields[2]

    async def _hostnames(self, nodelist: str) -> list[str]:
        if not re.search(r"[\[,]", nodelist):
            return [nodelist]
        res = await self._client(["scontrol", "show", "hostnames", nodelist])
        return res.stdout.split() or [nodelist]

    def _lost_error(self, job_id: str, state: str, reason: str, *, started: bool) -> ExecutorError:
        kind, what = _LOST.get(state, ("allocation_lost", "the allocation is gone"))
        why = f" ({state}{', ' + reason if reason and reason != 'None' else ''})" if state else ""
        return ExecutorError(
            f"{self.host}: {what}: job {job_id}{why}.",
            kind=kind,
            started=started,
            next_step="call again: the next call requests a new allocation"
            + (
                " (`sinfo -R` on the login node says why nodes are down)"
                if kind == "node_failure"
                else ""
            ),
        )

    async def _check_lost(self, stderr: str, *, ended: bool = False) -> None:
        """Raise the classified error when a step ended because its job or node did: srun's
        stderr says so, or (`ended`: a warm runner's step closed unasked) squeue does."""
        job = self._job
        lost = bool(_STEP_LOST.search(stderr))
        killed = bool(_KILLED.search(stderr))
        if job is None or not (ended or lost or killed):
            return
        node_failed = "Node failure" in stderr
        if killed and not (ended or lost):
            # A task killed with no word from srun: its node died (srun may report the kill
            # before it notices the node) or something else killed it. A probe step decides.
            if await self._node_answers(job):
                return
            node_failed = True
        state, reason, _ = await self._job_state(job.job_id)
        if state == "RUNNING" and not node_failed:
            return  # the job lives on: the step itself failed; its result says why
        if self._job is job:
            self._job = None
        if state == "RUNNING":  # a node failed; Slurm has not ended the job yet
            await self._cancel_job(job.job_id)
        if node_failed and state != "PREEMPTED":  # srun saw it; squeue may say CANCELLED/gone
            state = "NODE_FAIL"
        never_ran = "create step" in stderr or "Invalid job id" in stderr
        raise self._lost_error(job.job_id, state, reason, started=not never_ran)

    async def _node_answers(self, job: Allocation) -> bool:
        """Whether the allocation's node still runs a step (`true`, within PROBE_TIMEOUT_S)."""
        try:
            res = await self._client(
                ["srun", f"--jobid={job.job_id}", "--overlap", "--nodes=1", "--ntasks=1",
                 "--gres=none", "true"],
                timeout_s=PROBE_TIMEOUT_S,
            )  # fmt: skip
        except ExecutorError:
            return False
        return res.exit_code == 0 and not res.timed_out

    async def _cancel_job(self, job_id: str) -> None:
        try:
            await self._client(["scancel", job_id])
        except ExecutorError as exc:
            log.warning("%s: could not cancel job %s: %s", self.host, job_id, exc)

    async def _client(self, argv: list[str], **kwargs: Any) -> CommandResult:
        """A Slurm client command on the login node."""
        return await self.login.run(
            argv, env=self._env, timeout_s=kwargs.pop("timeout_s", CLIENT_TIMEOUT_S), **kwargs
        )

    # -- steps ------------------------------------------------------------------------------

    def _step_argv(
        self, job: Allocation, name: str, gpu: int | None, cwd: str | None, argv: list[str]
    ) -> list[str]:
        node = job.nodes[min((gpu or 0) // self.gpus_per_node, len(job.nodes) - 1)]
        gres = f"gpu:{self.gpus_per_node}" if gpu is not None else "none"
        local = "" if gpu is None else str(gpu % self.gpus_per_node)
        return [
            "srun", f"--jobid={job.job_id}", f"--job-name={name}", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", "--overlap", f"--gres={gres}", "--quiet", "--export=ALL",
            "sh", "-c", _STEP, "hl-step", local, cwd or "", *argv,
        ]  # fmt: skip

    def _running(self) -> Allocation:
        """The running allocation; another call may have found it lost since `connect`."""
        job = self._job
        if job is None or not job.nodes:
            raise ExecutorError(
                f"{self.host}: the allocation ended before the step started.",
                kind="allocation_lost",
                started=False,
                next_step="call again: the next call requests a new allocation",
            )
        return job

    @staticmethod
    def _gpu(env: Mapping[str, str] | None) -> int | None:
        """The allocation's GPU the launcher named (CUDA_VISIBLE_DEVICES=k), if any."""
        value = (env or {}).get("CUDA_VISIBLE_DEVICES", "")
        return int(value) if value.isdigit() else None

    async def _cancel_step(self, job: Allocation, name: str) -> None:
        """Kill the step named `name` (its processes, through Slurm); never raises."""
        with anyio.CancelScope(shield=True):
            try:
                res = await self._client(["squeue", "-h", "-s", "-j", job.job_id, "-o", "%i %j"])
                for line in res.stdout.splitlines():
                    step, _, step_name = line.partition(" ")
                    if step_name.strip() == name:
                        await self._client(["scancel", "--signal=KILL", step])
                        await self._client(["scancel", step])
            except ExecutorError as exc:
                log.warning("%s: could not cancel step %s: %s", self.host, name, exc)

    async def run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float,
        stdin: bytes | None = None,
        max_output_bytes: int = 8 << 20,
        on_line: LineSink | None = None,
    ) -> CommandResult:
        """Run argv as a step of the allocation (see `Executor.run`); on the slot's GPU when
        env names one. A step that could not start because the allocation had ended is retried
        once on a new allocation."""
        if not argv:
            raise ExecutorError("empty argv", kind="remote_env", started=False)
        for attempt in range(2):
            await self.connect()
            try:
                return await self._run_step(
                    argv, cwd, env, timeout_s, stdin, max_output_bytes, on_line
                )
            except ExecutorError as exc:
                if exc.started or attempt or exc.kind not in ("allocation_lost", "preempted"):
                    raise
                log.info("%s: %s; retrying on a new allocation", self.host, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _run_step(
        self,
        argv: list[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        timeout_s: float,
        stdin: bytes | None,
        limit: int,
        on_line: LineSink | None,
    ) -> CommandResult:
        job = self._running()
        name = f"hl-{uuid.uuid4().hex[:12]}"
        step = self._step_argv(job, name, self._gpu(env), cwd, argv)
        started = time.perf_counter()
        try:
            res = await self.login.run(
                step,
                env={**self._env, **(env or {})},
                timeout_s=timeout_s,
                stdin=stdin,
                max_output_bytes=limit,
                on_line=on_line,
            )
        except BaseException:
            await self._cancel_step(job, name)
            raise
        finally:
            self._last_used = time.monotonic()
        if res.timed_out:
            await self._cancel_step(job, name)
        else:
            await self._check_lost(res.stderr)
        if failure := start_failure(self.host, res.exit_code, res.stderr, argv[0], cwd):
            raise failure
        return res.model_copy(
            update={
                "argv": list(argv),
                "stderr": _EXIT_REPORT.sub("", res.stderr),
                "host": self.host,
                "duration_s": time.perf_counter() - started,
            }
        )

    async def start(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stderr_path: str | None = None,
    ) -> InteractiveProcess:
        """A long-lived step (a warm runner) talking JSON lines over srun's stdin/stdout; its
        stderr goes to stderr_path (appended), srun's own to `<stderr_path>.srun`."""
        await self.connect()
        job = self._running()
        name = f"hl-{uuid.uuid4().hex[:12]}"
        log_to = stderr_path or "/dev/null"
        words = ["sh", "-c", 'f=$1; shift; exec "$@" 2>>"$f"', "sh", log_to, *argv]
        step = self._step_argv(job, name, self._gpu(env), cwd, words)
        srun_log = f"{stderr_path}.srun" if stderr_path else None
        proc = await self.login.start(step, env={**self._env, **(env or {})}, stderr_path=srun_log)
        self._last_used = time.monotonic()
        return SlurmInteractive(self, job, name, proc, srun_log)

    async def sync_tree(
        self, local_dir: Path, remote_dir: str, *, skip: Collection[str] = ()
    ) -> list[str]:
        return await self.login.sync_tree(local_dir, remote_dir, skip=skip)

    def channels_held(self) -> int:
        return self.login.channels_held()

    # -- health -----------------------------------------------------------------------------

    async def health(
        self, *, python: str, min_free_disk_gb: float = 1.0, python_probe: bool = True
    ) -> HostHealth:
        """The compute node's health (through a step, as every backend's) plus the scheduler's
        view: partitions, free GPUs, this server's job. Waits up to HEALTH_WAIT_S for a
        pending allocation, then reports it pending instead of probing."""
        try:
            running = await self._ensure(None, give_up_s=HEALTH_WAIT_S)
        except ExecutorError as exc:
            report = HostHealth(host=self.host, executor=self.name, reachable=False)
            report.add(exc.kind, exc.message, exc.next_step)
            report.scheduler = await self.scheduler_state()
            return report
        if running:
            report = await probe_host(
                self, python=python, min_free_disk_gb=min_free_disk_gb, python_probe=python_probe
            )
        else:
            report = HostHealth(host=self.host, executor=self.name, reachable=True)
        report.scheduler = await self.scheduler_state()
        job = report.scheduler.get("job") or {}
        if job.get("state") == "PENDING":
            report.notes.append(
                Problem(
                    kind="pending",
                    message=f"job {job.get('id')} pending: {job.get('reason')}",
                    next_step="GPU tools wait for it (their progress says so); a smaller "
                    "allocation (--slurm-gpus) or another partition may start sooner",
                )
            )
        return report

    async def scheduler_state(self) -> dict[str, Any]:
        """Partitions (state, nodes, free GPUs) and this executor's job; never raises."""
        out: dict[str, Any] = {"partitions": [], "free_gpus": None, "job": None}
        try:
            res = await self._client(
                [
                    "sinfo",
                    "-h",
                    "-N",
                    "-O",
                    "NodeList:|,Partition:|,StateCompact:|,Gres:|,GresUsed:",
                ]
            )
            parts: dict[str, dict[str, Any]] = {}
            for line in res.stdout.splitlines():
                cells = [c.strip() for c in line.split("|")]
                if len(cells) < 5:
                    continue
                _node, partition, state, gres, used = cells[:5]
                p = parts.setdefault(
                    partition.rstrip("*"),
                    {"name": partition.rstrip("*"), "default": partition.endswith("*"),
                     "nodes": 0, "gpus": 0, "free_gpus": 0, "states": {}},
                )  # fmt: skip
                total = sum(int(n) for n in _GRES.findall(gres))
                busy = sum(int(n) for n in _GRES.findall(used))
                p["nodes"] += 1
                p["gpus"] += total
                if state.rstrip("*~#") in ("idle", "mix", "mixed") and not state.endswith("*"):
                    p["free_gpus"] += max(0, total - busy)
                p["states"][state] = p["states"].get(state, 0) + 1
            out["partitions"] = list(parts.values())
            out["free_gpus"] = sum(p["free_gpus"] for p in parts.values())
            if self._job is not None:
                state, reason, nodes = await self._job_state(self._job.job_id)
                out["job"] = {
                    "id": self._job.job_id,
                    "state": state or "GONE",
                    "reason": reason,
                    "nodes": nodes,
                }
        except ExecutorError as exc:
            out["error"] = f"{exc.kind}: {exc.message}"
        return out

    # -- shutdown ---------------------------------------------------------------------------

    async def release(self) -> None:
        """Cancel the allocation now (the next call submits a new one)."""
        job, self._job = self._job, None
        if job is not None:
            with anyio.CancelScope(shield=True):
                await self._cancel_job(job.job_id)

    async def aclose(self) -> None:
        """Cancel the allocation (its steps end with it), then close the login executor."""
        self._closing = True
        await self.release()
        await self.login.aclose()


class SlurmInteractive(InteractiveProcess):
    """A warm runner's step: lines through srun's stdin/stdout on the login node."""

    def __init__(
        self,
        executor: SlurmExecutor,
        job: Allocation,
        name: str,
        proc: InteractiveProcess,
        srun_log: str | None,
    ) -> None:
        self.pid = proc.pid
        self._executor, self._job, self._name, self._proc = executor, job, name, proc
        self._srun_log = srun_log
        self._killed = False

    def alive(self) -> bool:
        """Its srun still runs, in the allocation this executor still holds."""
        return self._executor._job is self._job and self._proc.alive()

    async def ended(self) -> Ending:
        return await self._proc.ended()

    async def send_line(self, line: str) -> None:
        try:
            await self._proc.send_line(line)
        except (ExecutorError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            if not self._killed:  # the step is gone: with its node or job?
                await self._executor._check_lost(self._srun_tail(), ended=True)
            raise

    async def receive_line(self, max_bytes: int = 64 << 20) -> str | None:
        line = await self._proc.receive_line(max_bytes)
        if line is None and not self._killed:  # the step ended: with its node or job?
            await self._executor._check_lost(self._srun_tail(), ended=True)
        return line

    def _srun_tail(self) -> str:
        """srun's own messages (on this machine; over SSH only squeue tells)."""
        if not self._srun_log or not self._executor.on_this_machine:
            return ""
        try:
            return Path(self._srun_log).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    async def kill(self) -> None:
        if self._killed:
            return
        self._killed = True
        await self._proc.kill()
        await self._executor._cancel_step(self._job, self._name)


__all__ = ["Allocation", "SlurmExecutor", "SlurmInteractive", "allocation_argv"]
