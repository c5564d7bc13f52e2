"""benchmarks/rmsnorm_cuda_variants_gpu.py, the one GPU call that decides which plan of the CUDA
rmsnorm_gate solution ships per shape class, and its variants
(benchmarks/variants/rmsnorm_gate_cuda_plans/plans.py): what can be checked without a GPU.
The plans cover every row within their launch bounds; the dry run compiles every variant's
kernels and takes each launch through the launcher's checks (misaligned pointers on the 2-byte
path, the shipped plan unchanged, no kernel spilling); the verdicts and the table come from
the rows. The timing itself needs a GPU (the script's docstring: PARTS=cudavariants)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harnesslab.tests.tools.gpu.cuda_support import compiler, staged
from harnesslab.tools.gpu.runner import load_module

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "rmsnorm_cuda_variants_gpu.py"
DIMS = [8, 256, 1000, 1001, 1024, 1536, 2048, 3000, 4096, 5120, 6144, 8192, 8191, 16384, 65536]
ROWS = [1, 192, 768, 4096]


staged("harnesslab_cuda")  # the solution imports it by plain name, as on a GPU host
SCRIPT_MOD = load_module(SCRIPT, "_test_rmsnorm_cuda_variants_gpu")
PLANS = load_module(SCRIPT_MOD.PLANS, "_test_rmsnorm_gate_cuda_plans")


@pytest.mark.parametrize("name", sorted(PLANS.VARIANTS))
def test_every_variant_plan_covers_the_row_within_its_launch_bounds(name: str) -> None:
    mod = PLANS.variant_module(name)
    shipped = PLANS.load_solution("shipped_for_test")
    for dim in DIMS:
        for vec in (8, 1):
            if dim % vec:
                continue
            for rows in ROWS:
                p, base = mod.plan(dim, vec, rows), shipped.plan(dim, vec, rows)
                threads, npack = p.block[0] * p.block[1], dim // vec
                assert threads <= p.max_threads <= 1024, (name, dim, vec, p)
                per_row = 32 if p.variant == "warp" else p.block[0]
                assert p.chunks == 0 or p.chunks * per_row >= npack, (name, dim, vec, p)
                if p.min_blocks:  # the registers the bound leaves are enough to launch at all
                    assert p.max_threads * p.min_blocks <= 2048, (name, p)
                if p.variant == "persist":
                    assert p.per_sm * threads <= 2048 and p.min_blocks == p.per_sm, (name, p)
                if vec == 1:  # the 2-byte path takes no hints: a variant changes only vec 8
                    assert p == base, (name, dim, p)


def test_the_shipped_plan_takes_each_shape_classs_measured_hints_and_no_other_knob() -> None:
    """Nothing ships without GPU evidence: the tenth session's run picked the streaming hints for
    the small class and bf16 from packed words for the large one, the eleventh the weight loaded
    early there too (cuda_rmsnorm_gate.plan's docstring); the 2-byte path takes none. A new pick
    changes this test in the same commit."""
    mod = PLANS.load_solution("defaults_for_test")
    stream = mod.LOAD_NA | mod.LOAD_EF | mod.STORE_CS
    for dim in DIMS:
        vec = 8 if dim % 8 == 0 else 1
        for rows in (1, 4096):
            p = mod.plan(dim, vec, rows)
            small = rows * dim <= 1 << 22
            want = 0 if vec == 1 else stream if small else mod.BF16_WORDS | mod.W_EARLY
            assert PLANS.shape_class(rows, dim) == ("small" if small else "large")
            assert (p.hints, p.max_threads, p.min_blocks, p.per_sm) == (want, 1024, 0, 0), (
                dim, rows, p,
            )  # fmt: skip


def test_resident_warps_explains_the_half_occupancy_ncu_saw() -> None:
    # block<bf16, 8, 2>: 50 registers, 512 threads: ncu read 47.55% warps active (BENCHMARKS.md)
    assert SCRIPT_MOD.resident_warps(50, 512) == 32
    assert SCRIPT_MOD.resident_warps(32, 512) == SCRIPT_MOD.resident_warps(32, 1024) == 64
    assert SCRIPT_MOD.resident_warps(56, 1024) == 32
    assert SCRIPT_MOD.resident_warps(64, 128) == 32  # the register file, not the 32-block cap
    assert SCRIPT_MOD.resident_warps(16, 32) == 32  # 32 blocks an SM at most


def _results(times: dict[str, dict[str, float]], check_failed: tuple[str, ...] = ()) -> dict:
    """Synthetic results: times[strategy][case] in us; a value <= 0 is a failed row."""
    cases = [{"name": "768x2048_fp16", "class": "small", "group": "lab"},
             {"name": "448x4096_fp16", "class": "small", "group": "hg"},
             {"name": "4096x8192_bf16", "class": "large", "group": "lab"}]  # fmt: skip
    rows = [{"strategy": s, "case": c, "passed": t > 0, "status": "passed" if t > 0 else "failed",
             "median_us": t if t > 0 else None, "repeat_spread": 0.004}
            for s, per in times.items() for c, t in per.items()]  # fmt: skip
    check = {n: {"passed": n not in check_failed, "failures": ["probe:x: wrong"]}
             for n in times if n not in ("fla", "liger", "compile")}  # fmt: skip
    return {"info": {"device": "H100"}, "cases": cases, "rows": rows, "check": check}


def test_the_verdicts_take_the_fastest_variant_that_passed_every_row_and_the_check() -> None:
    times = {
        "shipped": {"768x2048_fp16": 4.6, "448x4096_fp16": 4.9, "4096x8192_bf16": 65.5},
        "wearly": {"768x2048_fp16": 4.3, "448x4096_fp16": 4.5},
        "t128": {"768x2048_fp16": 4.1, "448x4096_fp16": -1},  # faster, but one row failed
        "t512": {"4096x8192_bf16": 63.0},  # fastest, but failed the check
        "ldna": {"4096x8192_bf16": 64.0},
        "fla": {"768x2048_fp16": 4.6, "448x4096_fp16": 4.4, "4096x8192_bf16": 64.4},
        "liger": {"768x2048_fp16": 6.0, "448x4096_fp16": 6.0, "4096x8192_bf16": 70.0},
    }
    ours = ["shipped", "wearly", "t128", "t512", "ldna"]
    s = SCRIPT_MOD.summarize(_results(times, check_failed=("t512",)), ours)
    assert s["cases"]["768x2048_fp16"]["best"] == "t128"  # per case, a passed row is enough
    assert s["cases"]["4096x8192_bf16"]["best"] == "ldna"  # t512 failed the check
    assert s["cases"]["4096x8192_bf16"]["ratio"]["fla"] == pytest.approx(64.4 / 64.0)
    assert s["cases"]["4096x8192_bf16"]["ratio"]["shipped"] == pytest.approx(65.5 / 64.0)
    assert s["classes"]["small"]["pick"] == "wearly"  # t128 lacks a passed row of the class
    assert s["classes"]["small"]["leads_every_case"] == {"fla": False, "liger": True,
                                                          "compile": False}  # fmt: skip
    assert s["classes"]["large"]["pick"] == "ldna"
    assert s["hg_sum_us"] == {"best": 4.5, "shipped": 4.9, "fla": 4.4, "liger": 6.0}


def test_the_table_of_every_variant_fits_the_45_lines_the_session_part_keeps() -> None:
    ours = ["shipped", *PLANS.VARIANTS]
    cases = [{"name": f"{r}x{d}_fp16", "class": PLANS.shape_class(r, d), "group": "lab"}
             for r, d in ((1024, 1024), (768, 2048), (4096, 8192), (192, 8192))]  # fmt: skip
    times = {n: {c["name"]: 10.0 + i for c in cases} for i, n in enumerate(ours)}
    times |= {"fla": {c["name"]: 12.0 for c in cases}, "liger": {c["name"]: 13.0 for c in cases},
              "compile": {c["name"]: 14.0 for c in cases}}  # fmt: skip
    results = {**_results(times), "cases": cases}
    results["summary"] = SCRIPT_MOD.summarize(results, ours)
    table = SCRIPT_MOD.render(results, [*ours, "fla", "liger", "compile"], ours)
    lines = table.splitlines()
    assert len(lines) <= 45, len(lines)
    assert lines[-1].startswith("check: ") and any(ln.startswith("class large: pick shipped")
                                                   for ln in lines)  # fmt: skip
    assert "10.0±0.4" in table and "1.200" in table  # us ± spread; FLA 12 us / shipped 10 us


@pytest.mark.slow
def test_the_dry_run_compiles_every_variant_and_checks_every_launch(tmp_path: Path) -> None:
    compiler()  # NVRTC, or a skip that says how to get it
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--dry-run"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "rmsnorm_cuda_variants.json").read_text())
    assert data["build"]["errors"] == [] and data["build"]["kernels"] >= 40
    launched = data["dry_launch"]
    assert set(launched) == {"shipped", *PLANS.VARIANTS}
    for name, per_input in launched.items():
        for label, expr in per_input.items():
            assert expr.startswith("rmsnorm_gate_"), (name, label, expr)
            if label.startswith("misaligned:"):  # one element past 16 bytes: 2-byte accesses
                assert re.search(r"<\w+, 1, ", expr), (name, label, expr)
    res = data["build"]["resources"]
    if data["build"]["cuobjdump"] != "not found":  # Triton's wheel carries one
        spilled = {e: r for e, r in res.items() if r.get("stack") or r.get("local")}
        assert spilled == {}, spilled
        t512 = launched["t512"]["4096x8192_bfloat16"] + " @512"  # two 16-byte packs a thread
        assert res[t512]["warps_pct"] == 100, (t512, res[t512])
    # What ships: the hints of each shape class on the 16-byte path (7: LOAD_NA | LOAD_EF |
    # STORE_CS, 40: BF16_WORDS | W_EARLY), no other knob, none on the 2-byte path
    # (test_the_shipped_plan_takes_each_shape_classs_measured_hints_and_no_other_knob).
    for label, expr in launched["shipped"].items():
        knobs = expr.split(">")[0].split(", ")[3:]
        assert knobs in ([], ["7", "1024", "0"], ["40", "1024", "0"]), (label, expr)
        assert (knobs == []) == bool(re.search(r"<\w+, 1, ", expr)), (label, expr)


@pytest.fixture(scope="module")
def cpu_ctx(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The script's context on the CPU (the Triton interpreter's Env), with stand-ins for the
    CUDA strategies: what the GPU path does around the kernels runs here as it would there."""
    ctx = SCRIPT_MOD.rv.context(True)
    ctx["out"] = tmp_path_factory.mktemp("out")
    ref = ctx["ev"].ref

    def honest(x, gate, weight, eps=1e-5):
        return ref.reference(x, gate, weight, eps).to(x.dtype)

    def aligned_only(x, gate, weight, eps=1e-5):  # what a vector path without the check does
        out = honest(x, gate, weight, eps)
        return out if all(t.data_ptr() % 16 == 0 for t in (x, gate, weight)) else out * 1.5

    ctx["stand_ins"] = {"shipped": honest, "t512": aligned_only}
    return ctx


def test_the_check_takes_misaligned_pointers_to_the_reference(cpu_ctx: dict) -> None:
    extra = tuple(SCRIPT_MOD.misaligned(cpu_ctx))
    args, _ = extra[0][2]()
    assert all(a.data_ptr() % 16 == 2 for a in args)  # one fp16/bf16 element past 16 bytes
    got = SCRIPT_MOD.rv.check(cpu_ctx, cpu_ctx["stand_ins"], [], 1e12, extra=extra)
    assert got["shipped"]["passed"], got["shipped"]
    assert not got["t512"]["passed"]
    assert all(f.startswith("misaligned:") for f in got["t512"]["failures"]), got["t512"]


def test_the_timed_path_runs_the_runner_per_case_and_fills_the_table(cpu_ctx: dict) -> None:
    cases = [{"name": "768x2048_fp16", "dtype": "float16", "shape": {"rows": 768, "dim": 2048},
              "group": "hg", "class": "small"}]  # fmt: skip
    fns = {"shipped": cpu_ctx["stand_ins"]["shipped"], "fla": cpu_ctx["stand_ins"]["shipped"]}
    errors = {"liger": "missing: liger-kernel not importable here"}
    results: dict = {"info": {"device": "cpu"}, "cases": cases, "rows": []}
    by_class = {"small": ["shipped", "fla", "liger"]}
    SCRIPT_MOD.time_cases(cpu_ctx, fns, errors, cases, by_class, 1e12, 2, results)
    rows = {r["strategy"]: r for r in results["rows"]}
    assert rows["shipped"]["passed"] and rows["shipped"]["median_us"] > 0, rows["shipped"]
    assert rows["liger"]["status"] == "missing" and not rows["liger"]["passed"]
    results["summary"] = SCRIPT_MOD.summarize(results, ["shipped"])
    assert results["summary"]["cases"]["768x2048_fp16"]["best"] == "shipped"
    table = SCRIPT_MOD.render(results, ["shipped", "fla", "liger"], ["shipped"])
    assert "missing" in table and "class small: pick shipped" in table
    assert (cpu_ctx["out"] / "rmsnorm_cuda_variants.json").is_file()
