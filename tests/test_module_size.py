"""No module of the library (tools/) or the servers (servers/) grows past MAX_LINES: a module
longer than that holds more than one concern (STYLE: ~500 lines, 700 the hard ceiling). A module
already over it is named in OVER with its size, and the number is a ratchet: it may only go
down, and must be lowered when the module shrinks (so the slack cannot be spent again)."""

from __future__ import annotations

from pathlib import Path

import harnesslab.tools as tools

MAX_LINES = 700
ROOT = Path(tools.__path__[0]).parent  # holds tools/ and servers/ (repository or installed)
# Modules over MAX_LINES today, relative to ROOT, with their line counts. Empty: keep it so.
OVER: dict[str, int] = {}


def line_counts() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for folder in ("tools", "servers")
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def test_no_module_is_over_the_ceiling_unless_named_and_none_grows():
    counts = line_counts()
    assert counts, f"no modules found under {ROOT}"
    grown = {
        name: f"{n} lines (limit {OVER.get(name, MAX_LINES)})"
        for name, n in counts.items()
        if n > OVER.get(name, MAX_LINES)
    }
    assert not grown, f"split these modules by concern: {grown}"


def test_the_named_exceptions_are_exact_so_the_ratchet_only_turns_down():
    counts = line_counts()
    stale = {
        name: f"now {counts.get(name)} lines: lower OVER to that (or drop it at <= {MAX_LINES})"
        for name, limit in OVER.items()
        if counts.get(name) != limit
    }
    assert not stale, stale
