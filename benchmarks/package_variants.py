"""Variants of an installed harnesslab package for an A/B of a warm run_objective's host and
runner costs (issue 30: <= 0.2 s over SSH), each undoing one change by exact text replacement so
a variant that no longer applies fails loudly instead of measuring the base twice. The files a
variant touches are first restored from PRISTINE (copies of the installed ones, made once).

    python benchmarks/package_variants.py VARIANT PKG PRISTINE
        # PKG: the installed package (.../harnesslab); PRISTINE: a folder of its original files

Variants (combine with "+"):
  base        unchanged
  nohelper    the SSH stage sync runs every step as an SSH exec of its own (before 43f57aa)
  noreuse     the warm runner imports the candidate afresh on every request (before 0eaddc7)
  before      tools/gpu/timing.py replaced whole by .whl/timing_before.py (an earlier version:
              `git show REV:tools/gpu/timing.py > .whl/timing_before.py`, carried with the wheels)
benchmarks/session_gpu.sh's `objab` part runs bench_ssh_e2e.py's objective once per variant.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

EDITS: dict[str, list[tuple[str, str | None, str]]] = {  # (file, anchor or None: whole, new)
    "base": [],
    "before": [("tools/gpu/timing.py", None, ".whl/timing_before.py")],
    "nohelper": [
        (
            "tools/execution/ssh_sync.py",
            "        if not self._lock.locked() and not any(",
            "        if False and not any(",
        )
    ],
    "noreuse": [
        (
            "tools/gpu/runner.py",
            "        mod = _IMPORTED.get(name) if config is None else None\n",
            "        mod = None\n",
        )
    ],
}
FILES = sorted({path for edits in EDITS.values() for path, _old, _new in edits})


def apply(variant: str, pkg: Path, pristine: Path) -> None:
    """Restore every file a variant may touch from `pristine` (saving it there first), then
    apply `variant`'s edits."""
    for rel in FILES:
        saved = pristine / rel.replace("/", "__")
        if not saved.exists():
            pristine.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pkg / rel, saved)
        shutil.copyfile(saved, pkg / rel)
    for name in variant.split("+"):
        for rel, old, new in EDITS[name]:
            if old is None:
                shutil.copyfile(Path(__file__).resolve().parents[1] / new, pkg / rel)
                continue
            text = (pkg / rel).read_text()
            if text.count(old) != 1:
                raise SystemExit(f"variant {name}: its anchor is not in {rel} once: {old!r}")
            (pkg / rel).write_text(text.replace(old, new))


def main() -> int:
    variant, pkg, pristine = sys.argv[1:4]
    apply(variant, Path(pkg), Path(pristine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
