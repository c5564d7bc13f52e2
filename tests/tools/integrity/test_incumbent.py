"""The incumbent comparison's host half (tools/integrity/incumbent.py), shared by the kernel
verify and the step verify: which checkpoint is the incumbent, its staging, and the best pointer
after a verify (settle_best), rule by rule on a real store:

- The incumbent is the best on this case set, else the latest best on any; never the candidate.
- Staging names it in the request only when its checkpoint exists.
- A meaningful same-verify comparison decides the best pointer: faster, the candidate with its
  score; not faster, the incumbent with its score on this case set (its own, else the one the
  comparison measured, else none set). A comparison that is not meaningful (the interpreter),
  a verify that did not pass, or no incumbent leaves the ledger's decision alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harnesslab.tests.conftest_shared import make_workspace
from harnesslab.tools.evaluation import EvalResult
from harnesslab.tools.integrity.incumbent import (
    comparison,
    incumbent_of,
    settle_best,
    stage_incumbent,
)
from harnesslab.tools.state import Checkpoints


def store(tmp_path: Path) -> tuple[Any, Checkpoints, str, str]:
    """A decode_step workspace's checkpoints with two saved candidates (a, b)."""
    ws = make_workspace(tmp_path, "decode_step")
    ckpt = Checkpoints(ws)
    a = ckpt.save({"kernel.py": b"def step(s, t):\n    return 1\n", "kernel_config.json": b"{}"})
    b = ckpt.save({"kernel.py": b"def step(s, t):\n    return 2\n", "kernel_config.json": b"{}"})
    return ws, ckpt, a, b


def result(digest: str, score: float | None, status: str = "passed") -> EvalResult:
    return EvalResult(status=status, score_us=score, candidate=digest, mode="final",  # type: ignore[arg-type]
                      config={}, record_id="r1", is_new_best=True, meaningful=True, cases=[])  # fmt: skip


def rows(cand: float, inc: float | None) -> dict[str, Any]:
    return comparison([{"candidate_us": cand, "incumbent_us": inc,
                        "incumbent_passed": inc is not None}], True, "x", None)  # fmt: skip


def test_the_incumbent_is_this_case_sets_best_else_the_latest_and_never_the_candidate(
    tmp_path: Path,
) -> None:
    _, ckpt, a, b = store(tmp_path)
    assert incumbent_of(ckpt, "cs1", b) == (None, None, None)
    ckpt.set_best("final", a, 30.0, "r0", case_set="cs0")
    best, prior, inc = incumbent_of(ckpt, "cs1", b)
    assert best is None and prior is not None and prior["hash"] == a and inc == a
    ckpt.set_best("final", b, 20.0, "r1", case_set="cs1")
    best, prior, inc = incumbent_of(ckpt, "cs1", b)
    assert best is not None and best["hash"] == b and inc is None  # the candidate itself
    ckpt.set_best("final", a, 10.0, "r2", case_set="cs2")  # the latest, on another case set
    best, prior, inc = incumbent_of(ckpt, "cs1", "c" * 16)
    assert inc == b and prior == best  # this case set's best, not the latest


def test_staging_names_the_incumbents_checkpoint_in_the_request(tmp_path: Path) -> None:
    ws, ckpt, a, _ = store(tmp_path)
    staged: list[tuple[dict[str, bytes], str, str]] = []

    class Launcher:
        def stage_candidate(self, files: dict[str, bytes], digest: str, scope: str = "") -> str:
            staged.append((files, digest, scope))
            return f"cands/{digest}"

    request: dict[str, Any] = {}
    stage_incumbent(Launcher(), ws, ckpt, a, request)  # type: ignore[arg-type]
    assert request == {"baseline_dir": f"@stage/cands/{a}"}
    assert staged == [(ckpt.files(a), a, ws.store.root.name)]  # staged in the store's scope
    for missing in (None, "0" * 64):
        request = {}
        stage_incumbent(Launcher(), ws, ckpt, missing, request)  # type: ignore[arg-type]
        assert request == {}


