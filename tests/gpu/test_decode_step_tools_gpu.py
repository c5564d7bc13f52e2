"""decode_step's kernel tools on a real GPU (tests/gpu/conftest.py marks these gpu and skips them
without one), at task.toml's GPU sizes: numerical_probe's step probes on the eager baseline and
the shipped Triton solution (max_seq 2048), profile_kernel's per-kernel breakdown of the
solution's step and sweep_kernel_config over its knobs (issue 32 item 4). The CPU tests
(tests/servers/test_task_server_step.py) run the interpreter's tiny sizes."""

from __future__ import annotations

import anyio

from harnesslab.tools.evaluation import numerical_probe
from harnesslab.tools.evaluation.profiling import profile_kernel
from harnesslab.tools.evaluation.sweep import sweep
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task import load_task


def test_the_step_probes_pass_the_baseline_and_the_solution_at_the_task_toml_sizes(tmp_path):
    """numerical_probe on a decode_step workspace on a GPU (issue 32 item 4): the eager baseline
    and the shipped Triton solution pass every step probe at task.toml's GPU sizes (max_seq
    2048: long_context attends over all of it). The probes' scales were chosen at the
    interpreter's sizes; this is where they meet the real ones. Prints each probe's worst
    tolerance ratio."""
    settings = Settings(state_dir=tmp_path / "state")
    solution = load_task("decode_step").solutions()["triton"].read_text()
    for name, source in (("eager", None), ("triton", solution)):
        ws = init_workspace("decode_step", tmp_path / name, settings)
        if source is not None:
            (ws.root / "kernel.py").write_text(source)

        async def go(ws=ws):
            launcher = Launcher(settings)
            try:
                with anyio.fail_after(600):
                    return await numerical_probe(ws, launcher)
            finally:
                await launcher.aclose()

        rep = anyio.run(go)
        for r in rep.results:
            print(name, r.probe, r.dtype, r.passed, r.tolerance_ratio, r.context, r.reason)
        assert rep.status == "passed", (name, rep.failing, rep.reason)
        longest = [r for r in rep.results if r.probe == "long_context"]
        assert longest and all(r.context == 2048 for r in longest)


def test_the_step_profile_names_the_solutions_kernels_and_the_sweep_scores_its_knobs(tmp_path):
    """profile_kernel and sweep_kernel_config on a decode_step workspace holding the shipped
    Triton solution, on a GPU at task.toml's sizes: the profile's rows are device kernels
    (CUPTI sees the CUDA graph's replays) with the solution's attention among them, and two
    block_n configs both pass the step objective with a score each. Prints both."""
    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("decode_step", tmp_path / "ws", settings)
    (ws.root / "kernel.py").write_text(load_task("decode_step").solutions()["triton"].read_text())

    async def go():
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(600):
                profiled = await profile_kernel(ws, launcher, case="fixed_fp16", repeats=3)
                swept = await sweep(ws, launcher, space={"block_n": [32, 64]},
                                    cases=["fixed_fp16"])  # fmt: skip
                return profiled, swept
        finally:
            await launcher.aclose()

    profiled, swept = anyio.run(go)
    print(profiled.model_dump_json(indent=1))
    print([(r.config, r.status, r.score_us) for r in swept.results])
    assert profiled.meaningful and profiled.profiler == "torch.profiler"
    names = [k.kernel for k in [profiled.main, *profiled.others]]
    assert any("_attend" in n for n in names), names
    assert swept.ok == 2 and swept.meaningful
