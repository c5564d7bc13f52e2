"""The task spec (tools/task/spec.py), rule by rule: what task.toml may hold (each limit at its
boundary), how a hidden domain draws its cases, what a TaskSpec answers (dims, languages,
solutions, configs), and how a task is found and read (names, sizes, files that are no text).
The models alone where possible; no task is run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harnesslab.tools.errors import UsageError
from harnesslab.tools.task import spec
from harnesslab.tools.task.spec import (
    Case,
    FinalDomain,
    Language,
    Numerics,
    Objective,
    SizeRange,
    TaskSpec,
    Tolerance,
    first_line,
    is_shipped,
    list_tasks,
    load_task,
    parse_task,
    read_toml,
    tasks_root,
)

MAX_DIM = 2**31 - 1
MAX_TOML_BYTES = 1 << 20


def refused(model: type, **fields: Any) -> bool:
    try:
        model(**fields)
    except ValidationError:
        return True
    return False


def test_each_size_and_setting_is_held_to_its_range_at_the_boundary() -> None:
    assert not refused(SizeRange, min=1, max=MAX_DIM, multiple_of=1)
    assert not refused(SizeRange, min=1, max=1)
    assert refused(SizeRange, min=0, max=4) and refused(SizeRange, min=1, max=0)
    assert refused(SizeRange, min=MAX_DIM + 1, max=4) and refused(SizeRange, min=1, max=MAX_DIM + 1)
    assert refused(SizeRange, min=1, max=4, multiple_of=0)
    assert SizeRange(min=1, max=4).multiple_of == 1
    dom = {"dtypes": ["float16"]}
    assert not refused(FinalDomain, count=1, **dom) and not refused(FinalDomain, count=64, **dom)
    assert refused(FinalDomain, count=0, **dom) and refused(FinalDomain, count=65, **dom)
    assert FinalDomain(count=1, **dom).ranges == {}
    assert not refused(Tolerance, atol=0, rtol=0)
    assert refused(Tolerance, atol=-1e-9, rtol=0) and refused(Tolerance, atol=0, rtol=-1e-9)
    assert not refused(Case, name="a", dtype="float32", shape={"n": MAX_DIM})
    assert refused(Case, name="a", dtype="float64", shape={"n": 1})
    assert Case(name="a", dtype="float32", shape={"n": 1}).label() == "a"


def test_an_objectives_command_and_defaults_are_held_to_their_ranges() -> None:
    ok = {"command": "x"}
    assert refused(Objective, command="")
    for field, good, bad in (
        ("timeout_s", (1e-3, 86400), (0, 86400.5)),
        ("warmup", (0, 100), (-1, 101)),
        ("repeats", (1, 200), (0, 201)),
    ):
        for value in good:
            assert not refused(Objective, **ok, **{field: value}), (field, value)
        for value in bad:
            assert refused(Objective, **ok, **{field: value}), (field, value)
    for name in ("python", "warmup", "repeats", "cases", "cases_file", "task_dir"):
        assert Objective(command=f"run {{{name}}}").command == f"run {{{name}}}"
    with pytest.raises(ValidationError, match=r"unknown placeholder \{home\}"):
        Objective(command="cat {home}")


def test_unknown_keys_and_unknown_names_are_refused_not_ignored() -> None:
    assert refused(Objective, command="x", comand="y")
    assert refused(Language, editable=["k.py"], spaces={})
    assert refused(Language, editable=[])
    assert Language(editable=["k.py"]).editable == ["k.py"]
    assert refused(Numerics, skip=[], skipped=["odd_dims"])
    assert Numerics(skip=["odd_dims"]).skip == ["odd_dims"]
    with pytest.raises(ValidationError, match="numerics.skip: 'odd' is not one of"):
        Numerics(skip=["odd"])


DOMAIN = FinalDomain(
    count=4,
    dtypes=["float16", "bfloat16"],
    ranges={"rows": SizeRange(min=3, max=10, multiple_of=4)},
    choices={"dim": [8, 16]},
    require=[{"dim": 16}],
)


def test_a_domain_says_what_it_draws_from_without_drawing() -> None:
    assert DOMAIN.describe() == {
        "count": 4,
        "dtypes": ["float16", "bfloat16"],
        "ranges": {"rows": {"min": 3, "max": 10, "multiple_of": 4}},
        "choices": {"dim": [8, 16]},
        "always_includes": [{"dim": 16}],
    }


def test_a_draw_is_a_function_of_the_seed_and_keeps_to_the_domain() -> None:
    """Rule: same seed, same cases (a str seed and its bytes alike); sizes are multiples
    within the range (rounded inwards), the required shapes come first, every dtype appears
    in order before any is drawn at random."""
    cases = DOMAIN.draw("seed")
    assert [c.name for c in cases] == [
        "final0_8x16_fp16", "final1_8x16_bf16", "final2_8x16_fp16", "final3_4x8_bf16"
    ]  # fmt: skip
    assert DOMAIN.draw(b"seed") == cases and DOMAIN.draw("other") != cases
    assert [c.dtype for c in cases[:2]] == ["float16", "bfloat16"]
    many = DOMAIN.model_copy(update={"count": 64}).draw(7, prefix="x")
    assert {c.shape["rows"] for c in many} == {4, 8}
    assert {c.shape["dim"] for c in many} == {8, 16} and many[0].shape["dim"] == 16
    assert many[5].name.startswith("x5_") and len(many) == 64
    odd = FinalDomain(count=2, dtypes=["float32"], choices={"dim": [8]}, require=[{"dim": 24}])
    assert [c.name for c in odd.draw("s")] == ["final0_24_fp32", "final1_8_fp32"]


def test_a_spec_knows_its_dims_entry_objective_and_numerics(tmp_path: Path) -> None:
    task = load_task("rmsnorm_gate")
    assert task.dims() == {"rows", "dim"}
    assert task.entry_file == "kernel.py" and task.entry_function == "rmsnorm_gate"
    assert task.reference_path == task.root / "reference.py"
    assert task.objective_for("final").command == "true"  # a kernel task has none
    request = task.numerics_request()
    assert request == {"skip": list(task.numerics.skip), "max_dims": {"rows": 16384, "dim": 8192}}
    both = task.model_copy(
        update={"entry": "k.py:ns:f", "dev_cases": [],
                "final": DOMAIN.model_copy(update={"choices": {"dim": [8, 16], "e": []}}),
                "numerics": Numerics(skip=["odd_dims"])}
    )  # fmt: skip
    assert both.entry_function == "ns:f"
    assert both.dims() == {"rows", "dim", "e"}
    assert both.numerics_request() == {"skip": ["odd_dims"], "max_dims": {"rows": 10, "dim": 16}}
    assert both.model_copy(update={"final": None}).dims() == set()
    assert both.model_copy(update={"final": None}).numerics_request()["max_dims"] == {}
    one = parse_task(
        'name = "c"\nsummary = "s"\nkind = "command"\neditable = ["a"]\nobjective = "go"\n',
        tmp_path,
    )
    assert one.objective_for("dev").command == "go" and one.dev_cases == []


def test_a_language_view_has_its_own_files_space_template_and_brief() -> None:
    task = load_task("rmsnorm_gate")
    assert task.for_language("triton") is task
    assert task.workspace_template == task.root / "workspace"
    assert task.brief_path() == task.root / "task.md"
    cuda = task.for_language("cuda")
    lang = task.languages["cuda"]
    assert (cuda.language, cuda.editable, cuda.space, cuda.config_rules) == (
        "cuda", lang.editable, lang.space, lang.config_rules
    )  # fmt: skip
    assert cuda.workspace_template == task.root / "workspace_cuda"
    assert cuda.brief_path() == task.root / "task_cuda.md"
    assert cuda.for_language("cuda") is cuda
    hip = task.model_copy(update={"languages": {**task.languages, "hip": lang}})
    for view, language in ((task, "rust"), (cuda, "triton"), (hip.for_language("cuda"), "hip")):
        with pytest.raises(UsageError, match=f"has no '{language}' version"):
            view.for_language(language)


def test_solutions_are_listed_per_language_without_private_files(tmp_path: Path) -> None:
    task = load_task("rmsnorm_gate")
    assert list(task.solutions()) == ["fast"]
    assert list(task.solutions("cuda")) == ["cuda_rmsnorm_gate"]
    assert list(task.for_language("cuda").solutions()) == ["cuda_rmsnorm_gate"]
    copy = task.model_copy(update={"root": tmp_path})
    assert copy.solutions() == {}
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "_helper.py").write_text("")
    (tmp_path / "solutions" / "b.py").write_text("")
    assert list(copy.solutions()) == ["b"]


def test_a_dev_case_is_found_by_name_or_refused_with_the_names() -> None:
    task = load_task("rmsnorm_gate")
    assert task.dev_case("768x2048_fp16").shape == {"rows": 768, "dim": 2048}
    with pytest.raises(UsageError, match="unknown case 'nope'") as err:
        task.dev_case("nope")
    assert "1024x1024_fp16" in err.value.next_step


def test_a_config_holds_only_allowed_values_of_the_same_type() -> None:
    task = load_task("rmsnorm_gate").model_copy(update={"space": {"num_warps": [4, 8]}})
    task.validate_config({"num_warps": 4, "_note": "x", "own_knob": 3})
    for bad in (True, 4.0, 2, "4"):
        with pytest.raises(UsageError, match=f"num_warps={bad!r} is not one of 4,8"):
            task.validate_config({"num_warps": bad})
    with pytest.raises(UsageError, match=r"^kernel_config.json: num_warps=2"):
        task.validate_config({"num_warps": 2}, source="kernel_config.json")
    with pytest.raises(UsageError, match=r"^num_warps=2"):
        task.validate_config({"num_warps": 2})
    spaced = task.model_copy(update={"space": {"_private": [1]}})
    spaced.validate_config({"_private": 5})  # underscored keys are notes, never checked


def test_shipped_tasks_are_found_by_name_only(tmp_path: Path) -> None:
    assert list_tasks() == ["decode_step", "matmul", "rmsnorm_gate", "softmax", "swiglu"]
    assert is_shipped(load_task("softmax"))
    for name in ("nope", "decode_step/../rmsnorm_gate"):
        with pytest.raises(UsageError, match="unknown task"):
            load_task(name)
    with pytest.raises(UsageError, match="has no task.toml"):
        load_task(tmp_path)
    folder = tmp_path / "softmax"
    shutil.copytree(tasks_root() / "softmax", folder)
    copy = load_task(folder)
    assert copy.name == "softmax" and not is_shipped(copy)


def test_a_declared_task_folder_must_hold_its_reference(tmp_path: Path) -> None:
    (tmp_path / "task.toml").write_text(
        'name = "d"\nsummary = "s"\nkind = "kernel"\nentry = "kernel.py:f"\n'
        'editable = ["kernel.py"]\ndtypes = ["float16"]\n'
        "[tolerances.float16]\natol = 1e-2\nrtol = 1e-2\n"
        '[[dev_cases]]\ndtype = "float16"\nshape = { rows = 4 }\n'
        '[final]\ncount = 1\ndtypes = ["float16"]\nranges = { rows = { min = 1, max = 8 } }\n'
        '[declare]\nreference = "ref.py:f"\ninputs = [{ name = "x", shape = ["rows"] }]\n'
        'output = { shape = ["rows"] }\n'
    )
    with pytest.raises(UsageError, match="task.toml: declare.reference: ref.py"):
        load_task(tmp_path)
    (tmp_path / "ref.py").write_text("def f(x):\n    return x\n")
    task = load_task(tmp_path)
    assert task.dev_cases[0].name == "4_fp16"  # a case without a name is named by its shape


def test_task_toml_is_read_only_as_a_regular_utf8_file_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "task.toml"
    text = "#" + "x" * (MAX_TOML_BYTES - 3) + "\na"
    path.write_text(text)
    assert read_toml(path) == text
    path.write_text(text + "b")
    with pytest.raises(UsageError, match="is over 1048576 bytes"):
        read_toml(path)
    path.write_bytes(b"a\xffb")
    with pytest.raises(UsageError, match=r"not UTF-8 text \(byte 1\)"):
        read_toml(path)
    with pytest.raises(UsageError, match="cannot be read"):
        read_toml(tmp_path / "missing.toml")
    with pytest.raises(UsageError, match="is not a regular file"):
        read_toml(Path(os.devnull))


def test_task_toml_text_that_is_no_task_is_one_usage_error(tmp_path: Path) -> None:
    comment = "#" + "x" * (MAX_TOML_BYTES - 1)
    with pytest.raises(UsageError, match="title|name"):  # within the limit: parsed, no task
        parse_task(comment, tmp_path)
    for text, message in (
        (comment + "x", "is over 1048576 bytes"),
        ("a = [", "not valid TOML"),
        ("a = " + "9" * 5000, "an integer too long"),
        ('name = "x"\nsummary = "s"\nkind = "kernel"\neditable = 3\n', "editable"),
    ):
        with pytest.raises(UsageError, match=message):
            parse_task(text, tmp_path)


def test_a_messages_first_line_is_three_lines_joined_and_capped() -> None:
    assert first_line(ValueError("a\nb\nc\nd")) == "a; b; c"
    assert len(first_line(ValueError("x" * 400))) == 300
    assert first_line(ValueError("")) == "ValueError"


def test_a_task_name_is_a_folder_name_and_cases_may_be_left_out(tmp_path: Path) -> None:
    text = 'name = "%s"\nsummary = "s"\nkind = "command"\neditable = ["a"]\nobjective = "go"\n'
    with pytest.raises(UsageError, match="task name 'Bad Name' must match"):
        parse_task(text % "Bad Name", tmp_path)
    direct = TaskSpec(name="c", summary="s", kind="command", editable=["a"], root=tmp_path,
                      objective="go")  # fmt: skip
    assert direct.dev_cases == []


def test_toml_nested_past_the_parsers_recursion_is_one_usage_error(tmp_path, monkeypatch) -> None:
    def too_deep(text: str) -> dict[str, Any]:
        raise RecursionError

    monkeypatch.setattr(spec.tomllib, "loads", too_deep)
    with pytest.raises(UsageError, match="nested too deeply"):
        parse_task("a = 1", tmp_path)


def test_a_named_case_keeps_its_name(tmp_path: Path) -> None:
    text = (load_task("rmsnorm_gate").root / "task.toml").read_text()
    assert parse_task(text, tmp_path).dev_cases[0].name == "1024x1024_fp16"


# Last: a real recursion (5000 nested arrays) also ends line tracing, which the mutation driver
# uses to find the lines the tests above run.
def test_toml_nested_five_thousand_deep_is_one_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="nested too deeply"):
        parse_task("a = " + "[" * 5000 + "]" * 5000, tmp_path)
