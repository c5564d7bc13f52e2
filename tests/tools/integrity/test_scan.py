"""The static scan's rules (integrity/scan.py), one at a time: every forbidden module, call
prefix, builtin, attribute, path and word gets its reason code and severity; what an honest
kernel does (its own folder's files, Triton inside @triton.jit, literal getattr) stays clean.
The tables are copied here on purpose: dropping an entry from scan.py must fail a test."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harnesslab.tools.integrity.scan import (
    Finding,
    ScanReport,
    integrity_rules,
    scan_sources,
    scan_workspace,
)
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace

HEADER = "import os, sys, time, math, json, glob, io, shutil, functools\nimport torch, triton\n"


def scan(body: str, **kw) -> ScanReport:
    src = HEADER + textwrap.dedent(body)
    return scan_sources({"kernel.py": src.encode()}, entry_function="kernel", **kw)


def found(body: str, **kw) -> set[tuple[str, str]]:
    return {(f.code, f.severity) for f in scan(body, **kw).findings}


# -- imports -------------------------------------------------------------------------------------
MODULES = {
    "threading": "concurrency", "_thread": "concurrency", "multiprocessing": "concurrency",
    "concurrent": "concurrency", "asyncio": "concurrency", "torch.multiprocessing": "concurrency",
    "subprocess": "subprocess", "pty": "subprocess", "gc": "introspection",
    "inspect": "introspection", "ctypes": "introspection", "cffi": "introspection",
    "traceback": "introspection", "dis": "introspection", "marshal": "introspection",
    "pickle": "introspection", "types": "introspection", "builtins": "introspection",
    "importlib": "dynamic_code", "numpy": "host_compute", "socket": "exfiltration",
    "urllib": "exfiltration", "http": "exfiltration", "cupy": "host_compute",
    "runner": "harness_access", "guard": "harness_access", "guard_child": "harness_access",
    "harnesslab": "harness_access", "__main__": "harness_access",
    "__mp_main__": "harness_access", "torch._C": "private_api",
    "torch.utils._python_dispatch": "private_api", "torch.overrides": "private_api",
    "triton.runtime.interpreter": "private_api", "triton.runtime.jit": "private_api",
    "triton.compiler": "private_api", "triton.backends": "private_api",
    "triton.knobs": "private_api", "torch.utils.cpp_extension": "host_extension",
    "numba": "host_extension", "pycuda": "host_extension", "cuda": "host_extension",
    "cuda_bindings": "host_extension", "cudadrv": "harness_access", "nvrtc": "harness_access",
    "cuda_source": "harness_access", "replay": "harness_access", "guard_gpu": "harness_access",
}  # fmt: skip
VERIFY = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "tools/gpu/verify").glob("*.py")
                if p.stem != "__init__")  # fmt: skip


@pytest.mark.parametrize("module", VERIFY)
def test_every_module_of_the_guarded_verify_is_harness_access_to_the_scan_and_the_child(
    module: str,
) -> None:
    """A kernel importing any of them reaches for the harness (guard_observer.IMPORT_CODES is
    the child's runtime list, FORBIDDEN_MODULES the scan's)."""
    from harnesslab.tools.gpu.verify import guard_observer

    assert ("harness_access", "reject") in found(f"import {module}\n")
    assert guard_observer.IMPORT_CODES.get(module) == "harness_access"


@pytest.mark.parametrize(("module", "code"), MODULES.items())
def test_every_forbidden_module_is_rejected_however_it_is_imported(module: str, code: str) -> None:
    assert (code, "reject") in found(f"import {module}\n")
    assert (code, "reject") in found(f"import {module}.sub as m\n")
    assert (code, "reject") in found(f"from {module} import thing\n")


def test_a_name_that_merely_starts_like_a_forbidden_module_is_fine() -> None:
    assert found("import threadingx\nimport guarded\nfrom numpyish import x\n") == set()


def test_a_module_whose_member_is_forbidden_is_rejected() -> None:
    assert ("private_api", "reject") in found("from torch import _C\n")
    assert ("concurrency", "reject") in found("from torch import multiprocessing\n")


def test_a_relative_import_reaches_for_the_harness() -> None:
    report = scan("from . import runner_helpers\n")
    assert ("harness_access", "reject") in {(f.code, f.severity) for f in report.findings}
    assert "relative import from '.'" in report.findings[0].detail


# -- calls and attributes ------------------------------------------------------------------------
PREFIXES = {
    "torch.nn.": "forbidden_call", "torch.special.": "forbidden_call",
    "torch.linalg.": "forbidden_call", "torch.compile": "forbidden_call",
    "torch.jit.": "forbidden_call", "torch.ops.": "private_api", "torch.library.": "private_api",
    "torch.cuda.Stream": "stream_creation", "torch.cuda.stream": "stream_creation",
    "torch.cuda.ExternalStream": "stream_creation", "torch.cuda.set_stream": "stream_creation",
    "torch.Stream": "stream_creation", "torch.cuda.graph": "stream_creation",
    "torch.from_numpy": "host_compute", "os.system": "subprocess", "os.popen": "subprocess",
    "os.fork": "concurrency", "os.exec": "subprocess", "os.spawn": "subprocess",
    "os.posix_spawn": "subprocess", "os.kill": "subprocess", "sys.": "introspection",
    "torch.utils.cpp_extension": "host_extension", "torch.cuda.jiterator": "host_extension",
}  # fmt: skip


@pytest.mark.parametrize(("prefix", "code"), PREFIXES.items())
def test_every_forbidden_call_prefix_is_rejected(prefix: str, code: str) -> None:
    name = prefix + "thing" if prefix.endswith(".") else prefix
    assert (code, "reject") in found(f"def kernel(x):\n    return {name}(1)\n")
    if not prefix.endswith("."):  # the name itself, and what starts with it
        assert (code, "reject") in found(f"def kernel(x):\n    return {prefix}v(1)\n")


def test_a_prefix_without_its_dot_is_the_module_itself() -> None:
    assert ("forbidden_call", "reject") in found("def kernel(x):\n    return torch.nn\n")
    assert found("def kernel(x):\n    return torch.nnx(1)\n") == set()


def test_calls_are_resolved_through_import_aliases() -> None:
    body = "import torch.nn.functional as F\nfrom os import system as run\n"
    body += "def kernel(x):\n    run('ls')\n    return F.silu(x)\n"
    assert found(body) == {("forbidden_call", "reject"), ("subprocess", "reject")}


@pytest.mark.parametrize(
    "name", ["sys.maxsize", "sys.float_info", "sys.version_info", "sys.byteorder"]
)
def test_the_harmless_sys_values_are_allowed(name: str) -> None:
    assert found(f"def kernel(x):\n    return {name}\n") == set()


def test_any_other_sys_attribute_is_introspection() -> None:
    assert found("def kernel(x):\n    return sys.argv\n") == {("introspection", "reject")}


def test_the_tasks_forbidden_calls_are_the_references_math() -> None:
    body = "def kernel(x):\n    return torch.rsqrt(x)\n"
    assert found(body) == set()
    report = scan(body, forbidden_calls=["torch.rsqrt"])
    (f,) = report.findings
    assert (f.code, f.severity, f.detail) == (
        "forbidden_call", "reject", "calls torch.rsqrt (the reference's math)",
    )  # fmt: skip


def test_private_torch_and_triton_names_are_rejected_but_dunders_are_not() -> None:
    assert found("def kernel(x):\n    return torch._foo.bar\n") == {("private_api", "reject")}
    assert found("def kernel(x):\n    return triton.language._x\n") == {("private_api", "reject")}
    assert found("def kernel(x):\n    return torch.__version__\n") == set()
    assert found("def kernel(x):\n    return json._default_decoder\n") == set()


@pytest.mark.parametrize(
    "name", ["exec", "eval", "compile", "__import__", "globals", "locals", "vars", "breakpoint"]
)
def test_dynamic_code_builtins_are_rejected(name: str) -> None:
    assert ("dynamic_code", "reject") in found(f"def kernel(x):\n    return {name}('x')\n")


def test_getattr_and_hasattr_need_a_literal_name_and_setattr_delattr_patch() -> None:
    assert found("def kernel(x):\n    return getattr(x, 'shape')\n") == set()
    assert found("def kernel(x):\n    return hasattr(x, 'shape')\n") == set()
    assert found("def kernel(x, n):\n    return getattr(x, n)\n") == {("dynamic_code", "reject")}
    assert found("def kernel(x):\n    return getattr(x)\n") == {("dynamic_code", "reject")}
    assert found("def kernel(x):\n    setattr(x, 'a', 1)\n") == {("monkey_patch", "reject")}
    assert found("def kernel(x):\n    delattr(x, 'a')\n") == {("monkey_patch", "reject")}
    assert found("def kernel(x):\n    return getattr(torch, '_C')\n") == {("private_api", "reject")}


DUNDERS = [
    "f_back", "f_locals", "f_globals", "f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame",
    "__code__", "__globals__", "__closure__", "__subclasses__", "__mro__", "__bases__",
    "__dict__", "__builtins__", "__class__", "__self__", "__func__", "__wrapped__",
]  # fmt: skip


@pytest.mark.parametrize("attr", DUNDERS)
def test_frame_and_object_internals_are_introspection(attr: str) -> None:
    assert found(f"def kernel(x):\n    return x.{attr}\n") == {("introspection", "reject")}


# -- the environment -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "word",
    ["HARNESSLAB_X", "verify", "BENCH", "final_run", "hidden", "SECRET", "guard", "RUNNER_ID"],
)
def test_harness_like_environment_variables_are_probes(word: str) -> None:
    for read in (f"os.environ[{word!r}]", f"os.getenv({word!r})", f"os.environ.get({word!r})",
                 f"{word!r} in os.environ"):  # fmt: skip
        assert ("env_probe", "reject") in found(f"def kernel(x):\n    return {read}\n"), read


def test_other_environment_reads_are_only_warnings() -> None:
    assert found("def kernel(x):\n    return os.environ['HOME']\n") == {("env_read", "warn")}
    assert ("env_probe", "reject") not in found("def kernel(x):\n    return os.getenv('HOME')\n")
    assert found("def kernel(x, k):\n    return os.environ[k]\n") == {("env_read", "warn")}


def test_writing_the_environment_patches_it() -> None:
    assert ("monkey_patch", "reject") in found("os.environ['A'] = '1'\n")


# -- mode sniffing -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "word",
    [
        "verif",
        "Bench",
        "FINAL",
        "hidden",
        "guard",
        "harness",
        "runner",
        "grader",
        "judge",
        "secret",
    ],
)
def test_comparing_against_a_harness_word_is_mode_sniffing(word: str) -> None:
    assert ("mode_sniffing", "reject") in found(f"def kernel(x, m):\n    return m == 'x{word}y'\n")
    assert ("mode_sniffing", "reject") in found(f"def kernel(x, m):\n    return {word!r} in m\n")


def test_comparing_against_other_words_is_fine() -> None:
    assert found("def kernel(x, m):\n    return m == 'fast'\n") == set()


# -- host compute --------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["numpy", "__array__"])
def test_moving_the_math_to_the_host_is_rejected(method: str) -> None:
    assert ("host_compute", "reject") in found(f"def kernel(x):\n    return x.{method}()\n")


@pytest.mark.parametrize(
    "method", ["item", "tolist", "cpu", "data_ptr", "untyped_storage", "_version"]
)
def test_host_syncs_are_warnings(method: str) -> None:
    assert found(f"def kernel(x):\n    return x.{method}()\n") == {("host_sync", "warn")}


DEFAULT_METHODS = [
    "rsqrt", "rsqrt_", "sqrt", "sigmoid", "sigmoid_", "silu", "mean", "sum", "pow", "pow_",
    "square", "norm", "exp", "var", "mul", "mul_", "div", "div_", "addcmul", "matmul",
]  # fmt: skip


@pytest.mark.parametrize("method", DEFAULT_METHODS)
def test_tensor_math_methods_are_rejected_by_default(method: str) -> None:
    assert found(f"def kernel(x):\n    return x.{method}()\n") == {("forbidden_call", "reject")}
    assert found(f"def kernel(x):\n    return x.{method}()\n", forbidden_methods=[]) == set()


@pytest.mark.parametrize("owner", ["torch", "triton", "tl", "os", "json", "math", "functools"])
def test_module_functions_are_judged_by_their_dotted_name_not_as_methods(owner: str) -> None:
    body = f"import triton.language as tl\ndef kernel(x):\n    return {owner}.sum(x) and {owner}.cpu()\n"
    assert ("forbidden_call", "reject") not in found(body)
    assert ("host_sync", "warn") not in found(body)


# -- patches -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "target", ["torch.cuda.synchronize", "triton.x", "time.time", "os.x", "math.pi", "shutil.copy"]
)
def test_assigning_into_a_module_is_a_monkey_patch(target: str) -> None:
    assert ("monkey_patch", "reject") in found(f"{target} = None\n")
    assert ("monkey_patch", "reject") in found(f"def kernel(x):\n    {target} += 1\n")


def test_deleting_from_a_module_and_assigning_a_timer_anywhere_are_patches() -> None:
    assert ("monkey_patch", "reject") in found("del torch.cuda\n")
    assert ("monkey_patch", "reject") in found("builtins.x: int = 1\n")
    for timer in ("time", "perf_counter", "perf_counter_ns", "monotonic", "elapsed_time"):
        assert ("monkey_patch", "reject") in found(f"def kernel(x, ev):\n    ev.{timer} = 1\n")


def test_assigning_an_objects_own_attribute_is_fine() -> None:
    assert found("def kernel(x, cfg):\n    cfg.block = 4\n    cfg.block += 1\n") == set()


def test_rebinding_module_state_from_a_function_is_a_warning() -> None:
    assert found("CACHE = None\ndef kernel(x):\n    global CACHE\n") == {("module_state", "warn")}


# -- reading files -------------------------------------------------------------------------------
READERS = [
    "open({p})", "io.open({p})", "os.open({p})", "os.listdir({p})", "os.scandir({p})",
    "os.walk({p})", "glob.glob({p})", "glob.iglob({p})", "shutil.copy({p}, 'b')",
    "shutil.copyfile({p}, 'b')", "shutil.copytree({p}, 'b')", "os.stat({p})",
    "P({p}).read_text()", "P({p}).read_bytes()", "P({p}).iterdir()", "P({p}).glob('*')",
    "P({p}).rglob('*')", "P({p}).open()", "P({p}).exists()",
]  # fmt: skip


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_of_a_suspect_path_is_rejected_and_of_another_warned(reader: str) -> None:
    head = "from pathlib import Path as P\ndef kernel(x, where):\n    return "
    assert ("reads_outside_workspace", "reject") in found(head + reader.format(p="'/etc/x'"))
    assert ("dynamic_path_read", "warn") in found(head + reader.format(p="where"))


@pytest.mark.parametrize(
    "path",
    [
        "/abs",
        "~/x",
        "a/../b",
        "harnesslab",
        "stage",
        "secret",
        "request",
        "state",
        "runner",
        "guard",
    ],
)
def test_every_suspect_path_word_rejects_a_read(path: str) -> None:
    assert ("reads_outside_workspace", "reject") in found(
        f"def kernel(x):\n    return open('x{path}x' if False else {path!r})\n"
    )


def test_a_plain_relative_name_is_only_a_warning() -> None:
    assert found("def kernel(x):\n    return open('data.bin')\n") == {("dynamic_path_read", "warn")}


def test_files_next_to_the_kernel_are_its_own() -> None:
    body = """
    from pathlib import Path
    HERE = Path(__file__).parent
    TABLE = os.path.join(os.path.dirname(__file__), "table.json")
    def kernel(x):
        open(TABLE).close()
        (HERE / "cfg.json").read_text()
        return Path(__file__).with_name("b.json").read_bytes()
    """
    assert found(body) == set()


@pytest.mark.parametrize(
    "path",
    [
        "Path(__file__).parents[1] / 'x'",
        "Path(__file__).parent.parent / 'x'",
        "os.path.dirname(os.path.dirname(__file__))",
        "os.path.join(os.path.dirname(__file__), '../x')",
        "UP / 'x'",
        "HERE / '..' / 'x'",
    ],
)
def test_climbing_out_of_the_kernels_folder_is_rejected(path: str) -> None:
    body = "from pathlib import Path\nHERE = Path(__file__).parent\nUP = Path(__file__).parent.parent\n"
    body += f"def kernel(x):\n    return open({path})\n"
    assert ("reads_outside_workspace", "reject") in found(body)


def test_a_name_built_by_climbing_stays_escaping_even_when_from_file() -> None:
    body = "from pathlib import Path\nUP = os.path.dirname(os.path.dirname(__file__))\n"
    body += "ROOT = UP\ndef kernel(x):\n    return open(ROOT)\n"
    assert ("reads_outside_workspace", "reject") in found(body)


def test_a_copy_from_the_kernels_folder_to_outside_is_rejected() -> None:
    body = "HERE = os.path.dirname(__file__)\ndef kernel(x):\n    shutil.copy(HERE, '../out')\n"
    assert ("reads_outside_workspace", "reject") in found(body)
    body = "HERE = os.path.dirname(__file__)\ndef kernel(x):\n    shutil.copy(HERE, HERE)\n"
    assert found(body) == set()


def test_a_reader_without_arguments_reads_nothing() -> None:
    assert found("def kernel(x):\n    return os.listdir()\n") == set()


# -- functions -----------------------------------------------------------------------------------
def test_a_triton_kernel_body_is_only_checked_for_torch_and_numpy() -> None:
    body = """
    import triton.language as tl
    @triton.jit
    def k(x_ptr, n: tl.constexpr):
        v = tl.load(x_ptr).exp()
        return tl.sum(v) == 'verify'
    @triton.jit(do_not_specialize=["n"])
    def k2(x_ptr):
        return tl.load(x_ptr).rsqrt()
    """
    assert found(body) == set()
    report = scan("@triton.jit\ndef k(x):\n    y = 1\n    return torch.sum(x) + torch.exp(x)\n")
    (f,) = report.findings
    assert (f.code, f.severity) == ("forbidden_call", "reject")
    assert f.detail == "torch.sum inside @triton.jit k(): a kernel body is Triton"
    assert found("import numpy\n@triton.jit\ndef k(x):\n    return numpy.sum(x)\n") >= {
        ("forbidden_call", "reject")
    }


def test_a_function_decorated_otherwise_is_python() -> None:
    body = "@triton.autotune(configs=[])\ndef k(x):\n    return x.rsqrt()\n"
    assert found(body) == {("forbidden_call", "reject")}
    body = "@torch.jit.script\ndef k(x):\n    return x\n"
    assert ("forbidden_call", "reject") in found(body)  # the decorator itself is scanned


def test_memoizing_is_a_warning() -> None:
    body = "@functools.lru_cache(maxsize=8)\ndef block(n):\n    return n\n"
    report = scan(body)
    (f,) = report.findings
    assert (f.code, f.severity) == ("memoized_function", "warn")
    assert f.detail.startswith("block is memoized (functools.lru_cache)")
    assert found("@functools.cache\ndef block(n):\n    return n\n") == {
        ("memoized_function", "warn")
    }


def test_host_arithmetic_on_the_entrys_tensors_is_a_warning() -> None:
    assert found("def kernel(x, gate, eps=1e-5, config=None):\n    return x * 2\n") == {
        ("tensor_arithmetic", "warn")
    }
    assert found("def kernel(x, gate, eps=1e-5, config=None):\n    return 2 + gate\n") == {
        ("tensor_arithmetic", "warn")
    }
    assert found("def kernel(x, eps=1e-5, config=None):\n    return eps * 2 + config\n") == set()
    assert found("def helper(n):\n    return n * 2\n") == set()
    assert found("def helper(t: torch.Tensor):\n    return t * 2\n") == {
        ("tensor_arithmetic", "warn")
    }


def test_parameters_are_known_only_inside_their_function() -> None:
    body = "def kernel(x):\n    def inner(n):\n        return n + 1\n    return inner(1)\n"
    assert found(body) == set()
    body = "def kernel(x):\n    return 1\ndef other(y):\n    return x * 2\n"
    assert found(body) == set()  # `x` outside kernel is not kernel's tensor


def test_async_functions_are_scanned_like_functions() -> None:
    assert ("subprocess", "reject") in found("async def kernel(x):\n    os.system('ls')\n")


# -- the report ----------------------------------------------------------------------------------
def test_findings_have_their_line_and_one_per_code_and_line() -> None:
    report = scan("def kernel(x):\n    return torch.nn.functional.silu(x)\n")
    (f,) = report.findings  # the call and its attribute are one finding
    assert (f.file, f.line, f.where()) == ("kernel.py", 4, "kernel.py:4")


def test_rejects_and_warnings_split_the_findings() -> None:
    report = scan("def kernel(x):\n    os.system('a')\n    return x.item()\n")
    assert [f.code for f in report.rejects] == ["subprocess"]
    assert [f.code for f in report.warnings] == ["host_sync"]


def test_only_python_files_are_scanned_and_a_syntax_error_is_a_warning() -> None:
    report = scan_sources(
        {"b.py": b"x = (\n", "a.py": b"import os\n", "notes.txt": b"import socket\n"}
    )
    assert report.files == ["a.py", "b.py"]
    (f,) = report.findings
    assert (f.code, f.severity, f.file, f.line) == ("syntax_error", "warn", "b.py", 1)


def test_undecodable_bytes_do_not_stop_the_scan() -> None:
    report = scan_sources({"k.py": b"import socket  # \xff\n"})
    assert [f.code for f in report.findings] == ["exfiltration"]


def test_the_references_math_in_a_helper_the_entry_never_reaches_is_a_warning() -> None:
    body = """
    def reference(x):
        return torch.rsqrt(x)
    def kernel(x):
        os.system('a')
        return x
    """
    report = scan(body, forbidden_calls=["torch.rsqrt"])
    codes = {(f.code, f.severity) for f in report.findings}
    assert codes == {("unused_reference", "warn"), ("subprocess", "reject")}
    (unused,) = [f for f in report.findings if f.code == "unused_reference"]
    assert "in reference(), which the entry function never reaches" in unused.detail
    body_used = body.replace("return x\n", "return reference(x)\n")
    assert ("forbidden_call", "reject") in found(body_used, forbidden_calls=["torch.rsqrt"])
    attack = "def helper():\n    os.system('a')\ndef kernel(x):\n    return x\n"
    assert found(attack) == {("subprocess", "reject")}  # attacks reject anywhere


# -- the workspace -------------------------------------------------------------------------------
def test_a_workspace_is_scanned_with_its_tasks_entry_and_integrity_table(tmp_path: Path) -> None:
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", Settings(state_dir=tmp_path / "state"))
    rules = integrity_rules(ws)
    assert "torch.rsqrt" in rules["forbidden_calls"]
    assert scan_workspace(ws).rejects == []  # the baseline kernel is honest
    cheat = (
        b"import torch\ndef rmsnorm_gate(x, gate, weight, eps=1e-5):\n    return torch.rsqrt(x)\n"
    )
    files = {**ws.editable_files(), "kernel.py": cheat}
    assert [f.code for f in scan_workspace(ws, files).rejects] == ["forbidden_call"]


def test_integrity_rules_keep_only_lists_and_survive_a_broken_task_toml(tmp_path: Path) -> None:
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", Settings(state_dir=tmp_path / "state"))
    text = (ws.task.root / "task.toml").read_text()
    task_root = tmp_path / "task"
    task_root.mkdir()
    ws.task = ws.task.model_copy(update={"root": task_root})
    (task_root / "task.toml").write_text('[integrity]\nforbidden_calls = ["a.b"]\nnote = "x"\n')
    assert integrity_rules(ws) == {"forbidden_calls": ["a.b"]}
    (task_root / "task.toml").write_text("[integrity\n")
    assert integrity_rules(ws) == {}
    (task_root / "task.toml").unlink()
    assert integrity_rules(ws) == {}
    assert "[integrity]" in text
    cheat = {
        "kernel.py": b"def rmsnorm_gate(x):\n    return x.rsqrt()\n",
        "kernel_config.json": b"{}",
    }
    assert [f.code for f in scan_workspace(ws, cheat).rejects] == ["forbidden_call"]


def test_a_finding_is_a_plain_record() -> None:
    f = Finding(code="c", severity="warn", file="k.py", line=3, detail="d")
    assert f.where() == "k.py:3"


# -- each branch of the scanner, where the tables above do not reach ----------------------------
def test_hasattr_with_a_computed_name_is_dynamic_code() -> None:
    assert found("def kernel(x, n):\n    return hasattr(x, n)\n") == {("dynamic_code", "reject")}


def test_a_forbidden_call_is_one_finding_even_where_a_prefix_matches_too() -> None:
    body = "def kernel(x):\n    return os.system('a')\n"
    assert found(body, forbidden_calls=["os.system"]) == {("forbidden_call", "reject")}
    body = "def kernel(x):\n    return torch.nn._private(x)\n"
    assert found(body) == {("forbidden_call", "reject")}


def test_an_import_that_rebinds_a_name_is_followed() -> None:
    body = (
        "import os as torch\nimport torch.linalg\ndef kernel(x):\n    return torch.linalg.inv(x)\n"
    )
    assert found(body) == {("forbidden_call", "reject")}
    body = "import os as o\ndef kernel(x):\n    o.system('ls')\n"
    assert found(body) == {("subprocess", "reject")}


def test_patching_a_dotted_module_imported_whole_is_a_monkey_patch() -> None:
    assert ("monkey_patch", "reject") in found("import xml.dom\nxml.dom.minidom = None\n")
    assert ("monkey_patch", "reject") in found("import xml.dom as d\nd.minidom = None\n")


def test_a_from_import_is_checked_when_imported_and_followed_when_used() -> None:
    assert found("from torch.nn.functional import silu\n") == {("forbidden_call", "reject")}
    assert found("from os import system\n") == {("subprocess", "reject")}
    assert found("from torch import cuda\ndef kernel(x):\n    cuda.Stream()\n") == {
        ("stream_creation", "reject")
    }
    assert found("from torch import cuda as c\ndef kernel(x):\n    c.Stream()\n") == {
        ("stream_creation", "reject")
    }
    assert found("from torch import cuda\n") == set()


def test_torch_anywhere_in_a_triton_body_is_one_finding_per_body() -> None:
    report = scan("@triton.jit\ndef k(x):\n    t = torch\n    return t\n")
    assert [(f.code, f.line) for f in report.findings] == [("forbidden_call", 5)]
    report = scan("@triton.jit\ndef k(x):\n    a = torch.sum(x)\n    return torch.exp(a)\n")
    assert [(f.code, f.line) for f in report.findings] == [("forbidden_call", 5)]


def test_any_decorator_shape_is_read_and_only_triton_jit_is_triton() -> None:
    body = "DECORATORS = [lambda f: f]\n@DECORATORS[0]\ndef kernel(x):\n    return x\n"
    assert found(body) == set()
    body = "import helpers\n@helpers.jit\ndef k(x):\n    os.system('a')\n"
    assert found(body) == {("subprocess", "reject")}


def test_only_tensor_annotations_make_a_helpers_argument_a_tensor() -> None:
    assert found("def helper(n: int):\n    return n * 2\n") == set()
    assert found("def helper(t: 'torch.Tensor'):\n    return t * 2\n") == set()  # a string


def test_odd_assignment_targets_do_not_break_the_scan() -> None:
    body = "def kernel(x, cfgs):\n    cfgs[0].block = 4\n    n = 0\n    n += 1\n    cfgs.path = __file__\n"
    assert found(body) == set()
    assert found("def kernel(x, d):\n    d['a'] = 1\n") == set()
    assert found("def kernel(x, f):\n    f()[0] = 1\n") == set()


def test_writing_os_environ_by_its_imported_name_is_a_patch() -> None:
    assert found("from os import environ\nenviron['A'] = '1'\n") == {("monkey_patch", "reject")}


@pytest.mark.parametrize(
    "statement",
    [
        "y = exec('a')",
        "y += exec('a')",
        "y: int = exec('a')",
        "del y[exec('a')]",
        "y = exec('a').bit_length()",
        "y = exec('a') == 0",
        "y = exec('a') + 1",
        "print(exec('a'))",
    ],
)
def test_calls_inside_any_statement_or_expression_are_scanned(statement: str) -> None:
    assert found(f"def kernel(x, y):\n    {statement}\n") == {("dynamic_code", "reject")}


def test_storing_into_a_private_name_is_a_patch_not_a_private_read() -> None:
    assert found("torch.cuda._lazy_x = 1\n") == {("monkey_patch", "reject")}


def test_only_the_environment_is_probed_by_its_keys() -> None:
    assert found("def kernel(x, d):\n    return d['FINAL']\n") == set()
    assert found("def kernel(x):\n    return os.environ[0]\n") == {("env_read", "warn")}
    assert found("def kernel(x):\n    return str('SECRET_SAUCE')\n") == set()
    assert found("def kernel(x):\n    return os.getenv()\n") == set()
    assert ("env_probe", "reject") in found("def kernel(x, d):\n    return os.getenv('GUARD', d)\n")
    assert ("env_probe", "reject") in found(
        "def kernel(x):\n    return 'SECRET' in os.environ == True\n"
    )


def test_comparisons_with_numbers_are_fine() -> None:
    assert found("def kernel(x, m):\n    return m == 3\n") == set()


def test_an_unaliased_tl_is_triton_language() -> None:
    assert found("def kernel(x):\n    return tl.sum(x)\n") == set()


def test_escaping_is_only_parent_of_parent_or_dirname_of_dirname() -> None:
    body = """
    from pathlib import Path
    P = Path(__file__)
    HERE = os.path.dirname(os.path.abspath(__file__))
    def kernel(x):
        open(P.anchor.parent)
        open(os.path.join(HERE, "a"))
        open(P.with_name(P.parent.name))
        there = os.path.dirname(FNS[0](__file__))
        return there
    """
    assert ("reads_outside_workspace", "reject") not in found(body)


def test_a_syntax_error_skips_only_its_file() -> None:
    report = scan_sources({"a.py": b"import socket\n", "b.py": b"x = (\n"})
    assert [(f.code, f.file) for f in report.findings] == [
        ("exfiltration", "a.py"),
        ("syntax_error", "b.py"),
    ]
    (nul,) = scan_sources({"k.py": b"import os\x00\n"}).findings
    assert (nul.code, nul.line) == ("syntax_error", 0)  # no line from the parser


def test_findings_are_kept_per_code_file_and_line() -> None:
    report = scan_sources({"a.py": b"import socket\nimport socket\n", "b.py": b"import socket\n"})
    assert [(f.file, f.line) for f in report.findings] == [("a.py", 1), ("a.py", 2), ("b.py", 1)]
    report = scan("def kernel(x):\n    return os.system('a') or exec('b')\n")
    assert {f.code for f in report.findings} == {"subprocess", "dynamic_code"}  # one line
    report = scan("def kernel(x):\n    return os.system('a') + x.item()\n")
    assert {f.code for f in report.findings} == {"subprocess", "host_sync"}


def test_the_references_math_in_the_entry_stays_a_reject_beside_an_unused_helper() -> None:
    body = "def helper(x):\n    return x\ndef kernel(x):\n    return torch.rsqrt(x)\n"
    assert found(body, forbidden_calls=["torch.rsqrt"]) == {("forbidden_call", "reject")}


def test_the_references_math_in_an_unused_helpers_default_runs_at_import() -> None:
    body = (
        "def helper(x, y=torch.rsqrt(torch.ones(1))):\n    return x\ndef kernel(x):\n    return x\n"
    )
    assert found(body, forbidden_calls=["torch.rsqrt"]) == {("forbidden_call", "reject")}
    body = "def helper(\n    x,\n    y=torch.rsqrt(torch.ones(1)),\n):\n    return x\ndef kernel(x):\n    return x\n"
    assert found(body, forbidden_calls=["torch.rsqrt"]) == {("forbidden_call", "reject")}


def test_a_workspace_scan_uses_the_tasks_entry_and_methods(tmp_path: Path) -> None:
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", Settings(state_dir=tmp_path / "state"))
    helper = (
        b"import torch\ndef reference(x):\n    return torch.rsqrt(x)\n"
        b"def rmsnorm_gate(x, gate, weight, eps=1e-5):\n    return x\n"
    )
    files = {**ws.editable_files(), "kernel.py": helper}
    assert [f.code for f in scan_workspace(ws, files).findings] == ["unused_reference"]
    task_root = tmp_path / "task"
    task_root.mkdir()
    ws.task = ws.task.model_copy(update={"root": task_root})
    (task_root / "task.toml").write_text('[integrity]\nforbidden_methods = ["relu"]\n')
    relu = b"def rmsnorm_gate(x):\n    return x.relu()\n"
    rsqrt = b"def rmsnorm_gate(x):\n    return x.rsqrt()\n"
    assert [f.code for f in scan_workspace(ws, {"kernel.py": relu}).rejects] == ["forbidden_call"]
    assert scan_workspace(ws, {"kernel.py": rsqrt}).rejects == []


def test_default_arguments_are_scanned_they_run_at_import() -> None:
    assert found("def kernel(x, _=os.system('a')):\n    return x\n") == {("subprocess", "reject")}
    assert found("def kernel(x, *, _=exec('a')):\n    return x\n") == {("dynamic_code", "reject")}
    body = "@triton.jit\ndef k(x, n=os.system('a')):\n    return x\n"
    assert ("subprocess", "reject") in found(body)
