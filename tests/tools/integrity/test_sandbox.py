"""One hostile candidate through every path that runs agent code.

At import the kernel tries to write outside its scratch folder, read the state dir (where the
hidden-case secret lives), connect to a loopback listener, leave a setsid daemon behind and
signal a process outside its run (this test's own). It computes the right answer only if every
attempt failed, so a passing result is the proof; the test also looks for what an attempt that
worked would have left (a file, a connection, a process). Run through the dev eval, a sweep, the
numerical probe and the guarded verify (tests/tools/meta/test_genserver.py runs the same attacks as a
generated server's custom tool). The sandbox itself is tools/gpu/isolation/sandbox.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from harnesslab.tests.conftest_shared import small_rmsnorm
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.evaluation.probe import numerical_probe
from harnesslab.tools.evaluation.sweep import sweep
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.execution.runner_policy import PROFILER_ENV_PREFIXES
from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.integrity.verify import guarded_verify, judge
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace, init_workspace

MARKER = "hl-hostile-daemon"
HOSTILE = """
import os, socket, sys
import torch
import triton
import triton.language as tl

WORKED = []

def _try(name, fn):
    try:
        fn()
        WORKED.append(name)
    except Exception:
        pass

def _write():
    with open({outside!r}, "w") as fh:
        fh.write("escaped")

def _read_state():
    for root, _, files in os.walk({state!r}):
        for f in files:
            open(os.path.join(root, f), "rb").read(1)
            return
    raise OSError("nothing readable")

def _connect():
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()

def _signal():
    os.kill({pid}, 0)

_try("write", _write)
_try("read_state", _read_state)
_try("connect", _connect)
_try("signal", _signal)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", {marker!r}])
    os._exit(0)


