"""Mutation testing of the trusted modules: does a test fail when a rule breaks?

    python tests/mutation/mutate.py                      # every module in config.toml
    python tests/mutation/mutate.py -m ledger -m declaration
    python tests/mutation/mutate.py --changed            # only what this change touched (CI)
    python tests/mutation/mutate.py --list -m ledger     # the mutants, not run

For each configured module: its covering tests run once unmutated (traced, to learn which lines
they execute), then once per mutant (tests/mutation/operators.py), stopping at the first
failure. A mutant is killed when the tests fail or time out, survives when they pass; a mutant on
a line no covering test executes (in its process, an audit hook included, or in a fork of it that
ends through os._exit or os.execve) survives without a run. Survivors recorded in config.toml as
equivalent (with the reason) do not count against the score:
    score = killed (incl. timed out) / (mutants - equivalent survivors).
The exit status is 1 when a module scores below its threshold or its tests fail unmutated.

A mutant never touches the tree: each run is a fork of this process (pytest and the third-party
libraries already imported, nothing of harnesslab) that compiles the mutated source in place of
the module's file when it is imported, whatever its import name. `--root` runs against another
checkout (its harnesslab packages are imported instead of the installed ones).

Test tooling, not product: the file is not named test_*.py, so pytest never collects it.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from importlib.machinery import SourceFileLoader
from importlib.metadata import entry_points
from importlib.util import spec_from_file_location
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from operators import Mutant, mutants  # noqa: E402

CONFIG = HERE / "config.toml"


@dataclass
class Module:
    name: str
    path: str
    tests: list[str]
    functions: list[str] | None = None
    threshold: float = 90.0
    preload: list[str] = field(default_factory=list)  # imported once before its forks
    equivalent: dict[str, str] = field(default_factory=dict)  # mutant id -> why
    note: str = ""


@dataclass
class Outcome:
    module: Module
    mutants: list[Mutant] = field(default_factory=list)
    results: dict[str, str] = field(default_factory=dict)  # id -> killed|timeout|survived|uncovered
    error: str = ""
    incomplete: bool = False

    def count(self, *kinds: str) -> int:
        return sum(1 for r in self.results.values() if r in kinds)

    @property
    def survivors(self) -> list[Mutant]:
        return [m for m in self.mutants if self.results.get(m.id) in ("survived", "uncovered")]

    @property
    def unexplained(self) -> list[Mutant]:
        return [m for m in self.survivors if m.id not in self.module.equivalent]

    @property
    def score(self) -> float | None:
        judged = len(self.mutants) - (len(self.survivors) - len(self.unexplained))
        return 100.0 * self.count("killed", "timeout") / judged if judged else None


def load_config(path: Path) -> tuple[list[Module], list[str]]:
    data = tomllib.loads(path.read_text())
    modules = []
    for entry in data.get("module", []):
        equivalent = {e["mutant"]: e["why"] for e in entry.get("equivalent", [])}
        modules.append(
            Module(
                name=entry["name"],
                path=entry["path"],
                tests=list(entry["tests"]),
                functions=entry.get("functions"),
                threshold=float(entry.get("threshold", data.get("threshold", 90))),
                preload=list(entry.get("preload", [])),
                equivalent=equivalent,
                note=entry.get("note", ""),
            )
        )
    return modules, list(data.get("preload", []))


# -- the forked test run ----------------------------------------------------------------------
def install_root(root: Path) -> None:
    """Import harnesslab's packages from `root` (pyproject's package-dir), not from wherever
    the environment installed them."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {name: root / rel for name, rel in mapping["package-dir"].items()}

    class RootFinder:
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            folder = dirs.get(fullname)
            if folder is None or not (folder / "__init__.py").is_file():
                return None
            return spec_from_file_location(
                fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
            )

    sys.meta_path.insert(0, RootFinder)  # type: ignore[arg-type]


def install_source(target: Path, source: str) -> None:
    """Whoever imports the file `target` (any module name, any finder using the standard
    source loader) gets `source` compiled under the file's own name; its bytecode cache is
    neither read nor written (other modules' is, as in any test run)."""
    original = SourceFileLoader.get_code
    target_real = os.path.realpath(target)

    def get_code(self, fullname):
        if os.path.realpath(self.path) == target_real:
            return compile(source, self.path, "exec", dont_inherit=True)
        return original(self, fullname)

    SourceFileLoader.get_code = get_code  # type: ignore[method-assign]