def test_a_meaningful_comparison_decides_the_best_pointer(tmp_path: Path) -> None:
    _, ckpt, a, b = store(tmp_path)
    ckpt.set_best("final", a, 30.0, "r0", case_set="cs")
    best, prior, _ = incumbent_of(ckpt, "cs", b)
    # the ledger made b the best (a lower score than a's from another verify) ...
    ckpt.set_best("final", b, 25.0, "r1", case_set="cs")
    res = result(b, 25.0)
    settle_best(ckpt, res, rows(25.0, 25.1), prior, best, "cs")  # ... 0.4%: not faster here
    assert res.is_new_best is False and ckpt.best("final", case_set="cs")["hash"] == a  # type: ignore[index]
    assert ckpt.best("final", case_set="cs")["score"] == 30.0  # type: ignore[index]
    res = result(b, 25.0)
    settle_best(ckpt, res, rows(25.0, 26.0), prior, best, "cs")  # 4%: faster
    assert res.is_new_best is True and ckpt.best("final", case_set="cs")["hash"] == b  # type: ignore[index]
    assert ckpt.best("final", case_set="cs")["record"] == "r1"  # type: ignore[index]
    res = result(b, 25.0).model_copy(update={"record_id": None})
    settle_best(ckpt, res, rows(25.0, 26.0), prior, best, "cs")
    assert ckpt.best("final", case_set="cs")["record"] == ""  # type: ignore[index]


def test_a_contested_comparison_needs_the_ledgers_agreement_to_promote(tmp_path: Path) -> None:
    """A step verify's candidate process lives while the incumbent is timed: a comparison that
    says faster promotes it only where its score also beats the recorded best's."""
    _, ckpt, a, b = store(tmp_path)
    ckpt.set_best("final", a, 30.0, "r0", case_set="cs")
    best, prior, _ = incumbent_of(ckpt, "cs", b)
    res = result(b, 31.0).model_copy(update={"is_new_best": False})  # slower than a's record
    settle_best(ckpt, res, rows(25.0, 26.0), prior, best, "cs", contested=True)  # 4% here
    assert res.is_new_best is False and ckpt.best("final", case_set="cs")["hash"] == a  # type: ignore[index]
    res = result(b, 31.0).model_copy(update={"is_new_best": False})
    settle_best(ckpt, res, rows(25.0, 26.0), prior, best, "cs")  # uncontested: the comparison
    assert res.is_new_best is True and ckpt.best("final", case_set="cs")["hash"] == b  # type: ignore[index]
    ckpt.set_best("final", a, 30.0, "r0", case_set="cs")
    res = result(b, 25.0)  # the ledger agrees
    settle_best(ckpt, res, rows(25.0, 26.0), prior, best, "cs", contested=True)
    assert res.is_new_best is True and ckpt.best("final", case_set="cs")["hash"] == b  # type: ignore[index]
    ckpt.set_best("final", a, 30.0, "r0", case_set="cs")
    res = result(b, 25.0)  # the ledger agrees, the comparison does not
    settle_best(ckpt, res, rows(25.0, 25.1), prior, best, "cs", contested=True)
    assert res.is_new_best is False and ckpt.best("final", case_set="cs")["hash"] == a  # type: ignore[index]


def test_on_a_new_case_set_the_incumbent_keeps_the_best_with_the_score_measured_beside(
    tmp_path: Path,
) -> None:
    _, ckpt, a, b = store(tmp_path)
    ckpt.set_best("final", a, 30.0, "r0", case_set="old")
    best, prior, _ = incumbent_of(ckpt, "new", b)
    settle_best(ckpt, result(b, 25.0), rows(25.0, 25.0), prior, best, "new")
    assert ckpt.best("final", case_set="new") == {**ckpt.best("final", case_set="new"),  # type: ignore[dict-item]
                                                   "hash": a, "score": 25.0}  # fmt: skip
    # an incumbent with no time on this case set sets nothing
    _, ckpt, a, b = store(tmp_path / "2")
    ckpt.set_best("final", a, 30.0, "r0", case_set="old")
    best, prior, _ = incumbent_of(ckpt, "new", b)
    settle_best(ckpt, result(b, 25.0), rows(25.0, None), prior, best, "new")
    assert ckpt.best("final", case_set="new") is None


def test_no_meaningful_comparison_leaves_the_ledgers_decision(tmp_path: Path) -> None:
    _, ckpt, a, b = store(tmp_path)
    ckpt.set_best("final", a, 30.0, "r0", case_set="cs")
    best, prior, _ = incumbent_of(ckpt, "cs", b)
    ckpt.set_best("final", b, 25.0, "r1", case_set="cs")
    cpu = {**rows(25.0, 25.1), "meaningful": False}
    for args in ((result(b, 25.0), cpu, prior), (result(b, None, "failed"), rows(25.0, 25.1), prior),
                 (result(b, 25.0), None, prior), (result(b, 25.0), rows(25.0, 25.1), None)):  # fmt: skip
        res, compared, pri = args
        settle_best(ckpt, res, compared, pri, best, "cs")  # type: ignore[arg-type]
        assert res.is_new_best is True and ckpt.best("final", case_set="cs")["hash"] == b  # type: ignore[index]
