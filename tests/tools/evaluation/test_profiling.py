"""profile_kernel's parsing and classification, on real Nsight Compute output: the fixture is
`ncu --csv --page details --print-units base` of the rmsnorm_gate baseline on 4096x4096 fp16,
three launches, taken on an H100 80GB HBM3 (ncu 2025.3.1, driver 580.159.04)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesslab.tools.evaluation.profiling import KernelProfile, classify, parse_ncu_csv, summarize

H100_CSV = Path(__file__).parent / "data" / "ncu_h100_rmsnorm_gate.csv"


def test_real_ncu_csv_parses_into_per_kernel_medians():
    launches = parse_ncu_csv(H100_CSV.read_text())
    assert len(launches) == 3
    (k,) = summarize(launches)
    assert k.kernel == "_rmsnorm_gate_kernel" and k.launches == 3
    assert k.duration_us == pytest.approx(32.544)
    assert k.achieved_gbps == pytest.approx(2635.1, rel=1e-3)
    assert k.dram_throughput_pct == pytest.approx(78.67)
    assert k.registers_per_thread == 80 and k.grid_size == 4096 and k.block_size == 128
    assert k.local_memory_instructions == 0


def test_the_h100_baseline_is_classified_memory_bound():
    (k,) = summarize(parse_ncu_csv(H100_CSV.read_text()))
    line = classify(k)
    assert line.startswith("memory-bound") and "79%" in line and "2635 GB/s" in line


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        (KernelProfile(kernel="k", launches=1, duration_us=2.1, dram_throughput_pct=5), "launch-bound"),
        (KernelProfile(kernel="k", launches=1, duration_us=90, sm_throughput_pct=85), "compute-bound"),
        (
            KernelProfile(
                kernel="k", launches=1, duration_us=90, dram_throughput_pct=20, sm_throughput_pct=15,
                achieved_occupancy_pct=12, local_memory_instructions=4096,
            ),
            "latency/occupancy-bound",
        ),
    ],
)  # fmt: skip
def test_bottleneck_classification_names_the_limit(profile, expected):
    line = classify(profile)
    assert line.startswith(expected)
    if profile.local_memory_instructions:
        assert "spill" in line


def test_output_without_csv_rows_gives_no_kernels():
    assert parse_ncu_csv("==PROF== Disconnected from process 1\n") == []
