"""Diagnostic for the step verify's timed pass (issue 32): patches an INSTALLED copy of
harnesslab (the one a GPU session installs with `pip --target`; never the source tree) so the
candidate's process (step_child.py) writes, per timed step, how long its own parts took to its
stderr, and the guarded verify keeps the candidates' stderr in a file (guard_kid.py discards it).
The staged harness is hash-checked against the installed package, so the patched copy is what
runs. Then prints the child's medians: wait (the request readable -> the handler starts), work
(run_step), sync (lengths + synchronize), reply (the frame written).

    python benchmarks/step_timed_diag.py patch INSTALLED_HARNESSLAB_DIR LOG [SWITCH_S|none [SPIN_S]]
    python benchmarks/step_timed_diag.py report LOG

For a GPU session only: the patched install is thrown away with the machine.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

CHILD_OLD = """    def timed_step(self, msg: dict[str, Any]) -> None:
        error, copied = self.run_step(msg)
        if not error:
            self.views["lengths"] += 1  # reference.advance's device half, on the harness's handle
            if self.cuda:
                error = self.synchronize()
        self.reply(error=error, copied=copied)
"""
CHILD_NEW = """    def timed_step(self, msg: dict[str, Any]) -> None:
        _t0 = time.perf_counter()
        error, copied = self.run_step(msg)
        _t1 = time.perf_counter()
        if not error:
            self.views["lengths"] += 1  # reference.advance's device half, on the harness's handle
            if self.cuda:
                error = self.synchronize()
        _t2 = time.perf_counter()
        self.reply(error=error, copied=copied)
        _t3 = time.perf_counter()
        _wait = (_t0 - getattr(self, "_ready", _t0)) * 1e6
        if not getattr(self, "_told", False):
            import threading

            self._told = True
            print("HLTHREADS", [(t.name, t.daemon) for t in threading.enumerate()],
                  sys.getswitchinterval(), file=sys.stderr, flush=True)
        print(f"HLDIAG {_wait:.1f} {(_t1 - _t0) * 1e6:.1f} {(_t2 - _t1) * 1e6:.1f} "
              f"{(_t3 - _t2) * 1e6:.1f}", file=sys.stderr, flush=True)
"""
SPIN_OLD = """        while time.monotonic() < deadline and not select.select([self.fd_in], [], [], 0)[0]:
            pass
"""
SPIN_NEW = (
    SPIN_OLD
    + """        self._ready = time.perf_counter()
"""
)


INIT_OLD = "        self.torch, self.cfg, self.out = torch, cfg, out\n"
LOOP_OLD = "            for i in range(lo, end):\n"  # TimedPass.block: one side's steps
LOOP_NEW = LOOP_OLD + "                _p0 = __import__('time').perf_counter()\n"
GOT_OLD = "                reply, wall_us = got\n"
GOT_NEW = GOT_OLD + (
    "                if i > lo:\n"
    "                    with open(PARENT_LOG, 'a') as _fh:\n"
    "                        _fh.write(f'HLPARENT {(_p0 - _last) * 1e6:.1f} {wall_us:.1f}\\n')\n"
)
APPEND_OLD = "                side.samples.append(wall_us + (self.clock() - t0) * 1e6)\n"
APPEND_NEW = APPEND_OLD + "                _last = __import__('time').perf_counter()\n"
SPIN_LIMIT_OLD = "def spin_for_request(self, limit_s: float = 1.0)"


def patch(root: Path, log: str, switch_s: float | None = None, spin_s: float | None = None) -> None:
    """`switch_s`: also set the child's GIL switch interval (sys.setswitchinterval); `spin_s`:
    the child's wait for the next request awake (step_child.spin_for_request's limit). The
    parent (step_timed.py) writes each timed step's gap since the last reply and its wall time
    to LOG + ".parent"."""
    child = root / "tools" / "gpu" / "verify" / "step_child.py"
    kid = root / "tools" / "gpu" / "verify" / "guard_kid.py"
    text = child.read_text()
    assert CHILD_OLD in text and SPIN_OLD in text, "step_child.py changed: update the patch"
    text = text.replace(CHILD_OLD, CHILD_NEW).replace(SPIN_OLD, SPIN_NEW)
    if switch_s is not None:
        assert INIT_OLD in text, "step_child.py changed: update the patch"
        text = text.replace(INIT_OLD, INIT_OLD + f"        sys.setswitchinterval({switch_s})\n")
    if spin_s is not None:
        assert SPIN_LIMIT_OLD in text, "step_child.py changed: update the patch"
        text = text.replace(SPIN_LIMIT_OLD, SPIN_LIMIT_OLD.replace("1.0", repr(spin_s)))
    child.write_text(text)
    timed = root / "tools" / "gpu" / "verify" / "step_timed.py"
    text = timed.read_text()
    assert LOOP_OLD in text and GOT_OLD in text and APPEND_OLD in text, "step_timed.py changed"
    text = text.replace(LOOP_OLD, LOOP_NEW).replace(GOT_OLD, GOT_NEW)
    text = text.replace(APPEND_OLD, APPEND_NEW) + f"\nPARENT_LOG = {log + '.parent'!r}\n"
    timed.write_text(text)
    text = kid.read_text()
    old = "stderr=subprocess.DEVNULL,"
    assert old in text, "guard_kid.py changed: update the patch"
    kid.write_text(text.replace(old, f"stderr=open({log!r}, 'ab'),", 1))
    print(f"patched {child} and {kid}")


def report(log: str) -> None:
    lines = Path(log).read_text(errors="replace").splitlines()
    for ln in dict.fromkeys(x for x in lines if x.startswith("HLTHREADS")):
        print(ln[:400])
    parent = Path(log + ".parent")
    if parent.is_file():
        pairs = [[float(x) for x in ln.split()[1:]] for ln in parent.read_text().splitlines()
                 if ln.startswith("HLPARENT ")]  # fmt: skip
        for name, col in zip(
            ("gap since the last reply", "wall"), zip(*pairs, strict=True), strict=True
        ):
            xs = sorted(col)
            print(f"  parent {name}: median {statistics.median(xs):.1f} us (p10 "
                  f"{xs[len(xs) // 10]:.1f}, p90 {xs[9 * len(xs) // 10]:.1f}) n={len(xs)}")  # fmt: skip
    rows = [ln.split()[1:] for ln in lines if ln.startswith("HLDIAG ")]
    if not rows:
        print("no HLDIAG lines")
        return
    values = [[float(x) for x in r] for r in rows]
    # eager's steps take milliseconds of work, the Triton solution's under one: told apart here
    for group, lo, hi in (("work >= 3 ms", 3000.0, float("inf")), ("work < 3 ms", 0.0, 3000.0)):
        mine = [v for v in values if lo <= v[1] < hi]
        if not mine:
            continue
        print(f"{group}: {len(mine)} timed steps")
        for name, col in zip(
            ("wait", "work", "sync", "reply"), zip(*mine, strict=True), strict=True
        ):
            xs = sorted(col)
            print(f"  child {name:6} median {statistics.median(xs):9.1f} us  "
                  f"(p10 {xs[len(xs) // 10]:.1f}, p90 {xs[9 * len(xs) // 10]:.1f})")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "patch":
        opt = [None if x == "none" else float(x) for x in sys.argv[4:6]]
        patch(Path(sys.argv[2]), sys.argv[3], *opt)
    else:
        report(sys.argv[2])
