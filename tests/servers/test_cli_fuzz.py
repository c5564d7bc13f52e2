"""Fuzz of the CLI's inputs, the kind that found tracebacks: out-of-range, huge, negative,
non-finite and non-numeric numbers for every numeric flag that configures something, and
task.toml files that are not UTF-8, hold a 5000-digit integer, nest 5000 deep, are a folder or
ask for negative or enormous sizes. Each is a one-line `error:` (plus its `next:`), exit 2,
before anything runs or is allocated; none is a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harnesslab.servers.cli import main
from harnesslab.tools.task.spec import tasks_root

HUGE = "9" * 30


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    assert main(["init", "-w", str(tmp_path / "ws")]) == 0
    return tmp_path / "ws"


def exits_2(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run the CLI in process; it must exit 2 with one `error:` line and no traceback."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    return errors[0]


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--port", "99999"), ("--port", "-1"), ("--port", "http"), ("--port", HUGE),
        ("--max-sessions", "0"), ("--max-sessions", HUGE), ("--max-sessions-per-client", "-5"),
        ("--session-idle-min", "nan"), ("--session-idle-min", "-1"),
        ("--slurm-gpus", "-5"), ("--slurm-nodes", HUGE),
    ],
)  # fmt: skip
def test_serve_refuses_an_out_of_range_number_with_one_line(ws, capsys, flag, value):
    line = exits_2(["serve", "-w", str(ws), "--transport", "http", flag, value], capsys)
    assert flag.lstrip("-").split("-")[0] in line  # it names the flag


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "--slurm-nodes", HUGE, "--executor", "slurm"],  # was: OverflowError
        ["eval", "--slurm-gpus", "0"],
        ["eval", "--warmup", HUGE],
        ["run", "--task", "rmsnorm_gate", "--iterations", HUGE],  # was: a ValidationError
        ["demo", "--iterations", "-5"],
        ["lab", "--out", "OUT", "--repeats", "0"],
        ["lab", "--out", "OUT", "--budget-s", "nan"],
        ["meta", "--transport", "http", "--port", "65536"],
    ],
)
def test_other_commands_refuse_bad_numbers_with_one_line(ws, tmp_path, capsys, argv):
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    if argv[0] in ("eval", "run", "meta"):
        argv[1:1] = ["-w", str(ws if argv[0] != "run" else tmp_path / "run-ws")]
    if argv[0] == "demo":
        argv += ["--workspace", str(tmp_path / "demo")]
    exits_2(argv, capsys)


TOML_PROBLEMS = {
    "not-utf8": b'name = "x"\n\xff\xfe\n',
    "huge-integer": b"name = 1" + b"9" * 5000 + b"\n",
    "deep": b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "too-big": b"# " + b"x" * (2 << 20) + b"\n",
}


def task_folder(tmp_path: Path, problem: str) -> Path:
    folder = tmp_path / f"task-{problem}"
    shutil.copytree(tasks_root() / "rmsnorm_gate", folder)
    toml = folder / "task.toml"
    if problem in TOML_PROBLEMS:
        toml.write_bytes(TOML_PROBLEMS[problem])
    elif problem == "folder":
        toml.unlink()
        toml.mkdir()
    else:  # a size: negative, or past an int32 index
        text = toml.read_text()
        value = "-5" if problem == "negative-size" else str(10**12)
        toml.write_text(text.replace("rows = 1024", f"rows = {value}", 1))
        assert toml.read_text() != text
    return folder


@pytest.mark.parametrize("problem", [*TOML_PROBLEMS, "folder", "negative-size", "enormous-size"])
@pytest.mark.parametrize("command", ["init", "bind"])
def test_a_broken_task_toml_is_one_line_naming_it_in_init_and_bind(
    tmp_path, monkeypatch, capsys, command, problem
):
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    folder = task_folder(tmp_path, problem)
    target = tmp_path / "target"
    if command == "bind":
        target.mkdir()
    line = exits_2([command, "-w", str(target), "--task", str(folder)], capsys)
    assert "task.toml" in line or str(folder) in line, line
