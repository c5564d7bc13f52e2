"""A declared task's reference (tools/gpu/declared.py) on small declarations, in this process.

The GPU host stages declared.py as reference.py beside declaration.json and reads the
declaration from the folder the file sits in. Here the real file is run (its code, so a mutant
of it is what runs) as if it were staged: the module's spec places it in a stage folder (its
`__file__`, hence HERE), while its loader reads the source from the package. Each test pins one
rule: how an input is drawn, what the reference is called on, what the output must be, the
default bytes and flops, the interpreter's dims, the batch dim."""

from __future__ import annotations

import json
import math
import uuid
from importlib.machinery import ModuleSpec, SourceFileLoader
from importlib.util import module_from_spec
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import declared as package_copy

SOURCE = Path(package_copy.__file__).resolve()


def staged(tmp_path: Path, decl: dict[str, Any], files: dict[str, str]) -> ModuleType:
    """declared.py as the GPU host loads it: beside `decl` (declaration.json) and `files`."""
    stage = tmp_path / f"stage_{uuid.uuid4().hex[:8]}"
    stage.mkdir()
    (stage / "declaration.json").write_text(json.dumps(decl))
    for name, text in files.items():
        (stage / name).write_text(text)
    name = f"_declared_{uuid.uuid4().hex}"
    spec = ModuleSpec(name, SourceFileLoader(name, str(SOURCE)), origin=str(stage / "reference.py"))
    spec.has_location = True
    mod = module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    assert mod.HERE == stage
    return mod


ADD = "def add(x, y, alpha=1.0):\n    return x + alpha * y\n"


def function_task(tmp_path: Path, **over: Any) -> ModuleType:
    decl = {
        "inputs": [{"name": "x", "shape": ["n", "m"]}, {"name": "y", "shape": ["n", "m"]}],
        "output": {"shape": ["n", "m"]},
        "reference": {"entry": "ref.py:add"},
        **over,
    }
    return staged(tmp_path, decl, {"ref.py": ADD})


def gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- evaluate -----------------------------------------------------------------------------------
def test_an_expression_is_arithmetic_over_dims_and_nothing_else() -> None:
    ev = package_copy.evaluate
    assert ev(7, {}) == 7 and ev(2.5, {}) == 2.5 and ev(math.inf, {}) == math.inf
    dims = {"a": 7, "b": 2}
    assert [ev(e, dims) for e in ("a+b", "a-b", "a*b", "a//b", "a/b", "a**b", "a%b", "-a")] == [
        9, 5, 14, 3, 3.5, 49, 1, -7,
    ]  # fmt: skip
    assert ev("3", dims) == 3 and ev("2*a - -b", dims) == 16 and ev("0.5 * a", dims) == 3.5
    for bad in ("len(a)", "a.real", "a[0]", "+a", "'a'", "a if b else 1", "a << b"):
        with pytest.raises(ValueError, match="unsupported expression"):
            ev(bad, dims)
    with pytest.raises(KeyError):
        ev("c", dims)


def test_the_package_copy_declares_nothing() -> None:
    assert package_copy.DECL == {} and package_copy.MODULE is None
    assert package_copy.BATCH_DIM is None


# -- drawing inputs -----------------------------------------------------------------------------
def test_inputs_take_their_shape_dtype_and_device_and_the_case_dtype_by_default(tmp_path) -> None:
    ref = function_task(
        tmp_path,
        inputs=[
            {"name": "x", "shape": ["n", "2*m"]},
            {"name": "i", "shape": [3, "m"], "dtype": "int64", "distribution": "randint"},
            {"name": "b", "shape": ["n"], "dtype": "bool", "distribution": "randint"},
        ],
    )
    (x, i, b), kwargs = ref.make_inputs({"n": 4, "m": 5}, torch.float16, "cpu", gen())
    assert kwargs == {}
    assert x.shape == (4, 10) and x.dtype == torch.float16
    assert i.shape == (3, 5) and i.dtype == torch.int64 and b.dtype == torch.bool
    assert x.is_contiguous() and x.device.type == "cpu"
    (x, _, _), _ = ref.make_inputs({"n": 4, "m": 5}, torch.float16, "meta", gen())
    assert x.is_meta and x.dtype == torch.float16  # drawn where the generator is, then moved
    assert ref.FIXED_DTYPES == {
        "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
        "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
    }  # fmt: skip


