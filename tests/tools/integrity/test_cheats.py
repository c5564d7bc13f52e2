"""The guarded verify against a corpus of cheating kernels, and honest kernels that must pass.

Every file in cheats/ is a complete kernel.py whose docstring names its exploit and the reason
code the verdict must carry (`expect:`); `runtime:` is the code the runtime guard must give when
the static scan is not enforced (proof that the second line holds on its own); `gpu:` codes can
only be observed on a GPU (benchmarks/integrity_gpu.py runs those). All of it runs on the Triton
CPU interpreter; a guarded verify costs a few seconds of CPU, a scan-rejected one almost none.
The verifies draw the task's 6 hidden cases from a smaller row range (`small_rmsnorm`): the
interpreter's time grows with the rows, no defense here depends on them.

Tiers: a defense is a reason code (docs/architecture.md, "Adding a defense"). Of the verifies
that repeat one (the same `expect:` code; for the runtime guard the same `runtime:` code, or for
a `harmless` one the same `expect:`), the first file in name order runs in `make test-fast` and
the others are marked `slow`, the marker naming the fast test that keeps the defense covered
(or all of them, where another fast test runs the defense: the candidate_error verify of
exception_leak.py below, and test_sandbox.py's hostile kernel for the sandbox's confinement of
writes, reads, signals and daemons);
`make test` runs them all, and the static scan test runs every file in both tiers.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import sysconfig
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import pytest

from harnesslab.tests.conftest_shared import make_settings, small_rmsnorm
from harnesslab.tools import gpu
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.integrity import scan
from harnesslab.tools.integrity import verify as verify_mod
from harnesslab.tools.integrity.scan import scan_workspace
from harnesslab.tools.integrity.verify import REASONS, Verdict, guarded_verify, judge_case
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.secrets_store import ensure_outside_workspace, workspace_secret
from harnesslab.tools.state.trusted_store import workspace_key
from harnesslab.tools.state.workspace import Workspace, init_workspace, open_workspace
from harnesslab.tools.task.spec import load_task

HERE = Path(__file__).parent
CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats"
SPEC = load_task("rmsnorm_gate")
CHEATS = sorted((CORPUS / "cpu").glob("*.py"))
BASELINE = SPEC.workspace_template / "kernel.py"
HONEST: dict[str, tuple[Path, dict[str, int] | None]] = {
    "baseline": (BASELINE, None),
    "baseline_rows_per_program_4": (BASELINE, {"rows_per_program": 4, "num_warps": 4}),
    **{f"solution_{n}": (p, None) for n, p in SPEC.solutions().items()},
    **{f"honest_{p.stem}": (p, None) for p in sorted((CORPUS / "honest").glob("*.py"))},
}


def expectation(path: Path) -> dict[str, str]:
    """`key: value` lines of a corpus file's docstring: expect (the verdict's code), runtime (the
    code without the static scan, or `harmless`: the file gives itself away with a wrong output
    whenever its attack works, so passing proves the attack failed; or `uncertified`: the attack
    may pass on the CPU interpreter, where the candidate's own reports cannot be believed, but
    the verdict must not certify that a Triton kernel did the work), gpu (a code only a GPU can
    show), absent (a path that must not exist afterwards), no_process (a command-line marker no
    process may carry afterwards)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    out = {}
    for line in doc.splitlines():
        key, _, code = line.partition(":")
        if key in ("expect", "runtime", "gpu", "absent", "no_process") and code.strip():
            out[key] = code.strip().replace("{site}", sysconfig.get_paths()["purelib"])
    return out


