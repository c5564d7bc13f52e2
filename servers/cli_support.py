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


def settings_from(args: argparse.Namespace, base: Settings) -> Settings:
    updates: dict[str, Any] = {}
    for field, attr in (
        ("gpu_host", "gpu_host"),
        ("ssh_key", "ssh_key"),
        ("known_hosts", "known_hosts"),
        ("gpus", "gpus"),
        ("interpret", "interpret"),
    ):
        value = getattr(args, attr, None)
        if value:
            updates[field] = value
    if getattr(args, "accept_new_host_key", False):
        updates["accept_new_host_key"] = True
    return base.model_copy(update=updates)


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
    "run_async",
    "settings_from",
    "temp_workspace_dir",
]