def test_the_same_generator_draws_the_same_inputs(tmp_path) -> None:
    ref = function_task(tmp_path)
    shape = ref._shape({"shape": [64]}, {})
    for dist in ("randint", "uniform", "normal"):
        d = {"distribution": dist, "high": 1000}
        assert torch.equal(ref._draw(d, shape, gen(5)), ref._draw(d, shape, gen(5))), dist
    a, _ = ref.make_inputs({"n": 8, "m": 8}, torch.float32, "cpu", gen(3))
    b, _ = ref.make_inputs({"n": 8, "m": 8}, torch.float32, "cpu", gen(3))
    c, _ = ref.make_inputs({"n": 8, "m": 8}, torch.float32, "cpu", gen(4))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[0], a[1])


def test_draws_are_made_on_the_generators_device_whatever_torchs_default_is(tmp_path) -> None:
    """On a GPU host the generator is CUDA's and torch's default device the CPU (or what a
    reference set); here a CPU generator under a meta default stands in for that."""
    ref = function_task(tmp_path)
    shape = ref._shape({"shape": [64]}, {})
    want_seed = int(torch.randint(0, 2**62, (1,), generator=gen(2)))
    for dist in ("randint", "uniform", "normal"):
        d = {"distribution": dist, "high": 1000}
        with torch.device("meta"):
            drawn = ref._draw(d, shape, gen(5))
        assert drawn.device.type == "cpu" and torch.equal(drawn, ref._draw(d, shape, gen(5)))
    with torch.device("meta"), ref._seeded(gen(2), torch.device("cpu")):
        assert torch.initial_seed() == want_seed  # the seed drawn on the generator's device


def test_each_distribution_draws_within_its_declared_bounds(tmp_path) -> None:
    ref = function_task(tmp_path)
    shape = ref._shape({"shape": ["n"]}, {"n": 4000, "k": 9})
    assert shape == (4000,) and shape.dims == {"n": 4000, "k": 9}
    draw = lambda d: ref._draw(d, shape, gen())  # noqa: E731
    r = draw({"distribution": "randint"})  # [0, 2) by default
    assert set(r.unique().tolist()) == {0, 1}
    r = draw({"distribution": "randint", "low": 3, "high": "k"})  # a bound over dims
    assert set(r.unique().tolist()) == set(range(3, 9))
    r = draw({"distribution": "randint", "low": 5, "high": 5})  # an empty range: the low bound
    assert set(r.unique().tolist()) == {5}
    u = draw({"distribution": "uniform"})
    assert 0.0 <= float(u.min()) < 0.01 and 0.99 < float(u.max()) < 1.0
    u = draw({"distribution": "uniform", "low": -3, "high": "k - 7"})
    assert -3.0 <= float(u.min()) < -2.9 and 1.9 < float(u.max()) < 2.0
    n = draw({})
    assert abs(float(n.mean())) < 0.1 and 0.9 < float(n.std()) < 1.1
    n = draw({"distribution": "normal", "mean": 5, "scale": 0.5})
    assert abs(float(n.mean()) - 5) < 0.1 and 0.45 < float(n.std()) < 0.55


def test_scalars_and_sizes_among_them_are_keyword_arguments(tmp_path) -> None:
    ref = function_task(
        tmp_path,
        scalars={"alpha": 0.5},
        scalar_dims={"size": "2*m", "shape": ["n", "m"]},
    )
    _, kwargs = ref.make_inputs({"n": 3, "m": 5}, torch.float32, "cpu", gen())
    assert kwargs == {"alpha": 0.5, "size": 10, "shape": [3, 5]}


# -- inputs_from --------------------------------------------------------------------------------
INPUTS_FROM = """
import torch
n = 2
width = n * 3
shape = (n, width)
def get_inputs():
    return [torch.rand(shape), torch.rand(shape)]
def wrong_count():
    return [torch.rand(shape)]
def wrong_shape():
    return [torch.rand(shape), torch.rand(n)]
def not_a_tensor():
    return [torch.rand(shape), 3]
"""


