"""The mutation driver (tests/mutation/mutate.py, operators.py) itself: mutants are valid Python
that differ from the module in one place, their ids survive edits elsewhere in the file, and a
run kills, keeps and explains mutants without ever changing a file of the tree."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harnesslab.tests.mutation.operators import mutants

HERE = Path(__file__).resolve().parent

MODULE = textwrap.dedent(
    '''
    """A module."""

    LIMIT = 10


    def clamp(x: int, flags: int = 1 | 2 | 4) -> int:
        """Docstring: never mutated."""
        if x > LIMIT and flags:
            raise ValueError(f"{x} is over {LIMIT}")
        return max(0, x)
    '''
)


def test_every_mutant_parses_and_changes_one_thing() -> None:
    found = list(mutants(MODULE))
    assert len(found) == len({m.source for m in found}) > 10
    for m in found:
        ast.parse(m.source)
        assert m.source != MODULE
        assert "Docstring: never mutated." in m.source
        assert "is over {LIMIT}" in m.source or "raise" not in m.source  # messages stay
    ids = {m.id for m in found}
    assert "clamp: `x > LIMIT` -> `x >= LIMIT` in `if x > LIMIT and flags:`" in ids
    assert "clamp: `max(0, x)` -> `min(0, x)` in `return max(0, x)`" in ids
    assert (
        "clamp: `1 | 2 | 4` -> `1 | 4` in `def clamp(x: int, flags: int = 1 | 2 | 4) -> int:`"
        in ids
    )
    assert any(m.id.startswith("clamp: `raise ValueError(") and "-> `pass`" in m.id for m in found)
    assert "<module>: `10` -> `11` in `LIMIT = 10`" in ids


def test_ids_do_not_move_with_the_code_around_them() -> None:
    edited = MODULE.replace("LIMIT = 10\n", "import os\n\n\nLIMIT = 10\nOTHER = 'x'\n")
    assert {m.id for m in mutants(MODULE)} <= {m.id for m in mutants(edited)}


def test_a_function_list_keeps_only_those_functions() -> None:
    assert {m.id.split(":")[0] for m in mutants(MODULE, ["clamp"])} == {"clamp"}


def test_a_modules_preload_adds_to_the_configs(tmp_path: Path) -> None:
    from harnesslab.tests.mutation.mutate import load_config

    config = tmp_path / "config.toml"
    config.write_text(
        'preload = ["a"]\n[[module]]\nname = "m"\npath = "p.py"\ntests = ["t.py"]\n'
        'preload = ["torch"]\n[[module]]\nname = "n"\npath = "q.py"\ntests = ["t.py"]\n'
    )
    modules, preloads = load_config(config)
    assert preloads == ["a"] and [m.preload for m in modules] == [["torch"], []]


def mini_project(tmp_path: Path) -> Path:
    """A project folder the driver can run on: tools/ as harnesslab.tools, an empty tests/."""
    root = tmp_path / "proj"
    (root / "tools").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"harnesslab.tools" = "tools"\n'
        "[tool.pytest.ini_options]\naddopts = '-p no:randomly'\n"
    )
    (root / "tools/__init__.py").write_text("")
    return root


@pytest.mark.slow
def test_a_run_kills_keeps_and_explains_mutants_and_leaves_the_tree_as_it_was(
    tmp_path: Path,
) -> None:
    root = mini_project(tmp_path)
    module = root / "tools/mini.py"
    module.write_text("def double(x):\n    return x * 2\n\n\ndef unused(x):\n    return x + 1\n")
    (root / "tests/test_mini.py").write_text(
        "from harnesslab.tools.mini import double\n\n\n"
        "def test_double():\n    assert double(3) == 6\n"
    )
    config = tmp_path / "config.toml"
    config.write_text(
        textwrap.dedent(
            """
            [[module]]
            name = "mini"
            path = "tools/mini.py"
            tests = ["tests/test_mini.py"]

            [[module.equivalent]]
            mutant = "unused: `x + 1` -> `x - 1` in `return x + 1`"
            why = "never called"

            [[module.equivalent]]
            mutant = "gone: `a` -> `b`"
            why = "stale"
            """
        )
    )
    before = hashlib.sha256(module.read_bytes()).hexdigest()
    done = subprocess.run(
        [sys.executable, str(HERE / "mutate.py"), "--root", str(root), "--config", str(config),
         "-j", "2"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = done.stdout
    # double: `x * 2` -> `x / 2`, `2` -> `3`, `return x * 2` -> `return None` (killed);
    # unused: `x + 1` -> `x - 1` (equivalent), `1` -> `0`, `1` -> `2`, `return None` (not run).
    assert "| mini | 7 | 3 (+0) | 4 (1) | 50% |" in out, out + done.stderr
    assert "stale equivalent entries (no such mutant; remove them):\n  gone: `a` -> `b`" in out
    assert "[uncovered] unused: `1` -> `0` in `return x + 1`" in out
    assert done.returncode == 1  # 50% is below the default threshold
    assert hashlib.sha256(module.read_bytes()).hexdigest() == before
    cached = list(root.rglob("mini*.pyc"))
    assert all(b"x / 2" not in p.read_bytes() for p in cached)


def test_the_change_is_the_last_commit_and_what_is_not_committed(tmp_path: Path) -> None:
    from harnesslab.tests.mutation.mutate import changed_paths

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("x = 1\n")
        git("add", name)
        git("commit", "-q", "-m", name)
    assert changed_paths(tmp_path, None) == {"b.py"}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert changed_paths(tmp_path, None) == {"a.py", "b.py"}
    git("checkout", "-q", "-b", "topic")
    git("commit", "-q", "-am", "a")
    (tmp_path / "c.py").write_text("")
    git("add", "c.py")
    git("commit", "-q", "-m", "c")
    git("checkout", "-q", "main")
    (tmp_path / "d.py").write_text("")
    git("add", "d.py")
    git("commit", "-q", "-m", "d")  # main moves on: not part of topic's change
    git("checkout", "-q", "topic")
    assert changed_paths(tmp_path, "main") == {"a.py", "c.py"}
    (tmp_path.parent / "plain").mkdir()
    assert changed_paths(tmp_path.parent / "plain", None) is None


def test_code_run_only_in_a_fork_or_an_audit_hook_is_traced_and_its_mutants_run(
    tmp_path: Path,
) -> None:
    root = mini_project(tmp_path)
    (root / "tools/mini.py").write_text(
        "import os\nimport sys\n\n\ndef double(x):\n    return x * 2\n\n\n"
        "def run_true():\n    os.execve('/bin/true', ['true'], {})\n\n\n"
        "def watch(seen):\n"
        "    def hook(event, args):\n"
        "        if event == 'os.listdir':\n"
        "            seen.append(event)\n\n"
        "    sys.addaudithook(hook)\n"
    )
    (root / "tests/test_mini.py").write_text(
        "import os\n\nfrom harnesslab.tools.mini import double, run_true, watch\n\n\n"
        "def test_double_in_a_fork():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(0 if double(3) == 6 else 1)\n"
        "    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0\n\n\n"
        "def test_true_in_a_fork():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        run_true()\n"
        "        os._exit(1)\n"
        "    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0\n\n\n"
        "def test_an_audit_hook_in_a_fork():\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        seen = []\n"
        "        watch(seen)\n"
        "        os.listdir('.')\n"
        "        os._exit(0 if 'os.listdir' in seen else 1)\n"
        "    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0\n"
    )
    config = tmp_path / "config.toml"
    config.write_text('[[module]]\nname = "mini"\npath = "tools/mini.py"\n'
                      'tests = ["tests/test_mini.py"]\n')  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(HERE / "mutate.py"), "--root", str(root), "--config", str(config),
         "-j", "1"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    # `x * 2` -> `x / 2`, `2` -> `3`, `return None`, the execve dropped, the hook not added or
    # its test negated (twice) or its append dropped:
    # run (not uncovered, though they ran only in a fork that ended in os._exit or os.execve,
    # the last three in an audit hook) and killed.
    assert "| mini | 7 | 7 (+0) | 0 (0) | 100% |" in done.stdout, done.stdout + done.stderr
