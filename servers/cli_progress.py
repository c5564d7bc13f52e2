"""Progress of a long CLI command on stderr, from the same `(done, total, message)` events the
MCP tools send as progress notifications: a rich bar (done/total, elapsed, time left) on a
terminal, one plain line per event otherwise (CI logs, pipes). stdout keeps only the result, so
`--json` output stays clean while progress still shows. A count never passes its total.
Presentation only: it decides nothing."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class CliProgress:
    """`with CliProgress("verify") as progress: await guarded_verify(..., progress=progress)`."""

    def __init__(self, what: str, *, console: Console | None = None) -> None:
        self.what = what
        self.console = console or Console(stderr=True, highlight=False)
        self.live = self.console.is_terminal
        self.t0 = time.monotonic()
        self.last = ""
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self) -> CliProgress:
        if self.live:
            self.bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,  # the result replaces it
            )
            self.bar.start()
            self.task = self.bar.add_task(f"{self.what}: starting", total=None)
        else:  # something at once: the first event may be seconds away (torch import, compile)
            self.console.print(f"  {self.what}: started")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, done: float, total: float, message: str) -> None:
        total = max(total, 0)
        done = min(max(done, 0), total) if total else max(done, 0)
        if self.bar is not None and self.task is not None:
            self.bar.update(
                self.task,
                completed=done,
                total=total or None,
                description=f"{self.what}: {message}",
            )
            return
        line = f"[{done:g}/{total:g}] {message}" if total else message
        if line != self.last:
            self.last = line
            self.console.print(f"  {time.monotonic() - self.t0:5.1f}s {line}", soft_wrap=True)


__all__ = ["CliProgress"]