def inputs_from_task(tmp_path: Path, call: str, constants=None) -> ModuleType:
    decl = {
        "inputs": [{"name": "a", "shape": ["n", "3*n"]}, {"name": "b", "shape": ["n", "3*n"]}],
        "output": {"shape": ["n", "3*n"]},
        "reference": {"entry": "ref.py:add"},
        "inputs_from": {"call": call, "constants": constants or {"n": "n"}},
    }
    return staged(tmp_path, decl, {"ref.py": ADD, "model.py": INPUTS_FROM})


def test_inputs_from_runs_the_files_function_at_the_cases_dims(tmp_path) -> None:
    ref = inputs_from_task(tmp_path, "model.py:get_inputs")
    (a, b), _ = ref.make_inputs({"n": 4}, torch.float16, "cpu", gen(1))
    assert a.shape == b.shape == (4, 12) and a.dtype == torch.float16  # width follows n
    assert 0 <= float(a.min()) and float(a.max()) < 1 and not torch.equal(a, b)
    again, _ = ref.make_inputs({"n": 4}, torch.float16, "cpu", gen(1))
    other, _ = ref.make_inputs({"n": 4}, torch.float16, "cpu", gen(2))
    assert torch.equal(a, again[0]) and not torch.equal(a, other[0])  # seeded by the generator
    # the file's draws come from torch's generator seeded with the case generator's next draw
    g = gen(1)
    seed = int(torch.randint(0, 2**62, (1,), generator=g))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        assert torch.equal(a, torch.rand(4, 12).half())
    ref.make_inputs({"n": 5}, torch.float32, "cpu", gen(1))
    assert len(ref._INPUT_FNS) == 2  # one load per set of constants
    ref.make_inputs({"n": 4}, torch.float32, "cpu", gen(1))
    assert len(ref._INPUT_FNS) == 2


def test_inputs_from_checks_what_the_function_made(tmp_path) -> None:
    for call, message in (
        ("wrong_count", "inputs_from made 1 inputs, the declaration has 2"),
        ("wrong_shape", r"inputs_from's input 1 is \(3,\), the declaration says \(3, 9\)"),
        ("not_a_tensor", "inputs_from's input 1 is int, the declaration says"),
    ):
        ref = inputs_from_task(tmp_path, f"model.py:{call}")
        with pytest.raises(ValueError, match=message):
            ref.make_inputs({"n": 3}, torch.float32, "cpu", gen())


def test_a_list_constant_is_a_tuple_at_the_cases_dims(tmp_path) -> None:
    ref = inputs_from_task(tmp_path, "model.py:get_inputs", {"n": "n", "shape": ["n", "3*n"]})
    (a, _), _ = ref.make_inputs({"n": 2}, torch.float32, "cpu", gen())
    assert a.shape == (2, 6)
    (mod_key,) = ref._INPUT_FNS
    assert json.loads(mod_key) == {"n": 2, "shape": [2, 6]}


def test_load_source_replaces_a_constant_right_after_the_file_assigns_it(tmp_path) -> None:
    path = tmp_path / "m.py"
    path.write_text("a = 1\nb = a * 10\na, c = (a, 7)\nd: int = 4\ne = 1\ne += d\ndef f(): pass\n")
    mod = package_copy.load_source(path, f"_m_{uuid.uuid4().hex}", {"a": 2, "d": 5, "e": 0})
    assert (mod.a, mod.b, mod.c, mod.d, mod.e) == (2, 20, 7, 5, 0)
    assert mod.__file__ == str(path)
    plain = package_copy.load_source(path, f"_m_{uuid.uuid4().hex}")
    assert (plain.a, plain.b, plain.e) == (1, 10, 5)
    path.write_text(DATACLASS)  # a dataclass needs its module registered
    assert package_copy.load_source(path, f"_m_{uuid.uuid4().hex}").scale(2.0) == 6.0


