"""The registry of executor backends: a name, and a factory that builds the executors for a
settings object. `build_launcher` asks here, so a new backend is one module plus one
`register_backend` call (README.md in this folder says how).

    settings.executor: "" (local, or ssh when gpu_host is set) | "local" | "ssh" | "slurm" |
                       a registered name
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UsageError
from ..settings import Settings
from .executor import Executor, LocalExecutor
from .slurm import SlurmExecutor

Factory = Callable[[Settings], list[Executor]]
BACKENDS: dict[str, Factory] = {}


def register_backend(name: str, factory: Factory) -> None:
    """Make `name` a value of HARNESSLAB_EXECUTOR: `factory(settings)` returns its executors
    (one per host; the launcher makes a slot per GPU of each)."""
    BACKENDS[name] = factory


def backend_name(settings: Settings) -> str:
    return settings.executor or ("ssh" if settings.gpu_host else "local")


def build_executors(settings: Settings) -> list[Executor]:
    name = backend_name(settings)
    factory = BACKENDS.get(name)
    if factory is None:
        raise UsageError(
            f"no executor backend {name!r}.",
            next_step=f"set HARNESSLAB_EXECUTOR to one of: {', '.join(sorted(BACKENDS))}",
        )
    executors = factory(settings)
    if not executors:
        raise UsageError(
            f"the {name} executor backend has no host to run on.",
            next_step="set HARNESSLAB_GPU_HOST (user@host[,user@host...])",
        )
    return executors


def _local(settings: Settings) -> list[Executor]:
    return [LocalExecutor(settings.state_dir)]


def _ssh(settings: Settings) -> list[Executor]:
    # asyncssh is imported only when an SSH backend is built.
    from .ssh import SSHExecutor  # noqa: PLC0415
    from .ssh_pool import targets_from_settings  # noqa: PLC0415

    return [SSHExecutor(t) for t in targets_from_settings(settings)]


def _slurm(settings: Settings) -> list[Executor]:
    """One executor for the allocation, reached through the login node: over SSH when
    gpu_host names it (its first entry), else this machine is the login node."""
    login = _ssh(settings)[:1] if settings.gpu_host else _local(settings)
    return [SlurmExecutor(login[0], settings)]


register_backend("local", _local)
register_backend("ssh", _ssh)
register_backend("slurm", _slurm)

__all__ = ["BACKENDS", "Factory", "backend_name", "build_executors", "register_backend"]
