"""Every runner mode that imports agent code is started inside the sandbox: the modes
runner.handle dispatches, less the trusted parents that sandbox their own children ("verify",
"step_verify") and "health" (no candidate), are exactly the launcher's SANDBOXED_MODES. A new
mode (step_profile was one) that is not listed would run the candidate unsandboxed."""

from __future__ import annotations

import ast
import inspect

from harnesslab.tools.execution.launcher import SANDBOXED_MODES
from harnesslab.tools.gpu import runner

TRUSTED_PARENTS = {"verify", "step_verify", "health"}


def _dispatched_modes() -> set[str]:
    tree = ast.parse(inspect.getsource(runner.handle))
    modes = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)
                and node.left.id == "mode" and isinstance(node.ops[0], ast.Eq)):  # fmt: skip
            (right,) = node.comparators
            if isinstance(right, ast.Constant) and isinstance(right.value, str):
                modes.add(right.value)
    return modes


def test_every_mode_that_imports_agent_code_is_sandboxed():
    modes = _dispatched_modes()
    assert {"evaluate", "step", "probe", "step_profile", "verify"} <= modes  # the parse works
    assert modes - TRUSTED_PARENTS == set(SANDBOXED_MODES)