def test_assigned_names_are_what_a_statement_binds_at_module_level() -> None:
    import ast

    names = [package_copy.assigned_names(s) for s in ast.parse(
        "a = b = 1\nd, h, w = (16, 32, 32)\n[p, q] = 1, 2\nx: int = 1\ny += 1\nz.k = 1\n"
        "s[0] = 1\nprint(1)\n"
    ).body]  # fmt: skip
    assert names == [{"a", "b"}, {"d", "h", "w"}, {"p", "q"}, {"x"}, {"y"}, set(), set(), set()]


# -- the reference --------------------------------------------------------------------------------
def test_the_reference_runs_on_fp32_copies_and_returns_fp32(tmp_path) -> None:
    ref = function_task(tmp_path, scalars={"alpha": 2.0})
    (x, y), kwargs = ref.make_inputs({"n": 3, "m": 4}, torch.float16, "cpu", gen())
    out = ref.reference(x, y, **kwargs)
    assert out.dtype == torch.float32
    assert torch.equal(out, x.float() + 2.0 * y.float())
    x64, y64 = x.double(), y.double()
    assert ref.reference(x64, y64).dtype == torch.float64  # fp64 stays fp64
    assert torch.equal(ref.reference(2.0, y), 2.0 + y.float())  # a number is passed as is
    i = torch.arange(4)
    assert ref.reference(i, i, alpha=1).dtype == torch.int64  # integers are not made floats


def test_a_reference_that_returns_no_tensor_is_refused(tmp_path) -> None:
    decl = {"inputs": [{"name": "x", "shape": ["n"]}], "output": {"shape": ["n"]},
            "reference": {"entry": "ref.py:pair"}}  # fmt: skip
    ref = staged(tmp_path, decl, {"ref.py": "def pair(x):\n    return x, x\n"})
    with pytest.raises(TypeError, match="returned tuple, expected one tensor"):
        ref.reference(torch.ones(2))


def test_the_reference_is_called_without_autograd(tmp_path) -> None:
    decl = {"inputs": [{"name": "x", "shape": ["n"]}], "output": {"shape": ["n"]},
            "reference": {"entry": "ref.py:grad"}}  # fmt: skip
    text = (
        "import torch\ndef grad(x):\n    return torch.full((1,), float(torch.is_grad_enabled()))\n"
    )
    ref = staged(tmp_path, decl, {"ref.py": text})
    assert float(ref.reference(torch.ones(2))) == 0.0


MODEL = """
import torch
class Model(torch.nn.Module):
    def __init__(self, n_in, n_out, pad=(0, 0)):
        super().__init__()
        self.lin = torch.nn.Linear(n_in, n_out)
        self.bn = torch.nn.BatchNorm1d(n_out)
        self.pad = pad
    def forward(self, x):
        assert isinstance(self.pad, tuple)
        return self.bn(self.lin(x))
"""


def module_task(tmp_path: Path, **reference: Any) -> ModuleType:
    decl = {
        "inputs": [
            {"name": "x", "shape": ["batch", "n_in"]},
            {"name": "w", "shape": ["n_out", "n_in"], "distribution": "init"},
            {"name": "b", "shape": ["n_out"], "distribution": "init"},
        ],
        "output": {"shape": "reference"},
        "scalar_dims": {"n_in": "n_in", "n_out": "n_out"},
        "scalars": {"pad": [1, 2]},
        "reference": {"entry": "model.py:Model", "kind": "module",
                      "params": ["lin.weight", "lin.bias"], "init": ["n_in", "n_out", "pad"],
                      **reference},
    }  # fmt: skip
    return staged(tmp_path, decl, {"model.py": MODEL})


