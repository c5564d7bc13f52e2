"""What every `harnesslab` subcommand module uses: the registry its handlers join
(`@command`), the executor flags and their settings, and running a coroutine. cli.py builds the
parser from COMMANDS after importing the command modules it names; none of them imports cli."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

from harnesslab.tools.errors import UsageError
from harnesslab.tools.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]
COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Handler]] = {}


def command(name: str, help_text: str, add_args: Callable[[argparse.ArgumentParser], None]):
    """Register a subcommand: `add_args` declares its arguments, the decorated handler runs it."""

    def bind(handler: Handler) -> Handler:
        COMMANDS[name] = (add_args, handler)
        HELP[name] = help_text
        return handler

    return bind


HELP: dict[str, str] = {}


# Slurm flags: the settings field is the flag's name (--slurm-gpus -> slurm_gpus).
SLURM_FLAGS = {
    "--slurm-gpus": "GPUs per node of the allocation (--gres=gpu:N)",
    "--slurm-nodes": "nodes of the allocation",
    "--slurm-partition": "partition",
    "--slurm-account": "account",
    "--slurm-qos": "QoS",
    "--slurm-time": "time limit of the allocation, e.g. 2:00:00",
    "--slurm-constraint": "node features, e.g. h100",
}


def executor_flags() -> list[tuple[str, str]]:
    """(flag, settings field) of every executor flag that takes a value."""
    plain = [("--gpu-host", "gpu_host"), ("--ssh-key", "ssh_key"), ("--known-hosts", "known_hosts"),
             ("--gpus", "gpus"), ("--interpret", "interpret"), ("--executor", "executor")]  # fmt: skip
    return plain + [(f, f[2:].replace("-", "_")) for f in SLURM_FLAGS]


def add_executor_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("GPU host (default: this machine; Triton interpreter without a GPU)")
    g.add_argument(
        "--gpu-host", help="user@host[:port] or ssh-config alias; comma-separated for several"
    )
    g.add_argument("--ssh-key", type=Path, help="private key for the GPU host")
    g.add_argument("--known-hosts", type=Path, help="known_hosts file (default ~/.ssh/known_hosts)")
    g.add_argument(
        "--accept-new-host-key", action="store_true", help="trust and record an unknown host key"
    )
    g.add_argument("--gpus", help="GPU indices per host, e.g. 0,1")
    g.add_argument(
        "--interpret", choices=["auto", "always", "never"], help="Triton CPU interpreter"
    )
    g.add_argument(
        "--executor",
        help="executor backend: local, ssh, slurm (default: ssh with --gpu-host, else local)",
    )
    s = p.add_argument_group(
        "Slurm (--executor slurm; --gpu-host names the login node, or none when serving on it)"
    )
    for flag, what in SLURM_FLAGS.items():
        s.add_argument(
            flag, type=int if flag in ("--slurm-gpus", "--slurm-nodes") else str, help=what
        )


def settings_from(args: argparse.Namespace, base: Settings) -> Settings:
    """`base` with the executor flags applied, each checked like its HARNESSLAB_* variable
    (--slurm-gpus -5 is a usage error before anything is submitted or allocated)."""
    updates: dict[str, Any] = {}
    for _flag, field in executor_flags():
        value = getattr(args, field, None)
        if value is not None and value != "":
            updates[field] = value
    if getattr(args, "accept_new_host_key", False):
        updates["accept_new_host_key"] = True
    if not updates:
        return base
    try:
        return Settings.model_validate({**base.model_dump(), **updates})
    except ValidationError as exc:
        field, _, rest = validation_text(exc).partition("=")
        raise UsageError(
            f"--{field.replace('_', '-')}={rest}",
            next_step="see the command's --help for the allowed values",
        ) from exc


def validation_text(exc: ValidationError) -> str:
    """A pydantic ValidationError in one line: where, what was given, what is allowed."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "value"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}={err.get('input')!r}: {err['msg']}{more}"[:300]


def run_async(fn, *args: Any) -> Any:
    return anyio.run(fn, *args)


def temp_workspace_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="harnesslab-demo-"))


__all__ = [
    "COMMANDS",
    "HELP",
    "Handler",
    "add_executor_args",
    "command",
    "executor_flags",
    "run_async",
    "settings_from",
    "temp_workspace_dir",
    "validation_text",
]
