"""The KernelBench import's reading of a file's constants and its naming of axes
(tools/task/kernelbench_sizes.py), rule by rule on small sources and made-up runs, without
running a file: which constants are literals and sizes, which feed the constructor, how dims are
tied and made, the perturbed runs, and the expression fitted to an axis. The import on real files
is tests/tasks/test_kernelbench_sizes.py."""

from __future__ import annotations

import ast

from harnesslab.tools.authoring import kernelbench_sizes as ks


def lit(src: str):
    return ks._literal(ast.parse(src, mode="eval").body)


def test_a_literal_is_an_integer_or_a_tuple_of_integers_written_with_literals() -> None:
    assert lit("1024 * 2") == 2048
    assert lit("(3, 4 + 1)") == (3, 5)
    assert lit("()") == ()
    assert lit("2.5") is None and lit("True") is None and lit("'a'") is None
    assert lit("(3, 2.5)") is None and lit("(3, True)") is None  # every element an int
    assert lit("n * 2") is None and lit("1 // 0") is None


def test_user_error_is_the_first_line_of_the_exception_at_most_200_characters() -> None:
    assert ks.user_error(ValueError("bad\nmore")) == "ValueError: bad"
    assert ks.user_error(KeyError("x" * 300)) == ("KeyError: '" + "x" * 300)[:200]
    assert ks.Refused("no way").next_step == ""


SOURCE = """
import torch
a = 4
b = a * 2
c, d = (5, 6)
e, f = (7, 8, 9)
g, h = k = (1, 2)
[i, j] = 10, 11
m = 12
m += 1
n: int = 30
o = 2 ** 4
size = 64
width = 3
lone = (2,)

def get_init_inputs():
    return [size * width, feat]

feat = base + 1
base = 40
other = 50
"""


def test_constants_are_module_level_literal_bindings_the_last_winning() -> None:
    values, init = ks._constants(SOURCE)
    assert values["a"] == 4 and values["b"] is None  # computed from another name
    assert (values["c"], values["d"]) == (5, 6)
    assert values["e"] is None and values["f"] is None  # three values for two names
    assert (values["g"], values["h"]) == (1, 2) and values["k"] == (1, 2)
    assert (values["i"], values["j"]) == (10, 11)
    assert values["m"] is None  # an augmented assignment: not a literal any more
    assert values["n"] == 30 and values["o"] == 16
    # what get_init_inputs() reads, directly or through the names they are computed from
    assert init == {"size", "width", "feat", "base"}
    assert ks.constructor_constants(SOURCE) == init


def test_a_size_is_an_integer_above_1_or_a_tuple_of_positive_integers_one_above_1() -> None:
    assert ks._is_size(2) and not ks._is_size(1) and not ks._is_size(0)
    assert not ks._is_size(True) and not ks._is_size(2.0)
    assert ks._is_size((1, 2)) and not ks._is_size((1, 1)) and not ks._is_size(())
    assert not ks._is_size((0, 4)) and not ks._is_size((2, 2.0))


def test_size_constants_are_sizes_and_constructor_ones_only_from_16_on() -> None:
    sizes = ks.size_constants(SOURCE)
    assert sizes == {
        "a": 4,
        "c": 5,
        "d": 6,
        "h": 2,
        "k": (1, 2),
        "i": 10,
        "j": 11,
        "n": 30,
        "o": 16,
        "size": 64,
        "lone": (2,),
        "base": 40,
        "other": 50,
    }  # fmt: skip  (width 3 feeds the constructor: below 16, a kernel size; g = 1 is no size)
    src = (
        "x = (4, 16)\ny = (4, 8)\nz = 16\nw = 15\ndef get_init_inputs():\n    return [x, y, z, w]\n"
    )
    assert ks.size_constants(src) == {"x": (4, 16), "z": 16}


