"""Nsight Compute: the one parser of its CSV (profile_kernel on the host reads the same
`parse_ncu_csv`), and for the kernel lab, a target command run under ncu with its profiled
launches attributed to cases in order. Self-contained (standard library only) like runner.py;
lab.py loads it by path from beside itself.

Why a CSV parser and not NVIDIA's ncu_report module: ncu_report ships inside an Nsight Compute
installation (extras/python), is not on PyPI, and reads .ncu-rep files where ncu runs, while
profile_kernel reads the log back on the host, which has no Nsight Compute.

The target calls each case's function `calls` times between cudaProfilerStart/Stop (warm-up,
compile and autotuning happen outside that window), so with --profile-from-start off ncu sees
exactly cases x calls launches when each call launches one kernel; otherwise the record says
the launches could not be attributed. --clock-control none keeps the GPU's normal boost clocks,
so durations compare with the runner's.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

# What profile_kernel collects; the lab, which profiles every case of a task, the first five.
NCU_METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes.sum.per_second",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",
    "launch__grid_size",
    "launch__block_size",
    "smsp__sass_inst_executed_op_local_ld.sum",
    "smsp__sass_inst_executed_op_local_st.sum",
)
LAB_METRICS = NCU_METRICS[:5]
# Tensor-pipe utilisation for tflops tasks; which names exist depends on the chip and the ncu
# version, so the list is filtered by --query-metrics. On an H100 with ncu 2025.3 there is no
# "gmma" metric; hmma_cycles_active and tensor_cycles_active both count wgmma (94-97% active for
# the TMA GEMM at 4096^3 and 8192^3, 2026-11-21).
NCU_TENSOR = [
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
]


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for p in ["/usr/local/cuda/bin/ncu", *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))]:
        if os.access(p, os.X_OK):
            return p
    return None


def ncu_metrics(ncu: str, tensor: bool) -> list[str]:
    if not tensor:
        return list(LAB_METRICS)
    try:
        listed = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True,
                                timeout=60).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        listed = ""
    have = [m for m in NCU_TENSOR if m.split(".")[0] in listed]
    return list(LAB_METRICS) + (have[:2] if listed else NCU_TENSOR[1:2])


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def parse_ncu_csv(text: str, metrics: tuple[str, ...] = NCU_METRICS) -> list[dict[str, Any]]:
    """ncu --csv output -> one {"id", "kernel", "metrics": {name: [value, unit]}} per profiled
    launch, in launch order. The details page has one row per metric; the raw page a header of
    metric names, a row of units, then one row per launch (there only `metrics` are kept).
    Lines that are not CSV (ncu's ==PROF== messages, the target's output) are skipped."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows:
        return []
    header = rows[0]
    launches: dict[str, dict[str, Any]] = {}
    if "Metric Name" in header:
        col = {name: i for i, name in enumerate(header)}
        for row in rows[1:]:
            if len(row) != len(header) or row == header:
                continue
            entry = launches.setdefault(row[col["ID"]], {"id": row[col["ID"]],
                                        "kernel": row[col["Kernel Name"]], "metrics": {}})  # fmt: skip
            value = _number(row[col["Metric Value"]])
            entry["metrics"][row[col["Metric Name"]]] = [value, row[col["Metric Unit"]]]
    else:
        units = rows[1] if len(rows) > 1 else []
        kname = header.index("Kernel Name") if "Kernel Name" in header else None
        for row in rows[2:]:
            if len(row) != len(header):
                continue
            launches[row[0]] = {
                "id": row[0],
                "kernel": row[kname] if kname is not None else "?",
                "metrics": {
                    name: [_number(row[i]), units[i] if i < len(units) else ""]
                    for i, name in enumerate(header)
                    if name in metrics
                },
            }
    return sorted(launches.values(), key=lambda x: int(x["id"]) if x["id"].isdigit() else 0)


def profile(
    target: list[str], cases: list[str], calls: int, log: Path, budget_s: float, *, tensor: bool
) -> dict[str, Any]:
    """Run `target` under ncu; {"metrics", "rc", "csv", "launches", "by_case" or "error"}."""
    ncu = find_ncu()
    if ncu is None or budget_s < 20:
        return {"error": "not profiled: " + ("ncu not found" if ncu is None else "time budget")}
    metrics = ncu_metrics(ncu, tensor)
    text, rc, err = "", None, ""
    for attempt in range(2):
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv", "--page",
               "details", "--print-units", "base", "--metrics", ",".join(metrics), "--log-file",
               str(log), *target]  # fmt: skip
        log.unlink(missing_ok=True)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s)
            rc, err = proc.returncode, proc.stderr[-2000:] + proc.stdout[-1000:]
        except subprocess.TimeoutExpired:
            rc, err = None, f"ncu timed out after {budget_s:.0f}s"
        text = log.read_text(errors="replace") if log.is_file() else ""
        if "Failed to find metric" in text + err and attempt == 0:
            metrics = list(LAB_METRICS)  # an unknown tensor metric: profile without it
            continue
        break
    launches = parse_ncu_csv(text)
    record: dict[str, Any] = {"metrics": metrics, "rc": rc, "csv": text[:400_000],
                              "launches": len(launches)}  # fmt: skip
    if launches and len(launches) == calls * len(cases):
        record["by_case"] = {c: summarize_launches(launches[i * calls : (i + 1) * calls])
                             for i, c in enumerate(cases)}  # fmt: skip
    else:
        record["error"] = (f"{len(launches)} profiled launches for {len(cases)} cases x {calls} "
                           f"calls: cannot attribute them (rc={rc}): {err.strip()[-300:]}")  # fmt: skip
    return record


def summarize_launches(launches: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"kernel": launches[0]["kernel"][:120] if launches else ""}
    names = {m for x in launches for m in x["metrics"]}
    for name in sorted(names):
        vals = [
            x["metrics"][name][0] for x in launches if x["metrics"].get(name, [None])[0] is not None
        ]
        unit = next((x["metrics"][name][1] for x in launches if name in x["metrics"]), "")
        out[name] = {"value": statistics.median(vals) if vals else None, "unit": unit}
    return out


__all__ = [
    "LAB_METRICS",
    "NCU_METRICS",
    "find_ncu",
    "parse_ncu_csv",
    "profile",
    "summarize_launches",
]
