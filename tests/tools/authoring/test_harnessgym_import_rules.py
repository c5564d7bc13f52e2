"""What the HarnessGym import reads from a task folder (tools/task/harnessgym_import.py), rule by
rule on small texts: the task name, the dev and final commands (remote wrapper removed, the
benchmark preferred for dev and the verifier for final, else by file name), the score key and
its unit, the editable files, the kernel contract, and each rewrite of task.md. The whole import
of an example folder is tests/harnessgym/test_harnessgym_task.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesslab.tools.authoring import harnessgym_import as hg
from harnesslab.tools.errors import UsageError
from harnesslab.tools.task.spec import load_task

FILES = {"benchmark.py": b"", "verifier.py": b"", "kernel.py": b"", "remote_run.py": b""}

CONTRACTS = hg.shipped_contracts()


def test_a_task_name_is_the_folders_lowercased_or_the_one_given() -> None:
    assert hg.task_name(Path("/x/My Task.v2"), None) == "my-task-v2"
    assert hg.task_name(Path("/x/-_Kernel_-"), None) == "kernel"
    assert hg.task_name(Path("/x/+++"), None) == "imported"
    assert hg.task_name(Path("/x/whatever"), "given_name") == "given_name"
    with pytest.raises(UsageError, match="'Bad Name' is not a task name"):
        hg.task_name(Path("/x/ok"), "Bad Name")
    with pytest.raises(UsageError):
        hg.task_name(Path("/x/" + "a" * 70), None)


def test_commands_come_from_the_brief_without_the_remote_wrapper() -> None:
    brief = (
        "Run `python3 remote_run.py --host gpu1 -- python3 benchmark.py --json --mode dev`.\n"
        "Final: `python ./verifier.py --mode=final --json`\n"
    )
    assert hg.find_commands(brief, FILES) == {
        "dev": "{python} benchmark.py --json --mode dev",
        "final": "{python} ./verifier.py --mode=final --json",
    }


def test_the_benchmark_is_preferred_for_dev_and_the_verifier_for_final() -> None:
    brief = (
        "python3 verifier.py --mode dev\npython3 benchmark.py --mode dev\n"
        "python3 benchmark.py --mode final\npython3 verifier.py --mode final\n"
        "python3 verifier.py --mode dev --again\npython3 benchmark.py --mode dev --later\n"
    )
    assert hg.find_commands(brief, FILES) == {
        "dev": "{python} benchmark.py --mode dev",
        "final": "{python} verifier.py --mode final",
    }
    # the first named wins where neither is preferred
    brief = "python3 run_a.py --mode dev\npython3 run_b.py --mode dev\n"
    files = {"run_a.py": b"", "run_b.py": b""}
    assert hg.find_commands(brief, files) == {"dev": "{python} run_a.py --mode dev"}


def test_a_command_of_a_file_the_folder_lacks_is_ignored_and_file_names_fill_in() -> None:
    brief = "python3 missing.py --mode dev\n"
    assert hg.find_commands(brief, FILES) == {
        "dev": "{python} benchmark.py --json --mode dev",
        "final": "{python} verifier.py --json --mode final",
    }
    assert hg.find_commands("", {"verifier.py": b""}) == {
        "dev": "{python} verifier.py --json --mode dev",
        "final": "{python} verifier.py --json --mode final",
    }
    assert hg.find_commands("", {"benchmark.py": b""}) == {
        "dev": "{python} benchmark.py --json --mode dev",
        "final": "{python} benchmark.py --json --mode final",
    }
    assert hg.find_commands("", {"kernel.py": b""}) == {}


def test_the_score_key_comes_from_the_first_hint_and_its_unit_from_its_suffix() -> None:
    assert hg.find_key("Aim for the lowest `best_us` you can.") == "best_us"
    assert hg.find_key("MAXIMIZE `tflops` please") == "tflops"
    assert hg.find_key("Score key: latency_ms") == "latency_ms"
    assert hg.find_key("the `gbps` metric") == "gbps"
    assert hg.find_key("the `a` metric; lowest `b`") == "b"  # the hints in order
    assert hg.find_key("no key here") == ""
    units = {"t_us": "us", "t_ms": "ms", "t_ns": "ns", "cycles": "cycles", "t_s": "s", "x": ""}
    for key, unit in units.items():
        assert hg.unit_of(key) == unit, key


def test_editable_files_are_the_briefs_list_else_kernels_and_configs() -> None:
    files = {**FILES, "config.json": b"", "kernel_v2.py": b"", "sub/kernel.py": b"",
             "tuning_config.json": b"", "notes.json": b"", "kernels/k.py": b"", "kernel.cu": b"",
             "config.yaml": b""}  # fmt: skip
    brief = "You may edit:\n- `kernel.py`\n* `config.json`\n- `nope.py`\n- `sub/kernel.py`\n\nMore."
    assert hg.find_editable(brief, files) == ["kernel.py", "config.json"]
    assert hg.find_editable("You MAY EDIT\n  - `kernel_v2.py`\n", files) == ["kernel_v2.py"]
    fallback = ["config.json", "kernel.py", "kernel_v2.py", "tuning_config.json"]
    assert hg.find_editable("no list", files) == fallback
    assert hg.find_editable("You may edit:\n- `nope.py`\n", files) == fallback


def test_parameters_are_the_functions_positional_ones() -> None:
    src = "def other(a):\n    pass\n\ndef f(a, /, b, c=1, *args, d, **kw):\n    pass\n"
    assert hg._params(src, "f") == ["a", "b", "c"]
    assert hg._params(src, "g") is None
    assert hg._params("def f(:\n", "f") is None
    assert (
        hg._params("class K:\n    def f(self, x):\n        pass\n", "f") is None
    )  # top level only


def test_a_kernel_contract_is_a_shipped_tasks_entry_with_its_leading_parameters() -> None:
    task = load_task("rmsnorm_gate")
    want = hg._params((task.workspace_template / task.entry_file).read_text(), task.entry_function)
    assert want
    fn = task.entry_function
    src = f"def {fn}({', '.join(want)}, extra=None):\n    pass\n".encode()
    found = hg.kernel_contract(CONTRACTS, {"kernel.py": src}, ["kernel.py"])
    assert found is not None and found.task.name == "rmsnorm_gate" and found.function == fn
    assert hg.kernel_contract(CONTRACTS, {"kernel.py": src}, []) is None  # not editable
    assert hg.kernel_contract(CONTRACTS, {"k.txt": src}, ["k.txt"]) is None  # not Python
    assert hg.kernel_contract(CONTRACTS, {}, ["kernel.py"]) is None
    wrong = f"def {fn}({', '.join(reversed(want))}):\n    pass\n".encode()
    assert hg.kernel_contract(CONTRACTS, {"kernel.py": wrong}, ["kernel.py"]) is None
    short = f"def {fn}({want[0]}):\n    pass\n".encode()
    assert hg.kernel_contract(CONTRACTS, {"kernel.py": short}, ["kernel.py"]) is None


def test_an_entry_names_a_kernel_of_another_name_and_the_closest_contract_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shipped = hg.list_tasks()
    monkeypatch.setattr(hg, "list_tasks", lambda: list(reversed(shipped)))  # softmax's (x) first
    src = (
        b"def fused(x, gate, weight, eps=1e-5, config=None):\n    pass\n\n"
        b"def helper(y):\n    pass\n"
    )
    files = {"kernel.py": src}
    assert hg.kernel_contract(CONTRACTS, files, ["kernel.py"]) is None  # no rmsnorm_gate by name
    found = hg.kernel_contract(CONTRACTS, files, ["kernel.py"], "kernel.py:fused")
    # rmsnorm_gate's (x, gate, weight, eps), not softmax's (x): the most parameters win
    assert found is not None and (found.task.name, found.function) == ("rmsnorm_gate", "fused")
    assert hg.kernel_contract(CONTRACTS, files, ["kernel.py"], "kernel.py:helper") is None
    assert hg.kernel_contract(CONTRACTS, files, [], "kernel.py:fused") is None  # not editable
    assert hg.kernel_contract(CONTRACTS, files, ["kernel.py"], "kernel.py:") is None
    assert {k: t.name for k, t in hg.lookalikes(CONTRACTS, files, ["kernel.py"]).items()} == {
        "kernel.py:fused": "rmsnorm_gate"
    }
    shim = hg.shim_source(found, "kernel.py:fused")
    namespace: dict[str, object] = {}
    exec(compile(src.decode() + shim, "kernel.py", "exec"), namespace)  # noqa: S102
    calls = []
    namespace["fused"] = lambda *a, **k: calls.append((a, k)) or "out"
    assert namespace["rmsnorm_gate"](1, 2, 3, eps=4) == "out" and calls == [((1, 2, 3), {"eps": 4})]


def test_lookalikes_are_other_names_in_editable_python_files_the_folder_has() -> None:
    src = b"def fused(x, gate, weight, eps=1e-5):\n    pass\n"
    named = b"def rmsnorm_gate(x, gate, weight, eps=1e-5):\n    pass\n"
    files = {"kernel.py": src, "k.txt": src, "own.py": named}
    found = hg.lookalikes(CONTRACTS, files, ["kernel.py", "k.txt", "missing.py", "own.py"])
    # not a .txt, not a file the folder lacks; rmsnorm_gate is no lookalike of its own task
    # (kernel_contract finds it by name), only of softmax's (x)
    assert {k: t.name for k, t in found.items()} == {
        "kernel.py:fused": "rmsnorm_gate", "own.py:rmsnorm_gate": "softmax"
    }  # fmt: skip


def report() -> hg.ImportReport:
    return hg.ImportReport(source="s", task_folder="t", name="n", kind="command", editable=[])


def test_the_brief_is_rewritten_and_every_change_listed() -> None:
    r = report()
    text = (
        "Run `python3 remote_run.py --port 22 -- python3 benchmark.py --mode dev`\n"
        "Set HARNESSGYM_GPU_HOST and HARNESSGYM_GPU_KEY; HARNESSGYM_GPU_WORKSPACE too.\n"
        "Results land in `.harnessgym/runs/result.json`.\n"
        "Logs are in .harnessgym/logs. HarnessGym rocks.\n"
        "python3 verifier.py --mode final\n"
    )
    out = hg.rewrite_brief(text, r)
    assert out == (
        "Run `python3 benchmark.py --mode dev`\n"
        "Set HARNESSLAB_GPU_HOST and HARNESSLAB_SSH_KEY; HARNESSGYM_GPU_WORKSPACE too.\n"
        "Results land in the result file the loop's prompt names.\n"
        "Logs are in .harnesslab/logs. harnesslab rocks.\n"
        "python verifier.py --mode final\n"
    )
    assert r.rewritten == [
        "remote wrapper removed from commands (harnesslab runs objectives on the GPU host "
        "itself: --gpu-host) (1x)",
        "HARNESSGYM_GPU_HOST -> HARNESSLAB_GPU_HOST (1x)",
        "HARNESSGYM_GPU_KEY -> HARNESSLAB_SSH_KEY (1x)",
        "result.json path -> the loop's result file (1x)",
        ".harnessgym -> .harnesslab (1x)",
        "HarnessGym -> harnesslab (1x)",
        "python3 -> python (1x)",
    ]
    unchanged = report()
    assert hg.rewrite_brief("nothing to do\n", unchanged) == "nothing to do\n"
    assert unchanged.rewritten == []


def test_a_line_naming_a_dropped_wrapper_says_what_harnesslab_does_instead() -> None:
    r = report()
    text = (
        "Steps:\n  - use remote_run.py for every run:\n3. remote_run.py needs a key\n"
        "Configure the remote wrapper with:\nkeep remote_runner.py here\n"
    )
    out = hg.rewrite_brief(text, r, dropped=["remote_run.py"])
    lines = out.splitlines()
    assert lines[1] == "  - " + hg.NO_WRAPPER + ". The commands themselves:"
    assert lines[2] == "3. " + hg.NO_WRAPPER
    assert lines[3] == "To reach the GPU host, whoever starts harnesslab sets:"
    assert lines[4] == "keep remote_runner.py here"  # another name that starts alike
    assert r.rewritten == [
        "remote_run.py (not imported) -> harnesslab's GPU host (2x)",
        "remote wrapper settings -> harnesslab's (1x)",
    ]


def test_an_import_that_ends_as_a_command_task_loads_each_shipped_task_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel contract and the lookalikes (its notes) are asked of one load of every
    shipped task, not one each."""
    loaded: list[str] = []

    def counted(name_or_dir: str | Path) -> hg.TaskSpec:
        loaded.append(str(name_or_dir))
        return load_task(name_or_dir)

    monkeypatch.setattr(hg, "load_task", counted)
    src = tmp_path / "hg"
    src.mkdir()
    (src / "task.md").write_text(
        "You may edit `kernel.py`.\nRun `python3 verifier.py --json --mode final`: best_us.\n"
    )
    (src / "verifier.py").write_text("print('{\"best_us\": 1.0}')\n")
    (src / "kernel.py").write_text("def fused(x, gate, weight, eps):\n    return x\n")
    report = hg.convert(src, tmp_path / "out")
    assert report.kind == "command"
    assert any("kernel.py:fused takes rmsnorm_gate's" in n for n in report.notes)  # a lookalike
    shipped = [n for n in loaded if n in hg.list_tasks()]
    assert sorted(shipped) == sorted(hg.list_tasks())  # each once
