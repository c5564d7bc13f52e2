"""The KernelBench import's source-level rules (tools/task/kernelbench.py) on small sources: the
task name, a weight's argument name, and Model.forward as a plain function (when it may be one,
what it carries along). The import of real files is tests/tasks/test_kernelbench.py."""

from __future__ import annotations

from pathlib import Path

from harnesslab.tools.authoring import kernelbench as kb


def test_a_task_name_is_kb_and_the_lowercased_stem() -> None:
    assert (
        kb.task_name(Path("1_Square_matrix_multiplication_.py"))
        == "kb_1_square_matrix_multiplication"
    )
    assert kb.task_name(Path("x/-A+B-.py")) == "kb_a_b"
    assert kb.task_name(Path("a-b.py")) == "kb_a-b"
    long = kb.task_name(Path(("n" * 60) + "_x_.py"))
    assert long == "kb_" + "n" * 60  # cut at 64 characters, then no trailing _
    assert len(kb.task_name(Path("y" * 100 + ".py"))) == 64


def test_a_weights_argument_name_is_its_path_with_underscores_never_taken_twice() -> None:
    taken = {"x", "conv_weight"}
    got = kb._arg_names(["conv.weight", "0.bias", "bn.weight", "bn.weight"], taken)
    assert got == ["conv_weight_param", "p_0_bias", "bn_weight", "bn_weight_param"]
    assert {"conv_weight_param", "p_0_bias", "bn_weight", "bn_weight_param"} <= taken


MODEL = """
import torch
import torch.nn as nn
import math, os

class Model(nn.Module):
    def __init__(self, dim, eps, other):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.scale = 2
        self.pair, self.more = dim, eps

    def forward(self, x, y):
        z = x * y
        return torch.sum(z, dim=self.dim) + self.eps + math.pi
"""


def test_forward_becomes_a_function_of_its_inputs_and_the_constructor_scalars() -> None:
    out = kb.forward_as_function(MODEL, {"dim": 1, "eps": 1e-5})
    assert out is not None
    assert "def model_new(x, y, *, dim=1, eps=1e-05):" in out
    assert "return torch.sum(z, dim=dim) + eps + math.pi" in out
    assert "import torch\n" in out and "import math\n" in out  # only what the body uses
    assert "nn" not in out.split('"""')[2] and "os" not in out.split('"""')[2]
    assert out.startswith('"""Baseline: the KernelBench Model') and out.endswith("\n")
    plain = "import torch\nclass Model:\n    def forward(self, x):\n        return torch.relu(x)\n"
    assert "def model_new(x):" in (kb.forward_as_function(plain, {}) or "")


def test_forward_stays_a_model_when_it_uses_anything_else() -> None:
    assert kb.forward_as_function("x = 1\n", {}) is None  # no Model
    assert (
        kb.forward_as_function("class Model:\n    def __init__(self):\n        pass\n", {}) is None
    )
    uses = {
        "self.scale": "a constant stored in __init__, not a parameter",
        "self.pair": "a tuple assignment",
        "nn.functional.relu(x)": "torch.nn",
        "F.relu(x)": "F",
        "helper(x)": "a module-level name",
        "self.other": "a parameter it was not given",
    }
    for expr, why in uses.items():
        src = MODEL.replace("return torch.sum(z, dim=self.dim) + self.eps + math.pi",
                            f"return {expr}")  # fmt: skip
        assert kb.forward_as_function(src, {"dim": 1, "eps": 1e-5}) is None, why
    assert kb.forward_as_function(MODEL, {"dim": 1}) is None  # eps is not a known scalar
    # builtins and names bound in the body are known
    src = MODEL.replace("return torch.sum(z, dim=self.dim) + self.eps + math.pi",
                        "w = abs(z)\n        return max(w.sum(), 0)")  # fmt: skip
    assert kb.forward_as_function(src, {"dim": 1, "eps": 1e-5}) is not None
    other_class = MODEL.replace("class Model(", "class Other(")
    assert kb.forward_as_function(other_class, {"dim": 1, "eps": 1e-5}) is None


def test_only_selfs_attributes_assigned_a_known_scalar_become_parameters() -> None:
    head = "import torch\nimport math\nclass Model:\n    scale_attr = 2\n"
    head += "    def __init__(self, dim, eps):\n"

    def fn(init: str, body: str) -> str | None:
        src = head + init + f"    def forward(self, x):\n        return {body}\n"
        return kb.forward_as_function(src, {"dim": 1, "eps": 1e-5})

    assert "return x.dim()" in (fn("        self.dim = dim\n", "x.dim()") or "")
    assert fn("        self.a = self.b = dim\n", "x + self.a") is None  # two targets
    assert fn("        self.cfg.size = dim\n        self.dim = dim\n", "x + self.dim") is not None
    assert fn("        other = object()\n        other.eps2 = eps\n", "x + self.eps2") is None
    assert fn("        self.m = math\n", "self.m.pi + x") is None  # not a constructor scalar


def test_imports_by_alias_submodule_or_from_are_known_and_carried() -> None:
    base = "class Model:\n    def forward(self, x):\n        return {body}\n"
    out = kb.forward_as_function("import math as m\n" + base.format(body="m.pi + x"), {})
    assert out is not None and "import math as m" in out
    out = kb.forward_as_function("import os.path\n" + base.format(body="os.path.sep + x"), {})
    assert out is not None and "import os.path" in out
    out = kb.forward_as_function("from math import pi\n" + base.format(body="pi + x"), {})
    assert out is not None and "from math import pi" in out
    f_src = "import torch.nn.functional as F\n" + base.format(body="F.relu(x)")
    assert kb.forward_as_function(f_src, {}) is None  # torch.nn.functional stays a Model


def test_a_weight_name_starting_with_a_letter_keeps_it() -> None:
    assert kb._arg_names(["w.0"], set()) == ["w_0"]
