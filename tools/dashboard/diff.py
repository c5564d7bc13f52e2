"""A candidate's kernel against the best: the files of two checkpoints (state/checkpoints.py,
re-hashed on read) and a line diff of each, with unchanged runs folded.

Side of the trust boundary: trusted, read-only, the operator's. The files are the agent's code:
the page escapes them as text (servers/dashboard_page.py), nothing runs them.
"""

from __future__ import annotations

import difflib

from ..state import Workspace
from ..state.checkpoints import HASH_RE, Checkpoints
from .gather import READ_ERRORS, why
from .models import CandidateDiff, DiffLine, FileDiff

CONTEXT = 3  # unchanged lines kept around a change
MAX_FILE_BYTES = 256 << 10  # a bigger file is named, not shown


def line_diff(old: list[str], new: list[str], context: int = CONTEXT) -> list[DiffLine]:
    """The diff of two line lists; runs of more than 2 x `context` unchanged lines are folded
    into one `skip` line."""
    out: list[DiffLine] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
        None, old, new, autojunk=False
    ).get_opcodes():
        if tag != "equal":
            out += [DiffLine(tag="del", old_no=i + 1) for i in range(i1, i2)]
            out += [DiffLine(tag="add", new_no=j + 1) for j in range(j1, j2)]
            continue
        n = i2 - i1
        head = context if out else 0  # after a change
        tail = context if i2 < len(old) or j2 < len(new) else 0  # before a change
        shown = range(n) if n <= head + tail + 1 else [*range(head), -1, *range(n - tail, n)]
        for k in shown:
            if k < 0:
                out.append(DiffLine(tag="skip", count=n - head - tail))
            else:
                out.append(DiffLine(tag="same", old_no=i1 + k + 1, new_no=j1 + k + 1))
    return out


def _text(data: bytes) -> str:
    if len(data) > MAX_FILE_BYTES:
        return f"({len(data)} bytes: too big to show)\n"
    return data.decode("utf-8", errors="replace")


def best_candidate(ws: Workspace) -> tuple[str | None, str]:
    """The checkpoint to compare against: the latest best final pointer, else the dev one."""
    ckpt = Checkpoints(ws)
    for mode, label in (("final", "best verified (final)"), ("dev", "best dev score")):
        pointer = ckpt.latest_best(mode)
        if pointer and isinstance(pointer.get("hash"), str):
            return pointer["hash"], label
    return None, ""


def candidate_diff(ws: Workspace, candidate: str, against: str | None = None) -> CandidateDiff:
    """`candidate`'s files against `against` (default: the best, best_candidate)."""
    if not HASH_RE.match(candidate or ""):
        return CandidateDiff(candidate=candidate[:80], problem="not a candidate hash")
    label = "requested"
    if against is None:
        against, label = best_candidate(ws)
    ckpt = Checkpoints(ws)
    try:
        new = ckpt.files(candidate)
        old = ckpt.files(against) if against else {}
    except READ_ERRORS as exc:
        return CandidateDiff(candidate=candidate, best=against, best_label=label, problem=why(exc))
    files = []
    for rel in sorted(set(new) | set(old)):
        a, b = _text(old.get(rel, b"")), _text(new.get(rel, b""))
        files.append(
            FileDiff(
                path=rel,
                old_text=a,
                new_text=b,
                lines=line_diff(a.splitlines(), b.splitlines()),
                changed=a != b,
            )
        )
    return CandidateDiff(
        candidate=candidate,
        best=against,
        best_label=label if against else "no best yet: the whole candidate is shown",
        files=files,
    )


__all__ = ["CONTEXT", "best_candidate", "candidate_diff", "line_diff"]
