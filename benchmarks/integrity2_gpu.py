"""Integrity 2.0 on a GPU host: the sandbox, CUDA inside it, memory shared into a sandboxed
replayer, and guarded verifies (record -> replay -> check -> time) of honest kernels.

    python benchmarks/integrity2_gpu.py [--parts probe,cuda,ipc,verify,abba] [--tasks a,b]
                                        [--json OUT.json]

Run with harnesslab importable (see benchmarks/gpu_final.sh for the install from .whl). Every
part runs on its own and reports; a failing part never stops the next one. Prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def Settings(**kw):  # noqa: N802 - harnesslab imported lazily: the probe parts run without it
    from harnesslab.tools.settings import Settings as S

    return S(**kw)


TOOLS = ROOT / "tools" / "gpu"
ROWS: list[dict[str, Any]] = []


def part(name: str):
    def wrap(fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                out = fn(*a, **k)
                ROWS.append(
                    {
                        "part": name,
                        "ok": True,
                        "s": round(time.perf_counter() - t0, 1),
                        **(out or {}),
                    }
                )
            except Exception as exc:
                traceback.print_exc()
                ROWS.append(
                    {
                        "part": name,
                        "ok": False,
                        "s": round(time.perf_counter() - t0, 1),
                        "error": f"{type(exc).__name__}: {exc}"[:400],
                    }
                )
            print(json.dumps(ROWS[-1])[:2000], flush=True)

        return run

    return wrap


@part("probe")
def probe() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(TOOLS / "isolation" / "sandbox.py"), "--probe"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return {"probe": json.loads(out.stdout), "uname": os.uname().release}


CUDA_SCRIPT = r"""
import json, os, socket, time
t0 = time.perf_counter()
import torch, triton, triton.language as tl
res = {"import_s": round(time.perf_counter() - t0, 2)}
@triton.jit
def add(x, y, o, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)
x = torch.randn(1 << 20, device="cuda"); y = torch.randn_like(x); o = torch.empty_like(x)
t1 = time.perf_counter()
add[(triton.cdiv(x.numel(), 1024),)](x, y, o, x.numel(), B=1024)
torch.cuda.synchronize()
res["compile_s"] = round(time.perf_counter() - t1, 2)
res["correct"] = bool(torch.allclose(o, x + y))
res["device"] = torch.cuda.get_device_name(0)
def tryit(name, fn):
    try:
        fn(); res[name] = "ALLOWED"
    except Exception as e:
        res[name] = "denied: " + type(e).__name__