def test_a_module_reference_is_built_once_under_its_seed_its_parameters_the_last_inputs(
    tmp_path,
) -> None:
    ref = module_task(tmp_path, seed=7)
    assert ref.MODULE == {"params": ["lin.weight", "lin.bias"], "init": ["n_in", "n_out", "pad"],
                          "seed": 7, "train": True}  # fmt: skip
    dims = {"batch": 6, "n_in": 5, "n_out": 3}
    (x, w, b), kwargs = ref.make_inputs(dims, torch.float32, "cpu", gen(1))
    assert w.shape == (3, 5) and b.shape == (3,) and kwargs["pad"] == [1, 2]
    # the parameters are the Model's own initialiser's, drawn under a seed from the generator
    (_, w2, _), _ = ref.make_inputs(dims, torch.float32, "cpu", gen(1))
    (_, w3, _), _ = ref.make_inputs(dims, torch.float32, "cpu", gen(2))
    assert torch.equal(w, w2) and not torch.equal(w, w3)
    assert float(w.abs().max()) <= 1 / math.sqrt(5)  # Linear's uniform(-1/sqrt(in), 1/sqrt(in))
    out = ref.reference(x, w, b, **kwargs)
    lin = x @ w.T + b
    expected = (lin - lin.mean(0)) / torch.sqrt(lin.var(0, unbiased=False) + 1e-5)
    assert torch.allclose(out, expected, atol=1e-5)  # train mode: the batch's statistics
    ref.reference(x, w, b, **kwargs)
    (model,) = ref._MODULES.values()  # built once, in fp32 for fp32 inputs
    assert model.lin.weight.dtype == torch.float32
    assert int(model.bn.num_batches_tracked) == 0  # each call starts from the Model's buffers
    assert float(model.bn.running_mean.abs().max()) == 0.0
    torch.manual_seed(7)
    own = torch.nn.Linear(5, 3)
    assert torch.equal(model.lin.weight, own.weight)  # the task's seed


def test_the_same_seed_builds_the_same_model_and_leaves_the_global_generator_alone(
    tmp_path,
) -> None:
    ref = module_task(tmp_path, seed=3)
    torch.manual_seed(100)
    model = ref._module({"n_in": 5, "n_out": 3, "pad": [0, 0]}, torch.device("cpu"), torch.float32)
    after = torch.randn(1)
    torch.manual_seed(100)
    assert torch.equal(after, torch.randn(1))  # forked: the caller's generator untouched
    torch.manual_seed(3)
    assert torch.equal(model.lin.weight, torch.nn.Linear(5, 3).weight)
    assert model.training


def test_an_eval_mode_module_keeps_its_running_statistics(tmp_path) -> None:
    ref = module_task(tmp_path, mode="eval")
    assert ref.MODULE["train"] is False and ref.MODULE["seed"] == 0
    dims = {"batch": 6, "n_in": 5, "n_out": 3}
    (x, w, b), kwargs = ref.make_inputs(dims, torch.float32, "cpu", gen(1))
    out = ref.reference(x, w, b, **kwargs)
    assert torch.allclose(out, (x @ w.T + b) / math.sqrt(1 + 1e-5), atol=1e-5)
    (model,) = ref._MODULES.values()
    assert not model.training
    torch.manual_seed(0)  # the default seed
    assert torch.equal(model.lin.weight, torch.nn.Linear(5, 3).weight)


def test_fp64_inputs_get_an_fp64_model(tmp_path) -> None:
    ref = module_task(tmp_path)
    dims = {"batch": 4, "n_in": 5, "n_out": 3}
    (x, w, b), kwargs = ref.make_inputs(dims, torch.float64, "cpu", gen(1))
    assert x.dtype == w.dtype == torch.float64
    assert ref.reference(x, w, b, **kwargs).dtype == torch.float64
    (model,) = [m for k, m in ref._MODULES.items() if "float64" in k]
    assert model.lin.weight.dtype == torch.float64
    assert ref.init_value([1, 2]) == (1, 2) and ref.init_value(3) == 3


def test_a_drawn_parameter_follows_its_distribution_not_the_initialiser(tmp_path) -> None:
    decl = {
        "inputs": [{"name": "x", "shape": ["batch", "n_in"]},
                   {"name": "w", "shape": ["n_out", "n_in"], "distribution": "init"},
                   {"name": "b", "shape": ["n_out"], "distribution": "uniform", "low": 5,
                    "high": 6}],
        "output": {"shape": "reference"},
        "scalar_dims": {"n_in": "n_in", "n_out": "n_out"},
        "reference": {"entry": "model.py:Model", "kind": "module",
                      "params": ["lin.weight", "lin.bias"]},
    }  # fmt: skip
    ref = staged(tmp_path, decl, {"model.py": MODEL})
    (_, w, b), _ = ref.make_inputs({"batch": 2, "n_in": 5, "n_out": 3}, torch.float32, "cpu", gen())
    assert float(w.abs().max()) <= 1 / math.sqrt(5)  # the initialiser's
    assert float(b.min()) >= 5  # as declared


