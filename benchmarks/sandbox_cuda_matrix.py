"""Which sandbox layer keeps CUDA from starting: one probe per combination of layers.

python benchmarks/sandbox_cuda_matrix.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "gpu"
PROBE = "import ctypes; l=ctypes.CDLL('libcuda.so.1'); r=l.cuInit(0); n=ctypes.c_int(); l.cuDeviceGetCount(ctypes.byref(n)); print(json.dumps({'cuInit': r, 'devices': n.value}))"
OFF = {"seccomp": False, "drop_caps": False, "namespaces": False}
CONFIGS = {
    "nothing": {**OFF, "landlock": False},
    "full_sandbox": {},
    "seccomp_only": {"landlock": False, "drop_caps": False, "namespaces": False},
    "seccomp_only_allow_connect": {
        "landlock": False,
        "drop_caps": False,
        "namespaces": False,
        "seccomp_allow": ["connect"],
    },
    "seccomp_only_allow_sendmsg": {
        "landlock": False,
        "drop_caps": False,
        "namespaces": False,
        "seccomp_allow": ["sendmsg", "sendmmsg"],
    },
    "landlock_only": {**OFF},
    "landlock_w_proc": {**OFF, "write": ["/proc"]},
    "landlock_w_proc_driver": {**OFF, "write": ["/proc/driver"]},
    "landlock_w_proc_sys": {**OFF, "write": ["/proc/sys"]},
}
SHIM = Path(__file__).resolve().parent / "shim" / "trace_open.c"
so = Path(tempfile.mkdtemp()) / "trace.so"
built = subprocess.run(
    ["gcc", "-shared", "-fPIC", "-O1", "-o", str(so), str(SHIM), "-ldl"],
    capture_output=True,
    text=True,
)
if built.returncode == 0:
    traced = subprocess.run(
        [sys.executable, "-I", "-c", "import json;" + PROBE],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "LD_PRELOAD": str(so)},
        timeout=120,
    )
    print("== what cuInit touches (LD_PRELOAD trace, no sandbox):", traced.stdout.strip())
    seen = sorted({ln for ln in traced.stderr.splitlines() if ln.startswith("TRACE")})
    print("\n".join(seen[:80]))
else:
    print("shim did not build:", built.stderr[-300:])
for name, extra in CONFIGS.items():
    policy = {"scratch_root": tempfile.mkdtemp(), **extra}
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            str(TOOLS / "isolation" / "sandbox.py"),
            "--policy",
            json.dumps(policy),
            "--",
            sys.executable,
            "-I",
            "-c",
            "import json;" + PROBE,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(
        f"{name:32s} rc={out.returncode} {out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ''} {out.stderr.strip()[-200:]}"
    )
