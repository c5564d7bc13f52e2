"""Where a timed step of the step verify's timed pass spends its time (issue 32): the work of
step_child.py's `timed_step` in THIS process (no sandbox, no pipes), phase by phase, against the
same step as the dev objective times it. The guarded verify's timed pass measured the shipped
Triton solution at 5.9-6.3 ms per step on an H100 where the dev objective says ~0.6 ms: if the
work here is ~0.6 ms, the rest is the sandboxed process and its pipes, not the step.

    python benchmarks/step_timed_probe_gpu.py [--entry solutions/triton.py:step] [--steps 64]
                                              [--sandboxed]

--sandboxed runs the same probe inside sandbox.py with the step verify's candidate policy
(Landlock, namespaces, seccomp, limits): the difference from a plain run is the sandbox's.

Phases per step (median us over --steps, each phase synchronised before the next so it is
charged to itself): tokens (the arena's tokens to the device), step (the candidate's call),
logits (its logits into the arena slot), lengths (the harness's lengths advance), sync; and the
whole `timed_step` as the child runs it (one synchronize at the end). Standard library + torch;
the staged files from a flat copy of tools/gpu (as a GPU host has them).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("_hl_gpu", ROOT / "tools" / "gpu" / "__init__.py")
_gpu = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(_gpu)  # type: ignore[union-attr]
if "--flat" in sys.argv:  # the sandboxed run: the outer run's copy (read-only in there)
    FLAT = Path(sys.argv[sys.argv.index("--flat") + 1])
else:
    FLAT = _gpu.copy_flat(Path(tempfile.mkdtemp(prefix="hl_probe_")), _gpu.STAGED)
sys.path.insert(0, str(FLAT))

import step_child  # noqa: E402
import step_guard  # noqa: E402
import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entry", default="solutions/triton.py:step")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--sandboxed", action="store_true")
    ap.add_argument("--flat")
    args = ap.parse_args()
    if args.sandboxed:
        return sandboxed(args)
    cuda = torch.cuda.is_available()
    task = ROOT / "tasks" / "decode_step"
    toml = tomllib.loads((task / "task.toml").read_text())
    rel, func = args.entry.split(":")
    spec = importlib.util.spec_from_file_location("_hl_ref", task / "reference.py")
    ref = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["_hl_ref"] = ref
    spec.loader.exec_module(ref)  # type: ignore[union-attr]
    sizes = toml["step"]["model" if cuda else "interpreter"]
    config = ref.Config(**sizes, dtype=args.dtype)
    layout, size = step_guard.Arena.layout(config)
    scratch = tempfile.mkdtemp()
    arena = step_guard.Arena(torch, size + step_guard.ALIGN, scratch)
    views = arena.views(layout)
    truth = ref.new_state(config, seed=1, device="cuda" if cuda else "cpu")
    for name, w in truth.weights.items():
        views[f"w.{name}"].copy_(w)
    views["rope_cos"].copy_(truth.rope_cos)
    views["rope_sin"].copy_(truth.rope_sin)
    cand = ref.State(config=config, weights={}, kv_cache=views["kv_cache"],
                     lengths=views["lengths"], host_lengths=[0] * config.batch,
                     rope_cos=views["rope_cos"], rope_sin=views["rope_sin"])  # fmt: skip
    sink = os.open(os.devnull, os.O_WRONLY)
    child = step_child.StepChild({"device": "cuda" if cuda else "cpu",
                                  "candidate_dir": str(task / Path(rel).parent),
                                  "entry": f"{Path(rel).name}:{func}",
                                  "reference": str(task / "reference.py"),
                                  "memfd": arena.fd}, sink)  # fmt: skip
    child.spin_for_request = lambda *a, **k: None  # no parent here to wait for
    for op, msg in (("load", {}), ("map_arena", {"size": arena.size}),
                    ("trace", {"layout": layout, "config": step_guard._config_dict(config)})):  # fmt: skip
        getattr(child, op)(msg)
    length = 1000 if cuda else 20
    for b in range(config.batch):
        ref.prefill(cand, b, length, seed=b)
    child.push({})
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    phases: dict[str, list[float]] = {k: [] for k in
                                      ("tokens", "step", "logits", "lengths", "sync", "whole")}  # fmt: skip
    state = child.state
    for i in range(args.steps + 8):
        toks = [(7 * i + b) % config.vocab for b in range(config.batch)]
        views["tokens"].copy_(torch.tensor(toks, dtype=torch.int64))
        host = [length + i] * config.batch
        if i % 2:  # the child's timed_step as it is, one synchronize at its end
            sync()
            t0 = time.perf_counter()
            child.timed_step({"host_lengths": host})
            if i >= 8:
                phases["whole"].append((time.perf_counter() - t0) * 1e6)
            continue
        state.host_lengths = host
        marks = [time.perf_counter()]
        tokens = views["tokens"].to("cuda" if cuda else "cpu", copy=True)
        sync()
        marks.append(time.perf_counter())
        out = child.fn(state, tokens)
        sync()
        marks.append(time.perf_counter())
        views["logits"].copy_(out)
        sync()
        marks.append(time.perf_counter())
        child.device_lengths += 1
        sync()
        marks.append(time.perf_counter())
        sync()
        marks.append(time.perf_counter())
        if i >= 8:
            for k, a, b in zip(("tokens", "step", "logits", "lengths", "sync"), marks, marks[1:],
                               strict=False):  # fmt: skip
                phases[k].append((b - a) * 1e6)
    print(f"device {'cuda' if cuda else 'cpu'}  entry {args.entry}  dtype {args.dtype}  "
          f"steps {args.steps} (medians, us; p10-p90)")  # fmt: skip
    for k, xs in phases.items():
        xs = sorted(xs)
        print(
            f"  {k:8} {statistics.median(xs):9.1f}  ({xs[len(xs) // 10]:.1f}-{xs[9 * len(xs) // 10]:.1f})"
        )
    return 0


def sandboxed(args: argparse.Namespace) -> int:
    """This probe again inside sandbox.py, with the policy step_guard.py gives the candidate."""
    import dataclasses
    import subprocess

    import sandbox_policy as sp

    py = sys.executable
    scratch = tempfile.mkdtemp(prefix="hl_probe_scratch_")
    report_r, report_w = os.pipe()
    policy = sp.Policy(
        read=[str(FLAT), str(ROOT / "tasks"), str(ROOT / "benchmarks"), str(ROOT / "tools")],
        scratch_root=scratch, require=True, env_allow=["CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"],
        namespaces=True, report_fd=report_w, **sp.python_policy(sp.import_roots()),
        env={} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"},
    )  # fmt: skip
    target = [str(Path(__file__).resolve()), "--entry", args.entry, "--steps", str(args.steps),
              "--dtype", args.dtype, "--flat", str(FLAT)]  # fmt: skip
    launch = sp.command(py, str(FLAT / "sandbox.py"), dataclasses.replace(policy),
                        sp.python_argv(py, target))  # fmt: skip
    proc = subprocess.Popen(launch.argv, stdin=subprocess.PIPE, pass_fds=(report_w,))
    os.close(report_w)
    assert proc.stdin is not None
    proc.stdin.write(launch.stdin)
    proc.stdin.close()
    print("sandbox:", os.read(report_r, 4096).decode(errors="replace").splitlines()[0][:300])
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