# -- the output ---------------------------------------------------------------------------------
def test_the_output_spec_is_the_declared_shape_in_the_cases_or_a_fixed_dtype(tmp_path) -> None:
    ref = function_task(tmp_path, output={"shape": ["m", "2*n"]})
    x = torch.ones(3, 4, dtype=torch.float16)
    assert ref.output_spec(x, x) == ((4, 6), torch.float16)
    ref = function_task(tmp_path, output={"shape": ["n"], "dtype": "int32"})
    assert ref.output_spec(x, x) == ((3,), torch.int32)


def test_the_case_dtype_skips_fixed_inputs_and_defaults_to_fp32(tmp_path) -> None:
    ref = function_task(
        tmp_path,
        inputs=[{"name": "i", "shape": ["n"], "dtype": "int64"}, {"name": "x", "shape": ["n"]},
                {"name": "y", "shape": ["n"]}],
        output={"shape": ["n"]},
    )  # fmt: skip
    i, x, y = torch.ones(2, dtype=torch.int64), torch.ones(2, dtype=torch.bfloat16), torch.ones(2)
    assert ref._case_dtype((i, x, y)) == torch.bfloat16
    assert ref._case_dtype((i, 3.0, y)) == torch.float32
    assert ref._case_dtype((i,)) == torch.float32


def test_a_derived_output_is_the_references_on_meta_tensors(tmp_path) -> None:
    decl = {"inputs": [{"name": "x", "shape": ["n", "m"]},
                       {"name": "i", "shape": ["k"], "dtype": "int64"}],
            "output": {"shape": "reference"}, "reference": {"entry": "ref.py:pick"},
            "scalar_dims": {"rows": "k"}}  # fmt: skip
    text = (
        "import torch\n"
        "def pick(x, i, rows):\n"
        "    assert x.dtype == torch.float32 and i.dtype == torch.int64 and rows == i.shape[0]\n"
        "    assert x.is_meta and i.is_meta  # no memory for the shape\n"
        "    return x.t()[:rows]\n"
    )
    ref = staged(tmp_path, decl, {"ref.py": text})
    x, i = torch.ones(3, 5, dtype=torch.float16), torch.zeros(2, dtype=torch.int64)
    assert ref.output_spec(x, i, rows=2) == ((2, 3), torch.float16)
    # bytes: x (15 elements) and the output at the case's width, the int64 index at its own
    assert ref.bytes_moved({"n": 3, "m": 5, "k": 2}, 2) == 15 * 2 + 2 * 8 + 6 * 2
    assert ref.flops({"n": 3, "m": 5, "k": 2}) == 6


def test_dims_are_read_back_from_the_first_input_that_names_them(tmp_path) -> None:
    ref = function_task(
        tmp_path,
        inputs=[{"name": "x", "shape": ["n", 4, "2*m"]}, {"name": "y", "shape": ["m", "n"]}],
    )
    assert ref._dims_of((torch.ones(3, 4, 10), torch.ones(5, 7))) == {"n": 3, "m": 5}


# -- bytes, flops, the interpreter, the batch ---------------------------------------------------
def test_default_bytes_count_each_input_and_the_output_once(tmp_path) -> None:
    ref = function_task(
        tmp_path,
        inputs=[{"name": "x", "shape": ["n", "m"]},
                {"name": "i", "shape": ["n"], "dtype": "int32"}],
        output={"shape": ["m"], "dtype": "bool"},
    )  # fmt: skip
    assert ref.bytes_moved({"n": 3, "m": 5}, 2) == 15 * 2 + 3 * 4 + 5 * 1
    assert ref.flops({"n": 3, "m": 5}) == 5
    ref = function_task(tmp_path)
    assert ref.bytes_moved({"n": 3, "m": 5}, 4) == 3 * 15 * 4  # x, y and the output
    assert ref.flops({"n": 3, "m": 5}) == 15
    assert ref._numel(()) == 1 and ref._numel((2, 3, 4)) == 24