def observed_codes() -> set[str]:
    """The codes a candidate's own process may report (guard.CHILD_CODES), read from the staged
    source (guard.py imports its siblings by path, not as harnesslab modules)."""
    src = (gpu.FOLDER / "verify" / "guard.py").read_text()
    block = src[src.index("CHILD_CODES = {") : src.index("}", src.index("CHILD_CODES = {"))]
    return set(re.findall(r'"([a-z_]+)": "', block))


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def tiered(
    test: str,
    paths: list[Path],
    defense: Callable[[Path], str | tuple[str, str]],
    elsewhere: dict[str | tuple[str, str], str] | None = None,
) -> list[Any]:
    """`paths` as parameters of `test`: the first file per defense fast, the rest `slow`; every
    file `slow` whose defense a fast test named in `elsewhere` (defense -> test) already runs on
    it. The tests of a file that leaves traces outside its tmp_path (absent:, no_process:) share
    an xdist group, so under xdist one test's cleanup or check never meets another's run of the
    same file (tests/conftest.py)."""
    first: dict[str | tuple[str, str], str] = {}
    params = []
    for path in paths:
        key = defense(path)
        marks: list[Any] = []
        if key in (elsewhere or {}):
            marks.append(pytest.mark.slow(f"repeats {key}: {(elsewhere or {})[key]} stays fast"))
        elif key in first:
            marks.append(pytest.mark.slow(f"repeats {key}: {test}[{first[key]}] stays fast"))
        else:
            first[key] = path.stem
        if {"absent", "no_process"} & expectation(path).keys():
            marks.append(pytest.mark.xdist_group(f"cheat_traces_{path.stem}"))
        params.append(pytest.param(path, marks=marks, id=path.stem))
    return params


def clear_traces(path: Path) -> None:
    """What an earlier, unsandboxed run of a cheat may have left, gone before this one."""
    exp = expectation(path)
    if "absent" in exp:
        Path(exp["absent"]).unlink(missing_ok=True)


