"""The sandbox's policy as it travels (gpu/isolation/sandbox_policy.py): a policy frame the sandbox reads
back exactly, a parser that refuses an unknown key or a value of the wrong type (an old sandbox
never ignores a rule), and the reports on a sandboxed command's stdout, of which only the one
carrying this launch's token counts as the sandbox's own. Pure functions; nothing is started."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import pytest

from harnesslab.tools.gpu.isolation import sandbox_policy as sp


# -- the policy and its frame --------------------------------------------------------------------
def test_a_policy_round_trips_through_its_json() -> None:
    policy = sp.Policy(
        read=["/r"],
        env={"A": "1"},
        namespaces=["net"],
        die_with_parent=7,
        installed_bytecode=True,
        limits=sp.Limits(pids=5, cgroup="off"),
        bind=(("/src", "/dst"),),
    )
    assert sp.Policy.from_json(policy.to_json()) == policy
    assert sp.Policy.from_json(sp.Policy().to_json()) == sp.Policy()
    assert " " not in policy.to_json()  # compact: one line


def test_the_frame_is_eight_hex_digits_of_length_the_json_and_a_newline() -> None:
    policy = sp.Policy(cwd="/w")
    data = policy.to_json().encode()
    frame = sp.frame(policy)
    assert frame == b"%08x" % len(data) + data + b"\n"
    assert frame[:8] == f"{len(data):08x}".encode()


def test_a_launch_runs_the_sandbox_isolated_with_the_policy_on_stdin_and_a_token() -> None:
    launch = sp.command("/py", "/s/sandbox.py", sp.Policy(cwd="/w"), ["prog", "--x"])
    assert launch.argv == [
        "/py",
        "-I",
        "-B",
        "/s/sandbox.py",
        "--policy-stdin",
        "--",
        "prog",
        "--x",
    ]
    sent = sp.Policy.from_json(launch.stdin[8:])
    assert sent.cwd == "/w" and sent.token == launch.token
    assert len(launch.token) == 32 and int(launch.token, 16) >= 0
    assert sp.command("/py", "/s", sp.Policy(), []).token != launch.token  # fresh each time
    assert sp.command("/py", "/s", sp.Policy(token="mine"), []).token == "mine"
    assert launch.stdin_line == launch.stdin[:-1].decode() and "\n" not in launch.stdin_line


def test_a_policy_given_nothing_is_the_strictest_sandbox() -> None:
    assert json.loads(sp.Policy().to_json()) == {
        "read": [], "write": [], "mkdir": [], "scratch_root": "", "cwd": "", "env": {},
        "env_allow": [], "env_allow_prefixes": [], "path": "", "python_path": [],
        "python_sites": [], "triton_cache": "", "installed_bytecode": False, "require": False,
        "landlock": True, "namespaces": True, "seccomp": True, "seccomp_allow": [],
        "drop_caps": True, "fork": True, "die_with_parent": 0, "report": True, "report_fd": -1,
        "token": "", "bind": [],
        "limits": {"pids": 1024, "memory_mb": 8192, "file_mb": 1024, "cpu_s": 3600,
                   "open_files": 4096, "scratch_mb": 1024, "cgroup": "auto"},
    }  # fmt: skip


def test_with_limits_replaces_only_the_limits() -> None:
    policy = sp.Policy(cwd="/w").with_limits(sp.Limits(memory_mb=1))
    assert (policy.cwd, policy.limits) == ("/w", sp.Limits(memory_mb=1))


# -- what the parser refuses ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[1]", "policy must be a JSON object"),
        ("{torn", "policy is not JSON"),
        ('{"surprise": 1, "also": 2}', "policy: unknown key(s) also, surprise"),
        ('{"limits": {"gpus": 1}}', "limits: unknown key(s) gpus"),
        ('{"limits": []}', "limits must be a JSON object"),
        ('{"landlock": 1}', "policy.landlock: 1 is not bool"),
        ('{"die_with_parent": true}', "policy.die_with_parent: True is not int"),
        ('{"die_with_parent": "1"}', "policy.die_with_parent: '1' is not int"),
        ('{"cwd": 1}', "policy.cwd: 1 is not str"),
        ('{"read": "/r"}', "policy.read: '/r' is not list[str]"),
        ('{"read": ["/r", 1]}', "policy.read: ['/r', 1] is not list[str]"),
        ('{"env": {"A": 1}}', "policy.env: {'A': 1} is not dict[str, str]"),
        ('{"env": ["A"]}', "policy.env: ['A'] is not dict[str, str]"),
        ('{"namespaces": "net"}', "policy.namespaces: 'net' is not bool | list[str]"),
        ('{"namespaces": [1]}', "policy.namespaces: [1] is not bool | list[str]"),
        ('{"limits": {"pids": 1.5}}', "limits.pids: 1.5 is not int"),
        ('{"limits": {"cgroup": null}}', "limits.cgroup: None is not str"),
    ],
)
def test_a_policy_of_unknown_keys_or_wrong_types_is_refused(raw: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        sp.Policy.from_json(raw)
    assert str(info.value).startswith(message)


def test_a_field_of_a_type_the_parser_does_not_know_is_refused() -> None:
    @dataclasses.dataclass
    class Other:
        ratio: float = 0.0

    with pytest.raises(ValueError, match=r"^other\.ratio: 1\.0 is not float$"):
        sp._build(Other, {"ratio": 1.0}, "other")


def test_every_field_type_accepts_its_values() -> None:
    raw = {
        "namespaces": False,
        "read": [],
        "env": {},
        "limits": {"pids": 0},
        "report_fd": -1,
        "scratch_root": "",
    }
    policy = sp.Policy.from_json(json.dumps(raw))
    assert (policy.namespaces, policy.limits.pids) == (False, 0)
    assert sp.Policy.from_json('{"namespaces": ["net", "pid"]}').namespaces == ["net", "pid"]
    assert isinstance(sp.Policy.from_json('{"limits": {}}').limits, sp.Limits)


@pytest.mark.parametrize(
    "bind",
    [
        "/a",
        [["/a"]],
        [["/a", "/b", "/c"]],
        [["/a", "b"]],
        [["a", "/b"]],
        [["/a", 1]],
        [("/a", "/b")],  # JSON has no tuples: a pair that is not a list is not from JSON
        [["/a", "/b"], "/c"],
        (["/a", "/b"],),  # a tuple of pairs is not JSON's list either
    ],
)
def test_binds_are_pairs_of_absolute_paths(bind: Any) -> None:
    with pytest.raises(ValueError, match=r"policy\.bind: .* is not a list of \[SOURCE, TARGET\]"):
        sp._build(sp.Policy, {"bind": bind}, "policy")


def test_binds_become_tuples_in_order() -> None:
    policy = sp.Policy.from_json('{"bind": [["/a", "/b"], ["/c", "/d"]]}')
    assert policy.bind == (("/a", "/b"), ("/c", "/d"))
    assert sp.Policy.from_json('{"bind": []}').bind == ()


# -- reports on stdout ---------------------------------------------------------------------------
def exit_line(token: str = "t0k", **extra: Any) -> str:
    return json.dumps({"event": "sandbox_exit", "token": token, **extra})


def test_only_an_exit_report_with_this_launchs_token_is_the_sandboxs() -> None:
    assert sp.exit_report(exit_line(), "t0k") == {"event": "sandbox_exit", "token": "t0k"}
    assert sp.exit_report(exit_line("forged"), "t0k") is None
    assert sp.exit_report(exit_line(""), "") is None  # no token: nothing can be trusted
    other = {"event": "other", "x": "sandbox_exit", "token": "t0k"}
    assert sp.exit_report(json.dumps(other), "t0k") is None
    # the sandbox writes its report plainly: an escaped spelling of it is the target's text
    assert sp.exit_report('{"event": "sandbox\\u005fexit", "token": "t0k"}', "t0k") is None
    assert sp.exit_report('["sandbox_exit"]', "t0k") is None
    assert sp.exit_report('{"sandbox_exit" torn', "t0k") is None
    deep = "[" * 100_000 + '"sandbox_exit"' + "]" * 100_000
    assert sp.exit_report(deep, "t0k") is None  # never raises for what the target printed


def test_take_reports_splits_the_sandboxs_reports_from_the_targets_output() -> None:
    first = json.dumps({"event": "sandbox", "landlock": True})
    out = f"{first}\nline 1\nline 2\n{exit_line(limits_hit=['memory'])}\n"
    start, end, rest = sp.take_reports(out, "t0k")
    assert start == {"landlock": True}
    assert end == {"event": "sandbox_exit", "token": "t0k", "limits_hit": ["memory"]}
    assert rest == "line 1\nline 2\n"


def test_without_the_sandboxs_first_report_the_whole_stdout_is_the_targets() -> None:
    out = '{"event": "other"}\nline\n'
    assert sp.take_reports(out, "t0k") == ({}, None, out)
    assert sp.take_reports("[1]\nline\n", "t0k") == ({}, None, "[1]\nline\n")
    assert sp.take_reports("{torn\nline\n", "t0k") == ({}, None, "{torn\nline\n")


def test_a_forged_exit_report_stays_in_the_targets_output() -> None:
    first = json.dumps({"event": "sandbox"})
    out = f"{first}\nx\n{exit_line('forged')}\n"
    start, end, rest = sp.take_reports(out, "t0k")
    assert (start, end, rest) == ({}, None, f"x\n{exit_line('forged')}\n")


def test_an_exit_report_alone_leaves_no_output() -> None:
    first = json.dumps({"event": "sandbox"})
    assert sp.take_reports(f"{first}\n{exit_line()}\n", "t0k")[2] == ""
    assert sp.take_reports(f"{first}\n{exit_line()}", "t0k")[1] is not None


def test_the_limit_hit_is_the_first_one_named() -> None:
    assert sp.limit_hit({"limits_hit": ["memory", "pids"]}) == "memory"
    assert sp.limit_hit({"limits_hit": []}) == ""
    assert sp.limit_hit({"limits_hit": "memory"}) == ""
    assert sp.limit_hit({}) == "" and sp.limit_hit(None) == ""


# -- Python children -----------------------------------------------------------------------------
def test_a_python_child_is_isolated_and_bootstrapped() -> None:
    assert sp.python_argv("/py", ["-m", "mod", "a"]) == [
        "/py",
        "-I",
        "-B",
        "-c",
        sp.BOOT,
        "-m",
        "mod",
        "a",
    ]


def test_the_interpreters_own_folders_are_its_installation(tmp_path, monkeypatch) -> None:
    assert sp.own_install(sys.prefix) and sp.own_install(os.path.join(sys.base_prefix, "lib"))
    assert not sp.own_install(str(tmp_path))
    assert not sp.own_install(sys.base_prefix + "-other")  # a prefix of the name is not inside
    prefixes = {
        "prefix": "/p1",
        "base_prefix": "/p2/",
        "exec_prefix": "/p3",
        "base_exec_prefix": "/p4",
    }
    for name, value in prefixes.items():
        monkeypatch.setattr(sys, name, value)
    assert [sp.own_install(p) for p in ("/p1/lib", "/p2/lib", "/p3", "/p4/x", "/p5", "/p20")] == [
        True, True, True, True, False, False,
    ]  # fmt: skip
    monkeypatch.setattr(sys, "base_exec_prefix", "")
    assert not sp.own_install("/elsewhere")  # an empty prefix holds nothing


def test_the_interpreters_folders_and_its_sites_are_import_roots(tmp_path, monkeypatch) -> None:
    import site

    for name in ("prefix", "base_prefix", "exec_prefix", "base_exec_prefix"):
        monkeypatch.setattr(sys, name, str(tmp_path / "prefix"))
    for name in ("prefix", "prefix/lib", "sites", "user", "plain"):
        (tmp_path / name).mkdir()
    (tmp_path / "file.py").write_text("")
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(tmp_path / "sites")])
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(tmp_path / "user"))
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    entries = [str(tmp_path / n) for n in ("prefix/lib", "sites", "user", "plain", "file.py")]
    missing = str(tmp_path / "prefix/missing")
    assert sp.import_roots([*entries, missing]) == entries[:3]
    assert sp.import_sites(entries) == [str(tmp_path / "user")]
    monkeypatch.setattr(site, "ENABLE_USER_SITE", False)
    assert sp.import_roots(entries) == entries[:2]
    assert sp.import_sites(entries) == []


def test_a_relative_entry_is_never_an_import_root(tmp_path, monkeypatch) -> None:
    (tmp_path / "src/harnesslab").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert sp.import_roots(["src", "", str(tmp_path / "src")]) == [str(tmp_path / "src")]


def test_an_installation_holds_a_dist_info_or_a_module_the_children_import(tmp_path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain/util.py").write_text("")
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist/x-1.0.dist-info").mkdir()
    (tmp_path / "dist/x.py").write_text("")
    (tmp_path / "egg").mkdir()
    (tmp_path / "egg/x.egg-info").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src/harnesslab").mkdir()
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod/pytest.py").write_text("")
    roots = [str(tmp_path / n) for n in ("plain", "dist", "egg", "src", "mod", "missing")]
    assert sp.import_roots(["", "rel", *roots, roots[1]]) == roots[1:5]


def test_the_import_env_names_the_roots_and_the_sites_to_process() -> None:
    assert sp.import_env(["/a", "/b"], sites=[]) == {sp.IMPORT_PATH_VAR: "/a" + os.pathsep + "/b"}
    assert sp.import_env(["/a"], sites=["/a"]) == {
        sp.IMPORT_PATH_VAR: "/a",
        "HARNESSLAB_IMPORT_SITES": "/a",
    }
    assert sp.import_sites(["/not/the/user/site"]) == []
    assert sp.python_policy(["/a"]) == {"python_path": ["/a"], "python_sites": []}
