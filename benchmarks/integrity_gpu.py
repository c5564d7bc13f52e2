"""The guarded verify on a GPU: cheat corpus, honest kernels, false-rejection rate, cost.

    python benchmarks/integrity_gpu.py [--parts corpus,honest,repeat,cost] [--repeats 20]
                                      [--cheats a,b] [--cuda] [--budget-s S] [--json OUT.json]

Measured on an H100 (2026-11-21): corpus 283 s (37 runs), honest 60 s, a verify ~13 s, cost
~80 s, so a 10-minute device call holds `--parts corpus` or `--parts honest,repeat,cost`, not
both. --budget-s stops starting verifies after S seconds; what ran is printed and saved.

Prints one table per part (run it on an H100/H200 host with harnesslab importable):
- corpus: every kernel in tools/integrity/cheats/cpu/ through the full guarded verify (its
  `expect:` code), and again with the static scan not enforced for files that name a `runtime:`
  or `gpu:` code, so the runtime guard's own verdict is shown. GPU-only exploits (side streams,
  profiler kernel list, timing) are judged here and nowhere else. With --cuda, the CUDA C++
  corpus instead (tools/integrity/cheats/gpu/cuda/<name>/: kernel.py + kernel.cu in a CUDA
  workspace; `gpu:` with the scan enforced, `runtime:` without; `harmless` passes count; the
  honest twin of a cheat whose code runs verifies first and is its incumbent).
- honest: baseline, the task's solutions (and for rmsnorm_gate tools/integrity/cheats/honest/)
  must all pass; each verify's phases print. --task names the task of honest, repeat, fresh,
  concurrent and cost (default rmsnorm_gate; the corpus is rmsnorm_gate's).
- repeat: --repeats guarded verifies of solutions/fast.py: false rejections must be 0; score
  spread across repeats.
- fresh: --repeats guarded verifies of solutions/fast.py, each in a fresh state dir: all pass.
- concurrent: four verifies at once in one state dir against one alone: all pass, each within
  2x the time of one (they share the GPU's lock: untimed work overlaps, timed windows queue).
- cost: a plain eval of the same hidden cases (runner "evaluate" mode, one check per case) vs the
  guarded verify of the same candidate, fresh process each, wall clock; target ratio <= 3.
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from harnesslab.tools.evaluation.recording import to_eval_result
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.integrity.verify import guarded_verify
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.secrets_store import workspace_secret
from harnesslab.tools.state.workspace import Workspace, init_workspace
from harnesslab.tools.task.spec import load_task

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tools" / "integrity" / "cheats"
SPEC = load_task("rmsnorm_gate")


def expectation(path: Path) -> dict[str, str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    out = {}
    for line in doc.splitlines():
        key, _, code = line.partition(":")
        if key in ("expect", "runtime", "gpu", "static", "twin") and code.strip():
            out[key] = code.strip()
    return out


class OutOfBudget(Exception):
    pass


class Bench:
    def __init__(self, budget_s: float | None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="hl-integrity-"))
        self.settings = Settings(state_dir=self.tmp / "state")
        self.n = 0
        self.phases: dict[str, float] = {}  # the last verify's, from the guard (operator view)
        self.deadline = time.monotonic() + budget_s if budget_s else None

    def check_budget(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise OutOfBudget

    def workspace(self, kernel: Path) -> Workspace:
        self.n += 1
        ws = init_workspace(SPEC.name, self.tmp / f"ws{self.n}", self.settings)
        shutil.copy(kernel, ws.root / SPEC.entry_file)
        return ws

    async def verify(self, ws: Workspace, **kw: Any) -> tuple[Any, float]:
        self.check_budget()
        launcher = Launcher(self.settings)
        calls: list[Any] = []  # the runner's call, for the operator's view of an error
        call = launcher.call

        async def kept(*a: Any, **k: Any) -> Any:
            calls.append(await call(*a, **k))
            return calls[-1]

        launcher.call = kept  # type: ignore[method-assign]
        t0 = time.perf_counter()
        try:
            with anyio.fail_after(600):
                v = await guarded_verify(ws, launcher, self.settings, **kw)
        finally:
            await launcher.aclose()
        raw = (calls[-1].result or {}) if calls else {}
        self.phases = {k: round(float(x), 2) for k, x in (raw.get("phases_s") or {}).items()}
        if v.verdict == "error" and calls:  # what an operator reads (stderr is never a verdict)
            c = calls[-1]
            print(
                f"  error: exit {c.exit_code}, timed out {c.timed_out}, limit {c.limit!r}, "
                f"phases {c.phases_s}, events {[e.get('event') for e in c.events][-8:]}\n"
                f"  stderr tail: {c.stderr_tail[-3000:]}",
                flush=True,
            )
        return v, time.perf_counter() - t0

    async def plain_eval(self, ws: Workspace) -> tuple[Any, float, float]:
        """The runner's plain evaluate mode on the workspace's hidden cases."""
        secret = workspace_secret(self.settings, ws.root)
        cases = ws.task.final.draw(secret["seed"])  # type: ignore[union-attr]
        candidate = ws.snapshot()
        digest = candidate.digest
        launcher = Launcher(self.settings)
        request = {
            "mode": "evaluate",
            "candidate_dir": f"@stage/{launcher.stage_candidate(candidate.files, digest)}",
            "entry": ws.task.entry,
            "config_file": ws.task.config_file,
            "tolerances": {k: v.model_dump() for k, v in ws.task.tolerances.items()},
            "cases": [c.model_dump() for c in cases],
            "seed": 1,
        }
        t0 = time.perf_counter()
        try:
            call = await launcher.call(request, task=ws.task, fresh=True)
        finally:
            await launcher.aclose()
        wall = time.perf_counter() - t0
        res = to_eval_result(call, cases, candidate=digest, config={}, mode="dev", seed=1)
        return res, wall, float((call.result or {}).get("runner_wall_s") or 0.0)


def codes(v: Any) -> list[str]:
    return sorted({r["code"] for r in v.reasons})


async def corpus(b: Bench, out: dict[str, Any], only: str) -> None:
    print(f"\n{'cheat':24s} {'scan':5s} {'expected':24s} {'verdict':9s} ok  codes")
    rows: list[dict[str, Any]] = []
    out["corpus"] = rows  # filled as it goes: a cut run keeps what it measured
    for path in sorted((CORPUS / "cpu").glob("*.py")):
        if only and path.stem not in only.split(","):
            continue
        exp = expectation(path)
        runs = [("on", exp["expect"], {})]
        if "runtime" in exp or "gpu" in exp:
            runs.append(("off", exp.get("gpu") or exp["runtime"], {"enforce_scan": False}))
        for scan, want, kw in runs:
            v, wall = await b.verify(b.workspace(path), **kw)
            # a `harmless` expectation is met by a pass (what the cheat aims at is defused)
            ok = (want == "harmless" and v.verdict == "passed") or (
                v.verdict == "rejected" and want in codes(v)
            )
            rows.append(
                {
                    "cheat": path.stem,
                    "scan": scan,
                    "expected": want,
                    "verdict": v.verdict,
                    "ok": ok,
                    "codes": codes(v),
                    "wall_s": wall,
                }
            )
            print(
                f"{path.stem:24s} {scan:5s} {want:24s} {v.verdict:9s} {'yes' if ok else 'NO':3s} "
                f"{','.join(codes(v))[:90]}",
                flush=True,
            )
    caught = sum(r["ok"] for r in rows)
    print(f"corpus: {caught} of {len(rows)} runs rejected for the expected reason")


async def cuda_corpus(b: Bench, out: dict[str, Any], only: str) -> None:
    print(f"\n{'cuda cheat':24s} {'scan':5s} {'expected':24s} {'verdict':9s} ok  codes")
    rows: list[dict[str, Any]] = []
    out["cuda_corpus"] = rows
    root = CORPUS / "gpu" / "cuda"
    for folder in sorted(p for p in root.iterdir() if (p / "kernel.py").is_file()):
        if only and folder.name not in only.split(","):
            continue
        exp = expectation(folder / "kernel.py")
        b.n += 1
        ws = init_workspace("rmsnorm_gate", b.tmp / f"ws{b.n}", b.settings, language="cuda")
        runs_on_gpu = exp.get("static") == "pass" and exp.get("gpu") != "import_failed"
        runs = [("twin", "pass", {})] if "twin" in exp and runs_on_gpu else []
        runs.append(("on", exp["gpu"], {}))
        if "runtime" in exp:
            runs.append(("off", exp["runtime"], {"enforce_scan": False}))
        for scan, want, kw in runs:
            src = root / exp["twin"] if scan == "twin" else folder
            for f in ("kernel.py", "kernel.cu"):
                shutil.copy(src / f, ws.root / f)
            v, wall = await b.verify(ws, **kw)
            wanted = want.split("|")
            if v.verdict == "passed":
                ok = "pass" in wanted or "harmless" in wanted
            else:
                ok = v.verdict == "rejected" and bool(set(wanted) & set(codes(v)))
            name = f"{folder.name} ({exp['twin']})" if scan == "twin" else folder.name
            rows.append({"cheat": name, "scan": scan, "expected": want, "verdict": v.verdict,
                         "ok": ok, "codes": codes(v), "wall_s": wall})  # fmt: skip
            print(
                f"{name[:24]:24s} {scan:5s} {want:24s} {v.verdict:9s} {'yes' if ok else 'NO':3s} "
                f"{','.join(codes(v))[:90]}",
                flush=True,
            )
    good = sum(r["ok"] for r in rows)
    print(
        f"cuda corpus: {good} of {len(rows)} runs as expected (rejected for the reason, or passed)"
    )


def honest_kernels() -> dict[str, Path]:
    found = {"baseline": SPEC.workspace_template / SPEC.entry_file}
    found |= {f"solution_{n}": p for n, p in SPEC.solutions().items()}
    if SPEC.name == "rmsnorm_gate":  # the corpus's honest twins are rmsnorm_gate kernels
        found |= {f"honest_{p.stem}": p for p in sorted((CORPUS / "honest").glob("*.py"))}
    return found


async def honest(b: Bench, out: dict[str, Any]) -> None:
    print(f"\n{'honest kernel':28s} {'verdict':8s} {'score us':>10s} {'% copy':>7s} {'wall s':>7s}")
    rows: list[dict[str, Any]] = []
    out["honest"] = rows
    for name, path in honest_kernels().items():
        v, wall = await b.verify(b.workspace(path))
        rows.append(
            {
                "kernel": name,
                "verdict": v.verdict,
                "score_us": v.score_us,
                "geomean_pct": v.geomean_pct_of_copy_bw,
                "codes": codes(v),
                "wall_s": wall,
            }
        )
        print(
            f"{name:28s} {v.verdict:8s} {v.score_us or 0:10.1f} "
            f"{v.geomean_pct_of_copy_bw or 0:7.1f} {wall:7.1f} {','.join(codes(v))[:60]}"
            f"\n  phases {b.phases}",
            flush=True,
        )


async def repeat(b: Bench, out: dict[str, Any], n: int) -> None:
    ws = b.workspace(SPEC.solutions()["fast"])
    scores, rejected, walls, speedups = [], [], [], []
    for i in range(n):
        try:
            v, wall = await b.verify(ws)
        except OutOfBudget:
            print(f"repeat: --budget-s reached after {i} runs")
            n = i
            break
        walls.append(wall)
        inc = "with" if v.incumbent else "without"
        print(f"repeat {i}: {v.verdict} {wall:.1f} s, {inc} an incumbent; phases {b.phases}",
              flush=True)  # fmt: skip
        if v.verdict != "passed":
            rejected.append({"run": i, "codes": codes(v), "reasons": v.reasons[:3]})
        elif v.score_us:
            scores.append(v.score_us)
        if v.incumbent and v.incumbent.get("speedup"):
            speedups.append(v.incumbent["speedup"])
    if not n:
        raise OutOfBudget
    spread = (max(scores) - min(scores)) / statistics.median(scores) * 100 if scores else None
    print(
        f"\nrepeat: {n} guarded verifies of solutions/fast.py: {len(rejected)} rejected "
        f"(false-rejection rate {len(rejected) / n:.0%}); score median "
        f"{statistics.median(scores) if scores else 0:.1f} us, spread {spread or 0:.2f}%, "
        f"wall median {statistics.median(walls):.1f} s"
    )
    out["repeat"] = {
        "runs": n,
        "rejected": rejected,
        "scores_us": scores,
        "walls_s": walls,
        "spread_pct": spread,
        "incumbent_speedups": speedups,
    }


async def fresh(b: Bench, out: dict[str, Any], n: int) -> None:
    """n verifies of solutions/fast.py, each in a fresh state dir (nothing staged, no Triton
    cache, no secret yet) and a fresh workspace: an honest kernel must pass every one."""
    rows: list[dict[str, Any]] = []
    out["fresh"] = rows
    for i in range(n):
        try:
            one = Bench(None)
            one.deadline = b.deadline
            v, wall = await one.verify(one.workspace(SPEC.solutions()["fast"]))
        except OutOfBudget:
            print(f"fresh: --budget-s reached after {i} runs")
            break
        finally:
            shutil.rmtree(one.tmp, ignore_errors=True)
        rows.append({"run": i, "verdict": v.verdict, "codes": codes(v), "score_us": v.score_us,
                     "wall_s": wall, "phases_s": one.phases})  # fmt: skip
        print(f"fresh {i:2d}: {v.verdict:8s} {v.score_us or 0:8.1f} us {wall:6.1f} s "
              f"{','.join(codes(v))} phases {one.phases}", flush=True)  # fmt: skip
    if not rows:
        raise OutOfBudget
    walls = [r["wall_s"] for r in rows]
    bad = [r for r in rows if r["verdict"] != "passed"]
    print(f"\nfresh: {len(rows)} verifies in fresh state dirs: {len(rows) - len(bad)} passed, "
          f"{len(bad)} not; wall median {statistics.median(walls):.1f} s "
          f"(min {min(walls):.1f}, max {max(walls):.1f})")  # fmt: skip


async def concurrent(b: Bench, out: dict[str, Any], n: int = 4) -> None:
    """One verify alone (after a warm-up that compiles), then n at once in the same state dir,
    each through its own launcher as n servers would: each must pass, within 2x the alone time.
    Nothing is saved, so no verify has an incumbent to time besides itself."""
    spaces = [b.workspace(SPEC.solutions()["fast"]) for _ in range(n)]
    await b.verify(spaces[0], save=False)  # compiles: the Triton cache is warm after it
    v, alone = await b.verify(spaces[0], save=False)
    print(f"\nconcurrent: alone {alone:.1f} s ({v.verdict}); phases {b.phases}", flush=True)
    rows: list[dict[str, Any]] = [{} for _ in spaces]
    waits: list[str] = []

    async def one(i: int, ws: Workspace) -> None:
        async def progress(done: float, total: float, message: str) -> None:
            if message.startswith("waiting"):
                waits.append(f"{i}: {message}")

        t0 = time.perf_counter()
        vi, wall = await b.verify(ws, save=False, progress=progress)
        rows[i] = {"verdict": vi.verdict, "codes": codes(vi), "wall_s": wall,
                   "started_s": t0 - t_all, "phases_s": b.phases}  # fmt: skip

    t_all = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, ws in enumerate(spaces):
            tg.start_soon(one, i, ws)
    total = time.perf_counter() - t_all
    worst = max(r["wall_s"] for r in rows)
    for i, r in enumerate(rows):
        print(f"concurrent {i}: {r['verdict']:8s} {r['wall_s']:6.1f} s "
              f"({r['wall_s'] / alone:.2f}x alone) {','.join(r['codes'])} {r['phases_s']}")  # fmt: skip
    print(f"concurrent: {n} at once, all done in {total:.1f} s; worst {worst:.1f} s = "
          f"{worst / alone:.2f}x one alone (target <= 2x); {len(waits)} waits told, e.g. "
          f"{waits[:2]}")  # fmt: skip
    out["concurrent"] = {"alone_s": alone, "rows": rows, "total_s": total,
                         "worst_ratio": worst / alone, "waits": waits}  # fmt: skip


async def cost(b: Bench, out: dict[str, Any]) -> None:
    ws = b.workspace(SPEC.solutions()["fast"])
    b.check_budget()
    await b.plain_eval(ws)  # warm the Triton cache: neither side pays compiles below
    rows = []
    for _ in range(3):
        res, plain_wall, plain_runner = await b.plain_eval(ws)
        v, guard_wall = await b.verify(ws, save=False)
        guard_runner = float(v.evidence.get("runner_wall_s") or 0.0)
        rows.append(
            {
                "plain_wall_s": plain_wall,
                "plain_runner_s": plain_runner,
                "guarded_wall_s": guard_wall,
                "guarded_runner_s": guard_runner,
                "plain_status": res.status,
                "verdict": v.verdict,
            }
        )
    pw = statistics.median(r["plain_wall_s"] for r in rows)
    gw = statistics.median(r["guarded_wall_s"] for r in rows)
    print(
        f"\ncost: plain eval {pw:.1f} s, guarded verify {gw:.1f} s (same hidden cases, fresh "
        f"process each): ratio {gw / pw:.2f} (target <= 3)"
    )
    out["cost"] = {"runs": rows, "ratio": gw / pw}


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="corpus,honest,repeat,cost")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument(
        "--task", default="rmsnorm_gate", help="honest/repeat/fresh/concurrent/cost on this task"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cheats", default="", help="comma-separated corpus names (default: all)")
    ap.add_argument("--cuda", action="store_true", help="corpus: the CUDA C++ cheats")
    ap.add_argument(
        "--budget-s", type=float, help="stop starting verifies after this; partial tables print"
    )
    args = ap.parse_args(argv)
    if "corpus" in args.parts.split(",") and args.task != "rmsnorm_gate":
        ap.error("the corpus is rmsnorm_gate's: run --parts corpus without --task")
    global SPEC
    SPEC = load_task(args.task)
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (interpreter)"
    print(f"device {device}, torch {torch.__version__}, python {sys.version.split()[0]}")
    b, out = Bench(args.budget_s), {"device": device, "torch": torch.__version__}
    parts = {
        "corpus": lambda: (cuda_corpus if args.cuda else corpus)(b, out, args.cheats),
        "honest": lambda: honest(b, out),
        "repeat": lambda: repeat(b, out, args.repeats),
        "cost": lambda: cost(b, out),
        "fresh": lambda: fresh(b, out, args.repeats),
        "concurrent": lambda: concurrent(b, out),
    }
    try:
        for name in args.parts.split(","):
            try:
                await parts[name]()
            except OutOfBudget:
                print(f"\n{name}: --budget-s reached; this part and the ones after it are cut")
                out.setdefault("cut", []).append(name)
    finally:
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, default=str))
        shutil.rmtree(b.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1:]))