def test_declared_bytes_and_flops_are_formulas_over_dims(tmp_path) -> None:
    ref = function_task(tmp_path, bytes="3 * n * m * dtype_bytes", flops="2 * n * m + 1")
    assert ref.bytes_moved({"n": 3, "m": 5}, 2) == 90
    assert ref.flops({"n": 3, "m": 5}) == 31
    ref = function_task(tmp_path, bytes="n / 2", flops="m / 2")
    assert ref.bytes_moved({"n": 3, "m": 5}, 2) == 1 and ref.flops({"n": 3, "m": 5}) == 2


def test_the_interpreter_caps_the_dims_unless_one_is_declared(tmp_path) -> None:
    ref = function_task(tmp_path)
    assert ref.interpreter_shape({"n": 4096, "m": 64, "k": 3}) == {"n": 64, "m": 64, "k": 3}
    ref = function_task(tmp_path, interpreter_cap=8, interpreter={"m": 100})
    assert ref.interpreter_shape({"n": 4096, "m": 64, "k": 3}) == {"n": 8, "m": 100, "k": 3}


def test_the_batch_dim_is_the_first_inputs_first_axis_when_it_names_a_dim(tmp_path) -> None:
    assert function_task(tmp_path).BATCH_DIM == "n"
    for first in ([4, "n"], ["2*n", "m"], []):
        ref = function_task(
            tmp_path, inputs=[{"name": "x", "shape": first}, {"name": "y", "shape": ["n"]}]
        )
        assert ref.BATCH_DIM is None, first


DATACLASS = (
    "from __future__ import annotations\nimport dataclasses\n"
    "@dataclasses.dataclass\nclass Scale:\n    k: float = 3.0\n"
    "def scale(x):\n    return x * Scale().k\n"
)


def test_the_reference_file_is_a_module_by_its_name(tmp_path) -> None:
    text = DATACLASS
    decl = {"inputs": [{"name": "x", "shape": ["n"]}], "output": {"shape": ["n"]},
            "reference": {"entry": "ref.py:scale"}}  # fmt: skip
    ref = staged(tmp_path, decl, {"ref.py": text})  # a dataclass needs its module registered
    assert torch.equal(ref.reference(torch.ones(2)), torch.full((2,), 3.0))


def test_a_reference_that_is_no_python_file_cannot_be_loaded(tmp_path) -> None:
    decl = {"inputs": [{"name": "x", "shape": ["n"]}], "output": {"shape": ["n"]},
            "reference": {"entry": "ref.txt:scale"}}  # fmt: skip
    with pytest.raises(ImportError, match="cannot load the reference ref.txt"):
        staged(tmp_path, decl, {"ref.txt": DATACLASS})


MASKED = MODEL.replace("def forward(self, x):", "def forward(self, x, mask):").replace(
    "return self.bn(self.lin(x))", "return self.bn(self.lin(x)) * mask[:, None]"
)


def test_one_fp64_input_makes_the_model_fp64(tmp_path) -> None:
    decl = {
        "inputs": [
            {"name": "x", "shape": ["batch", "n_in"]},
            {"name": "mask", "shape": ["batch"], "dtype": "bool", "distribution": "randint"},
            {"name": "w", "shape": ["n_out", "n_in"], "distribution": "init"},
            {"name": "b", "shape": ["n_out"], "distribution": "init"},
        ],
        "output": {"shape": "reference"},
        "scalar_dims": {"n_in": "n_in", "n_out": "n_out"},
        "reference": {"entry": "model.py:Model", "kind": "module",
                      "params": ["lin.weight", "lin.bias"]},
    }  # fmt: skip
    ref = staged(tmp_path, decl, {"model.py": MASKED})
    dims = {"batch": 4, "n_in": 5, "n_out": 3}
    args, kwargs = ref.make_inputs(dims, torch.float64, "cpu", gen(1))
    assert args[1].dtype == torch.bool
    assert ref.reference(*args, **kwargs).dtype == torch.float64
    (model,) = ref._MODULES.values()
    assert model.bn.running_mean.dtype == torch.float64
