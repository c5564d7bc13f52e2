"""The runner's streamed events turned into `progress(done, total, message)` steps (the one
`Progress` type and its call are tools/progress.py).

Side of the trust boundary: trusted (host); an event's text is the runner's, shown to the
agent as feedback only (the guarded verify forwards none of it: tools/integrity/verify.py).
"""

from __future__ import annotations

from typing import Any

from ..progress import Progress, report


def case_events_progress(total: int, progress: Progress | None, unit: str = "case"):
    """The runner's streamed events as `progress(done, total, message)`: one step per event of
    `unit` ("case"; "config" for a sweep, whose runner also streams each config's cases;
    "probe"), never past `total`; "waiting" (for the GPU, for a Slurm allocation) says why
    nothing moves."""
    done = [0]

    async def on_event(ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if progress is None or kind not in ("waiting", unit):
            return
        if kind == "waiting":
            await report(progress, done[0], total, str(ev.get("message")))
            return
        done[0] = min(done[0] + 1, total)
        if kind == "case" and "name" not in ev:  # a hidden case: index only
            label = f"case {done[0]} of {total}"
        elif kind == "config":
            label = f"config {done[0]} of {total}"
        else:
            label = ev.get("name") or ev.get("probe") or kind
        await report(progress, done[0], total, f"{label}: {ev.get('status', '')}")

    return on_event


__all__ = ["case_events_progress"]
