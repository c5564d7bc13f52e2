"""The dashboard in a real headless browser (Debian's Chromium driven by Playwright for Python)
following a CPU run live: `harnesslab dashboard` is started on a new workspace, the page opened,
then `harnesslab run --runner autopilot` (1 iteration, Triton interpreter, a small copy of
rmsnorm_gate) is started beside it; the page must show the new iteration, its point on the
plot, the ledger's rows and the run's final verdict through its own live updates, and a ledger
row's diff on a click. A screenshot is left in the test's tmp dir.

Skipped (with the reason) where Chromium or Playwright is missing. Playwright's own browser
downloads are never used: Chromium is launched from /usr/bin with the flags that keep it off
the network (background networking, component updates, sync, QUIC)."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task.spec import load_task, tasks_root

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
CLI = [sys.executable, "-m", "harnesslab.servers"]
START_S = 90  # the dashboard's first line (imports on a loaded 2-core machine)
RUN_S = 300  # the whole run: baseline verify, a <= 30 s attempt, its verify, the final verify


def tiny_task(dest: Path) -> Path:
    """rmsnorm_gate with 2 small dev cases and 2 small hidden cases: every step is seconds on
    the interpreter."""
    shutil.copytree(
        tasks_root() / "rmsnorm_gate", dest, ignore=shutil.ignore_patterns("__pycache__")
    )
    toml = dest / "task.toml"
    text = toml.read_text().replace('name = "rmsnorm_gate"', 'name = "rmsnorm_tiny"')
    head, _, rest = text.partition("[[dev_cases]]")
    dev = "".join(
        f'[[dev_cases]]\nname = "{n}"\ndtype = "{d}"\nshape = {{ rows = {r}, dim = {c} }}\n\n'
        for n, d, r, c in (("256x1024_fp16", "float16", 256, 1024),
                           ("128x2048_bf16", "bfloat16", 128, 2048))
    )  # fmt: skip
    final = (
        '[final]\ncount = 2\ndtypes = ["float16", "bfloat16"]\n'
        "ranges = { rows = { min = 64, max = 512 } }\nchoices = { dim = [1024, 2048] }\n\n"
    )
    rest = rest[rest.index("[integrity]") :]
    toml.write_text(head + dev + final + rest)
    assert load_task(dest).final.count == 2
    return dest


def start(argv: list[str], env: dict[str, str], log: Path | None = None) -> subprocess.Popen[str]:
    """A process in its own group (stopped with its children below); its stderr is a pipe, or
    `log` (a run's progress must not fill a pipe nobody reads)."""
    out = log.open("w") if log else subprocess.PIPE
    return subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if log is None else out,
        stderr=out,
        text=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def serving_url(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The URL of the 'serving on' line on the dashboard's stderr (a reader thread, so the wait
    is bounded)."""
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    stream = proc.stderr

    def read() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if "serving on " in line:
            return line.split("serving on ", 1)[1].strip()
    raise AssertionError(f"no 'serving on' line in {timeout_s} s: {''.join(seen)[-2000:]}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dashboard_follows_a_cpu_run_live_in_a_real_browser(tmp_path: Path):
    sync_api = pytest.importorskip(
        "playwright.sync_api",
        reason="Playwright for Python is not installed (pip install playwright)",
    )
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium chromium-driver)")
    task = tiny_task(tmp_path / "rmsnorm_tiny")
    state = tmp_path / "state"
    ws = tmp_path / "ws"
    init_workspace(str(task), ws, Settings(state_dir=state))
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(state), "HARNESSLAB_INTERPRET": "always"}
    dashboard = start([*CLI, "dashboard", "-w", str(ws), "--port", "0"], env)
    run = None
    try:
        url = serving_url(dashboard, START_S)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"),  # a new, empty user-data-dir
                executable_path=str(CHROMIUM),
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1400, "height": 1000},
            )
            try:
                page = browser.new_page()
                page.goto(url, timeout=60_000)
                assert "no loop run" in page.locator("#sec-runs").inner_text()
                run = start(
                    [*CLI, "run", "-w", str(ws), "--task", str(task), "--runner", "autopilot",
                     "--iterations", "1", "--build", "never", "--attempt-timeout", "30"],
                    env,
                    tmp_path / "run.log",
                )  # fmt: skip
                wait_ms = RUN_S * 1000
                # The live update brings the new run and its iteration, then its verified score
                # as a point on the plot (a circle when it passed, a cross when not).
                page.wait_for_selector('tr.iter[data-iteration="1"]', timeout=wait_ms)
                point = (
                    'svg.plot[data-axis="iteration"] [data-kind="iteration"][data-iteration="1"]'
                )
                page.wait_for_selector(point, timeout=wait_ms)
                page.wait_for_selector('div.run[data-status="completed"]', timeout=wait_ms)
                page.wait_for_selector('svg.plot [data-kind="final"]', timeout=30_000)
                assert page.locator('svg.plot circle[data-kind="baseline"]').count() == 2
                finals = page.locator('tr.ledger-row[data-mode="final"]')
                assert finals.count() >= 3  # baseline, iteration 1, the final re-verify
                assert page.locator("tr.ledger-row").count() > finals.count()  # dev runs too
                assert "passed" in page.locator("#sec-runs").inner_text()
                finals.first.click()
                page.wait_for_selector("table.diff", timeout=30_000)
                assert "kernel.py" in page.locator("#diff").inner_text()
                page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            finally:
                browser.close()
        assert run.wait(timeout=60) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        for proc in (run, dashboard):
            if proc is not None:
                stop(proc)
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