def test_sizes_name_a_dim_per_constant_and_tie_equal_values_when_asked() -> None:
    consts = {"batch": 8, "dim": 8, "shape": (8, 1, 4), "one": (16,), "fixed": 99}
    s = ks.Sizes.of(consts, fixed={"fixed"}, tie=False, init_fed={"shape", "dim"})
    assert s.constants == {"batch": "batch", "dim": "dim", "shape": ["shape_0", 1, "shape_2"],
                           "one": ["one"]}  # fmt: skip
    assert s.dims == {"batch": 8, "dim": 8, "shape_0": 8, "shape_2": 4, "one": 16}
    assert s.init_dims == {"dim", "shape_0", "shape_2"}
    tied = ks.Sizes.of(consts, fixed={"fixed"}, tie=True, init_fed={"dim"})
    assert tied.constants["dim"] == "batch" and tied.constants["shape"] == ["batch", 1, "shape_2"]
    assert tied.dims == {"batch": 8, "shape_2": 4, "one": 16}
    assert tied.init_dims == {"batch"}
    assert tied.values({"batch": 3, "shape_2": 5, "one": 7}) == {
        "batch": 3, "dim": 3, "shape": (3, 1, 5), "one": (7,),
    }  # fmt: skip


def test_the_runs_are_the_files_dims_then_three_perturbed_sets() -> None:
    s = ks.Sizes(dims={"H": 20, "W": 33})
    assert s.runs(0) == [
        {"H": 20, "W": 33},
        {"H": 96, "W": 112},
        {"H": 97, "W": 113},
        {"H": 99, "W": 116},
    ]
    assert s.runs(1) == [
        {"H": 20, "W": 33},
        {"H": 128, "W": 160},
        {"H": 130, "W": 162},
        {"H": 134, "W": 168},
    ]


RUNS = ks.Sizes(dims={"H": 20, "W": 33}).runs(0)


def test_an_axis_is_a_literal_a_dim_or_a_linear_expression_of_one() -> None:
    assert ks.fit([5, 5, 5, 5], RUNS) == 5
    assert ks.fit(["a", "a", "a", "a"], RUNS) == "a"
    assert ks.fit([20, 96, 97, 99], RUNS) == "H"
    assert ks.fit([33, 112, 113, 116], RUNS) == "W"
    assert ks.fit([40, 192, 194, 198], RUNS) == "2*H"
    assert ks.fit([23, 99, 100, 102], RUNS) == "H + 3"
    assert ks.fit([18, 94, 95, 97], RUNS) == "H - 2"
    assert ks.fit([-20, -96, -97, -99], RUNS) == "-1*H"
    assert ks.fit([66, 224, 226, 232], RUNS) == "2*W"


def test_an_axis_that_no_expression_fits_is_none() -> None:
    assert ks.fit([20, 96, 97, 100], RUNS) is None  # off in the last run only
    assert ks.fit([21, 96, 97, 99], RUNS) is None  # off at the file's sizes only
    assert ks.fit([20, 96.0, 97, 99], RUNS) is None  # not all integers
    assert ks.fit([1, 2, 2, 2], RUNS) is None  # moves, but with no dim
    assert ks.fit([10, 48, 48, 49], RUNS) is None  # (H) // 2: a floor
    steady = [{"H": 4}, {"H": 5}, {"H": 5}, {"H": 6}]  # no step between the 2nd and 3rd runs
    assert ks.fit([1, 2, 3, 4], steady) is None
    assert ks.fit([0, 3, 4, 6], [{"H": 0}, {"H": 3}, {"H": 5}, {"H": 9}]) is None  # 1 / 2


def test_constants_skip_statements_that_bind_nothing_and_other_functions() -> None:
    src = (
        "import torch\ntorch.manual_seed(0)\nq: int\np, r = divmod(7, 2)\n"
        "obj = None\nobj.attr, u = (33, 44)\nbatch = 64\n"
        "def get_inputs():\n    return [torch.rand(batch)]\n"
        "def get_init_inputs():\n    return [u]\n"
    )
    values, init = ks._constants(src)
    assert values["p"] is None and values["r"] is None and "q" not in values
    assert init == {"u"}  # get_inputs' names feed no constructor
    assert "" not in ks.size_constants(src) and ks.size_constants(src)["u"] == 44


def test_a_tuple_element_of_2_is_a_dim_and_of_1_a_literal() -> None:
    s = ks.Sizes.of({"shape": (2, 1, 8)}, fixed=set(), tie=False, init_fed=set())
    assert s.constants == {"shape": ["shape_0", 1, "shape_2"]}


def test_a_linear_fit_is_found_on_the_second_run_set_too() -> None:
    runs = ks.Sizes(dims={"H": 20, "W": 33}).runs(1)  # step 2 between the 2nd and 3rd runs
    assert ks.fit([r["W"] + 3 for r in runs], runs) == "W + 3"
