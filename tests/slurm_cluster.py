"""A real one-node Slurm cluster on this machine for tests and the CPU benchmark.

`start_cluster(workdir)` starts munged (its key and socket in `workdir`), slurmctld and slurmd
(Debian's slurm-wlm 22.05) with a generated slurm.conf: this host as the only node, two CPUs,
two "GPUs" declared as gres with `File=` pointing at two empty files (a file-less gpu gres is
dropped and the node goes INVAL), `AutoDetect=off`, proctrack/linuxproc, task/none,
select/cons_tres and no accounting. Ports are free ones, so clusters of several test sessions
never meet. `SLURM_CONF` must point at `cluster.conf` for the client commands (srun, squeue);
the tests pass it through `Settings.slurm_conf` (`slurm_settings`). Fixture: `slurm_cluster`
(one per session); tests that use it get the `slurm` marker (conftest.py).

Needs root (slurmd starts job steps as the submitting user) and the packages slurm-wlm and
munge (.ci/run installs them). Where it cannot start, `start_cluster` raises `ClusterUnavailable`
with the reason, and the fixtures skip with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harnesslab.tools.settings import Settings

BINARIES = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun")
START_TIMEOUT_S = 30.0
PARTITION = "hltest"


class ClusterUnavailable(RuntimeError):
    """Slurm cannot run here (not installed, not root, a daemon failed); the message says why."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(eq=False)
class Cluster:
    workdir: Path
    node: str
    gpus: int
    conf: Path
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *argv: str, timeout_s: float = 30.0) -> str:
        """A Slurm client command against this cluster; its stdout."""
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> list[str]:
        """`squeue` lines (job id and state) of every job on the cluster."""
        return self.command("squeue", "-h", "-o", "%i %T").split()

    def node_state(self) -> str:
        return self.command("sinfo", "-h", "-n", self.node, "-o", "%T").strip()

    def wait_until(self, predicate, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"slurm: {what} not reached in {timeout_s:.0f} s")
            time.sleep(0.1)  # polls a bounded wait on the daemons

    def kill_slurmd(self) -> None:
        """A node failing mid-call: SIGKILL slurmd, the step daemons of this cluster's jobs and
        every process of those jobs (found by pid, before they are killed)."""
        jobs = self.command("squeue", "-h", "-t", "running", "-o", "%i").split()
        victims: list[int] = []
        for job in jobs:
            listing = self.command("scontrol", "listpids", job).splitlines()[1:]
            victims += [int(row.split()[0]) for row in listing if row.split()[:1] != ["-1"]]
        self._stop("slurmd", signal.SIGKILL)
        for proc in Path("/proc").iterdir():
            try:
                title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if title.startswith("slurmstepd: [") and title[13:].split(".")[0] in jobs:
                victims.append(int(proc.name))
        for pid in victims:
            _kill(pid)

    def start_slurmd(self) -> None:
        """Start slurmd again and bring the node back (after `kill_slurmd`)."""
        self._start("slurmd", ["/usr/sbin/slurmd", "-D", "-f", str(self.conf)])
        self.wait_until(lambda: _answers(self, "slurmd"), "slurmd up")
        try:
            self.command("scontrol", "update", f"nodename={self.node}", "state=resume")
        except RuntimeError:
            pass  # not down: nothing to resume
        self.wait_until(
            lambda: self.node_state() in ("idle", "mixed", "allocated"), "node idle again"
        )

    def stop(self) -> None:
        for job in self.command("squeue", "-h", "-o", "%i").split() if self.alive() else []:
            subprocess.run(["scancel", job], env=self.env, check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            self._stop(name, signal.SIGTERM)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.daemons.values())

    def _start(self, name: str, argv: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.daemons[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        log.close()

    def _stop(self, name: str, sig: int) -> None:
        process = self.daemons.pop(name, None)
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])


