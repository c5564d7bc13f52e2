"""A KernelBench-style candidate, `class ModelNew(nn.Module)`, as the entry function of a declared
module task: what lets a solution written for KernelBench drop in unchanged.

Staged beside runner.py and guard_child.py (standard library + torch only) and run where the
candidate runs: inside the sandbox, in the runner's dev modes and in the guarded verify's
candidate process. Nothing here is evidence; it only builds and calls the candidate's class.

The task's reference (declared.py, MODULE) says how: `ModelNew(*init)` is built once per
constructor arguments, in their declared order (KernelBench's `ModelNew(*get_init_inputs())`),
under the task's seed and on the inputs' device. Each call then binds the task's last inputs —
the reference Model's parameters, drawn fresh per call like every input — to the module's
parameters of the same names (or, when the names differ, in order where the shapes agree)
without copying: the module's kernels read the very tensors the caller passed, so the guard's
recording sees inputs, not memory of its own. What ModelNew computes from its weights in
`__init__` is therefore stale: derive such things in forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

ENTRY_CLASS = "ModelNew"


def resolve(mod: Any, name: str, module: dict[str, Any] | None) -> Any:
    """The entry `name` of the candidate's module; for a module task without it, its ModelNew."""
    fn = getattr(mod, name, None)
    if fn is None and module is not None:
        fn = getattr(mod, ENTRY_CLASS, None)
    return fn


def is_module_class(fn: Any) -> bool:
    import torch

    return isinstance(fn, type) and issubclass(fn, torch.nn.Module)


class ModuleEntry:
    """A ModelNew class called like a plain entry function: `entry(*inputs, **init)`."""

    def __init__(self, cls: type, module: dict[str, Any] | None) -> None:
        self.cls = cls
        self.params: list[str] = list((module or {}).get("params", []))
        self.init: list[str] = list((module or {}).get("init", []))
        self.seed = int((module or {}).get("seed", 0))
        self.train = bool((module or {}).get("train", True))
        self.built: dict[str, Any] = {}

    def build(self, kwargs: dict[str, Any], device: Any) -> Any:
        """ModelNew(*init) for these constructor arguments (once), under the task's seed."""
        import torch

        key = repr(sorted(kwargs.items())) + str(device)
        if key not in self.built:
            values = [tuple(v) if isinstance(v, list) else v for v in kwargs.values()]
            if self.init and set(self.init) == set(kwargs):
                values = [
                    tuple(v) if isinstance(v, list) else v for v in map(kwargs.get, self.init)
                ]
            cuda = [device.index or 0] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(self.seed)
                with device:
                    module = self.cls(*values)
            self.built[key] = module.train(self.train)
        return self.built[key]

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Callable[..., Any], list]:
        """The module with the task's last inputs as its parameters, and forward's arguments."""
        import torch

        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        module = self.build(kwargs, device or torch.device("cpu"))
        n = len(args) - len(self.params)
        given = dict(zip(self.params, args[n:], strict=True))
        own = dict(module.named_parameters())
        if not self.train:
            own |= dict(module.named_buffers())
        names = self.params if set(self.params) <= set(own) else self._by_order(own, given)
        for ref_name, own_name in zip(self.params, names, strict=True):
            owner = module.get_submodule(own_name.rpartition(".")[0])
            leaf = own_name.rpartition(".")[2]
            tensor = given[ref_name]
            if leaf in owner._parameters:
                owner._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)
            else:
                owner._buffers[leaf] = tensor
        return module, list(args[:n])

    def _by_order(self, own: dict[str, Any], given: dict[str, Any]) -> list[str]:
        """ModelNew names its parameters otherwise: take them in order where the shapes agree."""
        mine = list(own)[: len(given)]
        shapes = [tuple(own[k].shape) for k in mine]
        if len(mine) != len(given) or shapes != [tuple(t.shape) for t in given.values()]:
            raise TypeError(
                f"ModelNew's parameters {list(own)} do not match the reference Model's "
                f"{list(given)} (by name, or in order with the same shapes)"
            )
        return mine

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, fargs = self.bind(args, kwargs)
        return module(*fargs)


__all__ = ["ENTRY_CLASS", "ModuleEntry", "is_module_class", "resolve"]