def trace_lines(target: Path, lines: set[int]) -> None:
    target_real = os.path.realpath(target)
    names: dict[str, bool] = {}

    def local(frame, event, arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        if name not in names:
            names[name] = os.path.realpath(name) == target_real
        if names[name]:
            lines.add(frame.f_lineno)
            return local
        return None

    sys.settrace(tracer)
    threading.settrace(tracer)
    # The interpreter does not trace audit hooks unless the hook says it may (`__cantrace__`,
    # read through a bound method from its function): the hooks the tests add (a candidate's
    # process observing its candidate) are marked so, in place (a wrapper would add a frame to
    # the stack the hook may walk).
    add_hook = sys.addaudithook

    def addaudithook(hook):
        try:
            getattr(hook, "__func__", hook).__cantrace__ = True
        except (AttributeError, TypeError):  # a builtin: traced or not, it has no lines here
            pass
        return add_hook(hook)

    sys.addaudithook = addaudithook


def trace_forks(lines: set[int], trace: Path) -> None:
    """A test that forks (to run code that must not touch the test process: a candidate's
    process, its hooks and its os._exit; a sandbox's outer process) keeps the trace in the
    fork: there it is written to `trace`.<pid>.<random> when the fork ends through os._exit or
    replaces itself through os.execve, and the baseline reads those too. The file is opened at
    the fork, so a fork that then confines itself (Landlock, a PID namespace where every reaper
    is pid 1) can still write it."""
    real_exit, real_execve = os._exit, os.execve

    def forked() -> None:
        lines.clear()  # what the fork runs from here on
        name = f"{trace}.{os.getpid()}.{os.urandom(4).hex()}"
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError:
            return  # nowhere to write: this fork's lines go unseen

        def dump() -> None:
            try:
                os.write(fd, (" ".join(map(str, sorted(lines))) + "\n").encode())
            except OSError:
                pass

        def exit_(code: int) -> None:
            dump()
            real_exit(code)

        def execve(path, args, env):  # type: ignore[no-untyped-def]
            dump()
            return real_execve(path, args, env)

        os._exit, os.execve = exit_, execve  # type: ignore[assignment]

    os.register_at_fork(after_in_child=forked)


def traced(trace: Path) -> set[int]:
    """The lines the baseline ran: its own, and every fork's."""
    covered: set[int] = set()
    for path in [trace, *trace.parent.glob(f"{trace.name}.*")]:
        if path.exists():
            covered |= {int(x) for x in path.read_text().split()}
    return covered


def child(root: Path, module: Module, source: str, log: Path, here: Path, trace: Path | None):
    """In the forked process: run the module's tests against `source`, in the folder `here`
    (what a mutant writes to its working directory lands there, not in the tree); never
    returns."""
    code = 3
    try:
        os.setsid()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        here.mkdir()
        os.chdir(here)
        target = root / module.path
        install_root(root)
        install_source(target, source)
        lines: set[int] = set()
        if trace is not None:
            trace_lines(target, lines)
            trace_forks(lines, trace)
        import pytest

        args = [*(str(root / t) for t in module.tests), "--rootdir", str(root), "-x", "-q",
                "-p", "no:cacheprovider", "--basetemp", str(here / "tmp"),
                "-W", "ignore::pytest.PytestAssertRewriteWarning"]  # fmt: skip
        code = int(pytest.main(args))
        sys.settrace(None)
        if trace is not None:
            trace.write_text(" ".join(map(str, sorted(lines))))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Pool:
    """Forked test runs, at most `jobs` at a time, each killed (with its process group) at its
    deadline."""

    def __init__(self, root: Path, jobs: int, scratch: Path) -> None:
        self.root, self.jobs, self.scratch = root, jobs, scratch
        self.running: dict[int, tuple[str, float]] = {}
        self.logs: dict[str, Path] = {}  # kept for the baseline only (shown when it fails)
        self.temps: dict[int, Path] = {}
        self.n = 0

    def start(self, key: str, module: Module, source: str, timeout_s: float, trace=None) -> None:
        self.n += 1
        log = self.scratch / f"run{self.n}.log"
        here = self.scratch / f"run{self.n}"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(self.root, module, source, log, here, trace)
        self.running[pid] = (key, time.monotonic() + timeout_s)
        self.logs[key] = log
        self.temps[pid] = here

    def wait_one(self) -> tuple[str, str]:
        """(key, killed|timeout|survived) of the next run to finish."""
        while True:
            for pid, (key, deadline) in list(self.running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done == 0 and time.monotonic() < deadline:
                    continue
                if done == 0:
                    _kill_group(pid)
                    os.waitpid(pid, 0)
                    outcome = "timeout"
                else:
                    outcome = "survived" if os.waitstatus_to_exitcode(status) == 0 else "killed"
                _kill_group(pid)  # whatever the tests left running
                del self.running[pid]
                shutil.rmtree(self.temps.pop(pid), ignore_errors=True)
                if key != "baseline":
                    self.logs.pop(key).unlink(missing_ok=True)
                return key, outcome
            time.sleep(0.02)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def preload(names: list[str]) -> None:
    """Import pytest, its plugins and the listed libraries once, before any fork. (pytest
    would rewrite the asserts of its plugins' packages and warns that they were imported
    before: the forked run ignores that warning.) Then freeze the heap: the forks' garbage
    collections (pytest runs a few) skip what they inherited."""
    import pytest  # noqa: F401

    for ep in entry_points(group="pytest11"):
        try:
            ep.load()
        except Exception:  # a broken plugin fails in the run, as it would under pytest
            pass
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.collect()
    gc.freeze()
    leaked = sorted(m for m in sys.modules if m.startswith("harnesslab"))
    if leaked:
        raise SystemExit(f"preloading imported {leaked[:3]}: drop it from `preload`")


# -- running a module -------------------------------------------------------------------------
def run_module(pool: Pool, root: Path, module: Module, deadline: float, verbose: bool) -> Outcome:
    out = Outcome(module)
    path = root / module.path
    if not path.is_file():
        out.error = f"{module.path} is missing"
        return out
    source = path.read_text()
    out.error = _run_mutants(pool, root, module, source, out, deadline, verbose)
    if path.read_text() != source:  # edited meanwhile: the results are of another text
        out.error = f"{module.path} changed during the run"
    return out


def _run_mutants(
    pool: Pool,
    root: Path,
    module: Module,
    source: str,
    out: Outcome,
    deadline: float,
    verbose: bool,
) -> str:
    """Fill `out`: the baseline, then every mutant. Returns an error, or ""."""
    out.mutants = list(mutants(source, module.functions))
    module.tests = [t for t in module.tests if (root / t.split("::")[0]).exists()]
    if not module.tests:
        out.results = {m.id: "uncovered" for m in out.mutants}
        return "no covering tests"
    trace = pool.scratch / f"{module.name}.lines"
    began = time.monotonic()
    pool.start("baseline", module, source, timeout_s=900, trace=trace)
    _, baseline = pool.wait_one()
    took = time.monotonic() - began
    if baseline != "survived":
        return f"covering tests fail unmutated ({baseline}): see {pool.logs['baseline']}"
    covered = traced(trace)
    timeout_s = max(20.0, 5 * took + 10)
    if verbose:
        print(f"  {module.name}: baseline {took:.1f}s, {len(out.mutants)} mutants", flush=True)
    queue = []
    for m in out.mutants:
        if covered.isdisjoint(range(m.lineno, m.end_lineno + 1)):
            out.results[m.id] = "uncovered"
        else:
            queue.append(m)
    while queue or pool.running:
        while queue and len(pool.running) < pool.jobs:
            if time.monotonic() > deadline:
                out.incomplete = True
                queue.clear()
                break
            m = queue.pop(0)
            pool.start(m.id, module, m.source, timeout_s)
        if pool.running:
            key, result = pool.wait_one()
            out.results[key] = result
    return ""


def changed_paths(root: Path, base: str | None) -> set[str] | None:
    """Files this change touched (committed or not): since the merge base with `base` (default
    origin/main), else since the first parent (a clean checkout of main: the last commit is the
    change)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        except OSError:  # no git
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    merge_base = git("merge-base", "HEAD", base or "origin/main")
    if merge_base and merge_base != head:
        base = merge_base  # what this branch changed, not what the other side did since
    elif base is None:
        base = "HEAD^"
    names = git("diff", "--name-only", base)
    return None if names is None else set(names.splitlines())


def table(outcomes: list[Outcome]) -> str:
    rows = [
        "| module | mutants | killed (+timed out) | survived (of them equivalent) | score |",
        "|---|---|---|---|---|",
    ]
    for o in outcomes:
        survived = len(o.survivors)
        equivalent = survived - len(o.unexplained)
        score = "-" if o.score is None else f"{o.score:.0f}%"
        if o.error:
            score = f"error: {o.error}"
        elif o.incomplete:
            score += " (incomplete: time budget)"
        rows.append(
            f"| {o.module.name} | {len(o.mutants)} | {o.count('killed')} (+{o.count('timeout')})"
            f" | {survived} ({equivalent}) | {score} |"
        )
    return "\n".join(rows)


def report(outcomes: list[Outcome], snippets: bool = False) -> int:
    status = 0
    print(table(outcomes))
    for o in outcomes:
        stale = set(o.module.equivalent) - {m.id for m in o.mutants}
        if stale:
            print(f"\n{o.module.name}: stale equivalent entries (no such mutant; remove them):")
        for ident in sorted(stale):
            print(f"  {ident}")
        wrong = [m for m in o.mutants if m.id in o.module.equivalent and m not in o.survivors]
        for m in wrong:
            if m.id in o.results:
                print(f"\n{o.module.name}: recorded as equivalent but killed: {m.id}")
        if o.unexplained:
            print(f"\n{o.module.name}: survivors (add a test, or record why it is equivalent):")
            for m in o.unexplained:
                print(f"  {o.module.path}:{m.lineno} [{o.results[m.id]}] {m.id}")
            if snippets:
                print(
                    f"\n# config.toml entries for {o.module.name}, once each is shown equivalent:"
                )
                for m in o.unexplained:
                    print(f"[[module.equivalent]]\nmutant = {json.dumps(m.id, ensure_ascii=False)}")
                    print('why = ""\n')
        if o.error or (o.score is not None and o.score < o.module.threshold and not o.incomplete):
            print(f"\nFAIL {o.module.name}: below {o.module.threshold:.0f}% or not runnable")
            status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--module", action="append", help="module name (config.toml)")
    ap.add_argument("--changed", nargs="?", const="", help="only modules whose file or tests "
                    "changed against this git revision (default: merge base / HEAD^)")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting mutants after")
    ap.add_argument("-j", "--jobs", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--root", type=Path, default=HERE.parent.parent, help="checkout to test")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    ap.add_argument("--snippets", action="store_true", help="print survivors as config entries")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    modules, preloads = load_config(args.config)
    if args.module:
        unknown = set(args.module) - {m.name for m in modules}
        if unknown:
            ap.error(f"unknown module(s) {sorted(unknown)}")
        modules = [m for m in modules if m.name in args.module]
    if args.changed is not None:
        touched = changed_paths(root, args.changed or None)
        if touched is None:
            print("mutation: no git history to compare with; nothing to run")
            return 0
        # A changed module first, then one whose tests changed: the budget may not reach all.
        modules = [m for m in modules if m.path in touched] + [
            m
            for m in modules
            if m.path not in touched and any(t.split("::")[0] in touched for t in m.tests)
        ]
        print(f"mutation: modules touched by this change: {[m.name for m in modules] or 'none'}")
    if args.list:
        for m in modules:
            for mutant in mutants((root / m.path).read_text(), m.functions):
                print(f"{m.name} {m.path}:{mutant.lineno} {mutant.id}")
        return 0
    if not modules:
        return 0
    preload(preloads + [name for m in modules for name in m.preload])
    deadline = time.monotonic() + (args.budget_s if args.budget_s else float("inf"))
    scratch = Path(tempfile.mkdtemp(prefix="harnesslab-mutation-"))
    outcomes = []
    pool = Pool(root, max(1, args.jobs), scratch)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for m in modules:
            if args.verbose:
                print(f"mutation: {m.name} ({m.path})", flush=True)
            outcomes.append(run_module(pool, root, m, deadline, args.verbose))
    finally:
        for pid in pool.running:  # interrupted: no test run outlives the driver
            _kill_group(pid)
            os.waitpid(pid, 0)
        if not any(o.error for o in outcomes):
            shutil.rmtree(scratch, ignore_errors=True)
    return report(outcomes, args.snippets)


if __name__ == "__main__":
    raise SystemExit(main())