tryit("write_tmp", lambda: open("/tmp/sbx_probe_escape", "w").write("x"))
tryit("read_root", lambda: os.listdir("/root"))
tryit("tcp", lambda: socket.create_connection(("127.0.0.1", 22), timeout=1))
tryit("kill_parent", lambda: os.kill(os.getppid(), 0))
print(json.dumps(res))
"""


@part("cuda_in_sandbox")
def cuda_in_sandbox() -> dict[str, Any]:
    scratch = tempfile.mkdtemp(prefix="sbx-root-")
    script = Path(scratch) / "probe.py"
    script.write_text(CUDA_SCRIPT)
    policy = {"read": [str(script)], "scratch_root": scratch, "require": True}
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            str(TOOLS / "isolation" / "sandbox.py"),
            "--policy",
            json.dumps(policy),
            "--",
            sys.executable,
            "-I",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = out.stdout.strip().splitlines()
    return {
        "rc": out.returncode,
        "sandbox": json.loads(lines[0]) if lines else None,
        "result": json.loads(lines[-1]) if len(lines) > 1 else None,
        "wall_s": round(time.perf_counter() - t0, 1),
        "stderr": out.stderr[-1500:],
    }


@part("ipc")
def ipc() -> dict[str, Any]:
    from harnesslab.tools.gpu import copy_flat

    harness = copy_flat(Path(tempfile.mkdtemp(prefix="hl-harness-")))  # flat, as staged
    sys.path.insert(0, str(harness))
    import torch
    import wire
    from cudadrv import Driver

    torch.cuda.init()
    torch.empty(1, device="cuda")
    drv = Driver()
    drv.init_primary(0)
    results = {}
    for ns in (["net", "mnt"], ["net", "ipc", "mnt"], True, False):
        ptr = drv.alloc(1 << 20)
        handle = drv.ipc_handle(ptr)
        scratch = tempfile.mkdtemp(prefix="sbx-ipc-")
        policy = {"read": [str(harness)], "scratch_root": scratch, "namespaces": ns}
        p = subprocess.Popen(
            [
                sys.executable,
                "-I",
                str(harness / "sandbox.py"),
                "--policy",
                json.dumps(policy),
                "--",
                sys.executable,
                "-I",
                str(harness / "replay.py"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        fd_in, fd_out = p.stdin.fileno(), p.stdout.fileno()
        report = json.loads(wire.read_line(fd_out, 30))

        def ask(msg, fd_in=fd_in, fd_out=fd_out):
            wire.send(fd_in, msg)
            return wire.recv(fd_out, 60)

        try:
            r = ipc_steps(ask, handle)
        except Exception as exc:
            results[f"namespaces={ns}"] = {
                "error": repr(exc),
                "stderr": p.stderr.read().decode()[-600:] if p.poll() is not None else "",
            }
            p.kill()
            drv.free(ptr)
            continue

        class M:
            def __init__(s, ptr, n):
                s.__cuda_array_interface__ = {
                    "shape": (n,),
                    "typestr": "<u4",
                    "data": (ptr, False),
                    "version": 2,
                }

        t = torch.as_tensor(M(ptr, 1 << 18), device="cuda")
        ok = bool((t[1024:2048] == 0x12345678).all()) and not bool((t[:1024] == 0x12345678).any())
        ask({"op": "close_arena", "id": "a"})
        wire.send(fd_in, {"op": "exit"})
        p.wait(30)
        del t
        drv.free(ptr)
        results[f"namespaces={ns}"] = {
            "written_by_replayer": ok,
            "replies": [str(x)[:160] for x in r],
            "sandbox": report.get("level"),
            "stderr": p.stderr.read().decode()[-600:],
        }
    return results


def ipc_steps(ask, handle):
    import base64

    return [
        ask({"op": "hello"}),
        ask(
            {
                "op": "arena",
                "id": "a",
                "handle": base64.b64encode(handle).decode(),
                "nbytes": 1 << 20,
            }
        ),
        ask(
            {
                "op": "program",
                "id": "p",
                "steps": [
                    {
                        "op": "memset",
                        "buf": "b",
                        "offset": 0,
                        "width": 4,
                        "value": 0x12345678,
                        "count": 1024,
                    }
                ],
                "calls": [{"b": ["a", 4096, 8192]}],
            }
        ),
        ask({"op": "run", "id": "p", "calls": [0]}),
    ]


def honest_kernels(task: str) -> dict[str, tuple[Path, dict | None]]:
    from harnesslab.tools.task.spec import load_task

    spec = load_task(task)
    out = {"baseline": (spec.workspace_template / "kernel.py", None)}
    for n, p in spec.solutions().items():
        out[f"solution_{n}"] = (p, None)
    return out


def verify_once(ws, state: Path, **kw):  # noqa: D103
    import anyio

    from harnesslab.tools.execution.launcher import Launcher
    from harnesslab.tools.integrity.verify import guarded_verify

    settings = Settings(state_dir=state)

    async def go():
        launcher = Launcher(settings)
        try:
            return await guarded_verify(ws, launcher, settings, **kw)
        finally:
            await launcher.aclose()

    return anyio.run(go)


def summarize(v) -> dict[str, Any]:
    return {
        "verdict": v.verdict,
        "score_us": v.score_us and round(v.score_us, 2),
        "certifies": v.certifies,
        "sandbox": v.sandbox,
        "reasons": [f"{r['code']}: {r['detail']}"[:240] for r in v.reasons[:4]],
        "cases": [
            (
                c.median_us and round(c.median_us, 2),
                c.pct_of_copy_bw and round(c.pct_of_copy_bw, 1),
                c.timing_method,
            )
            for c in v.result.cases
        ],
        "checks": v.evidence.get("checks"),
        "wall_s": round(v.result.wall_s, 1),
        "incumbent": v.incumbent
        and {k: v.incumbent.get(k) for k in ("speedup", "faster", "error")},
    }


@part("verify")
def verify_tasks(tasks: list[str], state: Path) -> dict[str, Any]:
    from harnesslab.tools.state.workspace import init_workspace

    out = {}
    for task in tasks:
        for name, (path, _) in honest_kernels(task).items():
            tmp = Path(tempfile.mkdtemp(prefix=f"ws-{task}-"))
            ws = init_workspace(task, tmp / "ws", Settings(state_dir=state))
            shutil.copy(path, ws.root / ws.task.entry_file)
            t0 = time.perf_counter()
            try:
                v = verify_once(ws, state)
                out[f"{task}/{name}"] = {
                    **summarize(v),
                    "total_s": round(time.perf_counter() - t0, 1),
                }
            except Exception as exc:
                traceback.print_exc()
                out[f"{task}/{name}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(json.dumps({f"{task}/{name}": out[f"{task}/{name}"]})[:1500], flush=True)
    return out


@part("abba")
def abba(state: Path) -> dict[str, Any]:
    """The baseline verified first (the incumbent), then the solution, then the same solution
    with a comment added (a new hash, an identical kernel: it must not beat itself)."""
    from harnesslab.tools.state.workspace import init_workspace

    kernels = honest_kernels("rmsnorm_gate")
    tmp = Path(tempfile.mkdtemp(prefix="ws-abba-"))
    ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=state))
    rows = {}
    fast = kernels["solution_fast"][0].read_text()
    for name, text in (
        ("baseline", kernels["baseline"][0].read_text()),
        ("fast", fast),
        ("fast_identical", fast + "\n# the same kernel under a new hash\n"),
    ):
        (ws.root / "kernel.py").write_text(text)
        rows[name] = summarize(verify_once(ws, state))
    return rows


GPU_CHEATS = ROOT / "tools" / "integrity" / "cheats" / "gpu"
ONLY: set[str] = set()
ROUNDS = 2


def twin(text: str) -> str:
    """The honest twin of a GPU cheat: the file without its exploit block."""
    out, skip = [], False
    for line in text.splitlines():
        if line.strip() == "# -- exploit":
            skip = True
        elif line.strip() == "# -- end exploit":
            skip = False
        elif not skip:
            out.append(line)
    return "\n".join(out) + "\n"


def processes_running(marker: str) -> int:
    n = 0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                n += 1
        except OSError:
            pass
    return n


@part("gpu_cheats")
def gpu_cheats(state: Path) -> dict[str, Any]:
    """Each GPU cheat verified after its honest twin (the incumbent), scan not enforced."""
    import re

    from harnesslab.tools.state.workspace import init_workspace

    rows = {}
    for path in sorted(GPU_CHEATS.glob("*.py")):
        if ONLY and path.stem not in ONLY:
            continue
        want = re.search(r"^gpu: (\S+)", path.read_text(), re.M).group(1)
        tmp = Path(tempfile.mkdtemp(prefix=f"ws-{path.stem}-"))
        ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=state))
        (ws.root / "kernel.py").write_text(twin(path.read_text()))
        honest = verify_once(ws, state)
        shutil.copy(path, ws.root / "kernel.py")
        cheat = verify_once(ws, state, enforce_scan=False)
        codes = sorted({r["code"] for r in cheat.reasons})
        inc = cheat.incumbent or {}
        if want == "harmless":  # rejected by an observation, or passed and no faster
            ok = cheat.verdict == "rejected" or (
                cheat.verdict == "passed"
                and not cheat.is_new_best
                and (inc.get("speedup") or 0) < 1.03
            )
        else:
            ok = cheat.verdict == "rejected" and want in codes
        rows[path.stem] = {
            "expected": want,
            "ok": ok,
            "twin": honest.verdict,
            "verdict": cheat.verdict,
            "codes": codes,
            "speedup_vs_twin": inc.get("speedup"),
            "is_new_best": cheat.is_new_best,
            "guard_children_left": processes_running("guard_child.py"),
        }
        print(json.dumps({path.stem: rows[path.stem]}), flush=True)
    return rows


@part("overhead")
def overhead(n: int = 10) -> dict[str, Any]:
    """Warm run_objective (9 dev cases) through a sandboxed worker vs the same runner started
    without sandbox.py, alternating, each on its own launcher and warm worker. (A first version
    cleared SANDBOXED_MODES instead, which also turned the warm worker off: not comparable.)"""
    import anyio

    from harnesslab.tools.evaluation.objective import run_objective
    from harnesslab.tools.execution import launcher as lmod
    from harnesslab.tools.state.workspace import init_workspace

    tmp = Path(tempfile.mkdtemp(prefix="ws-overhead-"))
    ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=tmp / "sa"))
    sandboxed_argv = lmod.Launcher.runner_argv

    def plain_argv(self, slot, mode, task, *, worker, roots, candidates="candidates"):
        # the same runner through the same import bootstrap, no sandbox.py
        from harnesslab.tools.gpu.isolation import sandbox_policy as sp

        program = [self.harness(slot), "--worker" if worker else "-"]
        return sp.Launch(argv=sp.python_argv(self._python(slot), program), stdin=b"", token="")

    async def go():
        la = lmod.Launcher(Settings(state_dir=tmp / "sa"))
        lb = lmod.Launcher(Settings(state_dir=tmp / "sb"))
        walls = {"sandboxed": [], "unsandboxed": []}
        try:
            for i in range(n + 1):
                for name, lau in (("sandboxed", la), ("unsandboxed", lb)):
                    lmod.Launcher.runner_argv = (
                        sandboxed_argv if name == "sandboxed" else plain_argv
                    )
                    t0 = time.perf_counter()
                    r = await run_objective(ws, lau, save=False)
                    if i:
                        walls[name].append(time.perf_counter() - t0)
                    assert r.status == "passed", r.reason
        finally:
            lmod.Launcher.runner_argv = sandboxed_argv
            await la.aclose()
            await lb.aclose()
        return walls

    walls = anyio.run(go)
    med = {k: statistics.median(v) for k, v in walls.items()}
    spread = {k: (min(v), max(v)) for k, v in walls.items()}
    return {
        "median_s": med,
        "min_max_s": spread,
        "ratio": med["sandboxed"] / med["unsandboxed"],
        "n": n,
    }


@part("profile")
def profile() -> dict[str, Any]:
    """profile_kernel (Nsight Compute) on the rmsnorm_gate baseline: its target runs inside the
    sandbox with Landlock's file rules (no network namespace, no socket filter: ncu talks to
    it through sockets and /dev/shm)."""
    import anyio

    from harnesslab.tools.evaluation.profiling import profile_kernel
    from harnesslab.tools.execution.launcher import Launcher
    from harnesslab.tools.state.workspace import init_workspace

    tmp = Path(tempfile.mkdtemp(prefix="ws-profile-"))
    settings = Settings(state_dir=tmp / "state")
    ws = init_workspace("rmsnorm_gate", tmp / "ws", settings)
    case = ws.task.dev_cases[-1].name

    async def go():
        launcher = Launcher(settings)
        try:
            return await profile_kernel(ws, launcher, case=case, repeats=1)
        finally:
            await launcher.aclose()

    rep = anyio.run(go)
    return {
        "case": case,
        "bottleneck": rep.bottleneck,
        "main": rep.main.model_dump(),
        "kernels": 1 + len(rep.others),
    }


@part("cost")
def cost(state: Path) -> dict[str, Any]:
    """A plain evaluate of the hidden cases (fresh runner, sandboxed) vs the guarded verify of
    the same candidate (fresh), wall clock; run twice each, alternating."""
    import anyio

    from harnesslab.tools.execution.launcher import Launcher
    from harnesslab.tools.state.secrets_store import workspace_secret
    from harnesslab.tools.state.workspace import init_workspace

    tmp = Path(tempfile.mkdtemp(prefix="ws-cost-"))
    ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=state))
    shutil.copy(honest_kernels("rmsnorm_gate")["solution_fast"][0], ws.root / "kernel.py")
    settings = Settings(state_dir=state)
    cases = ws.task.final.draw(workspace_secret(settings, ws.root)["seed"])
    candidate = ws.snapshot()

    async def plain():
        launcher = Launcher(settings)
        request = {
            "mode": "evaluate",
            "entry": ws.task.entry,
            "config_file": ws.task.config_file,
            "candidate_dir": f"@stage/{launcher.stage_candidate(candidate.files, candidate.digest)}",
            "tolerances": {k: v.model_dump() for k, v in ws.task.tolerances.items()},
            "cases": [c.model_dump() for c in cases],
            "seed": 1,
        }
        t0 = time.perf_counter()
        try:
            call = await launcher.call(request, task=ws.task, fresh=True)
        finally:
            await launcher.aclose()
        assert call.result and call.result.get("status") == "passed", str(call.result)[:300]
        return time.perf_counter() - t0

    plain_s, verify_s = [], []
    for _ in range(ROUNDS):
        plain_s.append(anyio.run(plain))
        t0 = time.perf_counter()
        v = verify_once(ws, state)
        verify_s.append(time.perf_counter() - t0)
        assert v.verdict == "passed", v.reasons
    return {
        "plain_s": plain_s,
        "verify_s": verify_s,
        "ratio": statistics.median(verify_s) / statistics.median(plain_s),
    }


@part("repeat")
def repeat(state: Path, n: int, budget_s: float) -> dict[str, Any]:
    """Guarded verifies of the rmsnorm_gate solution, the same workspace each time (after the
    first it is its own incumbent), until n or the time budget."""
    from harnesslab.tools.state.workspace import init_workspace

    tmp = Path(tempfile.mkdtemp(prefix="ws-repeat-"))
    ws = init_workspace("rmsnorm_gate", tmp / "ws", Settings(state_dir=state))
    text = honest_kernels("rmsnorm_gate")["solution_fast"][0].read_text()
    deadline = time.monotonic() + budget_s
    rows = []
    (ws.root / "kernel.py").write_text(text)  # one candidate: its own Triton cache, no incumbent
    for _ in range(n):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        v = verify_once(ws, state)
        rows.append(
            {
                "verdict": v.verdict,
                "score_us": v.score_us,
                "codes": sorted({r["code"] for r in v.reasons}),
                "speedup": (v.incumbent or {}).get("speedup"),
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    scores = [r["score_us"] for r in rows if r["score_us"]]
    return {
        "runs": len(rows),
        "passed": sum(r["verdict"] == "passed" for r in rows),
        "false_rejections": sum(r["verdict"] != "passed" for r in rows),
        "score_median_us": statistics.median(scores) if scores else None,
        "score_spread": (max(scores) - min(scores)) / statistics.median(scores) if scores else None,
        "wall_median_s": statistics.median(r["wall_s"] for r in rows) if rows else None,
        "rows": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="probe,cuda,ipc,verify,abba")
    ap.add_argument("--tasks", default="rmsnorm_gate,swiglu,softmax,matmul")
    ap.add_argument("--json", default="")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--repeat-budget-s", type=float, default=240)
    ap.add_argument(
        "--deadline-s", type=float, default=0, help="stop starting repeats this long after start"
    )
    ap.add_argument("--cheats", default="", help="GPU cheats to run (default all)")
    ap.add_argument("--cost-rounds", type=int, default=2)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    started = time.monotonic()
    ONLY.update(c for c in args.cheats.split(",") if c)
    globals()["ROUNDS"] = args.cost_rounds
    state = Path(tempfile.mkdtemp(prefix="hlstate-"))
    if "probe" in parts:
        probe()
    if "cuda" in parts:
        cuda_in_sandbox()
    if "ipc" in parts:
        ipc()
    if "verify" in parts:
        verify_tasks(args.tasks.split(","), state)
    if "abba" in parts:
        abba(state)
    if "overhead" in parts:
        overhead()
    if "gpu_cheats" in parts:
        gpu_cheats(state)
    if "profile" in parts:
        profile()
    if "cost" in parts:
        cost(state)
    if "repeat" in parts:
        budget = args.repeat_budget_s
        if args.deadline_s:
            budget = min(budget, args.deadline_s - (time.monotonic() - started))
        repeat(state, args.repeats, budget)
    if args.json:
        Path(args.json).write_text(json.dumps(ROWS, indent=1, default=str))
    print("\n== summary")
    for r in ROWS:
        print(r["part"], "OK" if r["ok"] else "FAILED", r["s"], "s", r.get("error", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