def assert_contained(path: Path) -> None:
    """What a cheat tried to leave behind is not there."""
    exp = expectation(path)
    if "absent" in exp:
        assert not Path(exp["absent"]).exists(), f"{path.name} wrote {exp['absent']}"
    if "no_process" in exp:
        assert processes_with(exp["no_process"]) == [], f"{path.name} left a process behind"


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rmsnorm_gate with its 6 hidden cases drawn from fewer rows (tests/conftest_shared.py)."""
    return small_rmsnorm(tmp_path_factory.mktemp("task") / "rmsnorm_small", count=6)


def workspace(
    task: Path, tmp_path: Path, kernel: Path, config: dict[str, int] | None = None
) -> Workspace:
    ws = init_workspace(str(task), tmp_path / "ws", make_settings(tmp_path))
    shutil.copy(kernel, ws.root / "kernel.py")
    if config:
        cfg = json.loads((ws.root / "kernel_config.json").read_text()) | config
        (ws.root / "kernel_config.json").write_text(json.dumps(cfg))
    return ws


def verify(ws: Workspace, state: Path, **kwargs: Any) -> Verdict:
    settings = Settings(state_dir=state)

    async def go() -> Verdict:
        launcher = Launcher(settings)
        try:
            with anyio.fail_after(240):
                return await guarded_verify(ws, launcher, settings, **kwargs)
        finally:
            await launcher.aclose()

    return anyio.run(go)


def codes(v: Verdict) -> set[str]:
    return {r["code"] for r in v.reasons}


@pytest.fixture(scope="module")
def verified_baseline(
    tmp_path_factory: pytest.TempPathFactory, task: Path
) -> tuple[Workspace, Verdict]:
    """The baseline's passed guarded verify, done once per module (a verify is 10-25 s of CPU):
    the tests that only read it share it, the ones that verify more in its workspace take a
    `clone` of it."""
    tmp_path = tmp_path_factory.mktemp("verified-baseline")
    ws = workspace(task, tmp_path, BASELINE)
    return ws, verify(ws, tmp_path / "state")


def clone(verified: tuple[Workspace, Verdict], tmp_path: Path) -> Workspace:
    """A copy of a verified workspace at tmp_path/ws with its state at tmp_path/state: the same
    files, checkpoints, best and hidden case set (the state dir keys a workspace by its path)."""
    ws, _ = verified
    state, root = ws.store.root.parent.parent, tmp_path / "ws"
    shutil.copytree(ws.root, root)
    shutil.copytree(state, tmp_path / "state")
    old, new = workspace_key(ws.root), workspace_key(root)
    (tmp_path / "state" / "workspaces" / old).rename(tmp_path / "state" / "workspaces" / new)
    secrets = tmp_path / "state" / "secrets"
    (secrets / f"{old}.json").rename(secrets / f"{new}.json")
    binding = tmp_path / "state" / "workspaces" / new / "binding.json"
    binding.write_text(json.dumps(json.loads(binding.read_text()) | {"workspace": str(root)}))
    return open_workspace(root, Settings(state_dir=tmp_path / "state"))


def test_every_corpus_file_names_a_known_reason_code() -> None:
    assert len(CHEATS) >= 20
    for path in CHEATS:
        exp = expectation(path)
        assert "expect" in exp, f"{path.name}: no 'expect:' line in its docstring"
        for key in ("expect", "runtime", "gpu"):
            if key in exp and exp[key] not in ("harmless", "uncertified"):
                assert exp[key] in REASONS, f"{path.name}: {exp[key]} is not in verify.REASONS"


@pytest.mark.parametrize("path", CHEATS, ids=lambda p: p.stem)
def test_static_scan_rejects_exactly_the_cheats_it_can_see(
    task: Path, tmp_path: Path, path: Path
) -> None:
    ws = workspace(task, tmp_path, path)
    found = {f.code for f in scan_workspace(ws).rejects}
    exp = expectation(path)
    if found:  # the scan is this cheat's first line, and for the right reason
        assert exp["expect"] in found
    else:  # only the runtime guard can see it
        assert "runtime" not in exp and "gpu" not in exp


@pytest.mark.parametrize(
    "path",
    tiered(
        "test_cheat_is_rejected_with_its_reason_code",
        CHEATS,
        lambda p: expectation(p)["expect"],
        # exception_leak.py, the one candidate_error file, is verified there and its code checked
        {"candidate_error": "test_no_text_from_the_candidate_reaches_the_verdict"},
    ),
)
def test_cheat_is_rejected_with_its_reason_code(task: Path, tmp_path: Path, path: Path) -> None:
    clear_traces(path)
    v = verify(workspace(task, tmp_path, path), tmp_path / "state")
    assert v.verdict == "rejected", v.reasons
    assert expectation(path)["expect"] in codes(v), v.reasons
    assert v.score_us is None and not v.is_new_best
    assert_contained(path)


RUNTIME = [p for p in CHEATS if "runtime" in expectation(p)]
CONTAINED = "tests/tools/integrity/test_sandbox.py::test_the_guarded_verify_contains_every_attempt"


def runtime_defense(path: Path) -> str | tuple[str, str]:
    """What stops a cheat when the scan is off: its runtime code, or for `harmless` the
    sandbox's confinement of the attack its `expect:` code names (files, processes, network)."""
    exp = expectation(path)
    return ("harmless", exp["expect"]) if exp["runtime"] == "harmless" else exp["runtime"]


@pytest.mark.parametrize(
    "path",
    tiered(
        "test_runtime_guard_catches_the_cheat_without_the_scan",
        RUNTIME,
        runtime_defense,
        # The hostile kernel there writes outside its scratch, reads the state dir, signals a
        # process outside its run and leaves a setsid daemon, all in one unscanned guarded
        # verify, and checks each came to nothing: the confinement these files' attacks meet.
        {
            ("harmless", "reads_outside_workspace"): CONTAINED,
            ("harmless", "subprocess"): CONTAINED,
        },
    ),
)
def test_runtime_guard_catches_the_cheat_without_the_scan(
    task: Path, tmp_path: Path, path: Path
) -> None:
    clear_traces(path)
    v = verify(workspace(task, tmp_path, path), tmp_path / "state", enforce_scan=False)
    want = expectation(path)["runtime"]
    if want == "harmless":  # the sandbox stopped the attack: the kernel stayed correct...
        assert not codes(v) & {"wrong_output", "precision"}, v.reasons
        if v.verdict == "passed":
            assert v.sandbox == "full" and v.certifies == "outputs"
        else:  # ...and what it tried may also have been seen (fork, kill: subprocess)
            assert codes(v) <= observed_codes(), v.reasons
    elif want == "uncertified":  # a forged self-report may pass, but claims nothing of Triton
        assert v.verdict == "rejected" or (
            v.certifies == "outputs" and "triton_did_the_work" in v.unverified
        ), (v.verdict, v.certifies, v.reasons)
    else:
        assert v.verdict == "rejected", v.reasons
        assert want in codes(v), v.reasons
    assert_contained(path)


