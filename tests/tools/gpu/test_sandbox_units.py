"""The sandbox's launcher (tools/gpu/isolation/sandbox.py) rule by rule: its command line and the
policy frame on stdin (what it refuses, with which exit), the target's environment and PATH, what
enforces each limit, and the outer process's reports and exits (the target's status passed on,
a signal's as 128 + n, a setup that failed, `require` without Landlock, a refused bind, a dead
caller, a limit hit). The outer runs in a fork of the test (sandbox.main as `python -I
sandbox.py` would run it, without the interpreter start), so its exits and hooks stay there;
what each protection stops is tests/trust/test_sandbox_attacks.py's, through the real command.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.gpu.isolation import sandbox_policy as sp

PROBE = sandbox.probe()
FULL = pytest.mark.skipif(PROBE["level"] != "full", reason="no Landlock or namespaces here")


@dataclass
class Outcome:
    code: int
    reports: list[dict[str, Any]]
    stdout: str
    stderr: str


def launch(tmp: Path, args: list[str], stdin: bytes = b"", inside: Any = None) -> Outcome:
    """sandbox.main(args) in a fork: stdin `stdin`, stdout and stderr files; the reports on
    stdout unless the policy names a report_fd (the fork's descriptor 3 is a pipe for it).
    `inside(main)`, if given, runs in the fork in place of `main` (to change the outer there)."""
    files = {name: tmp / f"{name}-{len(list(tmp.glob(name + '-*')))}" for name in ("out", "err")}
    in_r, in_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.dup2(in_r, 0)
            for fd, name in ((1, "out"), (2, "err")):
                f = os.open(files[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(f, fd)
                os.close(f)
            os.dup2(rep_w, 3)
            for fd in (in_r, in_w, rep_r, rep_w):
                if fd > 3:
                    os.close(fd)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the fork's own stdout
            sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115 (as python's)
            code = inside(lambda: sandbox.main(args)) if inside else sandbox.main(args)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0 if code is None else code)  # as sys.exit(main()) exits
    os.close(in_r)
    os.close(rep_w)
    os.write(in_w, stdin)
    os.close(in_w)
    with os.fdopen(rep_r, "rb") as fh:
        reported = fh.read().decode()
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out = files["out"].read_text()
    lines = [json.loads(x) for x in (reported or "").splitlines()]
    if not reported:  # reports on stdout: every JSON line that is a sandbox event
        lines = [json.loads(x) for x in out.splitlines() if x.startswith('{"event": "sandbox')]
    return Outcome(code, lines, out, files["err"].read_text())


def run(tmp: Path, target: list[str], inside: Any = None, **policy: Any) -> Outcome:
    fields = {"report_fd": 3, "token": "tok", "scratch_root": str(tmp), **policy}
    return launch(tmp, ["--policy-stdin", "--", *target], sp.frame(sp.Policy(**fields)), inside)


SH = "/bin/sh"


# -- the target's environment, PATH and what enforces each limit ----------------------------------
def test_the_targets_path_is_the_policys_or_the_interpreters_folder_and_the_systems() -> None:
    assert sandbox.target_path(sp.Policy(path="/opt/x:/opt/y")) == "/opt/x:/opt/y"
    dirs = sandbox.target_path(sp.Policy()).split(os.pathsep)
    assert dirs[0] == os.path.dirname(sys.executable)
    expected = [d for d in dict.fromkeys([dirs[0], *sandbox.SYSTEM_PATH]) if os.path.isdir(d)]
    assert dirs == expected
    assert "/usr/bin" in dirs  # the system's, where it exists
    assert len(dirs) == len(set(dirs))


def test_the_targets_environment_keeps_only_the_allowlist_and_its_own_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outer = {"LANG": "C.UTF-8", "SECRET_TOKEN": "s", "KEEP_ME": "k", "HL_A": "a", "HLX": "x",
             "HOME": "/home/me", "PYTHONPYCACHEPREFIX": "/p"}  # fmt: skip
    for key, value in outer.items():
        monkeypatch.setenv(key, value)
    policy = sp.Policy(env_allow=["KEEP_ME"], env_allow_prefixes=["HL_"], env={"SET": "v"})
    env = sandbox.target_env(policy, str(tmp_path))
    assert (env["LANG"], env["KEEP_ME"], env["HL_A"], env["SET"]) == ("C.UTF-8", "k", "a", "v")
    assert "SECRET_TOKEN" not in env and "HLX" not in env
    assert env["PATH"] == sandbox.target_path(policy)
    folders = {"HOME": "home", "TMPDIR": "tmp", "TRITON_CACHE_DIR": "triton",
               "TRITON_HOME": "home", "XDG_CACHE_HOME": "cache", "CUDA_CACHE_PATH": "nv",
               "TORCHINDUCTOR_CACHE_DIR": "inductor", "MPLCONFIGDIR": "mpl",
               "PYTHONPYCACHEPREFIX": "pycache"}  # fmt: skip
    for var, sub in folders.items():
        assert env[var] == str(tmp_path / sub), var
        assert (tmp_path / sub).is_dir() and (tmp_path / sub).stat().st_mode & 0o777 == 0o700
    assert (env["PYTHONDONTWRITEBYTECODE"], env["HARNESSLAB_SANDBOXED"]) == ("1", "1")
    assert "PYTHONPATH" not in env and sp.IMPORT_PATH_VAR not in env
    none = sandbox.target_env(sp.Policy(), str(tmp_path))
    assert "KEEP_ME" not in none and "HL_A" not in none  # no prefixes: none kept by prefix


def test_import_roots_travel_in_the_boot_variables_and_pythonpath_names_only_foreign_ones(
    tmp_path: Path,
) -> None:
    own = os.path.dirname(os.__file__)
    policy = sp.Policy(python_path=[own, "/opt/extra"], python_sites=["/opt/extra"])
    env = sandbox.target_env(policy, str(tmp_path))
    assert env[sp.IMPORT_PATH_VAR] == os.pathsep.join([own, "/opt/extra"])
    assert env[sp.IMPORT_SITES_VAR] == "/opt/extra"
    assert env["PYTHONPATH"] == "/opt/extra"
    only_own = sandbox.target_env(sp.Policy(python_path=[own]), str(tmp_path))
    assert "PYTHONPATH" not in only_own


def test_a_policys_triton_cache_and_installed_bytecode_replace_the_scratch_defaults(
    tmp_path: Path,
) -> None:
    env = sandbox.target_env(sp.Policy(triton_cache="/cache/t", installed_bytecode=True),
                             str(tmp_path))  # fmt: skip
    assert env["TRITON_CACHE_DIR"] == "/cache/t"
    assert "PYTHONPYCACHEPREFIX" not in env
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_each_limit_names_what_enforces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    group = SimpleNamespace(kind="v2")
    assert sandbox.plan_limits(sp.Policy(), group, ["mnt"], True) == {
        "memory": "cgroup-v2", "pids": "cgroup-v2", "file": "rlimit", "cpu": "rlimit",
        "open_files": "rlimit", "scratch": "tmpfs"}  # fmt: skip
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    plan = sandbox.plan_limits(sp.Policy(), None, ["user"], False)
    assert (plan["memory"], plan["pids"], plan["scratch"]) == ("rlimit", "rlimit", "none")
    plan = sandbox.plan_limits(sp.Policy(), None, [], True)  # a GPU: RLIMIT_DATA would break it
    assert (plan["memory"], plan["pids"]) == ("none", "none")
    monkeypatch.setattr(os, "getuid", lambda: 0)  # root ignores RLIMIT_NPROC
    assert sandbox.plan_limits(sp.Policy(), None, ["user"], False)["pids"] == "none"


# -- the command line and the policy frame ------------------------------------------------------
def test_a_command_line_without_a_policy_option_and_a_double_dash_is_a_usage_error(
    tmp_path: Path,
) -> None:
    for args in (["--policy-stdin", SH], ["--nope", "--", SH], ["--", SH]):
        out = launch(tmp_path, args)
        assert (out.code, out.reports) == (2, []), args
        assert out.stderr.startswith("usage: sandbox.py"), args


def test_a_policy_given_on_the_command_line_is_read_from_it(tmp_path: Path) -> None:
    policy = sp.Policy(report_fd=3, token="cli", scratch_root=str(tmp_path)).to_json()
    out = launch(tmp_path, ["--policy", policy, "--", SH, "-c", "exit 7"])
    assert out.code == 7
    assert out.reports[-1] == {"event": "sandbox_exit", "token": "cli", "status": 7,
                               "limits_hit": []}  # fmt: skip
    missing = launch(tmp_path, ["--policy", "--", SH])  # no JSON between the option and --
    assert missing.code == 2 and missing.stderr.startswith("sandbox: policy is not JSON")


@pytest.mark.parametrize(
    ("stdin", "error"),
    [(b"", "the policy frame ended early"), (b"0000000", "the policy frame ended early"),
     (b"00000000\n", "the policy frame has a bad length"),
     (b"%08x" % (sp.MAX_POLICY_BYTES + 1), "the policy frame has a bad length"),
     (b"00000002{}x", "the policy frame is not terminated"),
     (b"00000002{}", "the policy frame ended early"),
     (b'0000000b{"nope": 1}\n', "policy: unknown key(s) nope")],
)  # fmt: skip
def test_a_bad_policy_frame_is_refused_before_anything_runs(
    tmp_path: Path, stdin: bytes, error: str
) -> None:
    out = launch(tmp_path, ["--policy-stdin", "--", SH, "-c", "echo ran"], stdin)
    assert (out.code, out.reports, out.stdout) == (2, [], "")
    assert out.stderr == f"sandbox: {error}\n"


def test_the_largest_policy_frame_is_read_and_what_follows_it_is_the_targets(
    tmp_path: Path,
) -> None:
    """The frame is read to its newline and no further; a frame of MAX_POLICY_BYTES is taken."""
    policy = sp.Policy(report_fd=3, token="t", scratch_root=str(tmp_path))
    data = policy.to_json().encode()
    data = data[:-1] + b" " * (sp.MAX_POLICY_BYTES - len(data)) + b"}"
    framed = b"%08x" % len(data) + data + b"\n"
    out = launch(tmp_path, ["--policy-stdin", "--", SH, "-c", "cat"], framed + b"after the frame")
    assert (out.code, out.stdout) == (0, "after the frame")


def test_no_target_is_a_usage_error_and_a_target_not_on_path_is_127(tmp_path: Path) -> None:
    frame = sp.frame(sp.Policy(report_fd=3, scratch_root=str(tmp_path)))
    out = launch(tmp_path, ["--policy-stdin", "--"], frame)
    assert (out.code, out.stderr) == (2, "sandbox: no target command\n")
    out = launch(tmp_path, ["--policy-stdin", "--", "no-such-command-here"], frame)
    assert (out.code, out.stderr) == (127, "sandbox: no-such-command-here: not found\n")


def test_a_target_named_without_a_path_is_found_on_path(tmp_path: Path) -> None:
    out = run(tmp_path, ["sh", "-c", "exit 5"])
    assert out.code == 5


def test_probe_prints_what_this_machine_can_apply(tmp_path: Path) -> None:
    out = launch(tmp_path, ["--probe"])
    assert out.code == 0
    assert json.loads(out.stdout) == PROBE


# -- the outer process: its reports and exits -----------------------------------------------------
@FULL
def test_the_first_report_says_what_was_applied_and_the_last_the_targets_status(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, [SH, "-c", "exit 9"])
    first, last = out.reports
    assert out.code == 9
    assert first == {
        "event": "sandbox", "landlock_abi": PROBE["landlock_abi"],
        "namespaces": ["user", "pid", "net", "ipc", "mnt"][-len(first["namespaces"]):],
        "seccomp": True, "no_new_privs": True, "capabilities": "dropped",
        "lifetime": "pid_namespace", "level": "full",
        "limits": {"memory_mb": 8192, "pids": 1024, "file_mb": 1024, "cpu_s": 3600,
                   "open_files": 4096, "scratch_mb": 1024,
                   "by": sandbox.plan_limits(sp.Policy(), SimpleNamespace(kind=PROBE["cgroup"]),
                                             first["namespaces"], False)},
    }  # fmt: skip
    assert last == {"event": "sandbox_exit", "token": "tok", "status": 9, "limits_hit": []}


@FULL
def test_the_reports_go_to_stdout_without_a_report_fd_and_nowhere_without_report(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, [SH, "-c", "echo target"], report_fd=-1)
    assert [r["event"] for r in out.reports] == ["sandbox", "sandbox_exit"]
    assert out.stdout.splitlines()[1] == "target"
    quiet = run(tmp_path, [SH, "-c", "echo target"], report=False)
    assert (quiet.reports, quiet.stdout) == ([], "target\n")


@FULL
def test_a_target_killed_by_a_signal_exits_128_plus_the_signal(tmp_path: Path) -> None:
    out = run(tmp_path, [SH, "-c", "kill -USR1 $$"])
    assert out.code == 128 + signal.SIGUSR1
    assert out.reports[-1]["status"] == 128 + signal.SIGUSR1


@FULL
def test_the_scratch_placeholder_in_the_argv_names_the_private_scratch_folder(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, [SH, "-c", 'test "$1" = "$TMPDIR" && test "$(pwd)" = "$2"', "sh",
                         "{scratch}/tmp", "{scratch}"])  # fmt: skip
    assert out.code == 0, out.stderr


def test_a_setup_that_fails_reports_sandbox_failed_and_exits_125(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"  # the scratch folder cannot be made under a file
    blocker.write_text("")
    out = run(tmp_path, [SH, "-c", "echo ran"], scratch_root=str(blocker))
    assert out.code == sandbox.SETUP_FAILED
    assert [r["event"] for r in out.reports] == ["sandbox_failed"]
    assert out.reports[0]["error"].startswith("FileExistsError: ")
    assert out.stdout == ""
    assert "could not set up" in out.stderr
    silent = run(tmp_path, [SH, "-c", "echo ran"], scratch_root=str(blocker),
                 report=False)  # fmt: skip
    assert (silent.code, silent.reports) == (sandbox.SETUP_FAILED, [])


def test_require_without_landlock_refuses_with_3_and_says_so(tmp_path: Path) -> None:
    out = run(tmp_path, [SH, "-c", "echo ran"], require=True, landlock=False)
    assert out.code == 3
    assert out.reports[0]["level"] == "none"
    assert out.reports[-1] == {"event": "sandbox_exit", "token": "tok", "status": 3,
                               "limits_hit": []}  # fmt: skip
    assert out.stdout == "" and "Landlock is not available" in out.stderr
    ran = run(tmp_path, [SH, "-c", "echo ran"], landlock=False)  # not required: it runs
    assert (ran.code, ran.stdout, ran.reports[0]["level"]) == (0, "ran\n", "none")


def test_binds_without_a_mount_namespace_are_refused_with_126(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    out = run(tmp_path, [SH, "-c", "echo ran"], namespaces=["net"],
              bind=((str(tmp_path / "src"), "/opt/elsewhere"),))  # fmt: skip
    assert (out.code, out.stdout) == (126, "")
    assert "needs a mount namespace" in out.stderr
    assert out.reports[-1]["status"] == 126


@FULL
def test_a_bind_onto_proc_is_refused_with_126(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    out = run(tmp_path, [SH, "-c", "echo ran"], bind=((str(tmp_path / "src"), "/proc/x"),))
    assert (out.code, out.stdout) == (126, "")


def test_a_caller_that_is_not_the_parent_ends_the_sandbox_before_the_target(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, [SH, "-c", "echo ran"], die_with_parent=1)
    assert (out.code, out.stdout) == (1, "")
    assert out.reports[-1]["event"] == "sandbox_exit" and out.reports[-1]["status"] == 1
    alive = run(tmp_path, [SH, "-c", "echo ran"], die_with_parent=os.getpid())
    assert (alive.code, alive.stdout) == (0, "ran\n")


@FULL
def test_a_cpu_limit_hit_is_reported_in_the_exit_report(tmp_path: Path) -> None:
    out = run(tmp_path, [SH, "-c", "while :; do :; done"], limits=sp.Limits(cpu_s=1))
    assert out.reports[-1]["limits_hit"] == ["cpu"]
    assert out.code == 128 + signal.SIGXCPU or out.code == 128 + signal.SIGKILL


@FULL
def test_a_full_scratch_is_reported_as_a_limit_hit(tmp_path: Path) -> None:
    fill = 'head -c 2000000 /dev/zero > "$TMPDIR/fill"; exit 0'
    out = run(tmp_path, [SH, "-c", fill], limits=sp.Limits(scratch_mb=1, cgroup="off"))
    assert "scratch" in out.reports[-1]["limits_hit"]


def test_without_namespaces_or_a_fork_the_target_replaces_the_outer(tmp_path: Path) -> None:
    script = "echo forged >&3 || exit 4; exit 5"  # the report channel is not the target's
    out = run(tmp_path, [SH, "-c", script], fork=False, namespaces=False)
    assert out.code == 4
    first = out.reports[0]
    assert (first["lifetime"], first["namespaces"]) == ("caller", [])
    assert not first["limits"]["by"]["memory"].startswith("cgroup")  # no cgroup in place
    assert len(out.reports) == 1  # no outer left to write an exit report
    forked = run(tmp_path, [SH, "-c", "exit 4"], fork=False, namespaces=["net"])
    assert [r["event"] for r in forked.reports] == ["sandbox", "sandbox_exit"]


def test_without_a_pid_namespace_the_outer_is_a_subreaper_and_kills_what_is_left(
    tmp_path: Path,
) -> None:
    """A daemon the target left behind (setsid, its parent gone) does not outlive the sandbox."""
    pidfile = tmp_path / "daemon.pid"
    daemon = f"setsid sh -c 'echo $$ > {pidfile}; sleep 30' & sleep 0.3; exit 0"
    out = run(tmp_path, [SH, "-c", daemon], namespaces=["net"], write=[str(tmp_path)])
    assert out.code == 0, out.stderr
    assert out.reports[0]["lifetime"] == "subreaper"
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# -- what the target gets ---------------------------------------------------------------------------
def status_of(tmp: Path, field: str, **policy: Any) -> str:
    out = run(tmp, [SH, "-c", f"grep '^{field}:' /proc/self/status"], **policy)
    assert out.code == 0, out.stderr
    return out.stdout.split(":", 1)[1].strip()


@FULL
def test_the_target_runs_without_new_privileges_or_capabilities(tmp_path: Path) -> None:
    assert status_of(tmp_path, "NoNewPrivs") == "1"
    assert status_of(tmp_path, "CapEff") == "0000000000000000"
    assert status_of(tmp_path, "CapEff", drop_caps=False) != "0000000000000000"


@FULL
def test_seccomp_refuses_a_namespace_call_unless_the_policy_turns_it_off(tmp_path: Path) -> None:
    code = "import ctypes; print(ctypes.CDLL(None).unshare(0))"  # unshare(0): a no-op call
    argv = [sys.executable, "-I", "-c", code]
    roots = sp.import_roots()
    assert run(tmp_path, argv, python_path=roots).stdout == "-1\n"
    assert run(tmp_path, argv, python_path=roots, seccomp=False).stdout == "0\n"
    assert run(tmp_path, argv, python_path=roots, seccomp_allow=["unshare"]).stdout == "0\n"


@FULL
def test_the_target_reads_only_what_the_policy_grants_and_writes_only_its_folders(
    tmp_path: Path,
) -> None:
    for name in ("granted", "other", "out"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(name)
    read = f"cat {tmp_path}/granted/f; cat {tmp_path}/other/f; echo w > {tmp_path}/out/new"
    out = run(tmp_path, [SH, "-c", read], read=[str(tmp_path / "granted")])
    assert out.stdout == "granted"
    assert not (tmp_path / "out" / "new").exists()
    out = run(tmp_path, [SH, "-c", read], read=[str(tmp_path / "granted")],
              write=[str(tmp_path / "out")], landlock=True)  # fmt: skip
    assert (tmp_path / "out" / "new").read_text() == "w\n"
    free = run(tmp_path, [SH, "-c", read], landlock=False, namespaces=False)
    assert free.stdout == "grantedother"


@FULL
def test_the_policys_folders_are_made_before_they_are_granted(tmp_path: Path) -> None:
    made = tmp_path / "made" / "deep"
    out = run(tmp_path, [SH, "-c", f"echo x > {made}/f"], mkdir=[str(made)], write=[str(made)])
    assert out.code == 0, out.stderr
    assert (made / "f").read_text() == "x\n" and made.stat().st_mode & 0o777 == 0o700


@FULL
def test_the_target_starts_in_the_policys_folder_with_the_policys_limits_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("KEEP_ME", "k")
    monkeypatch.setenv("DROP_ME", "d")
    script = 'pwd; ulimit -n; echo "${KEEP_ME:-}${DROP_ME:-}"; echo "$HARNESSLAB_SANDBOXED"'
    out = run(tmp_path, [SH, "-c", script], cwd=str(tmp_path / "work"), env_allow=["KEEP_ME"],
              read=[str(tmp_path / "work")], limits=sp.Limits(open_files=77))  # fmt: skip
    assert out.stdout.splitlines() == [str(tmp_path / "work"), "77", "k", "1"], out.stderr


@FULL
def test_the_target_cannot_write_the_report_channel(tmp_path: Path) -> None:
    out = run(tmp_path, [SH, "-c", 'echo \'{"event": "sandbox_exit"}\' >&3'])
    assert out.code != 0
    assert [r["event"] for r in out.reports] == ["sandbox", "sandbox_exit"]
    assert out.reports[-1]["token"] == "tok"


@FULL
def test_the_namespaces_named_are_the_ones_entered_and_the_level_says_what_that_gives(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, [SH, "-c", "exit 0"], namespaces=["net", "nope"])
    first = out.reports[0]
    assert [n for n in first["namespaces"] if n != "user"] == ["net"]
    assert (first["level"], first["lifetime"]) == ("partial", "subreaper")
    none = run(tmp_path, [SH, "-c", "exit 0"], namespaces=False, seccomp=False)
    assert (none.reports[0]["namespaces"], none.reports[0]["seccomp"]) == ([], False)
    assert none.reports[0]["limits"]["by"]["scratch"] == "none"


def test_without_a_cgroup_the_limits_are_rlimits(tmp_path: Path) -> None:
    out = run(tmp_path, [SH, "-c", "exit 0"], limits=sp.Limits(cgroup="off"))
    by = out.reports[0]["limits"]["by"]
    assert by["memory"] in ("rlimit", "none") and not by["memory"].startswith("cgroup")
    assert not by["pids"].startswith("cgroup")


# -- what is left behind, signals, and reports nobody reads -----------------------------------------
def leftovers(tmp: Path) -> list[str]:
    """What the sandboxes left in their scratch root (the test's own files aside)."""
    own = ("out-", "err-", "a-file", "granted", "other", "out", "work", "made", "src", "daemon")
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith(own))


@FULL
def test_the_scratch_folder_and_its_lock_are_removed_after_the_run(tmp_path: Path) -> None:
    out = run(tmp_path, [SH, "-c", 'test -d "$TMPDIR" && echo "$HOME"'])
    assert out.code == 0 and out.stdout.startswith(str(tmp_path))
    assert leftovers(tmp_path) == []
    refused = run(tmp_path, [SH, "-c", "exit 0"], require=True, landlock=False)
    assert refused.code == 3 and leftovers(tmp_path) == []


def test_a_setup_failing_after_the_scratch_was_made_removes_it_and_says_why_briefly(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = run(tmp_path, [SH, "-c", "echo ran"], mkdir=[str(blocker / ("x" * 400))])
    assert (out.code, out.stdout) == (sandbox.SETUP_FAILED, "")
    (failed,) = out.reports
    assert failed["event"] == "sandbox_failed" and len(failed["error"]) == 300
    assert failed["error"].startswith("NotADirectoryError: ")
    assert leftovers(tmp_path) == []


def test_a_caller_that_stopped_reading_the_reports_does_not_stop_the_target(
    tmp_path: Path,
) -> None:
    frame = sp.frame(sp.Policy(report_fd=3, token="t", scratch_root=str(tmp_path)))
    in_r, in_w = os.pipe()
    rep_r, rep_w = os.pipe()
    os.close(rep_r)  # nobody reads: every report write fails with EPIPE
    os.write(in_w, frame)
    os.close(in_w)
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.dup2(in_r, 0)
            os.dup2(rep_w, 3)
            code = sandbox.main(["--policy-stdin", "--", SH, "-c", "exit 6"])
        finally:
            os._exit(code)
    os.close(in_r)
    os.close(rep_w)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 6


@FULL
def test_terminating_the_outer_ends_the_target_with_it(tmp_path: Path) -> None:
    policy = sp.Policy(report_fd=3, token="t", scratch_root=str(tmp_path), write=[str(tmp_path)])
    in_r, in_w = os.pipe()
    rep_r, rep_w = os.pipe()
    go_r, go_w = os.pipe()  # the target says it runs on descriptor 5
    os.write(in_w, sp.frame(policy))
    os.close(in_w)
    marker = tmp_path / "out-survived"
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.dup2(in_r, 0)
            os.dup2(rep_w, 3)
            os.dup2(go_w, 5)
            script = f"echo running >&5; sleep 3; echo x > {marker}"
            code = sandbox.main(["--policy-stdin", "--", SH, "-c", script])
        finally:
            os._exit(code)
    for fd in (in_r, rep_w, go_w):
        os.close(fd)
    with os.fdopen(go_r, "rb") as running:
        assert running.readline() == b"running\n"
    os.kill(pid, signal.SIGTERM)
    with os.fdopen(rep_r, "rb") as reports:
        events = [json.loads(x) for x in reports.read().splitlines()]
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    assert code == 128 + signal.SIGKILL  # the reaper, killed: its namespace goes with it
    assert events[-1]["status"] == code
    assert not marker.exists()


def test_a_target_that_cannot_be_started_exits_126_and_says_why(tmp_path: Path) -> None:
    script = tmp_path / "out-not-executable"
    script.write_text("#!/bin/sh\necho ran\n")
    out = run(tmp_path, [str(script)], namespaces=False, landlock=False)
    assert (out.code, out.stdout) == (126, "")
    assert "sandbox: cannot start the target: " in out.stderr
    assert out.reports[-1]["status"] == 126

    def buffered(main: Any) -> int:  # a caller's stderr need not be line-buffered
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the fork's own stderr
        return main()

    out = run(tmp_path, [str(script)], inside=buffered, namespaces=False, landlock=False)
    assert out.code == 126 and "sandbox: cannot start the target: " in out.stderr


@FULL
def test_a_memory_limit_hit_ends_the_target_and_is_reported(tmp_path: Path) -> None:
    if PROBE["cgroup"] == "none":
        pytest.skip("no cgroup here")
    hog = "head -c 100000000 /dev/zero | tail > /dev/null"  # tail holds 100 MB
    out = run(tmp_path, [SH, "-c", hog], limits=sp.Limits(memory_mb=64))
    assert out.code != 0
    assert out.reports[-1]["limits_hit"][:1] == ["memory"]


# -- more of what the launcher decides ----------------------------------------------------------
def test_probe_is_the_first_argument_and_main_reads_sys_argv_without_arguments(
    tmp_path: Path,
) -> None:
    out = launch(tmp_path, ["--probe", "extra"])
    assert (out.code, json.loads(out.stdout)) == (0, PROBE)
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            f = os.open(tmp_path / "out-argv", os.O_WRONLY | os.O_CREAT, 0o600)
            os.dup2(f, 1)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the fork's own stdout
            sys.argv = ["sandbox.py", "--probe"]
            code = sandbox.main()
            sys.stdout.flush()
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert json.loads((tmp_path / "out-argv").read_text()) == PROBE


def test_only_a_relative_command_name_is_looked_up_on_path(tmp_path: Path) -> None:
    out = run(tmp_path, ["sh", "-c", "exit 5", "/an/absolute/argument"])
    assert out.code == 5


def test_without_a_scratch_root_the_scratch_folder_is_made_in_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    policy = sp.Policy(report_fd=3, token="t", namespaces=False, landlock=False)
    out = launch(tmp_path, ["--policy-stdin", "--", SH, "-c", 'echo "$HOME"'], sp.frame(policy))
    assert out.code == 0, out.stderr
    assert out.stdout.startswith(str(tmp_path / "temp"))


@FULL
def test_landlock_alone_refuses_what_is_not_granted(tmp_path: Path) -> None:
    for name in ("granted", "other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(name)
    read = f"cat {tmp_path}/granted/f; cat {tmp_path}/other/f"
    out = run(tmp_path, [SH, "-c", read], read=[str(tmp_path / "granted")], namespaces=False)
    assert out.stdout == "granted"


def test_a_folder_to_make_that_exists_is_kept(tmp_path: Path) -> None:
    (tmp_path / "made").mkdir()
    out = run(tmp_path, [SH, "-c", "exit 0"], mkdir=[str(tmp_path / "made")], landlock=False)
    assert out.code == 0, out.stderr


def test_a_system_folder_that_does_not_exist_is_left_off_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox, "SYSTEM_PATH", ("/usr/bin", "/no/such/folder"))
    assert "/no/such/folder" not in sandbox.target_path(sp.Policy()).split(os.pathsep)


@FULL
def test_the_level_is_full_only_with_both_pid_and_net_and_require_runs_when_it_is_not_none(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, [SH, "-c", "exit 0"], namespaces=["pid", "mnt"])
    assert out.reports[0]["level"] == "partial"
    required = run(tmp_path, [SH, "-c", "exit 0"], require=True)
    assert (required.code, required.reports[0]["level"]) == (0, "full")


@FULL
def test_a_bind_with_a_mount_namespace_shows_the_source_at_the_target(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("bound")
    view = tmp_path / "view"
    view.mkdir()
    out = run(tmp_path, [SH, "-c", f"cat {view}/f"], bind=((str(tmp_path / "src"), str(view)),),
              read=[str(view)])  # fmt: skip
    assert (out.code, out.stdout) == (0, "bound"), out.stderr


@FULL
def test_in_a_pid_namespace_the_target_sees_only_its_own_processes(tmp_path: Path) -> None:
    out = run(tmp_path, [SH, "-c", "ls /proc | grep -c '^[0-9]'"])
    assert int(out.stdout) <= 4  # the reaper, the shell, ls, grep


@FULL
def test_a_target_in_another_virtual_environment_may_read_that_environment(tmp_path: Path) -> None:
    """The target's interpreter is argv[0]: its venv (a folder with pyvenv.cfg) is granted
    for reading and running, not that of a later argument."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "data").write_text("from the venv\n")
    tool = venv / "bin" / "tool"
    tool.write_text(f"#!/bin/sh\ncat {venv / 'data'}\n")
    tool.chmod(0o755)
    out = run(tmp_path, [str(tool), "an-argument"], namespaces=False)
    assert (out.code, out.stdout) == (0, "from the venv\n"), out.stderr
    bare = tmp_path / "elsewhere"  # the same tool outside a venv: not readable there
    bare.mkdir()
    (bare / "tool").write_text(tool.read_text())
    (bare / "tool").chmod(0o755)
    assert run(tmp_path, [str(bare / "tool"), "an-argument"], namespaces=False).code == 126