@triton.jit
def _kernel(x_ptr, g_ptr, w_ptr, out_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / dim + eps)
    y = x * rstd * w * (g * tl.sigmoid(g))
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    dim = x.shape[-1]
    _kernel[(x.numel() // dim,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    if WORKED:
        out.zero_()
    return out
"""

pytestmark = pytest.mark.skipif(
    sandbox.probe()["level"] != "full", reason="no Landlock or namespaces on this machine"
)


def daemons() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and MARKER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


class Hostile:
    def __init__(self, tmp: Path) -> None:
        self.outside = tmp / "outside" / "escaped.txt"
        self.outside.parent.mkdir()
        self.settings = Settings(state_dir=tmp / "state")
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        # rmsnorm_gate's dev cases; a guarded verify of 2 small hidden cases (what is asserted is
        # that the attempts are contained, not the cases they ran on)
        task = small_rmsnorm(tmp / "rmsnorm_small")
        self.ws: Workspace = init_workspace(str(task), tmp / "ws", self.settings)
        (self.settings.state_dir / "secrets").mkdir(parents=True, exist_ok=True)
        (self.settings.state_dir / "secrets" / "planted.json").write_text('{"seed": "x"}')
        source = HOSTILE.format(
            outside=str(self.outside),
            state=str(self.settings.state_dir),
            port=self.listener.getsockname()[1],
            pid=os.getpid(),
            marker=MARKER,
        )
        (self.ws.root / "kernel.py").write_text(source)

    def contained(self) -> None:
        assert not self.outside.exists(), "the candidate wrote outside its scratch"
        with pytest.raises(BlockingIOError):
            self.listener.accept()  # nothing connected
        assert daemons() == [], "a daemon outlived the run"

    def run(self, work) -> object:
        async def go():
            launcher = Launcher(self.settings)
            try:
                with anyio.fail_after(240):
                    return await work(launcher)
            finally:
                await launcher.aclose()

        return anyio.run(go)


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Hostile]:
    h = Hostile(tmp_path)
    yield h
    h.listener.close()
    for pid in daemons():  # a failing run must not leave its daemon to the next test
        os.kill(pid, 9)


def test_the_dev_eval_contains_every_attempt(hostile: Hostile) -> None:
    res = hostile.run(lambda la: run_objective(hostile.ws, la, cases=["1024x1024_fp16"]))
    assert res.status == "passed", res.reason
    assert res.env.sandbox == "full"
    hostile.contained()


def test_a_sweep_contains_every_attempt(hostile: Hostile) -> None:
    space = {"num_warps": [2, 4]}
    res = hostile.run(lambda la: sweep(hostile.ws, la, space=space, cases=["1024x1024_fp16"]))
    assert [c.status for c in res.results] == ["ok", "ok"], res
    hostile.contained()


def test_the_numerical_probe_contains_every_attempt(hostile: Hostile) -> None:
    res = hostile.run(lambda la: numerical_probe(hostile.ws, la, probes=["zero_rows"]))
    assert res.status == "passed", res
    hostile.contained()


def test_the_guarded_verify_contains_every_attempt(hostile: Hostile) -> None:
    settings = hostile.settings
    v = hostile.run(
        lambda la: guarded_verify(hostile.ws, la, settings, enforce_scan=False)  # type: ignore[misc]
    )
    # Harmless: no attack worked (the kernel would have given itself away with wrong outputs);
    # its fork may also be seen by the candidate's own process and reject it.
    codes = {r["code"] for r in v.reasons}
    assert v.verdict == "passed" or codes == {"subprocess"}, v.reasons
    assert v.sandbox == "full"
    hostile.contained()


def test_a_machine_without_landlock_refuses_to_run_agent_code_unless_told(tmp_path: Path) -> None:
    """No Landlock (forced here): the sandbox says so first and, when required, exits 3 without
    running the target; the verify turns that into a clear error."""
    policy = {"landlock": False, "scratch_root": str(tmp_path), "require": True}
    marker = tmp_path / "ran"
    out = subprocess.run(
        [sys.executable, "-I", sandbox.__file__, "--policy", json.dumps(policy), "--",
         sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    report = json.loads(out.stdout.splitlines()[0])
    assert report["level"] == "none" and out.returncode == 3
    assert "HARNESSLAB_ALLOW_UNSANDBOXED" in out.stderr and not marker.exists()
    from harnesslab.tools.execution.launcher import RunnerCall

    call = RunnerCall(
        result={"status": "measured", "error_code": "sandbox_unavailable", "nonce": "n"},
        events=[], exit_code=0, timed_out=False, stderr_tail="", host="local", gpu_index=0,
        wall_s=0.0,
    )  # fmt: skip
    verdict, reasons, _, _ = judge(call, [], "n")
    assert verdict == "error" and reasons[0]["code"] == "sandbox_unavailable"
    assert "HARNESSLAB_ALLOW_UNSANDBOXED" in reasons[0]["detail"]


def test_the_sandbox_leaves_no_scratch_behind(tmp_path: Path) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    policy = {"scratch_root": str(root)}
    subprocess.run(
        [sys.executable, "-I", sandbox.__file__, "--policy", json.dumps(policy), "--",
         sys.executable, "-c", "import os; open(os.environ['TMPDIR'] + '/x', 'w').write('x')"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert list(root.iterdir()) == []
    shutil.rmtree(root)


def test_a_profiled_target_runs_in_place_with_the_file_rules(tmp_path: Path) -> None:
    """profile_target's policy (no namespaces, no socket filter, exec'd in place, the profiler's
    injection variables passed: without them ncu's target died with SIGSEGV on an H100) still
    applies Landlock: the target may write its scratch folder and nothing outside it, and sees
    no other variable of its caller."""
    outside = tmp_path / "outside.txt"
    code = (
        "import os, sys\n"
        "open(os.path.join(os.getcwd(), 'ok.txt'), 'w').write('x')\n"
        f"try:\n    open({str(outside)!r}, 'w').write('x'); print('WROTE')\n"
        "except OSError: print('DENIED')\n"
        "print('PID', os.getpid())\n"
        "print('ENV', sorted(k for k in os.environ if k.startswith(('NV_', 'HARNESSLAB_'))))\n"
    )
    policy = {
        "read": [],
        "scratch_root": str(tmp_path / "scratch"),
        "namespaces": False,
        "seccomp": False,
        "fork": False,
        "env_allow_prefixes": list(PROFILER_ENV_PREFIXES),
        "require": True,
    }
    env = {**os.environ, "NV_NSIGHT_INJECTION_PORT_BASE": "49152", "HARNESSLAB_SECRET": "x"}
    proc = subprocess.Popen(
        [sys.executable, sandbox.__file__, "--policy", json.dumps(policy), "--",
         sys.executable, "-I", "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads(out.splitlines()[0])
    assert report["lifetime"] == "caller" and report["landlock_abi"] >= 1
    assert "DENIED" in out and not outside.exists()
    assert f"PID {proc.pid}" in out  # exec'd in place: no reaper, no fork
    assert "'NV_NSIGHT_INJECTION_PORT_BASE'" in out and "HARNESSLAB_SECRET" not in out