# Honest kernels that repeat another fast verify: row_tile passes in
# test_incumbent_is_compared_in_the_same_layout, and it runs several rows per program as the
# baseline's rows_per_program=4 config does.
SLOW_HONEST = {
    "baseline_rows_per_program_4": "test_incumbent_is_compared_in_the_same_layout (row_tile)",
    "honest_row_tile": "test_incumbent_is_compared_in_the_same_layout",
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.slow(f"repeated by {SLOW_HONEST[n]}")])
        if n in SLOW_HONEST
        else n
        for n in sorted(HONEST)
    ],
)
def test_honest_kernel_passes_every_check(
    task: Path, tmp_path: Path, request: pytest.FixtureRequest, name: str
) -> None:
    kernel, config = HONEST[name]
    if name == "baseline":  # the verify the incumbent and hidden-case tests build on
        ws, v = request.getfixturevalue("verified_baseline")
        assert scan_workspace(ws).rejects == []
    else:
        ws = workspace(task, tmp_path, kernel, config)
        assert scan_workspace(ws).rejects == []
        v = verify(ws, tmp_path / "state")
    assert v.verdict == "passed", v.reasons
    assert v.reasons == []
    checks = v.evidence["checks"]
    assert checks["calls_checked"] == checks["calls_passed"] >= 6 * 4
    assert all(c.passed and c.median_us for c in v.result.cases)
    assert v.score_us is not None and not v.meaningful  # the interpreter says nothing of speed


def test_incumbent_is_compared_in_the_same_layout(
    tmp_path: Path, verified_baseline: tuple[Workspace, Verdict]
) -> None:
    ws, first = clone(verified_baseline, tmp_path), verified_baseline[1]
    assert first.verdict == "passed" and first.incumbent is None
    shutil.copy(CORPUS / "honest" / "row_tile.py", ws.root / "kernel.py")
    second = verify(ws, tmp_path / "state")
    assert second.verdict == "passed", second.reasons
    inc = second.incumbent
    assert inc is not None and inc["hash"] == first.evidence["candidate"]
    assert all(r["incumbent_passed"] and r["incumbent_us"] for r in inc["cases"])
    assert inc["speedup"] is not None and inc["meaningful"] is False


# An incumbent's staged kernel.py, rewritten: it dies at import, or on its third call (inside
# the first case's checks, which then run again without it: guard.without_failed_incumbent).
DYING = {
    "at_import": "import os\nos._exit(7)\n",
    "mid_case": "\nimport os as _os\n\n_calls, _real = [0], rmsnorm_gate\n\n\n"
    "def rmsnorm_gate(*a, **k):\n    _calls[0] += 1\n    if _calls[0] == 3:\n"
    "        _os._exit(7)\n    return _real(*a, **k)\n",
}


# mid_case repeats at_import's verify (an incumbent's process dies, the candidate's verdict stands)
# with the case run again without it: that rule is tests/tools/gpu/test_guard_units.py's
# test_a_step_the_incumbent_failed_runs_again_without_it, in the fast tier beside at_import.
DYING_SLOW = (
    "repeats [at_import]; the re-run: test_a_step_the_incumbent_failed_runs_again_without_it"
)


