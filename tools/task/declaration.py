"""A declared task's inputs, reference and output (task.toml `[declare]`): what lets a plain
PyTorch function (or a KernelBench `Model`) be a kernel task with no reference.py.

Host side and trusted. The launcher stages `tools/gpu/declared.py` as the task's reference.py
with `declaration.json` (this model, checked) beside it; `problems` names the field at fault
(`declare.inputs[1].shape: unknown dim 'cols'`) so a declaration error says what to fix.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# "case": the dev or final case's dtype (float16, bfloat16 or float32).
INPUT_DTYPES = ("case", "float16", "bfloat16", "float32", "float64", "int32", "int64", "bool")
Dim = int | str
Scalar = int | float | bool | str


class InputDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    shape: list[Dim] = Field(description="dim names, integers or expressions ('2*dim')")
    dtype: str = Field(default="case", description="'case' or a fixed dtype")
    distribution: Literal["normal", "uniform", "randint", "init"] = Field(
        default="normal",
        description="init: a module parameter as the Model's own constructor initialises it "
        "(mean and scale then approximate it for the probes)",
    )
    mean: float = 0.0
    scale: float = 1.0
    low: float | str = Field(default=0.0, description="a number, or an expression over dims")
    high: float | str = Field(
        default=1.0,
        description="a number, or an expression over dims: an index input's bound scales with "
        "the size it indexes (targets < num_classes)",
    )


class OutputDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shape: list[Dim] | Literal["reference"] = Field(
        description="dims, integers or expressions; 'reference': whatever the reference returns "
        "for the case's inputs (a conv's or a pooling's output size), derived on meta tensors"
    )
    dtype: str = "case"


class InputsFrom(BaseModel):
    """Inputs made by a function of the reference file (KernelBench's get_inputs()) with the
    case's dims as the file's module-level constants, instead of drawn per declaration: a
    symmetric matrix stays symmetric, probabilities stay positive, targets stay in range."""

    model_config = ConfigDict(extra="forbid")

    call: str = Field(description="'file.py:get_inputs' in the task folder")
    constants: dict[str, Dim | list[Dim]] = Field(
        default_factory=dict,
        description="module constant -> the dim (or, for a tuple constant, the dims) it takes",
    )


class Declaration(BaseModel):
    """task.toml `[declare]`."""

    model_config = ConfigDict(extra="forbid")

    reference: str = Field(description="'file.py:function' (or 'file.py:Model') in the task folder")
    reference_kind: Literal["function", "module"] = Field(
        default="function",
        description="module: a torch.nn.Module class built as Model(**scalars) under `seed`",
    )
    seed: int = 0
    module_params: list[str] = Field(
        default_factory=list,
        description="module: the Model's parameters (in eval mode, and buffers), in order, "
        "given as its last inputs (the candidate gets them too)",
    )
    module_mode: Literal["train", "eval"] = Field(
        default="train",
        description="module: 'train' as KernelBench runs it (BatchNorm normalises by the "
        "batch's statistics; the buffers it updates are restored after every call, never "
        "inputs); 'eval': running statistics (then buffers are inputs too), dropout off",
    )
    inputs: list[InputDecl] = Field(min_length=1)
    inputs_from: InputsFrom | None = None
    scalars: dict[str, Scalar | list[Scalar]] = Field(
        default_factory=dict,
        description="keyword arguments (module: the constructor's; a tuple argument such as "
        "bias_shape is a list)",
    )
    scalar_dims: dict[str, Dim | list[Dim]] = Field(
        default_factory=dict,
        description="keyword arguments that are sizes (a Model's in_features): the dim "
        "expression (for a tuple, the list of them) giving each its value per case",
    )
    init_order: list[str] = Field(
        default_factory=list,
        description="module: the constructor's arguments in order (a ModelNew class is built "
        "positionally, as KernelBench builds it)",
    )
    output: OutputDecl
    bytes: str = Field(
        default="", description="formula over dims and dtype_bytes (default: derived)"
    )
    flops: str = Field(default="", description="formula over dims (default: output elements)")
    interpreter: dict[str, int] = Field(
        default_factory=dict, description="dims on the CPU interpreter (others capped)"
    )
    interpreter_cap: int = Field(default=64, ge=1)

    def problems(self, dims: set[str]) -> list[str]:
        """What is wrong with the text, each naming its field (empty: valid)."""
        out: list[str] = []
        known = ", ".join(sorted(dims)) or "none"

        def check_expr(field: str, expr: Dim, extra: frozenset[str] = frozenset()) -> None:
            if isinstance(expr, int):
                if expr < 0:
                    out.append(f"{field}: {expr} is negative")
                return
            try:
                tree = ast.parse(str(expr), mode="eval")
            except SyntaxError:
                out.append(f"{field}: {expr!r} is not an expression")
                return
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and node.id not in dims | extra:
                    out.append(f"{field}: unknown dim {node.id!r} (dims: {known})")
                elif isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
                    out.append(f"{field}: {expr!r} may only use dims, numbers and + - * / // %")

        file_name, _, attr = self.reference.partition(":")
        if not attr.isidentifier() or not file_name.endswith(".py"):
            out.append(f"declare.reference: {self.reference!r} must be 'file.py:name'")
        elif Path(file_name).name != file_name:
            out.append(f"declare.reference: {file_name} must be a file of the task folder itself")
        for i, inp in enumerate(self.inputs):
            if inp.dtype not in INPUT_DTYPES:
                out.append(
                    f"declare.inputs[{i}].dtype: {inp.dtype!r} is not one of "
                    + ", ".join(INPUT_DTYPES)
                )
            for expr in inp.shape:
                check_expr(f"declare.inputs[{i}].shape", expr)
            for bound in ("low", "high"):
                value = getattr(inp, bound)
                if isinstance(value, str):
                    check_expr(f"declare.inputs[{i}].{bound}", value)
        if len(self.module_params) >= len(self.inputs):
            out.append("declare.module_params: more parameters than inputs")
        names = [i.name for i in self.inputs]
        if len(set(names)) != len(names):
            out.append(f"declare.inputs: names repeat ({', '.join(names)})")
        if self.output.dtype not in INPUT_DTYPES:
            out.append(
                f"declare.output.dtype: {self.output.dtype!r} is not one of "
                + ", ".join(INPUT_DTYPES)
            )
        if self.output.shape != "reference":
            for expr in self.output.shape:
                check_expr("declare.output.shape", expr)
        for name, value in self.scalar_dims.items():
            for expr in value if isinstance(value, list) else [value]:
                check_expr(f"declare.scalar_dims.{name}", expr)
            if name in self.scalars:
                out.append(f"declare.scalar_dims.{name}: also in declare.scalars")
        if self.inputs_from is not None:
            call_file, _, call = self.inputs_from.call.partition(":")
            if not call.isidentifier() or Path(call_file).name != call_file:
                out.append(
                    f"declare.inputs_from.call: {self.inputs_from.call!r} must be 'file.py:name' "
                    "of the task folder"
                )
            for name, value in self.inputs_from.constants.items():
                for expr in value if isinstance(value, list) else [value]:
                    check_expr(f"declare.inputs_from.constants.{name}", expr)
        if self.bytes:
            check_expr("declare.bytes", self.bytes, frozenset({"dtype_bytes"}))
        if self.flops:
            check_expr("declare.flops", self.flops)
        for k in self.interpreter:
            if k not in dims:
                out.append(f"declare.interpreter: unknown dim {k!r} (dims: {known})")
        return out

    def folder_problems(self, root: Path) -> list[str]:
        """What the task folder lacks (checked where the operator loads it, not where a stored
        task.toml is parsed inside a sandbox that cannot read the folder)."""
        out = []
        file_name = self.reference.partition(":")[0]
        if not (root / file_name).is_file():
            out.append(f"declare.reference: {file_name} is not a file of the task folder {root}")
        call_file = self.inputs_from.call.partition(":")[0] if self.inputs_from else ""
        if call_file and not (root / call_file).is_file():
            out.append(f"declare.inputs_from.call: {call_file} is not a file of the task folder")
        if (root / "reference.py").exists():
            out.append("declare: a declared task has no reference.py (its reference is generated)")
        return out

    def staged_json(self, probe_dims: dict[str, int]) -> str:
        """declaration.json as tools/gpu/declared.py reads it."""
        data: dict[str, Any] = self.model_dump()
        data["reference"] = {
            "entry": self.reference,
            "kind": self.reference_kind,
            "seed": self.seed,
            "params": self.module_params,
            "mode": self.module_mode,
            "init": self.init_order or [*self.scalars, *self.scalar_dims],
        }
        data["probe_dims"] = probe_dims
        return json.dumps(data, indent=1, sort_keys=True)


__all__ = ["INPUT_DTYPES", "Declaration", "InputDecl", "InputsFrom", "OutputDecl"]
