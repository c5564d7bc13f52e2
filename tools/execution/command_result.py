"""What one command did on an executor: the result type of the executor contract's `run`
(tools/execution/executor.py), kept below it so that the health probe, which the executor's own
`health` runs, can name it.

Side of the trust boundary: trusted (a record of a command's output; the caller judges it).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class CommandResult(BaseModel):
    """What one command did. Output is kept whole up to `max_output_bytes`, then its tail."""

    argv: list[str]
    exit_code: int | None = Field(description="None when killed by timeout or cancel")
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    host: str = "local"

    def stderr_tail(self, lines: int = 20) -> str:
        return "\n".join(self.stderr.strip().splitlines()[-lines:])


__all__ = ["CommandResult"]
