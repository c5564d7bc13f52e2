"""Static integrity scan of a candidate's Python before it runs (ast, no import).

The scan is the cheap first line of the guarded verify: patterns that only a gamed kernel needs
are hard rejects, patterns an honest kernel may have for a good reason are warnings. Every
finding has a reason code and file:line. The runtime guard (guard.py / guard_child.py) checks
the same things again by observation, so an obfuscated cheat that slips past the scan is still
caught by what it does.

Code inside @triton.jit functions is Triton, not Python (tl.sum, x.exp(), ... are the point
there): it is only checked for torch or numpy, which no kernel body needs. Everything else in
the editable .py files is the "entry path".
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field

from ..state import Workspace
from .scan_cuda import scan_cuda
from .scan_reach import unreachable_functions

Severity = Literal["reject", "warn"]

# module (or prefix) -> reason code; importing it (or any submodule) is a hard reject.
FORBIDDEN_MODULES: dict[str, str] = {
    "threading": "concurrency",
    "_thread": "concurrency",
    "multiprocessing": "concurrency",
    "concurrent": "concurrency",
    "asyncio": "concurrency",
    "torch.multiprocessing": "concurrency",
    "subprocess": "subprocess",
    "pty": "subprocess",
    "gc": "introspection",
    "inspect": "introspection",
    "ctypes": "introspection",
    "cffi": "introspection",
    "traceback": "introspection",
    "dis": "introspection",
    "marshal": "introspection",
    "pickle": "introspection",
    "types": "introspection",
    "builtins": "introspection",
    "importlib": "dynamic_code",
    "numpy": "host_compute",
    "socket": "exfiltration",
    "urllib": "exfiltration",
    "http": "exfiltration",
    "cupy": "host_compute",
    "torch.utils.cpp_extension": "host_extension",
    "numba": "host_extension",
    "pycuda": "host_extension",
    "cuda": "host_extension",  # cuda-python: cuda.bindings, cuda.core
    "cuda_bindings": "host_extension",
    "runner": "harness_access",
    "guard": "harness_access",
    "guard_child": "harness_access",
    "guard_observer": "harness_access",
    "harnesslab": "harness_access",
    "__main__": "harness_access",
    "__mp_main__": "harness_access",
    # The launcher's internals (a candidate uses harnesslab_cuda, nothing under it).
    "cudadrv": "harness_access",
    "nvrtc": "harness_access",
    "cuda_source": "harness_access",
    "replay": "harness_access",
    "guard_gpu": "harness_access",
    # The rest of the guarded verify (tools/gpu/verify/): names no kernel of its own would use.
    "guard_cpu": "harness_access",
    "guard_spawn": "harness_access",
    "guard_kid": "harness_access",
    "guard_schema": "harness_access",
    "guard_record": "harness_access",
    "phase_lock": "harness_access",
    "step_guard": "harness_access",
    "step_child": "harness_access",
    "step_timed": "harness_access",
    "step_arena": "harness_access",
    "step_record": "harness_access",
    "step_schema": "harness_access",
    "step_replay": "harness_access",
    "devmem": "harness_access",
    "torch._C": "private_api",
    "torch.utils._python_dispatch": "private_api",
    "torch.overrides": "private_api",
    "triton.runtime.interpreter": "private_api",
    "triton.runtime.jit": "private_api",
    "triton.compiler": "private_api",
    "triton.backends": "private_api",
    "triton.knobs": "private_api",
}
# Dotted call targets (after import aliases are resolved) that are hard rejects for kernel tasks.
FORBIDDEN_PREFIXES: dict[str, str] = {
    "torch.nn.": "forbidden_call",
    "torch.special.": "forbidden_call",
    "torch.linalg.": "forbidden_call",
    "torch.compile": "forbidden_call",
    "torch.jit.": "forbidden_call",
    "torch.ops.": "private_api",
    "torch.library.": "private_api",
    "torch.cuda.Stream": "stream_creation",
    "torch.cuda.stream": "stream_creation",
    "torch.cuda.ExternalStream": "stream_creation",
    "torch.cuda.set_stream": "stream_creation",
    "torch.Stream": "stream_creation",
    "torch.cuda.graph": "stream_creation",
    "torch.from_numpy": "host_compute",
    "torch.utils.cpp_extension": "host_extension",
    "torch.cuda.jiterator": "host_extension",
    "os.system": "subprocess",
    "os.popen": "subprocess",
    "os.fork": "concurrency",
    "os.exec": "subprocess",
    "os.spawn": "subprocess",
    "os.posix_spawn": "subprocess",
    "os.kill": "subprocess",
    "sys.": "introspection",
}
PRIVATE_ROOTS = ("torch", "triton", "harnesslab_cuda")  # their _names are internals
SAFE_SYS = {"sys.maxsize", "sys.float_info", "sys.version_info", "sys.byteorder"}
# A KernelBench `class ModelNew(nn.Module)` (tools/gpu/modelnew.py) subclasses torch.nn.Module and
# builds its layers and parameters in __init__: construction, outside the verified call, never
# math on the inputs (the runtime guard watches forward). torch.nn.functional stays forbidden.
MODULE_BASE = "torch.nn.Module"
CONSTRUCTION_EXEMPT = "torch.nn."
DYNAMIC_BUILTINS = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars"}
NAME_BUILTINS = {"getattr", "setattr", "delattr", "hasattr"}
DUNDER_ATTRS = {
    "f_back", "f_locals", "f_globals", "f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame",
    "__code__", "__globals__", "__closure__", "__subclasses__", "__mro__", "__bases__",
    "__dict__", "__builtins__", "__class__", "__self__", "__func__", "__wrapped__",
}  # fmt: skip
READ_CALLS = {
    "open", "io.open", "os.open", "os.listdir", "os.scandir", "os.walk", "glob.glob",
    "glob.iglob", "shutil.copy", "shutil.copyfile", "shutil.copytree", "os.stat",
}  # fmt: skip
READ_METHODS = {"read_text", "read_bytes", "iterdir", "glob", "rglob", "open", "exists"}
SUSPECT_PATH = re.compile(r"(^/|^~|\.\.|harnesslab|stage|secret|request|state|runner|guard)")
SNIFF_WORDS = re.compile(
    r"verif|bench|final|hidden|guard|harness|runner|grader|judge|secret", re.IGNORECASE
)
ENV_WORDS = re.compile(r"HARNESSLAB|VERIF|BENCH|FINAL|HIDDEN|SECRET|GUARD|RUNNER", re.IGNORECASE)
HOST_METHODS_REJECT = {"numpy", "__array__"}
HOST_METHODS_WARN = {"item", "tolist", "cpu", "data_ptr", "untyped_storage", "_version"}
DEFAULT_METHODS = {
    "rsqrt", "rsqrt_", "sqrt", "sigmoid", "sigmoid_", "silu", "mean", "sum", "pow", "pow_",
    "square", "norm", "exp", "var", "mul", "mul_", "div", "div_", "addcmul", "matmul",
}  # fmt: skip
TIMER_NAMES = {"time", "perf_counter", "perf_counter_ns", "monotonic", "elapsed_time"}


class Finding(BaseModel):
    code: str
    severity: Severity
    file: str
    line: int
    detail: str

    def where(self) -> str:
        return f"{self.file}:{self.line}"


class ScanReport(BaseModel):
    files: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)

    @property
    def rejects(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "reject"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warn"]


class _Scanner(ast.NodeVisitor):
    def __init__(
        self, file: str, entry: str, calls: set[str], methods: set[str], out: list[Finding]
    ) -> None:
        self.file = file
        self.entry = entry
        self.forbidden_calls = calls
        self.forbidden_methods = methods
        self.out = out
        self.aliases: dict[str, str] = {}  # local name -> dotted module/object path
        self.file_rooted: set[str] = set()  # names assigned from expressions using __file__
        self.escaping: set[str] = set()  # names assigned from paths that climb out of it
        self.params: set[str] = set()
        self.constructing = False  # inside a class's __init__

    # -- helpers ---------------------------------------------------------------------------------
    def add(self, node: ast.AST, code: str, severity: Severity, detail: str) -> None:
        line = getattr(node, "lineno", 0)
        self.out.append(
            Finding(code=code, severity=severity, file=self.file, line=line, detail=detail)
        )

    def dotted(self, node: ast.AST) -> str | None:
        """`F.silu` -> 'torch.nn.functional.silu' through the import aliases."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        root = self.aliases.get(node.id, node.id)
        return ".".join([root, *reversed(parts)])

    def uses_file(self, node: ast.AST) -> bool:
        """The path is the candidate's own folder: built from __file__ without climbing out."""
        return not self.escapes(node) and any(
            isinstance(n, ast.Name) and (n.id == "__file__" or n.id in self.file_rooted)
            for n in ast.walk(node)
        )

    def escapes(self, node: ast.AST) -> bool:
        """.parents, .parent.parent, dirname(dirname(...)), '..', or a name built that way."""
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in self.escaping:
                return True
            if isinstance(n, ast.Attribute) and n.attr == "parents":
                return True
            if isinstance(n, ast.Attribute) and n.attr == "parent":
                if isinstance(n.value, ast.Attribute) and n.value.attr == "parent":
                    return True
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and ".." in n.value:
                return True
            if isinstance(n, ast.Call) and (self.dotted(n.func) or "").endswith("dirname"):
                if any(
                    isinstance(a, ast.Call) and (self.dotted(a.func) or "").endswith("dirname")
                    for a in n.args
                ):
                    return True
        return False

    def check_module(self, node: ast.AST, name: str) -> None:
        for mod, code in FORBIDDEN_MODULES.items():
            if name == mod or name.startswith(mod + "."):
                self.add(node, code, "reject", f"imports {name}")
                return

    def check_target(self, node: ast.AST, name: str) -> None:
        if name in SAFE_SYS:
            return
        if (self.constructing and name.startswith(CONSTRUCTION_EXEMPT)
                and not name.startswith("torch.nn.functional")):  # fmt: skip
            return
        if name in self.forbidden_calls:
            self.add(node, "forbidden_call", "reject", f"calls {name} (the reference's math)")
            return
        for prefix, code in FORBIDDEN_PREFIXES.items():
            if name.startswith(prefix) or name == prefix.rstrip("."):
                self.add(node, code, "reject", f"uses {name}")
                return
        root = name.split(".", 1)[0]
        if "._" in name and root in PRIVATE_ROOTS and not name.endswith("__"):
            self.add(node, "private_api", "reject", f"uses private {name}")

    # -- imports ---------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.check_module(node, a.name)
            self.aliases[a.asname or a.name.split(".")[0]] = (
                a.name if a.asname else a.name.split(".")[0]
            )

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = "." * node.level + (node.module or "")
        if node.level:
            self.add(node, "harness_access", "reject", f"relative import from {mod!r}")
        self.check_module(node, mod)
        for a in node.names:
            full = f"{mod}.{a.name}"
            self.check_module(node, full)
            self.check_target(node, full)
            self.aliases[a.asname or a.name] = full

    # -- definitions -----------------------------------------------------------------------------
    def check_kernel_body(self, node: ast.FunctionDef) -> None:
        """A @triton.jit body is Triton, not Python: torch (or numpy) there is host math hidden
        where a scan of the entry path would not look (called through `.fn`, or run as Python
        by the interpreter)."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name | ast.Attribute):
                full = self.dotted(sub) or ""
                root = full.split(".")[0]
                if root in ("torch", "numpy"):
                    self.add(sub, "forbidden_call", "reject",
                             f"{full} inside @triton.jit {node.name}(): a kernel body is Triton")  # fmt: skip
                    return

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:  # Python evaluated at import, whatever the function is
                self.visit(default)
        names = [
            self.dotted(d.func if isinstance(d, ast.Call) else d) or "" for d in node.decorator_list
        ]
        if any(n.startswith("triton.") and n.endswith(".jit") for n in names):
            self.check_kernel_body(node)  # Triton code: only what Triton code may not hold
            return
        for dec, name in zip(node.decorator_list, names, strict=True):
            if name.startswith("functools."):
                self.add(
                    dec,
                    "memoized_function",
                    "warn",
                    f"{node.name} is memoized ({name}): "
                    "fine for launch parameters, never for results",
                )
            self.visit(dec)
        saved = set(self.params)
        args = [*node.args.posonlyargs, *node.args.args]
        self.params |= {
            a.arg
            for a in args
            if (node.name == self.entry and a.arg not in ("eps", "config"))
            or (a.annotation is not None and ast.unparse(a.annotation).endswith("Tensor"))
        }
        for stmt in node.body:
            self.visit(stmt)
        self.params = saved

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            if self.dotted(base) != MODULE_BASE:
                self.visit(base)
        for part in [*node.keywords, *node.decorator_list]:
            self.visit(part)
        for stmt in node.body:
            init = isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__"
            saved, self.constructing = self.constructing, init
            self.visit(stmt)
            self.constructing = saved

    # -- statements ------------------------------------------------------------------------------
    def _assign_targets(self, node: ast.AST, targets: Iterable[ast.AST], value: ast.AST | None):
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute):
                    root = self.dotted(sub) or ""
                    base = root.split(".", 1)[0]
                    modules = {v.split(".", 1)[0] for v in self.aliases.values()}
                    if base in modules | {"torch", "triton", "time", "os", "builtins", "math"}:
                        self.add(node, "monkey_patch", "reject", f"assigns {root}")
                    elif sub.attr in TIMER_NAMES:
                        self.add(node, "monkey_patch", "reject", f"assigns .{sub.attr}")
                if isinstance(sub, ast.Subscript) and "environ" in (self.dotted(sub.value) or ""):
                    self.add(node, "monkey_patch", "reject", "writes os.environ")
            if isinstance(t, ast.Name) and value is not None:
                if self.escapes(value):
                    self.escaping.add(t.id)
                elif self.uses_file(value):
                    self.file_rooted.add(t.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assign_targets(node, node.targets, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assign_targets(node, [node.target], None)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assign_targets(node, [node.target], node.value)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._assign_targets(node, node.targets, None)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.add(
            node,
            "module_state",
            "warn",
            f"rebinds module state {', '.join(node.names)} from a function (a cache?)",
        )

    # -- expressions -----------------------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in DUNDER_ATTRS:
            self.add(node, "introspection", "reject", f"touches .{node.attr}")
        name = self.dotted(node)
        if name and isinstance(node.ctx, ast.Load):
            if name.startswith("sys.") or name.startswith("os.environ"):
                self.check_env_or_sys(node, name)
            elif name.split(".", 1)[0] in ("torch", "triton"):
                self.check_target(node, name)
        self.generic_visit(node)

    def check_env_or_sys(self, node: ast.AST, name: str) -> None:
        if name.startswith("sys."):
            self.check_target(node, name)
            return
        self.add(node, "env_read", "warn", f"reads {name}")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        base = self.dotted(node.value) or ""
        key = node.slice
        if base.endswith("environ") and isinstance(key, ast.Constant):
            self.env_key(node, key.value)
        self.generic_visit(node)

    def env_key(self, node: ast.AST, key: object) -> None:
        if isinstance(key, str) and ENV_WORDS.search(key):
            self.add(node, "env_probe", "reject", f"reads the environment variable {key}")

    def visit_Compare(self, node: ast.Compare) -> None:
        if any("environ" in (self.dotted(c) or "") for c in node.comparators):
            if isinstance(node.left, ast.Constant):
                self.env_key(node, node.left.value)  # "HARNESSLAB_X" in os.environ
        for sub in [node.left, *node.comparators]:
            for c in ast.walk(sub):
                if isinstance(c, ast.Constant) and isinstance(c.value, str):
                    if SNIFF_WORDS.search(c.value):
                        self.add(node, "mode_sniffing", "reject", f"compares against {c.value!r}")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        for side in (node.left, node.right):
            if isinstance(side, ast.Name) and side.id in self.params:
                self.add(
                    node,
                    "tensor_arithmetic",
                    "warn",
                    f"host-side arithmetic on argument {side.id!r}",
                )
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        name = self.dotted(fn)
        if isinstance(fn, ast.Name) and fn.id in DYNAMIC_BUILTINS | {"breakpoint"}:
            self.add(node, "dynamic_code", "reject", f"calls {fn.id}()")
        if isinstance(fn, ast.Name) and fn.id in NAME_BUILTINS:
            literal = len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
            if fn.id in ("setattr", "delattr"):
                self.add(node, "monkey_patch", "reject", f"calls {fn.id}()")
            elif not literal:
                self.add(node, "dynamic_code", "reject", f"{fn.id}() with a computed name")
            else:
                base, attr = self.dotted(node.args[0]), node.args[1]
                if base is not None and isinstance(attr, ast.Constant):
                    self.check_target(node, f"{base}.{attr.value!s}")
        if name is not None:
            self.check_target(node, name)
            if name in READ_CALLS:
                self.check_read(node, node.args[0] if node.args else None, *node.args[1:])
            if name in ("os.getenv", "os.environ.get") and node.args:
                if isinstance(node.args[0], ast.Constant):
                    self.env_key(node, node.args[0].value)
        if isinstance(fn, ast.Attribute):
            self.check_method(node, fn)
        self.generic_visit(node)

    def check_method(self, node: ast.Call, fn: ast.Attribute) -> None:
        owner = self.dotted(fn.value) or ""
        if owner.split(".", 1)[0] in ("torch", "triton", "tl", "os", "json", "math", "functools"):
            return  # module functions are checked by their dotted name
        if fn.attr in HOST_METHODS_REJECT:
            self.add(node, "host_compute", "reject", f".{fn.attr}() moves the math to the host")
        elif fn.attr in HOST_METHODS_WARN:
            self.add(node, "host_sync", "warn", f".{fn.attr}() on the entry path")
        elif fn.attr in self.forbidden_methods:
            self.add(node, "forbidden_call", "reject", f".{fn.attr}() does the math in torch")
        if fn.attr in READ_METHODS:
            self.check_read(node, fn.value, *node.args)

    def check_read(self, node: ast.AST, path: ast.AST | None, *more: ast.AST) -> None:
        if path is None or (self.uses_file(path) and not any(map(self.escapes, more))):
            return
        literals = [
            c.value for e in (path, *more) for c in ast.walk(e) if isinstance(c, ast.Constant)
        ]
        if self.escapes(path) or any(
            isinstance(v, str) and SUSPECT_PATH.search(v) for v in literals
        ):
            self.add(node, "reads_outside_workspace", "reject", f"reads {ast.unparse(path)[:80]}")
        else:
            self.add(
                node,
                "dynamic_path_read",
                "warn",
                f"reads {ast.unparse(path)[:80]}, not relative to __file__",
            )


def scan_sources(
    files: dict[str, bytes],
    *,
    entry_function: str = "",
    forbidden_calls: Iterable[str] = (),
    forbidden_methods: Iterable[str] = DEFAULT_METHODS,
) -> ScanReport:
    """Scan every .py, .cu and .cuh file of a candidate snapshot (relative name -> bytes)."""
    report = ScanReport()
    calls, methods = set(forbidden_calls), set(forbidden_methods)
    found: list[Finding] = []
    for rel, data in sorted(files.items()):
        if rel.endswith((".cu", ".cuh")):
            report.files.append(rel)
            found += [Finding(code=c, severity="reject", file=rel, line=n, detail=d)
                      for c, n, d in scan_cuda(rel, data, files)]  # fmt: skip
            continue
        if not rel.endswith(".py"):
            continue
        report.files.append(rel)
        try:
            tree = ast.parse(data.decode("utf-8", errors="replace"), filename=rel)
        except SyntaxError as exc:
            found.append(
                Finding(
                    code="syntax_error",
                    severity="warn",
                    file=rel,
                    line=exc.lineno or 0,
                    detail=str(exc.msg),
                )
            )
            continue
        mark = len(found)
        _Scanner(rel, entry_function, calls, methods, found).visit(tree)
        found[mark:] = _unused_helpers(found[mark:], unreachable_functions(tree, entry_function))
    seen: set[tuple[str, str, int, str]] = set()
    for f in found:  # one finding per code and line (a call is also an attribute)
        key = (f.code, f.file, f.line, f.severity)
        if key not in seen:
            seen.add(key)
            report.findings.append(f)
    return report


def _unused_helpers(findings: list[Finding], unused: dict[str, tuple[int, int]]) -> list[Finding]:
    """The reference's math (forbidden_call) inside a function nothing reachable uses becomes a
    warning: it never runs during verification, and if it did the runtime guard would reject
    it (torch_compute). Every other code stays what it was: attack patterns reject anywhere."""
    out = []
    for f in findings:
        owner = next((n for n, (a, b) in unused.items() if a <= f.line <= b), None)
        if owner is not None and f.code == "forbidden_call" and f.severity == "reject":
            f = f.model_copy(
                update={
                    "code": "unused_reference",
                    "severity": "warn",
                    "detail": f"{f.detail} in {owner}(), which the entry function never "
                    "reaches: not run during verification (the runtime guard rejects it if "
                    "it runs)",
                }
            )
        out.append(f)
    return out


def integrity_rules(ws: Workspace) -> dict[str, list[str]]:
    """The task's `[integrity]` table from task.toml (forbidden_calls, forbidden_methods)."""
    path = ws.task.root / "task.toml"
    try:
        table = tomllib.loads(path.read_text()).get("integrity", {})
    except (OSError, tomllib.TOMLDecodeError):
        table = {}
    return {k: list(v) for k, v in table.items() if isinstance(v, list)}


def scan_workspace(ws: Workspace, files: dict[str, bytes] | None = None) -> ScanReport:
    rules = integrity_rules(ws)
    return scan_sources(
        ws.editable_files() if files is None else files,
        entry_function=ws.task.entry_function,
        forbidden_calls=rules.get("forbidden_calls", ()),
        forbidden_methods=rules.get("forbidden_methods", DEFAULT_METHODS),
    )


__all__ = ["Finding", "ScanReport", "integrity_rules", "scan_sources", "scan_workspace"]