def _answers(cluster: Cluster, daemon: str) -> bool:
    try:
        if daemon == "slurmctld":
            cluster.command("scontrol", "ping", timeout_s=5)
        else:
            cluster.command("scontrol", "show", "node", cluster.node, timeout_s=5)
        return True
    except (RuntimeError, subprocess.TimeoutExpired):
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _gpu_file(path: Path) -> None:
    """A stand-in GPU device: a character device (/dev/null's numbers) where mknod is allowed,
    so slurmd sets CUDA_VISIBLE_DEVICES for the steps as on a real GPU node; else an empty
    file (the gres still counts, but steps get no CUDA_VISIBLE_DEVICES)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        path.touch()


def slurm_conf(workdir: Path, node: str, *, gpus: int, cpus: int, ports: tuple[int, int]) -> str:
    # Job ids start at a random number: a step daemon is found by its job id (kill_slurmd), and
    # another session's test cluster on this machine counts from its own.
    first_job = 1000 + int.from_bytes(os.urandom(3)) % 9_000_000
    return f"""FirstJobId={first_job}
ClusterName=hl{workdir.name[-8:].lower().replace("_", "")}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={workdir}/munge.sock
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
GresTypes=gpu
ReturnToService=2
SlurmdTimeout=5
SlurmctldTimeout=5
InactiveLimit=0
KillWait=2
MessageTimeout=5
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{gpus} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def start_cluster(workdir: Path | None = None, *, gpus: int = 2) -> Cluster:
    """Start munged, slurmctld and slurmd; raises ClusterUnavailable when they cannot run."""
    missing = [b for b in BINARIES if not Path(b).is_file()]
    if missing:
        raise ClusterUnavailable(f"not installed: {', '.join(missing)} (apt-get install slurm-wlm)")
    if os.geteuid() != 0:
        raise ClusterUnavailable("the test cluster's slurmd needs root")
    workdir = Path(tempfile.mkdtemp(prefix="hl-slurm-")) if workdir is None else workdir
    for sub in ("state", "spool"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    node = socket.gethostname().split(".")[0]
    for i in range(gpus):
        _gpu_file(workdir / f"gpu{i}")
    key = workdir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = workdir / "slurm.conf"
    ports = (_free_port(), _free_port())
    conf.write_text(slurm_conf(workdir, node, gpus=gpus, cpus=max(2, gpus), ports=ports))
    files = f"{workdir}/gpu[0-{gpus - 1}]" if gpus > 1 else f"{workdir}/gpu0"
    (workdir / "gres.conf").write_text(f"AutoDetect=off\nNodeName={node} Name=gpu File={files}\n")
    cluster = Cluster(workdir=workdir, node=node, gpus=gpus, conf=conf)
    try:
        cluster._start(
            "munged",
            [
                "/usr/sbin/munged", "-F", "-f", "--key-file", str(key),
                "--socket", str(workdir / "munge.sock"), "--pid-file", str(workdir / "munged.pid"),
                "--seed-file", str(workdir / "munge.seed"), "--log-file", str(workdir / "munged.log"),
            ],
        )  # fmt: skip
        cluster.wait_until(lambda: (workdir / "munge.sock").exists(), "munged socket")
        cluster._start("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)])
        cluster.wait_until(lambda: _answers(cluster, "slurmctld"), "slurmctld answering")
        cluster._start("slurmd", ["/usr/sbin/slurmd", "-D", "-f", str(conf)])
        cluster.wait_until(lambda: cluster.node_state() == "idle", "node idle")
    except (ClusterUnavailable, OSError, RuntimeError) as exc:
        logs = "\n".join(f"--- {n}\n{cluster.log_tail(n)}" for n in ("slurmctld", "slurmd"))
        cluster.stop()
        raise ClusterUnavailable(f"{exc}\n{logs}") from exc
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """One test cluster for the whole session (starting it takes about a second); skips
    with the reason where Slurm cannot run."""
    try:
        cluster = start_cluster()
    except ClusterUnavailable as exc:
        pytest.skip(f"no test Slurm cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


def slurm_settings(cluster: Cluster, state_dir: Path, **overrides: object) -> Settings:
    """Settings of a Slurm executor on `cluster`: both GPUs of its node, one CPU each."""
    values: dict[str, object] = {
        "state_dir": state_dir,
        "executor": "slurm",
        "slurm_gpus": cluster.gpus,
        "slurm_cpus_per_gpu": 1,
        "slurm_time": "30:00",
        "slurm_conf": str(cluster.conf),
        **overrides,
    }
    return Settings.model_validate(values)


SLURM_FIXTURES = frozenset({"slurm_cluster"})

__all__ = [
    "PARTITION",
    "SLURM_FIXTURES",
    "Cluster",
    "ClusterUnavailable",
    "slurm_cluster",
    "slurm_settings",
    "start_cluster",
]