@pytest.mark.parametrize(
    "when",
    [
        pytest.param(w, marks=[pytest.mark.slow(DYING_SLOW)] if w == "mid_case" else [])
        for w in sorted(DYING)
    ],
)
def test_an_incumbent_that_dies_loses_the_comparison_not_the_verdict(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    verified_baseline: tuple[Workspace, Verdict],
    when: str,
) -> None:
    """An incumbent whose process dies before its first call (its staged copy exits at import)
    used to reject the candidate as `candidate_crashed`."""
    ws = clone(verified_baseline, tmp_path)
    assert verified_baseline[1].verdict == "passed"
    shutil.copy(CORPUS / "honest" / "row_tile.py", ws.root / "kernel.py")
    call = verify_mod._call_quietly

    async def with_a_dying_incumbent(launcher, request, *args):  # type: ignore[no-untyped-def]
        staged = launcher.stage / request["baseline_dir"].removeprefix("@stage/")
        dying = staged.parent / "dying"
        shutil.copytree(staged, dying)
        kernel = dying / "kernel.py"
        own = kernel.read_text() if when == "mid_case" else ""
        kernel.write_text(own + DYING[when])
        return await call(
            launcher,
            {**request, "baseline_dir": f"@stage/{dying.relative_to(launcher.stage)}"},
            *args,
        )

    monkeypatch.setattr(verify_mod, "_call_quietly", with_a_dying_incumbent)
    second = verify(ws, tmp_path / "state")
    assert second.verdict == "passed", second.reasons
    assert second.incumbent is not None and "candidate_crashed" in second.incumbent["error"]
    assert second.incumbent["speedup"] is None


def test_hidden_cases_stay_out_of_the_workspace(
    verified_baseline: tuple[Workspace, Verdict],
) -> None:
    ws, v = verified_baseline
    hidden = [c["shape"] for c in v.evidence["cases"]]
    assert hidden and v.verdict == "passed"
    text = "\n".join(p.read_text(errors="replace") for p in ws.root.rglob("*") if p.is_file())
    for shape in hidden:
        assert f"{shape['rows']}x{shape['dim']}" not in text
        assert f'"rows": {shape["rows"]}' not in text
    with pytest.raises(Exception, match="inside the workspace"):
        ensure_outside_workspace(Settings(state_dir=ws.root / "state"), ws.root)


