"""What a verdict says when nothing set it (tools/integrity/verdict.py) and the vocabulary it
says it in (tools/integrity/reasons.py), rule by rule, without a verify.

- A Verdict built with only what every verify knows claims nothing: not passed-and-certified,
  not a new best, not meaningful, not run on hidden cases, no sandbox; its lists are empty and
  its own (never shared between verdicts).
- Every reason code the guarded verify gives has the harness's own sentence: without one, the
  public verdict (verdict_view.public_reasons) says only "the verify did not pass".
- What a verdict certifies and leaves unverified is said for every path.
"""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from harnesslab.tools.evaluation import EvalResult
from harnesslab.tools.gpu.verify import guard
from harnesslab.tools.integrity import reasons, scan
from harnesslab.tools.integrity.verdict import Verdict
from harnesslab.tools.integrity.verdict_view import public_reasons

TOOLS = Path(guard.__file__).resolve().parents[2]  # tools/gpu/verify/guard.py


def bare() -> Verdict:
    result = EvalResult(status="failed", score_us=None, meaningful=False, cases=[], candidate="c")
    return Verdict(verdict="rejected", case_set="cs", result=result)


# -- verdict.py ---------------------------------------------------------------------------------
def test_a_verdict_nothing_set_claims_nothing() -> None:
    """Rule: a field the verify did not set never claims for the candidate."""
    v = bare()
    assert v.is_new_best is False and v.meaningful is False
    assert v.certifies == "nothing"
    assert v.ran_on_hidden_cases is False
    assert v.sandbox == "none"
    assert v.incumbent is None and v.geomean_pct_of_copy_bw is None
    assert v.score_us is None and v.best_final_score_us is None


def test_a_verdicts_lists_are_empty_and_its_own() -> None:
    """Rule: no reason, warning, unverified claim or evidence unless the verify added it, and
    what one verdict holds never shows in another (default factories, not a shared default)."""
    a, b = bare(), bare()
    assert (a.reasons, a.warnings, a.unverified, a.evidence) == ([], [], [], {})
    a.reasons.append({"code": "wrong_output", "detail": "x"})
    a.warnings.append({"code": "w", "detail": "x"})
    a.unverified.append("speed")
    a.evidence["k"] = 1
    assert (b.reasons, b.warnings, b.unverified, b.evidence) == ([], [], [], {})


def test_the_certifies_field_describes_every_claim() -> None:
    """Rule: each value `certifies` can take has the sentence that says what it certifies."""
    field = Verdict.model_fields["certifies"]
    assert set(typing.get_args(field.annotation)) == set(reasons.CERTIFIES)
    for text in reasons.CERTIFIES.values():
        assert text in (field.description or "")


# -- reasons.py ---------------------------------------------------------------------------------
# Codes the guarded verify gives outside the tables imported below, by the module that gives
# them (each still named there: test_every_listed_code_is_still_given).
GIVEN: dict[str, set[str]] = {
    "gpu/verify/guard.py": {
        "import_failed", "candidate_error", "not_plain_tensor", "output_aliases_input",
        "output_reused", "no_triton_launch", "precision", "wrong_output", "inputs_modified",
    },
    "gpu/verify/guard_kid.py": {
        "harness_tampered", "candidate_crashed", "sandbox_failed", "timeout", "resource_limit",
        "sandbox_unavailable",
    },
    "gpu/verify/guard_child.py": {"torch_compute", "background_thread", "monkey_patch"},
    "gpu/verify/guard_observer.py": {
        "foreign_kernel", "side_stream", "host_compute", "background_thread", "monkey_patch",
        "introspection", "dynamic_code", "subprocess", "exfiltration", "harness_access",
    },
    "gpu/verify/guard_schema.py": {"unreplayable", "forged_recording"},
    "integrity/verify.py": {
        "runner_failed", "forged_result", "wrong_output_timed", "implausible_speed",
        "timing_mismatch", "null_control",
    },
    "integrity/scan.py": {"reads_outside_workspace", "env_probe", "mode_sniffing"},
    "integrity/scan_cuda.py": {"cuda_include", "cuda_timer", "device_state", "cuda_host_code"},
    "gpu/verify/step_guard.py": {"wrong_shape", "wrong_output", "lengths_modified", "wrong_kv_cache",
                          "candidate_error", "import_failed"},
}  # fmt: skip


def given_codes() -> set[str]:
    tables = {*guard.CHILD_CODES, *scan.FORBIDDEN_MODULES.values()}
    tables |= set(scan.FORBIDDEN_PREFIXES.values())
    return tables.union(*GIVEN.values())


@pytest.mark.parametrize("module", sorted(GIVEN))
def test_every_listed_code_is_still_given(module: str) -> None:
    """The list above is not a copy of REASONS: each code is still named by its module."""
    text = (TOOLS / module).read_text()
    assert {c for c in GIVEN[module] if f'"{c}"' not in text} == set()


def test_every_code_the_verify_gives_has_the_harness_sentence() -> None:
    """Rule: an agent reads a fixed sentence for each code, never the fallback."""
    missing = given_codes() - set(reasons.REASONS)
    assert missing == set()
    for code in given_codes():
        shown = public_reasons([{"code": code, "detail": "case 3: 4096 x 17"}], ran=True)
        assert shown == [{"code": code, "detail": reasons.REASONS[code]}] or (
            code in ("sandbox_unavailable",) and shown[0]["detail"] == reasons.SANDBOX_REFUSED
        )


def test_what_each_path_leaves_unverified() -> None:
    """Rule: the interpreter verifies none of a kernel verify's claims (its launches, process
    reports and wall clock all come from the candidate's process); a GPU's replay verifies who
    computed and the timing, not the candidate process's reports about itself; a step verify
    checks outputs and times the step from the parent: the candidate's own steps (not which
    kernels computed them) or the replay of its recorded steps (not that the candidate's
    process stayed idle meanwhile), and on the interpreter nothing its wall clock says."""
    kernel = {"triton_did_the_work", "process_policy", "speed"}
    assert set(reasons.CPU_UNVERIFIED) == kernel and len(reasons.CPU_UNVERIFIED) == len(kernel)
    assert reasons.GPU_UNVERIFIED == ["process_policy"]
    assert reasons.step_unverified(replayed=False, meaningful=True) == ["step_work"]
    assert reasons.step_unverified(replayed=False, meaningful=False) == ["step_work", "speed"]
    assert reasons.step_unverified(replayed=True, meaningful=True) == ["step_idle"]
    assert reasons.step_unverified(replayed=True, meaningful=False) == ["step_idle", "speed"]
    assert set(reasons.UNVERIFIED) == kernel | {"step_work", "step_idle"}
