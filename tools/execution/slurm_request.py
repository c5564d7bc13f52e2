"""A Slurm allocation request that can never start: which pending reasons say so, and the error
that says why in Slurm's own words, with the size of the partition's nodes and the flag to
change (tools/execution/slurm.py cancels the job and raises it instead of waiting).

Side of the trust boundary: trusted (it reads Slurm's client commands on the login node)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from ..errors import ExecutorError
from ..settings import Settings
from .executor import CommandResult

Client = Callable[[list[str]], Awaitable[CommandResult]]

# Pending reasons with which Slurm will never start the job as asked: the request exceeds what
# the partition, the account or the QoS allows (waiting for them ended only at the command's own
# timeout). Each with the flag that changes it; AssocMax*/QOSMax* are matched by prefix.
NEVER = {
    "PartitionConfig": "--slurm-gpus, or fewer CPUs per GPU (HARNESSLAB_SLURM_CPUS_PER_GPU)",
    "BadConstraints": "--slurm-constraint (`sinfo -o '%N %f'` lists the nodes' features)",
    "PartitionNodeLimit": "--slurm-nodes",
    "PartitionTimeLimit": "--slurm-time (`sinfo -o '%P %l'` lists the partitions' limits)",
    "InvalidAccount": "--slurm-account",
    "AccountNotAllowed": "--slurm-account or --slurm-partition",
    "InvalidQOS": "--slurm-qos",
    "QOSNotAllowed": "--slurm-qos or --slurm-partition",
}
NEVER_PREFIXES = ("AssocMax", "QOSMax")
_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


def never_starts(reason: str) -> bool:
    """Whether a pending job with this reason can only start once its request changes."""
    return reason in NEVER or reason.startswith(NEVER_PREFIXES)


async def node_sizes(client: Client, partition: str) -> tuple[int, int] | None:
    """(CPUs, GPUs) of the largest node of `partition` (the default one when ''), from sinfo;
    None when sinfo does not say."""
    res = await client(["sinfo", "-h", *(["-p", partition] if partition else []), "-o", "%c|%G"])
    sizes = []
    for line in res.stdout.split() if res.exit_code == 0 else []:
        cpus, _, gres = line.partition("|")
        if cpus.isdigit():
            sizes.append((int(cpus), sum(int(n) for n in _GRES.findall(gres))))
    return max(sizes) if sizes else None


async def never_error(
    client: Client, settings: Settings, host: str, job_id: str, reason: str, argv: list[str]
) -> ExecutorError:
    """Why the allocation `argv` (an sbatch command line) never starts: Slurm's own words from
    `sbatch --test-only` of the same request, what it asked for, what the nodes have, and the
    flag (with values that fit, for CPUs and GPUs) to change."""
    test = await client([argv[0], "--test-only", *argv[1:]])
    said = test.stderr_tail(2).replace("\n", "; ").strip() if test.exit_code else ""
    nodes = await node_sizes(client, settings.slurm_partition)
    gpus, cpg = settings.slurm_gpus, settings.slurm_cpus_per_gpu
    asked = f"{settings.slurm_nodes} node(s) x {gpus} GPU(s) and {gpus * cpg} CPUs"
    has = f"; its nodes have at most {nodes[0]} CPUs and {nodes[1]} GPUs" if nodes else ""
    fix = NEVER.get(reason) or "ask for less (--slurm-gpus, --slurm-nodes, --slurm-time)"
    if reason == "PartitionConfig" and nodes and nodes[1]:
        fit = min(nodes[1], gpus)
        fix = (
            f"--slurm-gpus {fit} and HARNESSLAB_SLURM_CPUS_PER_GPU="
            f"{max(1, min(nodes[0] // fit, cpg))} fit them"
        )
    return ExecutorError(
        f"{host}: Slurm will never start the allocation as asked: job {job_id} was pending with "
        f"reason {reason}{f' ({said})' if said else ''}; it asked for {asked}{has}. The job was "
        "cancelled.",
        kind="remote_env",
        started=False,
        next_step=f"change the request: {fix}",
    )


__all__ = ["NEVER", "never_error", "never_starts", "node_sizes"]
