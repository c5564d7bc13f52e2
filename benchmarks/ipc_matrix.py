"""Which way of sharing device memory with a sandboxed process works on this GPU host:
legacy CUDA IPC handles or VMM file descriptors, under each sandbox layer.

    python benchmarks/ipc_matrix.py
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "gpu"
sys.path.insert(0, str(TOOLS))
CHILD = r"""
import base64, json, socket, sys, ctypes
sys.path.insert(0, sys.argv[1])
from cudadrv import Driver
d = Driver(); d.init_primary(0)
mode, arg, size = sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    if mode == "legacy":
        ptr = d.ipc_open(base64.b64decode(arg))
    else:
        s = socket.socket(fileno=int(arg))
        _, fds, _, _ = socket.recv_fds(s, 16, 1)
        ptr, _ = d.import_shareable(fds[0], size)
    d.memset(ptr + 4096, 4, 0x12345678, 1024, 0)
    d.synchronize()
    print(json.dumps({"ok": True}))
except Exception as e:
    print(json.dumps({"ok": False, "error": str(e)}))
"""
CONFIGS = {
    "no_sandbox": None,
    "landlock_only": {"seccomp": False, "drop_caps": False, "namespaces": False},
    "seccomp_only": {"landlock": False, "drop_caps": False, "namespaces": False},
    "caps_only": {"landlock": False, "seccomp": False, "namespaces": False},
    "ns_net_mnt": {
        "landlock": False,
        "seccomp": False,
        "drop_caps": False,
        "namespaces": ["net", "mnt"],
    },
    "ns_pid": {"landlock": False, "seccomp": False, "drop_caps": False, "namespaces": ["pid"]},
    "full": {},
}


def main() -> None:
    import torch

    torch.empty(1, device="cuda")
    from cudadrv import Driver

    d = Driver()
    d.init_primary(0)
    script = Path(tempfile.mkdtemp()) / "child.py"
    script.write_text(CHILD)
    for mode in ("legacy", "vmm"):
        for name, policy in CONFIGS.items():
            size = 1 << 21
            fds: tuple[int, ...] = ()
            if mode == "legacy":
                ptr = d.alloc(size)
                arg = base64.b64encode(d.ipc_handle(ptr)).decode()
            else:
                ptr, size, _, fd = d.alloc_shareable(size)
                a, b = socket.socketpair()
                socket.send_fds(a, [b"x"], [fd])
                arg, fds = str(b.fileno()), (b.fileno(),)
            argv = [sys.executable, "-I", str(script), str(TOOLS), mode, arg, str(size)]
            if policy is not None:
                p = {
                    "read": [str(TOOLS), str(script)],
                    "scratch_root": tempfile.mkdtemp(),
                    **policy,
                }
                argv = [
                    sys.executable,
                    "-I",
                    str(TOOLS / "isolation" / "sandbox.py"),
                    "--policy",
                    json.dumps(p),
                    "--",
                    *argv,
                ]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=120, pass_fds=fds)
            lines = out.stdout.strip().splitlines()

            class M:
                def __init__(s, p, n):
                    s.__cuda_array_interface__ = {
                        "shape": (n,),
                        "typestr": "<u4",
                        "data": (p, False),
                        "version": 2,
                    }

            seen = bool(
                (torch.as_tensor(M(ptr, size // 4), device="cuda")[1024:2048] == 0x12345678).all()
            )
            print(
                f"{mode:7s} {name:14s} child={lines[-1] if lines else out.stderr[-200:]!s:60.60s} written={seen}"
            )
            if mode == "legacy":
                d.free(ptr)


main()
