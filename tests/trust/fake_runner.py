"""A stand-in for the GPU-side runner (settings.python runs it as `fake_runner.py -I -B RUNNER -`,
the request on stdin):
it tells the test it started, over the Unix socket named by $FAKE_RUNNER_SOCKET, and waits for
"go" before it answers, so a test decides when a "timing run" ends. Without the variable it
answers at once."""

from __future__ import annotations

import json
import os
import socket
import sys

path = os.environ.get("FAKE_RUNNER_SOCKET")
if path:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(path)
        sock.sendall(f"start {os.getpid()}\n".encode())
        sock.recv(16)  # "go"
request = json.loads(sys.stdin.read() if sys.argv[-1] == "-" else open(sys.argv[-1]).read())
print(json.dumps({"event": "result", "status": "passed", "mode": request.get("mode"), "cases": []}))
