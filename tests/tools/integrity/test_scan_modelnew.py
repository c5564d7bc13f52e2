"""The static scan and a KernelBench `ModelNew` class: subclassing nn.Module and building layers
and parameters in __init__ is construction (outside the verified call), so it passes; torch.nn
math in forward, torch.nn.functional anywhere, stays a hard reject."""

from __future__ import annotations

from harnesslab.tools.integrity.scan import scan_sources

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
CLASS = """class ModelNew(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3)
        self.bias = nn.Parameter(torch.zeros(c))
        nn.init.zeros_(self.bias)

    def forward(self, x):
        return {body}
"""


def _rejects(src: str) -> set[str]:
    report = scan_sources({"kernel.py": src.encode()}, entry_function="model_new")
    return {f"{f.code}:{f.line}" for f in report.rejects}


def test_a_modelnew_that_builds_its_layers_in_init_passes_the_scan() -> None:
    assert _rejects(HEAD + CLASS.format(body="x")) == set()


def test_torch_nn_math_outside_init_is_still_rejected() -> None:
    assert _rejects(HEAD + CLASS.format(body="F.relu(x)"))  # functional in forward
    assert _rejects(HEAD + CLASS.format(body="nn.functional.gelu(x)"))
    in_forward = CLASS.format(body="nn.ReLU()(x)")
    assert _rejects(HEAD + in_forward)  # a layer built (and run) in forward
    init_functional = CLASS.replace("super().__init__()", "super().__init__()\n        F.relu")
    assert _rejects(HEAD + init_functional.format(body="x"))
    plain = "def model_new(x):\n    return nn.Linear(4, 4)(x)\n"
    assert _rejects(HEAD + plain)


def test_only_torch_nn_is_construction_in_init_anything_else_is_judged_as_anywhere() -> None:
    for call in ("os.system('ls')", "torch.ops.aten.add(1, 2)", "torch.cuda.Stream()"):
        init = CLASS.replace("super().__init__()", f"super().__init__()\n        {call}")
        assert _rejects("import os\n" + HEAD + init.format(body="x")), call


def test_construction_ends_with_the_class_body() -> None:
    """__init__ as the class's last statement: the code after the class is no construction."""
    last = "class ModelNew(nn.Module):\n    scale = 2\n\n    def __init__(self):\n        pass\n"
    after = "\n\ndef model_new(x):\n    return nn.Linear(4, 4)(x)\n"
    assert _rejects(HEAD + last + after) == {"forbidden_call:14"}


def test_a_class_bodys_other_statements_are_not_construction() -> None:
    body = "class ModelNew(nn.Module):\n    layer = nn.Linear(4, 4)\n\n    class __init__:\n"
    body += "        layer = nn.Linear(4, 4)\n"
    assert _rejects(HEAD + body) == {"forbidden_call:7", "forbidden_call:10"}


def test_a_classs_other_bases_keywords_and_decorators_are_scanned() -> None:
    assert _rejects(HEAD + "class K(torch.ops.aten.X):\n    pass\n") == {"private_api:6"}
    assert _rejects(HEAD + "class K(nn.Module, metaclass=torch.ops.M):\n    pass\n") == {
        "private_api:6"
    }
    assert _rejects(HEAD + "@torch.compile\nclass K(nn.Module):\n    pass\n") == {
        "forbidden_call:6"
    }
