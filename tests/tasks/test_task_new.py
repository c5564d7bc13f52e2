"""`harnesslab task new` without tracebacks: every common mistake is refused with the flag (or
field) at fault and the fix, exit 2, before anything is written or allocated; nothing of a
failed task stays on disk, and a failed command never suggests `init`."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesslab.servers.cli import main as cli_main
from harnesslab.tools.authoring.task_new import plan_new
from harnesslab.tools.errors import UsageError

HERE = Path(__file__).resolve().parent / "byok"
REF = f"{HERE / 'fused.py'}:scaled_residual_gelu"
KERNEL = f"{HERE / 'fused_kernel.py'}:fused_gelu"
INPUTS = ["--input", "x:rows,dim", "--input", "residual:rows,dim", "--input", "weight:dim"]
DIMS = ["--dims", "rows=16,dim=96"]
RAISES = "import torch\n\n\ndef op(x):\n    raise ValueError('rows must be even')\n"
TUPLE = "import torch\n\n\ndef op(x):\n    return x, x\n"
CALLED = "import torch\nfrom pathlib import Path\n\n\ndef op(x):\n    Path(__file__).with_name('called').write_text('1')\n    return x\n"

# (what the user typed after `task new NAME`, a part of the message naming the flag and fault)
MISTAKES = {
    "missing input": (["--reference", REF, *INPUTS[:4], *DIMS], "missing weight"),
    "extra input": (["--reference", REF, *INPUTS, "--input", "bias:dim", *DIMS], "4 inputs given"),
    "unknown scalar": (
        ["--reference", REF, *INPUTS, *DIMS, "--scalar", "alpah=0.5"],
        "--scalar alpah",
    ),
    "reference raises": (
        ["--reference", "{tmp}/raises.py:op", "--input", "x:rows", "--dims", "rows=8"],
        "raised ValueError: rows must be even",
    ),
    "reference returns a tuple": (
        ["--reference", "{tmp}/tuple.py:op", "--input", "x:rows", "--dims", "rows=8"],
        "returned tuple",
    ),
    "dims not a number": (
        ["--reference", REF, *INPUTS, "--dims", "rows=abc,dim=96"],
        "--dims rows=abc",
    ),
    "negative dims": (["--reference", REF, *INPUTS, "--dims", "rows=-5,dim=96"], "--dims rows=-5"),
    "zero dims": (["--reference", REF, *INPUTS, "--dims", "rows=0,dim=96"], "--dims rows=0"),
    "enormous dims": (
        ["--reference", REF, *INPUTS, "--dims", "rows=1000000000000,dim=96"],
        "larger than any GPU",
    ),
    "too many elements": (
        ["--reference", REF, *INPUTS, "--dims", "rows=2000000000,dim=2000000"],
        "--input x would have",
    ),
    "a dim without a size": (
        ["--reference", REF, *INPUTS, "--dims", "rows=16"],
        "dim 'dim' has no size",
    ),
    "a size without a dim": (
        ["--reference", REF, *INPUTS, "--dims", "rows=16,dim=96,cols=3"],
        "--dims cols",
    ),
    "empty range": (
        ["--reference", REF, *INPUTS, *DIMS, "--range", "rows=100:10"],
        "--range rows=100:10",
    ),
    "range of an unknown dim": (
        ["--reference", REF, *INPUTS, *DIMS, "--range", "cols=1:4"],
        "--range cols=1:4",
    ),
    "bad input flag": (["--reference", REF, "--input", "x", *DIMS], "--input 'x'"),
    "bad input axis": (["--reference", REF, "--input", "x:rows,2d", *DIMS], "'2d' is neither"),
    "bad input dtype": (
        ["--reference", REF, "--input", "x:rows,dim:float8", *DIMS],
        "dtype 'float8'",
    ),
    "repeated input": (
        [
            "--reference",
            REF,
            "--input",
            "x:rows,dim",
            "--input",
            "x:rows,dim",
            "--input",
            "w:dim",
            *DIMS,
        ],
        "names repeat",
    ),
    "no inputs": (["--reference", REF], "no inputs declared"),
    "missing reference file": (
        ["--reference", "{tmp}/nope.py:op", "--input", "x:rows", "--dims", "rows=8"],
        "does not exist",
    ),
    "no such function": (
        ["--reference", f"{HERE / 'fused.py'}:nope", *INPUTS, *DIMS],
        "defines no function nope",
    ),
    "reference without a name": (
        ["--reference", str(HERE / "fused.py"), *INPUTS, *DIMS],
        "--reference",
    ),
    "kernel without the function": (
        ["--reference", REF, "--kernel", f"{HERE / 'fused_kernel.py'}:nope", *INPUTS, *DIMS],
        "--kernel",
    ),
    "bad dtypes": (["--reference", REF, *INPUTS, *DIMS, "--dtypes", "float8"], "--dtypes"),
    "bad knob": (["--reference", REF, *INPUTS, *DIMS, "--knob", "num_warps"], "--knob"),
    "formula over an unknown dim": (
        [
            "--reference",
            REF,
            "--kernel",
            KERNEL,
            *INPUTS,
            *DIMS,
            "--scalar",
            "alpha=0.5",
            "--flops",
            "2*rows*cols",
        ],
        "declare.flops: unknown dim 'cols'",
    ),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_task_new_mistake_names_its_flag_and_leaves_nothing(
    mistake, tmp_path, capsys, monkeypatch
) -> None:
    args, message = MISTAKES[mistake]
    (tmp_path / "raises.py").write_text(RAISES)
    (tmp_path / "tuple.py").write_text(TUPLE)
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "task"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code = cli_main(["task", "new", "op_task", *argv, "--out", str(out), "--no-check"])
    printed = capsys.readouterr()
    assert code == 2, printed
    assert message in printed.err, printed.err
    assert "Traceback" not in printed.err + printed.out
    assert "next: harnesslab init" not in printed.out
    assert not out.exists()


def test_a_bad_name_is_refused_before_anything(tmp_path, capsys) -> None:
    code = cli_main(["task", "new", "Op", "--reference", REF, *INPUTS, *DIMS, "--out",
                     str(tmp_path / "t"), "--no-check"])  # fmt: skip
    assert code == 2 and "task name 'Op'" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_an_existing_folder_is_left_as_it_was(tmp_path, capsys) -> None:
    out = tmp_path / "task"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    code = cli_main(["task", "new", "op_task", "--reference", REF, *INPUTS, *DIMS, "--out",
                     str(out), "--no-check"])  # fmt: skip
    assert code == 2 and "is not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_enormous_sizes_are_refused_before_the_reference_runs(tmp_path) -> None:
    ref = tmp_path / "called.py"
    ref.write_text(CALLED)
    with pytest.raises(UsageError, match="larger than any GPU"):
        plan_new("op", f"{ref}:op", inputs=["x:n"], dims=["n=1000000000000"])
    with pytest.raises(UsageError, match="a size is a positive integer"):
        plan_new("op", f"{ref}:op", inputs=["x:n"], dims=["n=-5"])
    assert not (tmp_path / "called").exists()


def test_the_reference_never_runs_on_full_size_inputs_on_the_cpu(tmp_path) -> None:
    """A 2^20 x 2^12 fp32 dev case (16 GiB) is checked on meta tensors, never allocated."""
    ref = tmp_path / "big.py"
    ref.write_text("import torch\n\n\ndef op(x):\n    assert x.numel() < 1 << 24 or x.is_meta\n"
                   "    return x * 2\n")  # fmt: skip
    plan = plan_new("op", f"{ref}:op", inputs=["x:rows,dim"], dims=["rows=1048576,dim=4096"])
    assert plan.output_shape == ["rows", "dim"]


def test_a_good_task_new_still_prints_next_init(tmp_path, capsys) -> None:
    code = cli_main(["task", "new", "op_task", "--reference", REF, "--kernel", KERNEL, *INPUTS,
                     *DIMS, "--scalar", "alpha=0.5", "--out", str(tmp_path / "t"), "--no-check"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0 and f"next: harnesslab init --task {tmp_path / 't'}" in printed
