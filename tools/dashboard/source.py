"""What one dashboard watches: a workspace folder (opened afresh on every read, so a workspace
that `harnesslab run` creates later, or deletes, shows as it is), the lab and compare folders
the operator named, and the runs pinned with --run. `fingerprint` tells the page whether
anything it shows may have changed, from file metadata only (no file is read for it), so a page
polling every two seconds costs a few stat calls while nothing happens.

Side of the trust boundary: trusted, read-only, the operator's (see tools/dashboard/gather.py).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from ..settings import Settings
from ..state import TrustedStore
from ..state.workspace import Workspace, is_workspace, open_workspace
from .diff import candidate_diff
from .gather import READ_ERRORS, gather, workspace_missing
from .models import CandidateDiff, Dashboard
from .reports import compare_view, lab_view, latest_lab_folder


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Source:
    def __init__(
        self,
        root: Path,
        settings: Settings,
        *,
        labs: list[Path] | None = None,
        compares: list[Path] | None = None,
        runs: list[str] | None = None,
    ) -> None:
        self.root = root.expanduser().resolve()
        self.settings = settings
        self.labs = list(labs or [])
        self.compares = list(compares or [])
        self.runs = list(runs or []) or None

    def workspace(self) -> Workspace | None:
        """The workspace as it is now; None while the folder is not one (yet)."""
        if not is_workspace(self.root, self.settings):
            return None
        return open_workspace(self.root, self.settings)

    def watched(self) -> list[Path]:
        """Every file or folder whose change may change the page."""
        store = TrustedStore.location(self.settings, self.root)
        paths = [self.root, store / "binding.json"]
        if store.is_dir():
            paths += [
                store / "history.jsonl",
                store / "registry.json",
                store / "qualifications",
                store / "checkpoints" / "best",
                store / "runs",
            ]
            runs = store / "runs"
            if runs.is_dir():
                paths += [runs / name / "state.json" for name in os.listdir(runs)]
        paths += [self.root / ".harnesslab", self.root / ".harnesslab" / "telemetry.jsonl"]
        for folder in self.labs:
            found = latest_lab_folder(folder)
            paths += [folder, *([found, found / "results.json"] if found else [])]
        for folder in self.compares:
            paths += [folder, folder / "report.json"]
        return paths

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for path in self.watched():
            h.update(f"{path}\0{_stat(path)}\n".encode())
        return h.hexdigest()[:16]

    def snapshot(self, now: float | None = None) -> Dashboard:
        """The whole page's data; whatever cannot be read says so in its section."""
        now = time.time() if now is None else now
        try:
            ws = self.workspace()
        except READ_ERRORS as exc:
            page = workspace_missing(self.root, exc)
        else:
            if ws is None:
                page = Dashboard(
                    generated_at=now,
                    workspace=str(self.root),
                    missing=[
                        f"{self.root} is not a harnesslab workspace yet: `harnesslab init` or "
                        "`harnesslab run -w` creates one (this page picks it up when it appears)"
                    ],
                )
            else:
                page = gather(ws, runs=self.runs, now=now)
        page.labs = [lab_view(folder) for folder in self.labs]
        page.compares = [compare_view(folder, self.settings, now) for folder in self.compares]
        return page

    def diff(self, candidate: str) -> CandidateDiff:
        ws = self.workspace()
        if ws is None:
            return CandidateDiff(candidate=candidate[:80], problem="no workspace yet")
        return candidate_diff(ws, candidate)

    def lab_file(self, index: int, name: str) -> Path | None:
        """A plot of the `index`th lab report, only if its report lists it."""
        if not 0 <= index < len(self.labs):
            return None
        view = lab_view(self.labs[index])
        if name not in view.plots:
            return None
        return Path(view.folder) / name

    def compare_plot(self, index: int) -> Path | None:
        if not 0 <= index < len(self.compares):
            return None
        path = self.compares[index] / "scores.png"
        return path if path.is_file() else None


__all__ = ["Source"]
