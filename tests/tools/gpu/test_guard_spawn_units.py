"""The guarded verify's children, rule by rule (tools/gpu/verify/guard_spawn.py), without starting
one: the sandbox policy a role's process gets (child_policy: whole Policy objects compared), which
roles run (roles) and when the early start starts them (prespawn, with spawn_child and harden
replaced by recorders). Real early starts: tests/tools/gpu/test_guard_prespawn.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from harnesslab.tools.gpu.isolation import sandbox_policy as sp
from harnesslab.tools.gpu.verify import guard_spawn as gs

ALLOW = ["CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"]


def expected(**given: Any) -> sp.Policy:
    """The policy a child gets when nothing but `given` is asked for (the defaults spelled out)."""
    fields: dict[str, Any] = {
        "read": [gs.HERE],
        "write": [],
        "scratch_root": "/scratch",
        "require": True,
        "env": {},
        "env_allow": ALLOW,
        "triton_cache": "",
        "namespaces": True,
        "limits": sp.Limits(),
        **sp.python_policy(sp.import_roots()),
    }
    fields.update(given)
    return sp.Policy(**fields)


def test_a_bare_request_gets_the_strict_defaults() -> None:
    policy = gs.child_policy({}, "/scratch", [])
    assert policy == expected()
    assert policy.require is True and policy.namespaces is True  # not just truthy
    assert policy.env == {} and policy.write == [] and policy.triton_cache == ""


def test_the_stage_folder_is_read_first_then_the_folders_given() -> None:
    policy = gs.child_policy({}, "/scratch", ["/cand", "/ref"])
    assert policy.read == [gs.HERE, "/cand", "/ref"]
    assert policy == expected(read=[gs.HERE, "/cand", "/ref"])


def test_every_keyword_reaches_the_policy() -> None:
    req = {"sandbox_required": False, "sandbox_limits": {"memory_mb": 512, "pids": 64}}
    policy = gs.child_policy(req, "/s2", ["/cand"], env={"TRITON_INTERPRET": "1"},
                             write=["/cache"], cache="/cache", namespaces=["pid"])  # fmt: skip
    assert policy == expected(
        read=[gs.HERE, "/cand"],
        write=["/cache"],
        scratch_root="/s2",
        require=False,
        env={"TRITON_INTERPRET": "1"},
        triton_cache="/cache",
        namespaces=["pid"],
        limits=sp.Limits(memory_mb=512, pids=64),
    )


@pytest.mark.parametrize("flag", [False, 0, "", None])
def test_a_request_may_lift_the_sandbox_requirement_only_by_a_false_value(flag: Any) -> None:
    assert gs.child_policy({"sandbox_required": flag}, "/scratch", []).require is False


@pytest.mark.parametrize("flag", [True, 1, "yes"])
def test_a_true_sandbox_requirement_is_a_bool(flag: Any) -> None:
    assert gs.child_policy({"sandbox_required": flag}, "/scratch", []).require is True


@pytest.mark.parametrize("limits", [None, {}])
def test_no_limits_in_the_request_are_the_default_limits(limits: Any) -> None:
    assert gs.child_policy({"sandbox_limits": limits}, "/scratch", []).limits == sp.Limits()


def test_limits_are_read_as_the_sandbox_reads_them() -> None:
    raw = {"cpu_s": 7, "open_files": 9, "cgroup": "off"}
    assert gs.child_policy({"sandbox_limits": raw}, "/s", []).limits == sp.Limits.from_dict(raw)
    with pytest.raises(ValueError, match="unknown key"):  # not silently dropped
        gs.child_policy({"sandbox_limits": {"memroy_mb": 1}}, "/s", [])


def test_only_the_gpu_and_library_variables_pass_from_the_parent() -> None:
    assert gs.child_policy({}, "/s", [], env={"A": "b"}).env_allow == ALLOW
    assert gs.child_policy({}, "/s", []).env_allow_prefixes == []


def test_the_child_imports_from_this_interpreter_s_roots() -> None:
    policy = gs.child_policy({}, "/s", [])
    assert policy.python_path == sp.import_roots() and policy.python_path  # never empty here
    assert policy.python_sites == sp.import_sites(sp.import_roots())


def test_the_policys_lists_are_not_the_callers() -> None:
    read = ["/cand"]
    policy = gs.child_policy({}, "/s", read)
    read.append("/later")
    assert policy.read == [gs.HERE, "/cand"]


# -- roles --------------------------------------------------------------------------------------


def test_the_candidate_alone_runs_without_an_incumbent() -> None:
    assert gs.roles({"candidate_dir": "/c"}) == [("candidate", "/c")]
    assert gs.roles({"candidate_dir": "/c", "baseline_dir": ""}) == [("candidate", "/c")]
    assert gs.roles({"candidate_dir": "/c", "baseline_dir": None}) == [("candidate", "/c")]


def test_the_incumbent_runs_after_the_candidate_when_the_request_names_one() -> None:
    req = {"candidate_dir": "/c", "baseline_dir": "/b"}
    assert gs.roles(req) == [("candidate", "/c"), ("incumbent", "/b")]


def test_a_request_without_a_candidate_is_refused() -> None:
    with pytest.raises(KeyError):
        gs.roles({"baseline_dir": "/b"})


# -- prespawn -----------------------------------------------------------------------------------


class Starts:
    """spawn_child and harden replaced: what prespawn asked for, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpu: bool) -> None:
        self.log: list[Any] = []
        monkeypatch.setattr(gs, "gpu_present", lambda: gpu)
        monkeypatch.setattr(gs, "harden", lambda: self.log.append("harden"))
        monkeypatch.setattr(gs, "spawn_child", self.spawn)
        monkeypatch.setattr(gs, "EARLY", {})
        monkeypatch.delenv("HARNESSLAB_RUNNER_INTERPRET", raising=False)

    def spawn(self, req: dict[str, Any], role: str, folder: str, interpret: bool,
              memfd: int | None) -> str:  # fmt: skip
        self.log.append((req, role, folder, interpret, memfd))
        return f"kid:{role}"