def test_rotate_draws_a_new_case_set_and_keeps_it(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    a = workspace_secret(settings, tmp_path)
    assert workspace_secret(settings, tmp_path) == a
    b = workspace_secret(settings, tmp_path, rotate=True)
    assert b["seed"] != a["seed"] and b["generation"] == a["generation"] + 1


# -- the host's verdict from raw measurements (GPU numbers, synthetic) --------------------------


def gpu_case(samples_us: float, wall_us: float, bad: int = 0) -> dict[str, Any]:
    call = {"role": "candidate", "kind": "check", "set": 0, "passed": True, "codes": []}
    timing = {
        "samples_us": [samples_us] * 16,
        "parent_wall_us": [wall_us] * 16,
        "calls_per_sample": 100,
        "bad_calls": bad,
        "checked_calls": 1700,
        "method": "cuda_graph",
        "codes": [],
    }
    return {
        "dtype": "float16",
        "bytes": 100_000_000,
        "calls": [call],
        "null_control": {"zeros_rejected": True, "input_copy_rejected": True},
        "timing": {"candidate": timing},
    }


def test_a_case_faster_than_copy_bandwidth_is_implausible() -> None:
    # 100 MB in 10 us is 10 TB/s; the copy bandwidth is 3 TB/s.
    row, reasons, _ = judge_case(gpu_case(10.0, 1000.0), 3000.0, True, 0)
    assert {r["code"] for r in reasons} == {"implausible_speed"} and not row.passed
    row, reasons, _ = judge_case(gpu_case(40.0, 4000.0), 3000.0, True, 0)
    assert reasons == [] and row.passed and 80 < (row.pct_of_copy_bw or 0) < 90


def test_a_child_claiming_less_time_than_the_parent_saw_is_rejected() -> None:
    # 100 calls of 40 us is 4 ms per sample; the parent's wall clock saw 9 ms.
    _, reasons, _ = judge_case(gpu_case(40.0, 9000.0), 3000.0, True, 0)
    assert {r["code"] for r in reasons} == {"timing_mismatch"}


def test_a_host_hiccup_on_some_samples_is_no_timing_mismatch() -> None:
    # 4 ms per sample claimed; most samples' wall clocks carry 1.5 ms of CPU wake-up latency.
    case = gpu_case(40.0, 4100.0)
    case["timing"]["candidate"]["parent_wall_us"] = [5500.0] * 15 + [4100.0]
    _, reasons, _ = judge_case(case, 3000.0, True, 0)
    assert reasons == []
    case["timing"]["candidate"]["parent_wall_us"] = [5500.0] * 16
    _, reasons, _ = judge_case(case, 3000.0, True, 0)
    assert {r["code"] for r in reasons} == {"timing_mismatch"}


def test_one_wrong_timed_call_rejects_the_case() -> None:
    _, reasons, _ = judge_case(gpu_case(40.0, 4000.0, bad=1), 3000.0, True, 0)
    assert {r["code"] for r in reasons} == {"wrong_output_timed"}


def test_a_checker_that_accepts_zeros_voids_the_case() -> None:
    case = gpu_case(40.0, 4000.0)
    case["null_control"]["zeros_rejected"] = False
    _, reasons, _ = judge_case(case, 3000.0, True, 0)
    assert "null_control" in {r["code"] for r in reasons}


def test_every_code_the_guard_can_give_is_documented() -> None:
    static = {*scan.FORBIDDEN_MODULES.values(), *scan.FORBIDDEN_PREFIXES.values()}
    static |= {"reads_outside_workspace", "env_probe", "mode_sniffing", "forbidden_call"}
    guard_sources = "".join(
        (gpu.FOLDER / "verify" / n).read_text()
        for n in ("guard.py", "guard_gpu.py", "guard_child.py")
    )
    runtime = set(re.findall(r'\[\s*"([a-z_]+)",', guard_sources))
    runtime |= set(re.findall(r'KidFailed\(\s*"([a-z_]+)"', guard_sources))
    runtime |= set(re.findall(r'Bad\(\s*"([a-z_]+)"', guard_sources))
    assert static | runtime <= set(REASONS), (static | runtime) - set(REASONS)


def test_no_text_from_the_candidate_reaches_the_verdict(task: Path, tmp_path: Path) -> None:
    """exception_leak.py raises with the hidden shape in its message and its class name."""
    v = verify(workspace(task, tmp_path, CORPUS / "cpu" / "exception_leak.py"), tmp_path / "state")
    assert v.verdict == "rejected" and "candidate_error" in codes(v)
    text = json.dumps(
        {"reasons": v.reasons, "warnings": v.warnings, "result": v.result.model_dump()}
    )
    assert "HIDDEN-SHAPE" not in text and "Shape_" not in text
    assert "CandidateDefinedError" in text  # what the harness says instead


@pytest.mark.parametrize("path", sorted((CORPUS / "gpu").glob("*.py")), ids=lambda p: p.stem)
def test_a_gpu_cheats_honest_twin_imports_what_it_uses(path: Path) -> None:
    """The GPU tests and benchmarks/integrity2_gpu.py verify each GPU cheat after its honest twin
    (the file without its exploit block); a twin missing an import would be rejected itself
    (NameError), and the cheat then compared with no incumbent."""
    twin = ast.parse(re.sub(r"# -- exploit.*?# -- end exploit\n", "", path.read_text(), flags=re.S))
    bound = {
        a.asname or a.name.split(".")[0]
        for n in ast.walk(twin)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    used = {
        n.id
        for n in ast.walk(twin)
        if isinstance(n, ast.Name) and n.id in {"torch", "triton", "tl", "Path", "time", "os"}
    }
    assert used <= bound, f"{path.name}: the twin uses {sorted(used - bound)} without importing it"
