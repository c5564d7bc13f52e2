"""The one settings object. Built once in main() and passed down; library code never reads
os.environ itself. Every field can be set with a HARNESSLAB_<FIELD> environment variable."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_state_dir() -> Path:
    return Path.home() / ".local" / "state" / "harnesslab"


class Settings(BaseSettings):
    """Toolkit settings (env prefix HARNESSLAB_)."""

    model_config = SettingsConfigDict(
        env_prefix="HARNESSLAB_", extra="ignore", populate_by_name=True
    )

    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Per-user state outside every workspace: hidden-case secrets, caches.",
    )
    python: str = Field(
        default=sys.executable,
        description="Python interpreter that runs the GPU-side runner on the local executor.",
    )
    remote_python: str = Field(
        default="python3", description="Python interpreter on the GPU host (SSH executor)."
    )
    interpret: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="Triton interpreter on the CPU: auto = only when no CUDA GPU is visible.",
    )
    eval_timeout_s: float = Field(
        default=300.0, gt=0, description="Wall-clock limit for one runner invocation."
    )
    case_timeout_s: float = Field(
        default=60.0, gt=0, description="Limit for one case inside the runner (a hang fails it)."
    )
    warm_workers: bool = Field(
        default=True,
        description="Keep one runner per GPU warm (torch/triton/CUDA initialised) between calls.",
    )
    worker_idle_s: float = Field(
        default=600.0, gt=0, description="A warm worker exits after this idle time."
    )
    worker_max_calls: int = Field(
        default=50, ge=1, description="Restart a warm worker after this many calls (leaks, caches)."
    )
    executor: str = Field(
        default="",
        description="Executor backend: local, ssh, or another registered one "
        "(tools/execution/backends.py); empty: ssh when gpu_host is set, else local.",
    )
    # Remote GPU host (SSH executor). Empty gpu_host means the local executor.
    gpu_host: str = Field(
        default="",
        description="user@host[:port] or an ~/.ssh/config alias; comma-separated for several hosts.",
    )
    ssh_port: int | None = Field(
        default=None, description="SSH port (default from ssh config, 22)."
    )
    ssh_user: str | None = Field(default=None, description="SSH login user.")
    ssh_key: Path | None = Field(default=None, description="Private key file for SSH.")
    known_hosts: Path | None = Field(
        default=None, description="known_hosts file (default ~/.ssh/known_hosts); always checked."
    )
    accept_new_host_key: bool = Field(
        default=False,
        description="Trust an unknown host key on first connect and record it (never silent).",
    )
    remote_root: str = Field(
        default="~/.cache/harnesslab", description="Folder on the GPU host for synced workspaces."
    )
    allow_unsandboxed: bool = Field(
        default=False,
        description="Run guarded verification even where no sandbox (Landlock) can be applied. "
        "Only for a machine whose agent-written code you trust; every result says sandbox: none.",
    )
    custom_tools_workspace: Path | None = Field(
        default=None,
        description="Set by qualification for the generated server it starts: the path at "
        "which the server's custom tools see the workspace (the clean room is mounted there in "
        "their sandbox, so that it looks as it will when served). Unset otherwise.",
    )
    gpus: str = Field(
        default="",
        description="GPU indices to use per host, e.g. '0,1'; empty = one GPU (index 0).",
    )
    # Limits of every sandboxed process (tools/gpu/isolation/sandbox_policy.py Limits says what enforces
    # each one where). A run that exceeds one ends with `resource_limit: <which>`.
    sandbox_memory_mb: int = Field(
        default=8192, ge=64, description="Memory of one sandbox, swap included (a cgroup)."
    )
    sandbox_pids: int = Field(
        default=1024, ge=16, description="Processes and threads of one sandbox (a cgroup)."
    )
    sandbox_file_mb: int = Field(
        default=1024, ge=1, description="Largest file a sandboxed process may write."
    )
    sandbox_cpu_s: int = Field(
        default=3600,
        ge=10,
        description="CPU seconds of one sandboxed process (a warm worker's "
        "whole life: it is replaced after worker_max_calls calls).",
    )
    sandbox_open_files: int = Field(
        default=4096, ge=64, description="Open file descriptors of one sandboxed process."
    )
    sandbox_scratch_mb: int = Field(
        default=1024,
        ge=16,
        description="Size of a sandbox's private scratch folder (a tmpfs "
        "counted as its memory): its TMPDIR, HOME and caches.",
    )
    sandbox_cgroup: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: memory and pids limits through a cgroup where this machine lets the "
        "sandbox make one (v2 delegated, else v1), rlimits elsewhere; off: rlimits only.",
    )

    # Slurm executor (HARNESSLAB_EXECUTOR=slurm): an allocation on a cluster, reached through
    # the login node (gpu_host, over SSH) or directly when this process runs on the login node.
    slurm_gpus: int = Field(default=1, ge=1, le=64, description="GPUs per node of the allocation.")
    slurm_nodes: int = Field(default=1, ge=1, le=1024, description="Nodes of the allocation.")
    slurm_partition: str = Field(default="", description="Partition (-p); empty: the default.")
    slurm_account: str = Field(default="", description="Account (-A); empty: the default.")
    slurm_qos: str = Field(default="", description="QoS (--qos); empty: the default.")
    slurm_constraint: str = Field(default="", description="Node features (-C), e.g. 'h100'.")
    slurm_time: str = Field(
        default="4:00:00", description="Time limit of the allocation (--time), e.g. '2:00:00'."
    )
    slurm_cpus_per_gpu: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="CPUs per GPU of the allocation (compiles run on them).",
    )
    slurm_idle_s: float = Field(
        default=900.0,
        gt=0,
        description="The allocation ends itself after this long with no work in it (no step).",
    )
    slurm_conf: str = Field(
        default="", description="slurm.conf on the login node (SLURM_CONF); empty: Slurm's own."
    )

    # The shared HTTP server (`serve --transport http`): session limits, so that one client
    # cannot fill the session table for everyone (servers/http_sessions.py).
    http_max_sessions: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Open MCP sessions of the HTTP server in all (~40 kB each); when full, the "
        "session idle longest is closed to make room.",
    )
    http_max_sessions_per_client: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Open sessions per client address; one more is answered 429 with Retry-After.",
    )
    http_session_idle_min: float = Field(
        default=10.0,
        gt=0,
        le=7 * 24 * 60,
        description="Minutes a session may go without a request or an open stream before the "
        "server closes it.",
    )

    # Agent CLIs (the claude and codex runners, `doctor`, `config --approve`).
    claude_command: str = Field(
        default="claude", description="Claude Code program for --runner claude (name or path)."
    )
    codex_command: str = Field(
        default="codex", description="Codex CLI program for --runner codex (name or path)."
    )
    claude_config_dir: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("HARNESSLAB_CLAUDE_CONFIG_DIR", "CLAUDE_CONFIG_DIR"),
        description="Claude Code's config folder (CLAUDE_CONFIG_DIR): its global .claude.json "
        "holds the workspace trust that `config claude --approve` writes; default: home folder.",
    )
    codex_home: Path | None = Field(
        default=None,
        validation_alias=AliasChoices("HARNESSLAB_CODEX_HOME", "CODEX_HOME"),
        description="Codex's home (CODEX_HOME, default ~/.codex): its config.toml holds the "
        "project trust that `config codex --approve` writes.",
    )

    def claude_global_config(self) -> Path:
        """Claude Code's global config file (workspace trust lives in its `projects`)."""
        return (self.claude_config_dir or Path.home()) / ".claude.json"

    def codex_config(self) -> Path:
        """Codex's user config file (project trust lives in its `projects` tables)."""
        return (self.codex_home or Path.home() / ".codex") / "config.toml"

    def secrets_dir(self) -> Path:
        return self.state_dir / "secrets"

    def sandbox_limits(self) -> dict[str, int | str]:
        """The sandbox's limits as `sandbox_policy.Limits.from_dict` reads them (the request
        carries this to the GPU host's guarded verify)."""
        return {
            "memory_mb": self.sandbox_memory_mb,
            "pids": self.sandbox_pids,
            "file_mb": self.sandbox_file_mb,
            "cpu_s": self.sandbox_cpu_s,
            "open_files": self.sandbox_open_files,
            "scratch_mb": self.sandbox_scratch_mb,
            "cgroup": self.sandbox_cgroup,
        }

    def to_env(self) -> dict[str, str]:
        """The HARNESSLAB_* variables that give a child harnesslab process these settings: the
        state dir always, every other field that differs from its default (the one conversion,
        for turn servers, registered servers, `serve-generated` and qualification's children)."""
        env = {"HARNESSLAB_STATE_DIR": str(self.state_dir)}
        for key, value in self.model_dump(mode="json", exclude_defaults=True).items():
            if value is None or value == "" or key == "state_dir":
                continue
            env[f"HARNESSLAB_{key.upper()}"] = str(value)
        return env


__all__ = ["Settings"]
