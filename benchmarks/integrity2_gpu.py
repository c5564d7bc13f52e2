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
TOOLS = ROOT / "tools"
ROWS: list[dict[str, Any]] = []


def part(name: str):
    def wrap(fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                out = fn(*a, **k)
                ROWS.append({"part": name, "ok": True, "s": round(time.perf_counter() - t0, 1), **(out or {})})
            except Exception as exc:
                traceback.print_exc()
                ROWS.append({"part": name, "ok": False, "s": round(time.perf_counter() - t0, 1),
                             "error": f"{type(exc).__name__}: {exc}"[:400]})
            print(json.dumps(ROWS[-1])[:2000], flush=True)

        return run

    return wrap


@part("probe")
def probe() -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(TOOLS / "sandbox.py"), "--probe"], capture_output=True,
                         text=True, timeout=60)
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
    out = subprocess.run([sys.executable, "-I", str(TOOLS / "sandbox.py"), "--policy", json.dumps(policy),
                          "--", sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=300)
    lines = out.stdout.strip().splitlines()
    return {"rc": out.returncode, "sandbox": json.loads(lines[0]) if lines else None,
            "result": json.loads(lines[-1]) if len(lines) > 1 else None,
            "wall_s": round(time.perf_counter() - t0, 1), "stderr": out.stderr[-1500:]}


@part("ipc")
def ipc() -> dict[str, Any]:
    sys.path.insert(0, str(TOOLS))
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
        policy = {"read": [str(TOOLS)], "scratch_root": scratch, "namespaces": ns}
        p = subprocess.Popen([sys.executable, "-I", str(TOOLS / "sandbox.py"), "--policy", json.dumps(policy),
                              "--", sys.executable, "-I", str(TOOLS / "replay.py")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        fd_in, fd_out = p.stdin.fileno(), p.stdout.fileno()
        report = json.loads(wire.read_line(fd_out, 30))
        import base64

        def ask(msg):
            wire.send(fd_in, msg)
            return wire.recv(fd_out, 60)

        try:
            r = ipc_steps(ask, handle)
        except Exception as exc:
            results[f"namespaces={ns}"] = {"error": repr(exc), "stderr": p.stderr.read().decode()[-600:] if p.poll() is not None else ""}
            p.kill()
            drv.free(ptr)
            continue
        class M:

            def __init__(s, ptr, n):
                s.__cuda_array_interface__ = {"shape": (n,), "typestr": "<u4", "data": (ptr, False), "version": 2}
        t = torch.as_tensor(M(ptr, 1 << 18), device="cuda")
        ok = bool((t[1024:2048] == 0x12345678).all()) and not bool((t[:1024] == 0x12345678).any())
        ask({"op": "close_arena", "id": "a"})
        wire.send(fd_in, {"op": "exit"})
        p.wait(30)
        del t
        drv.free(ptr)
        results[f"namespaces={ns}"] = {"written_by_replayer": ok, "replies": [str(x)[:160] for x in r],
                                       "sandbox": report.get("level"), "stderr": p.stderr.read().decode()[-600:]}
    return results


def ipc_steps(ask, handle):
    import base64

    return [ask({"op": "hello"}),
            ask({"op": "arena", "id": "a", "handle": base64.b64encode(handle).decode(), "nbytes": 1 << 20}),
            ask({"op": "program", "id": "p", "steps": [{"op": "memset", "buf": "b", "offset": 0, "width": 4,
                                                        "value": 0x12345678, "count": 1024}],
                 "calls": [{"b": ["a", 4096, 8192]}]}),
            ask({"op": "run", "id": "p", "calls": [0]})]


def honest_kernels(task: str) -> dict[str, tuple[Path, dict | None]]:
    from harnesslab.tools.tasks import load_task

    spec = load_task(task)
    out = {"baseline": (spec.workspace_template / "kernel.py", None)}
    for n, p in spec.solutions().items():
        out[f"solution_{n}"] = (p, None)
    return out


def verify_once(ws, state: Path, **kw):
    import anyio
    from harnesslab.tools.launcher import Launcher
    from harnesslab.tools.settings import Settings
    from harnesslab.tools.verify import guarded_verify

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
        "verdict": v.verdict, "score_us": v.score_us and round(v.score_us, 2), "certifies": v.certifies,
        "sandbox": v.sandbox, "reasons": [f"{r['code']}: {r['detail']}"[:240] for r in v.reasons[:4]],
        "cases": [(c.median_us and round(c.median_us, 2), c.pct_of_copy_bw and round(c.pct_of_copy_bw, 1),
                   c.timing_method) for c in v.result.cases],
        "checks": v.evidence.get("checks"), "wall_s": round(v.result.wall_s, 1),
        "incumbent": v.incumbent and {k: v.incumbent.get(k) for k in ("speedup", "faster", "error")},
    }


@part("verify")
def verify_tasks(tasks: list[str], state: Path) -> dict[str, Any]:
    from harnesslab.tools.workspace import init_workspace

    out = {}
    for task in tasks:
        for name, (path, _) in honest_kernels(task).items():
            tmp = Path(tempfile.mkdtemp(prefix=f"ws-{task}-"))
            ws = init_workspace(task, tmp / "ws")
            shutil.copy(path, ws.root / ws.task.entry_file)
            t0 = time.perf_counter()
            try:
                v = verify_once(ws, state)
                out[f"{task}/{name}"] = {**summarize(v), "total_s": round(time.perf_counter() - t0, 1)}
            except Exception as exc:
                traceback.print_exc()
                out[f"{task}/{name}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(json.dumps({f"{task}/{name}": out[f"{task}/{name}"]})[:1500], flush=True)
    return out


@part("abba")
def abba(state: Path) -> dict[str, Any]:
    """The baseline verified first (the incumbent), then the solution, then the same solution
    with a comment added (a new hash, an identical kernel: it must not beat itself)."""
    from harnesslab.tools.workspace import init_workspace

    kernels = honest_kernels("rmsnorm_gate")
    tmp = Path(tempfile.mkdtemp(prefix="ws-abba-"))
    ws = init_workspace("rmsnorm_gate", tmp / "ws")
    rows = {}
    fast = kernels["solution_fast"][0].read_text()
    for name, text in (("baseline", kernels["baseline"][0].read_text()), ("fast", fast),
                       ("fast_identical", fast + "\n# the same kernel under a new hash\n")):
        (ws.root / "kernel.py").write_text(text)
        rows[name] = summarize(verify_once(ws, state))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="probe,cuda,ipc,verify,abba")
    ap.add_argument("--tasks", default="rmsnorm_gate,swiglu,softmax,matmul")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
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
    if args.json:
        Path(args.json).write_text(json.dumps(ROWS, indent=1, default=str))
    print("\n== summary")
    for r in ROWS:
        print(r["part"], "OK" if r["ok"] else "FAILED", r["s"], "s", r.get("error", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
