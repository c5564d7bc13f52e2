"""Progress of a long CLI command (servers/cli_progress.py): plain lines off a terminal, a bar on
one, something at once, and a count that never passes its total."""

from __future__ import annotations

import io

from rich.console import Console

from harnesslab.servers.cli_progress import CliProgress


def test_off_a_terminal_it_says_it_started_then_prints_one_line_per_step():
    sink = io.StringIO()
    with CliProgress("verify", console=Console(file=sink, width=80)) as progress:
        assert "verify: started" in sink.getvalue()  # before the first event arrives
        progress(1, 2, "case 1 of 2: measured")
        progress(1, 2, "case 1 of 2: measured")  # a repeat is not printed twice
        progress(7, 2, "case 2 of 2: measured")  # a count past its total stops at it
    lines = sink.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[1].endswith("[1/2] case 1 of 2: measured")
    assert lines[2].endswith("[2/2] case 2 of 2: measured")


def test_on_a_terminal_it_draws_a_bar_with_the_count_and_clears_it_at_the_end():
    sink = io.StringIO()
    term = Console(file=sink, width=100, force_terminal=True, color_system=None)
    with CliProgress("eval", console=term) as progress:
        assert progress.bar is not None
        progress(3, 9, "384x4096_bf16: passed")
        task = progress.bar.tasks[0]
        assert (task.completed, task.total) == (3, 9)
        assert "384x4096_bf16" in task.description
        progress(12, 9, "x")
        assert progress.bar.tasks[0].completed == 9
