"""The generic adversarial inputs of every kernel task with a reference: size edges and value
families, derived from the task's own make_inputs (its shapes, dtypes and input order), never
from per-task code.

Trusted side. The guarded verify (guard.py `Verify.variants`) draws them for every hidden case
from its secret-mixed generator and computes their expected values before any candidate runs;
the runner's probe mode (numerical_probe) runs them on the dev shapes, where the agent may see
every number. Standard library at import (the host reads NAMES and NOTES from here); torch is
the caller's, passed in.

Size edges: the case's own sizes made odd, its batch dim 1 and 0, and every other dim at the
hidden domain's maximum (a long reduction). Every hidden case gets all of them.

Value families: a task's inputs drawn as make_inputs draws them, then each floating tensor
transformed along its rows (all leading dims) and columns (the last dim). Which inputs are
"activations" and which are "weights" is left to the reference: a family is applied to every
floating input first, then to the first input alone, at decreasing strength (LEVELS), and the
first combination whose expected values are usable is kept: finite, representable in the output
dtype, not all within atol of zero (an all-zero output would pass, so it would prove nothing),
and judgeable (the fp32 reference agrees with the reference in fp64 within a quarter of the
tolerance, so an honest fp32 kernel can pass). A family that no combination makes usable is
inapplicable for that case and says why. So a gate or a weight that would overflow the output
is left as drawn while the activation still gets the family, without a word of per-task code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

SIZE_EDGES: dict[str, str] = {
    "odd_dims": "Every dim odd (the batch at most 3 rows on the interpreter, 63 on a GPU): fails when the last block or tile is "
    "not masked, or a vectorized path assumes aligned rows.",
    "single_row": "The batch dim is 1: fails when the grid or a several-rows-per-program tile "
    "assumes more rows than exist.",
    "empty_batch": "The batch dim is 0: the output is empty; fails when a zero-size grid or a "
    "division by the row count crashes.",
    "long_reduction": "Every dim but the batch at the hidden domain's maximum: fails when a "
    "register-resident or single-block path drops or double-counts part of a long row.",
}
FAMILIES: dict[str, str] = {
    "offset": "Each row a large offset (32-128x the input's scale) plus a small spread (1/1024 "
    "of the offset, at least half an ulp): fails when a variance is computed as "
    "E[x^2] - mean^2, a sum is kept in a 16-bit type, or softmax skips subtracting the row "
    "maximum.",
    "column_scales": "Per-column scales spanning the dtype's range, largest at both ends of the "
    "row: fails when a reduction skips or under-weights some columns (a row-partial norm, a "
    "missed tail block) or squares in a 16-bit type.",
    "row_scales": "Per-row scales spanning the dtype's range: fails when rows share a "
    "statistic or a scale, or a row's sum overflows a 16-bit type.",
    "column_outliers": "The first, the last and one random column hold values orders of "
    "magnitude above the rest: fails when any column is skipped or a max/sum misses it.",
    "near_overflow": "Values near the dtype's limit (fp16 +-60000; bf16 and fp32 as far as a "
    "row's sum of squares stays finite in fp32): fails when x*x or a sum is computed in the "
    "input dtype.",
    "subnormals": "Every value below the dtype's smallest normal: fails when subnormals are "
    "flushed, divided by, or produce NaN.",
    "zeros": "Whole rows of +0.0 and -0.0 and columns of -0.0: fails when an epsilon is dropped "
    "(0/0), or a sign bit or a zero is treated specially.",
    "ties": "Values on a coarse grid, so rows hold exact duplicates (of the maximum too): fails "
    "when an argmax/max-like op breaks ties differently from the reference.",
}
NAMES = (*SIZE_EDGES, *FAMILIES)
NOTES = {**SIZE_EDGES, **FAMILIES}
# Families about the arithmetic's precision and range: a failure there gets the reason code
# "precision" (the others "wrong_output"), as the tasks' own precision edges do.
PRECISION = frozenset({"offset", "near_overflow", "subnormals"})
# Strength of the families that have one, tried in order: the exponent of the dtype's span (or
# of the offset's ratio to its spread) scaled by it.
LEVELS = (1.0, 0.7, 0.45, 0.25)
LEVELLED = frozenset({"offset", "column_scales", "row_scales", "column_outliers", "near_overflow"})
# A family's draw is judgeable when the fp32 reference is within this fraction of the tolerance
# of the fp64 one: an honest fp32 kernel (another summation order) then stays within about half
# of it. Measured: a LayerNorm whose weight and bias also get the offset puts outputs at ~0 out
# of terms of ~86, where the fp32 reference itself is off by 5e-3 against an fp32 atol of 1e-4;
# such a draw is refused and the family goes to the first input alone.
CONDITION_FRACTION = 0.25
# How far (relative) each input element moves in the conditioning check: 2 units in the last
# place of fp32, about what another summation order costs an honest fp32 kernel.
PERTURBATION = 2.0**-23
# What an honest kernel's accumulation costs, relative to the magnitude of the terms it adds
# (not of their sum): another order of fp32 adds, or a tensor core's fp32 accumulator, which
# rounds less carefully than IEEE (sqrt(K) * 2^-23 for K terms is 2^-17 at K = 4096). A draw
# whose terms are so far above the result that this exceeds a quarter of the tolerance
# cancels too much to judge. Measured on an H100: the shipped matmul baseline (tl.dot, fp16)
# was rejected on per-column scales that the fp32 and fp64 references both got right.
ACCUMULATION = 2.0**-16
# The largest magnitude a family writes: 60000 in fp16 (its max is 65504), and in bf16/fp32
# 2^52: (2^52)^2 * 2^20 = 2^124 < 2^128, so a sum of squares or a dot product over a row of up to
# 2^20 elements stays finite in fp32, the reference's and an honest kernel's alike.
NEAR_FRACTION = 60000.0 / 65504.0
FP32_SAFE = 2.0**52
# Output values above this fraction of the output dtype's max would round to inf in an honest
# kernel: such a draw is not usable.
OUTPUT_FRACTION = 0.9
# The spread of the offset family, relative to the offset: 2^-10 at level 1 (2^-7, 2^-4.5, 2^-2.5
# below), never under half an ulp of the dtype (bf16: 2^-8), so it survives rounding to the input
# dtype. E[x^2] - mean^2 in fp32 then loses ~(2^10)^2 * 2^-24 = 6% of the variance; an honest
# two-pass (or Welford) norm ~2^10 * 2^-24 = 6e-5 of it, which the fp64 check below bounds.
OFFSET_SPREAD = 2.0**-10
# Families run with the batch dim capped (the rows along which nothing varies add cost, not
# coverage): 3 rows on the interpreter (odd: ragged tiles), 64 on a GPU.
FAMILY_ROWS = {"interpreter": 3, "gpu": 64}


class Edge:
    """One adversarial input set: name, args, kwargs, expected (None: inapplicable, `why`)."""

    def __init__(self, name: str, args: Any = None, kwargs: Any = None, expected: Any = None,
                 *, why: str = "", inputs: list[int] | None = None, level: float = 1.0) -> None:  # fmt: skip
        self.name, self.args, self.kwargs, self.expected = name, args, kwargs, expected
        self.why, self.inputs, self.level = why, inputs or [], level

    @property
    def applicable(self) -> bool:
        return self.expected is not None

    @property
    def precision(self) -> bool:
        return self.name in PRECISION

    def describe(self) -> dict[str, Any]:
        """What numerical_probe reports of it (dev shapes only)."""
        out: dict[str, Any] = {"family": self.name}
        if self.name in FAMILIES and self.applicable:
            out.update(inputs=self.inputs, level=self.level)
        if not self.applicable:
            out["not_applicable"] = self.why
        return out


def batch_key(ref: Any, shape: dict[str, int]) -> str:
    """The dim rows are counted in: the reference's BATCH_DIM, else the shape's first key."""
    key = getattr(ref, "BATCH_DIM", None)
    return key if isinstance(key, str) and key in shape else next(iter(shape))


class Suite:
    """The size edges and value families of one task, for one device.

    `numerics` is what the host sends: {"skip": [names], "max_dims": {dim: max}}; `scale` maps
    a full-size shape to the one this device runs (the interpreter's reduced shapes)."""

    def __init__(self, torch: Any, ref: Any, device: str, numerics: dict[str, Any] | None,
                 *, interpret: bool, scale: Callable[[dict[str, int]], dict[str, int]]) -> None:  # fmt: skip
        self.torch, self.ref, self.device, self.scale = torch, ref, device, scale
        cfg = numerics or {}
        self.skip = {str(s) for s in cfg.get("skip") or []}
        self.max_dims = {str(k): int(v) for k, v in (cfg.get("max_dims") or {}).items()}
        self.rows = FAMILY_ROWS["interpreter" if interpret else "gpu"]

    def names(self) -> list[str]:
        return [n for n in NAMES if n not in self.skip]

    # -- shapes ----------------------------------------------------------------------------------
    def family_shape(self, shape: dict[str, int]) -> dict[str, int]:
        key = batch_key(self.ref, shape)
        return {**shape, key: min(shape[key], self.rows)}

    def edge_shape(self, name: str, shape: dict[str, int], gen: Any) -> dict[str, int] | None:
        key = batch_key(self.ref, shape)
        if name == "single_row":
            return {**shape, key: 1}
        if name == "empty_batch":
            return {**shape, key: 0}
        if name == "odd_dims":
            capped = {**shape, key: min(shape[key], self.rows)}
            return {k: self._odd(v, gen) for k, v in capped.items()}
        if name == "long_reduction":
            if not self.max_dims:
                return None
            longest = dict(
                self.scale({k: max(v, self.max_dims.get(k, v)) for k, v in shape.items()})
            )
            return {**longest, key: min(shape[key], 2)}
        raise KeyError(name)

    def _odd(self, v: int, gen: Any) -> int:
        """An odd size near v, drawn from `gen` (no vector width divides it)."""
        if v <= 2:
            return 1
        step = int(self.torch.randint(0, max(1, v // 8), (1,), generator=gen, device=gen.device))
        return max(1, (v - 1 if v % 2 == 0 else v) - 2 * step)

    # -- the edges -------------------------------------------------------------------------------
    def edges(self, shape: dict[str, int], dtype: Any, gen: Any, tol: dict[str, float],
              *, names: list[str] | None = None) -> list[Edge]:  # fmt: skip
        """Every size edge at `shape` (the case's, as this device runs it) and every family at
        its reduced batch, in NAMES order, inapplicable ones included."""
        out = []
        for name in names if names is not None else self.names():
            out.append(self.edge(name, shape, dtype, gen, tol))
        return out

    def edge(self, name: str, shape: dict[str, int], dtype: Any, gen: Any,
             tol: dict[str, float]) -> Edge:  # fmt: skip
        """One size edge or family. On the CPU with one torch thread: these tensors are small,
        and on a loaded 2-core machine softmax's 72 edges of a verify took 10.3 s with torch's
        default threads, 0.87 s with one."""
        threads = self.torch.get_num_threads()
        if self.device == "cpu":
            self.torch.set_num_threads(1)
        try:
            return self._edge(name, shape, dtype, gen, tol)
        finally:
            self.torch.set_num_threads(threads)

    def _edge(self, name: str, shape: dict[str, int], dtype: Any, gen: Any,
              tol: dict[str, float]) -> Edge:  # fmt: skip
        if name in SIZE_EDGES:
            sized = self.edge_shape(name, shape, gen)
            if sized is None:
                return Edge(name, why="the hidden domain declares no larger dims")
            args, kwargs = self.ref.make_inputs(sized, dtype, self.device, gen)
            expected, why = self._expect(args, kwargs, tol, trivial_ok=True)
            return Edge(name, args, kwargs, expected, why=why)
        base, kwargs = self.ref.make_inputs(self.family_shape(shape), dtype, self.device, gen)
        return self._fit(name, list(base), kwargs, gen, tol)

    def _fit(self, name: str, base: list[Any], kwargs: dict[str, Any], gen: Any,
             tol: dict[str, float]) -> Edge:  # fmt: skip
        """The family on every floating input, else on the first alone, at the first level
        whose expected values are usable."""
        torch = self.torch
        floats = [i for i, a in enumerate(base)
                  if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() and a.dim()]  # fmt: skip
        if not floats:
            return Edge(name, why="no floating-point input to transform")
        subsets = [floats, floats[:1]] if len(floats) > 1 else [floats]
        levels = LEVELS if name in LEVELLED else LEVELS[:1]
        why = ""
        for level in levels:
            for subset in subsets:
                args = list(base)
                for i in subset:
                    args[i] = self.transform(name, base[i], gen, level)
                expected, why = self._expect(args, kwargs, tol, trivial_ok=False)
                if expected is not None:
                    return Edge(name, args, kwargs, expected, inputs=subset, level=level)
        return Edge(name, why=why)

    def _expect(self, args: list[Any], kwargs: dict[str, Any], tol: dict[str, float],
                *, trivial_ok: bool) -> tuple[Any, str]:  # fmt: skip
        """The reference's output on `args`, or None and why it is not usable. A family's draw
        must also be well-conditioned: the reference in fp64 agrees with the fp32 one within
        a quarter of the tolerance, so what an honest fp32 kernel gets is judgeable."""
        torch = self.torch
        try:
            expected = self.ref.reference(*args, **kwargs)
            _, out_dtype = self.ref.output_spec(*args, **kwargs)
        except Exception as exc:  # the reference's own domain: an inapplicable edge
            return None, f"the reference raised {type(exc).__name__}"
        if not isinstance(expected, torch.Tensor):
            return None, "the reference returned no tensor"
        if not expected.is_floating_point() or not expected.numel():
            return expected, ""
        if not bool(torch.isfinite(expected).all()):
            return None, "the reference's output is not finite"
        if out_dtype.is_floating_point:
            limit = OUTPUT_FRACTION * torch.finfo(out_dtype).max
            if float(expected.abs().max()) > limit:
                return None, f"the reference's output exceeds {out_dtype}'s range"
        if trivial_ok:
            return expected, ""
        if not bool((expected.abs() > tol["atol"]).any()):
            return None, "every expected value is within atol of zero"
        exact = self._reference64(args, kwargs)
        if exact is not None and exact.shape == expected.shape:
            bound = CONDITION_FRACTION * (tol["atol"] + tol["rtol"] * exact.abs())
            if not bool(((expected.double() - exact).abs() <= bound).all()):
                return None, "the fp32 reference is not accurate to the tolerance here"
            # The fp32 reference may be lucky (torch's cascade sum) where an honest kernel's
            # order is not: the op itself must be well-conditioned here. Inputs moved by
            # PERTURBATION (relative, each element its own sign) stand for another fp32 order;
            # measured: a blocked column sum over column outliers was off by 3x the tolerance
            # while torch's fp32 sum agreed with fp64.
            moved = self._reference64(self._perturbed(args), kwargs)
            if moved is not None and moved.shape == exact.shape:
                if not bool(((moved - exact).abs() <= bound).all()):
                    return None, "the op is ill-conditioned at these values (cancellation)"
            # For an op linear in every input (a matmul, a sum of products) the reference on
            # |inputs| is exactly the sum of |terms| each output adds. Elsewhere it measures
            # nothing of the kind (softmax or a gate of |x| is another function), so the check
            # is only made for such an op.
            terms = self._reference64([a.abs() if self._floating(a) else a for a in args], kwargs)
            if terms is not None and terms.shape == exact.shape:
                cancels = not bool((ACCUMULATION * terms.abs() <= bound).all())
                if cancels and self._multilinear(args, kwargs, exact):
                    return None, "the op cancels at these values (its terms dwarf its result)"
        return expected, ""

    def _multilinear(self, args: list[Any], kwargs: dict[str, Any], exact: Any) -> bool:
        """Whether doubling any one floating input doubles the fp64 reference (exactly, as a
        product of sums does)."""
        floating = [i for i, a in enumerate(args) if self._floating(a)]
        for i in floating:
            doubled = [a.double() * 2.0 if j == i else a for j, a in enumerate(args)]
            out = self._reference64(doubled, kwargs)
            if out is None or out.shape != exact.shape:
                return False
            if not bool(self.torch.allclose(out, 2.0 * exact, rtol=1e-9, atol=0.0)):
                return False
        return bool(floating)

    def _floating(self, a: Any) -> bool:
        return isinstance(a, self.torch.Tensor) and a.is_floating_point()

    def _perturbed(self, args: list[Any]) -> list[Any]:
        """fp64 copies of `args` with every floating element moved by +-PERTURBATION of
        itself (a fixed generator: the same draw judges alike everywhere)."""
        torch = self.torch
        gen = torch.Generator(device="cpu").manual_seed(0x5EED)
        out = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                sign = torch.randint(0, 2, a.shape, generator=gen).to(a.device) * 2 - 1
                a = a.double() * (1.0 + PERTURBATION * sign)
            out.append(a)
        return out

    def _reference64(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The reference on fp64 copies, when it computes in fp64 given fp64 (else None)."""
        torch = self.torch
        wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args]  # fmt: skip
        try:
            out = self.ref.reference(*wide, **kwargs)
        except Exception:  # a reference that takes only its own dtypes: fp32 is all there is
            return None
        ok = isinstance(out, torch.Tensor) and out.dtype == torch.float64
        return out if ok else None

    # -- the families ----------------------------------------------------------------------------
    def transform(self, name: str, t: Any, gen: Any, level: float) -> Any:
        """Family `name` applied to one floating tensor (computed in fp32, stored in t's dtype)."""
        torch = self.torch
        v = t.float().reshape(-1, t.shape[-1])
        rows, cols = v.shape
        dev = v.device
        finfo = torch.finfo(t.dtype)
        near = min(NEAR_FRACTION * finfo.max, FP32_SAFE)
        peak = float(v.abs().max()) or 1.0
        rms = float(v.pow(2).mean().sqrt()) or 1.0
        decades = max(0.0, math.log10(near / peak)) * level

        def rand(*size: int) -> Any:
            return torch.rand(*size, generator=gen, device=gen.device).to(dev)

        if name == "offset":
            z = v - v.mean()
            z = z / (float(z.pow(2).mean().sqrt()) or 1.0)
            sign = torch.where(rand(rows, 1) < 0.5, -1.0, 1.0)
            offset = sign * 32.0 * rms * 2.0 ** (2.0 * rand(rows, 1))
            spread = max(OFFSET_SPREAD**level, finfo.eps / 2)
            out = offset + offset.abs() * spread * z
        elif name == "column_scales":
            # Largest at both ends of the row (a U), jittered: a reduction that skips the first
            # or the last columns misses most of the row's magnitude.
            pos = torch.linspace(0.0, 1.0, cols, device=dev)
            u = (2.0 * (2.0 * pos - 1.0).abs() - 1.0 + 0.2 * (rand(cols) - 0.5)).clamp(-1.0, 1.0)
            out = v * 10.0 ** (decades * u)
        elif name == "row_scales":
            u = (
                torch.linspace(-1.0, 1.0, rows, device=dev)
                if rows > 1
                else torch.ones(1, device=dev)
            )
            perm = torch.randperm(rows, generator=gen, device=gen.device).to(dev)
            out = v * 10.0 ** (decades * u[perm]).reshape(rows, 1)
        elif name == "column_outliers":
            picked = sorted({0, cols - 1, int(rand(1).item() * cols) % cols})
            out = v.clone()
            out[:, picked] = (
                v[:, picked].sign().where(v[:, picked] != 0, 1.0) * peak * 10.0**decades
            )
        elif name == "near_overflow":
            out = v / peak * 10.0 ** (math.log10(near) * level)
        elif name == "subnormals":
            out = v / peak * (0.9 * finfo.tiny)
        elif name == "zeros":
            out = v.clone()
            picked = (rand(rows) < 1.0 / 3.0).nonzero().flatten().tolist()
            picked = sorted(set(picked) | {int(rand(1).item() * rows) % rows})
            if len(picked) == rows:  # one row keeps its values (a single row: none is zeroed)
                picked = picked[:-1]
            for n, r in enumerate(picked):
                out[r] = -0.0 if n % 2 else 0.0
            if cols > 2:
                for c in {cols - 1, int(rand(1).item() * cols) % cols}:
                    out[:, c] = -0.0
        elif name == "ties":
            step = rms / 2.0
            out = torch.round(v / step) * step
            if cols > 2:  # each row's maximum, then its minimum, also at another column
                for pick in (out.argmax(dim=1), out.argmin(dim=1)):
                    value = out.gather(1, pick.unsqueeze(1))
                    at = (rand(rows) * cols).long().clamp(max=cols - 1).unsqueeze(1)
                    for _ in range(cols):  # onto a column holding neither extreme
                        held = out.gather(1, at)
                        bad = (held == out.amax(dim=1, keepdim=True)) | (held == value)
                        if not bool(bad.any()):
                            break
                        at = torch.where(bad, (at + 1) % cols, at)
                    out.scatter_(1, at, torch.where(bad, out.gather(1, at), value))
        else:
            raise KeyError(name)
        return out.reshape(t.shape).to(t.dtype).to(t.device).contiguous()


def tolerance_ratio(torch: Any, out: Any, ref: Any, tol: dict[str, float]) -> float | None:
    """The worst |out - ref| / (atol + rtol * |ref|): how many tolerances off (<= 1 passes)."""
    if type(out) is not torch.Tensor or tuple(out.shape) != tuple(ref.shape) or not ref.numel():
        return None
    ratio = (out.float() - ref).abs() / (tol["atol"] + tol["rtol"] * ref.abs())
    return float(ratio.max())


__all__ = [
    "FAMILIES",
    "NAMES",
    "NOTES",
    "PRECISION",
    "SIZE_EDGES",
    "Edge",
    "Suite",
    "batch_key",
    "tolerance_ratio",
]