REQ = {"candidate_dir": "/c", "baseline_dir": "/b"}


def test_on_a_gpu_host_the_process_is_hardened_before_each_role_starts_for_the_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starts = Starts(monkeypatch, gpu=True)
    gs.prespawn(REQ)
    assert starts.log == ["harden", (REQ, "candidate", "/c", False, None),
                          (REQ, "incumbent", "/b", False, None)]  # fmt: skip
    assert gs.EARLY == {"candidate": "kid:candidate", "incumbent": "kid:incumbent"}


def test_without_an_incumbent_only_the_candidate_starts_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starts = Starts(monkeypatch, gpu=True)
    gs.prespawn({"candidate_dir": "/c"})
    assert starts.log == ["harden", ({"candidate_dir": "/c"}, "candidate", "/c", False, None)]
    assert gs.EARLY == {"candidate": "kid:candidate"}


def test_without_a_gpu_nothing_starts_and_nothing_is_hardened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starts = Starts(monkeypatch, gpu=False)
    gs.prespawn(REQ)
    assert starts.log == [] and gs.EARLY == {}


@pytest.mark.parametrize("interpret", [True, "always", 1])
def test_a_request_for_the_interpreter_starts_nothing_even_on_a_gpu_host(
    monkeypatch: pytest.MonkeyPatch, interpret: Any
) -> None:
    starts = Starts(monkeypatch, gpu=True)
    gs.prespawn({**REQ, "interpret": interpret})
    assert starts.log == [] and gs.EARLY == {}


def test_the_runner_s_interpreter_setting_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    starts = Starts(monkeypatch, gpu=True)
    monkeypatch.setenv("HARNESSLAB_RUNNER_INTERPRET", "1")
    gs.prespawn(REQ)
    assert starts.log == [] and gs.EARLY == {}


@pytest.mark.parametrize("interpret", ["never", False])
def test_a_request_that_refuses_the_interpreter_starts_early_on_a_gpu_host(
    monkeypatch: pytest.MonkeyPatch, interpret: Any
) -> None:
    starts = Starts(monkeypatch, gpu=True)
    gs.prespawn({**REQ, "interpret": interpret})
    assert [entry[1] for entry in starts.log[1:]] == ["candidate", "incumbent"]
