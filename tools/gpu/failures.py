"""What a failed case says: a one-line reason pointing at the candidate's own file and line,
hints for known messages that do not say what to change, and the per-case deadline whose expiry
is a timeout (however the Triton interpreter wraps it).

Staged to the GPU host beside runner.py (standard library only, never harnesslab); runs in the
runner's process (inside sandbox.py with the candidate in dev modes). The guarded verify's
per-call reasons are written by guard.py, not here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import traceback

MAX_REASON = 2000  # characters of an exception's first line kept in a reason


class CaseTimeout(Exception):
    pass


def caused_by(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """`exc` or the first exception of type `kind` that (directly or not) caused it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Raise CaseTimeout in the main thread after `seconds` (covers Python-level hangs; a hung
    GPU kernel is the parent's job: it kills the whole process group)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):
        raise CaseTimeout(f"exceeded {seconds:.0f}s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def one_line(exc: BaseException, candidate_dir: str | None = None) -> str:
    """A one-line reason, pointing at the candidate's own file and line when possible."""
    late = caused_by(exc, CaseTimeout)
    if late is not None:  # the deadline, however wrapped (the interpreter re-raises it)
        return f"timeout: case {late}"
    where = ""
    tb = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(tb):
        if candidate_dir and frame.filename.startswith(candidate_dir):
            where = f" at {os.path.basename(frame.filename)}:{frame.lineno}"
            break
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" at {os.path.basename(exc.filename)}:{exc.lineno}"
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}{where}: {msg}"
    if len(text) > MAX_REASON:  # said, not silently cut mid-word
        text = f"{text[:MAX_REASON]}... ({len(text) - MAX_REASON} more characters)"
    for needle, hint in HINTS.items():
        if needle in str(exc):
            text += f" (hint: {hint})"
    return text


# Known failures whose messages do not say what to change.
HINTS = {
    "mask has unsupported dtype": "the Triton CPU interpreter (3.9) rejects a vector mask combined "
    "with a scalar condition, e.g. (cols < dim) & (row < n_rows); test the scalar with `if` or "
    "broadcast it to a vector first",
    "out of resource: shared memory": "lower num_stages or the block size",
}
