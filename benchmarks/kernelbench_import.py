"""KernelBench import coverage: every problem of one or more KernelBench level folders through
`task import-kernelbench` (in process, as the CLI does it), then each written task's baseline
against its reference through the ordinary runner (the Triton interpreter without a GPU).

    python benchmarks/kernelbench_import.py KernelBench/level1 KernelBench/level2 \
        --out /tmp/kb_tasks [--no-check] [--json rows.json]

Prints one row per problem (written and its baseline's outcome, or refused and why, with the
import's wall time and peak resident memory while that file was imported), then per level: the
totals, the refusals grouped by reason, the median and max time and peak RSS per file, and the
whole process's peak RSS. The KernelBench sources are not part of this repository: fetch
https://github.com/ScalingIntelligence/KernelBench and point this script at its level folders.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import anyio

from harnesslab.tools.authoring.baseline_check import check_baselines
from harnesslab.tools.authoring.kernelbench import import_kernelbench, kernelbench_files
from harnesslab.tools.authoring.scaffold import record_check
from harnesslab.tools.settings import Settings


class PeakRss:
    """This process's peak resident memory since `reset`, sampled every 5 ms (ru_maxrss only
    ever grows, so a per-file peak needs sampling)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, int(self.now_mb()))

    def reset(self) -> None:
        self.peak = int(self.now_mb())

    def stop(self) -> None:
        self._stop.set()


WARM_UP = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        return torch.softmax(self.norm(x), dim=-1)

batch_size = 8
features = 32

def get_inputs():
    return [torch.rand(batch_size, features)]

def get_init_inputs():
    return [features]
"""


def warm_up(folder: Path) -> None:
    """One tiny file first: the first import in a process pays torch's one-time initialisation
    of meta tensors and decompositions (seconds), which is not any file's cost."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "0_warm_up.py").write_text(WARM_UP)
    import_kernelbench(folder / "0_warm_up.py", folder / "tasks", dtypes=["float32"], force=True)


def import_level(folder: Path, out: Path, rss: PeakRss) -> list[dict]:
    rows = []
    for path in kernelbench_files(folder):
        rss.reset()
        (row,) = import_kernelbench(path, out, dtypes=["float32"], force=True)
        rows.append({"level": folder.name, **row.model_dump(), "peak_rss_mb": rss.peak})
    return rows


def check(rows: list[dict]) -> None:
    written = [r for r in rows if r["status"] == "written"]
    results = anyio.run(check_baselines, [Path(r["folder"]) for r in written], Settings())
    for row, result in zip(written, results, strict=True):
        if isinstance(result, str):
            row["baseline"], row["failing"] = "failed", [result]
        else:
            row["baseline"] = "passed" if result.status == "passed" else "failed"
            row["failing"] = [f"{c.name}: {c.reason}" for c in result.cases if c.status != "passed"]
        record_check(Path(row["folder"]), row["baseline"], row["failing"])


def reason_group(reason: str) -> str:
    """A refusal's reason without its specifics (names, sizes), to group by."""
    head = reason.split(":")[0] if reason.startswith(("random", "not in")) else reason
    return re.sub(r"\b[\w.]+ (?=has dtype|'s axis)|\[[^\]]*\]|\([^)]*\)|\d+", "_", head)[:90]


def report(rows: list[dict], process_peak_mb: float) -> None:
    for r in rows:
        outcome = r["status"] if r["status"] == "refused" else (
            "baseline " + (r["baseline"] or "not run"))  # fmt: skip
        detail = r["reason"] or "; ".join(r["failing"][:1])
        print(f"{r['level']:<7} {r['file'][:46]:<46} {outcome:<16} {r['seconds']:6.2f}s "
              f"{r['peak_rss_mb']:6d}MB  {detail[:110]}")  # fmt: skip
    for level in sorted({r["level"] for r in rows}):
        lv = [r for r in rows if r["level"] == level]
        secs = [r["seconds"] for r in lv]
        mem = [r["peak_rss_mb"] for r in lv]
        written = sum(r["status"] == "written" for r in lv)
        passes = sum(r["baseline"] == "passed" for r in lv)
        print(f"\n{level}: {len(lv)} files, {written} imported, {passes} baselines pass, "
              f"{sum(r['baseline'] == 'failed' for r in lv)} baselines fail, "
              f"{len(lv) - written} refused")  # fmt: skip
        print(
            f"  time per file: median {statistics.median(secs):.2f} s, max {max(secs):.2f} s; "
            f"peak RSS per file: median {statistics.median(mem):.0f} MB, max {max(mem)} MB"
        )
        for reason, n in Counter(reason_group(r["reason"]) for r in lv if r["reason"]).items():
            print(f"  refused x{n}: {reason}")
    print(f"\nwhole run: peak RSS {process_peak_mb:.0f} MB (ru_maxrss of this process)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("levels", nargs="+", type=Path, help="KernelBench level folders")
    p.add_argument("--out", type=Path, required=True, help="folder the task folders go in")
    p.add_argument("--no-check", action="store_true", help="import only, no baseline runs")
    p.add_argument("--json", type=Path, help="also write the rows to this file")
    args = p.parse_args(argv)
    warm = time.perf_counter()
    warm_up(args.out / "_warm_up")
    warm = time.perf_counter() - warm
    rss = PeakRss()
    rows: list[dict] = []
    for level in args.levels:
        rows += import_level(level, args.out / level.name, rss)
    rss.stop()
    process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if not args.no_check:
        check(rows)
    report(rows, process_peak)
    print(f"warm-up (one tiny file before timing, torch's first-use initialisation): {warm:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main"]
