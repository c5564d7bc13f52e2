"""Decode-step traces and their objective: per-step latency per sequence-length bucket, and every
step's logits (and the KV cache after the trace) checked against the task's reference.

Staged (tools/gpu STAGED; standard library + torch, never harnesslab): the runner's step mode
(`objective`) runs a step task's dev traces with it, the task's reference.py loaded by path
(tasks/decode_step/reference.py: Config, new_state, prefill, advance, reference_step,
TOLERANCES); tests and the benchmark import it on the host too. Side of the trust boundary:
written as trusted code, but it runs in the runner's sandboxed process and calls the
candidate's step there, in the same interpreter: a candidate can rebind anything here (the
reference, the comparison, the clock), so what it reports is dev feedback, never evidence. The
guarded verify of a step task (step_guard.py) uses the traces and the state helpers here from
the trusted parent, with the candidate's step in a sandboxed process of its own.

A trace is JSON-able: {"name", "kind": "fixed" | "dynamic", "seed", "buckets": [bound, ...],
"segments": [{"lengths": [int | None per sequence], "prompt_seeds": [...], "tokens": [[batch
ints] per step]}]}. A segment first gives each sequence whose length is not None a new prompt
(reference.prefill: continuous batching replacing a finished request), then decodes its steps.
A step falls in the first bucket whose bound is >= its longest context (length + 1: the prompt,
the steps so far and this token). Every third step repeats the previous step's tokens at the
next position: a logits cache keyed on the tokens answers with stale logits there.

run_trace runs passes over one State (contents reset in place between passes, so graphs a
candidate captured into state.scratch stay valid; the first pass is its warm-up), each pass with
its own token and prompt draws (the same lengths and buckets), so no pass can be answered from
an earlier one, and every pass is checked against reference_step run alongside on its own State:
  check    before each step, every slot past a sequence's length is poisoned (keys 0, values
           POISON): a step that reads the KV cache past its length moves the logits far
  latency  the step as the caller sees it: the device idle when it starts, CUDA events around
           the step with the whole device synchronised inside the window (perf_counter on the
           CPU, where nothing is meaningful), and the host's time to return from the call
  device   (CUDA only) the stream primed with a sleep kernel so the step's launches queue up
           behind it: device time alone; launch_overhead_us = latency p50 - device p50
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))
if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from . import correctness, failures, scores
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import correctness
    import failures
    import scores
failures_mod = failures  # _one_pass and _run name their failure lists `failures`

POISON = 512.0  # stale values: exact in fp16/bf16; a stale slot's weight of 1e-3 moves out by 0.5
MAX_FAILURES = 8  # failures reported per run (any one fails it)
_REPEAT_EVERY = 3


# ----------------------------------------------------------------------------------------------
# traces


def bucket_of(context: int, buckets: list[int]) -> int:
    for bound in buckets:
        if context <= bound:
            return bound
    raise ValueError(f"context {context} is past the last bucket {buckets[-1]}")


def _tokens(rng: random.Random, steps: int, batch: int, vocab: int, before: list[list[int]]
            ) -> list[list[int]]:  # fmt: skip
    """`steps` more steps' tokens after the trace's `before`."""
    out = list(before)
    for _ in range(steps):
        repeat = len(out) % _REPEAT_EVERY == _REPEAT_EVERY - 1
        out.append(list(out[-1]) if repeat else [rng.randrange(vocab) for _ in range(batch)])
    return out[len(before) :]


def fixed_trace(config, *, length: int, steps: int, seed: int, buckets: list[int] | None = None
                ) -> dict[str, Any]:  # fmt: skip
    """Every sequence starts with a prompt of `length` and decodes `steps` tokens."""
    if length + steps > config.max_seq:
        raise ValueError(f"length {length} + steps {steps} is past max_seq {config.max_seq}")
    rng = random.Random(seed)
    batch = config.batch
    segment = {"lengths": [length] * batch,
               "prompt_seeds": [rng.randrange(1 << 31) for _ in range(batch)],
               "tokens": _tokens(rng, steps, batch, config.vocab, [])}  # fmt: skip
    return {"name": f"fixed_{length}x{steps}", "kind": "fixed", "seed": seed,
            "buckets": list(buckets or [config.max_seq]), "segments": [segment]}  # fmt: skip


def dynamic_trace(config, *, buckets: list[int], steps_per_segment: int, segments_per_bucket: int,
                  seed: int) -> dict[str, Any]:  # fmt: skip
    """Segments over the buckets in a seeded order, `segments_per_bucket` each. A segment aimed at
    bucket (lo, hi] keeps the sequences that stay within hi, replaces the others (and, after the
    first segment, about half of the rest) with prompts of 0..hi-steps tokens, and gives one
    sequence a prompt of lo..hi-steps: every step of the segment falls in that bucket."""
    steps, batch = steps_per_segment, config.batch
    bounds = [0, *buckets]
    if sorted(set(buckets)) != list(buckets) or buckets[-1] > config.max_seq:
        raise ValueError(f"buckets {buckets} must ascend up to max_seq {config.max_seq}")
    if any(hi - lo < steps for lo, hi in zip(bounds, buckets, strict=False)):
        raise ValueError(f"every bucket of {buckets} must be at least {steps} steps wide")
    rng = random.Random(seed)
    order = [i for i in range(len(buckets)) for _ in range(segments_per_bucket)]
    rng.shuffle(order)
    lengths = [0] * batch
    segments: list[dict[str, Any]] = []
    tokens: list[list[int]] = []
    for n, i in enumerate(order):
        lo, hi = bounds[i], buckets[i]
        anchor = rng.randrange(batch)
        new: list[int | None] = []
        for b in range(batch):
            keep = n and b != anchor and lengths[b] + steps <= hi and rng.random() < 0.5
            if keep:
                new.append(None)
            else:
                new.append(
                    rng.randint(lo, hi - steps) if b == anchor else rng.randint(0, hi - steps)
                )
        lengths = [
            (length if fresh is None else fresh) + steps
            for length, fresh in zip(lengths, new, strict=True)
        ]
        segments.append({"lengths": new,
                         "prompt_seeds": [None if x is None else rng.randrange(1 << 31) for x in new],
                         "tokens": _tokens(rng, steps, batch, config.vocab, tokens)})  # fmt: skip
        tokens += segments[-1]["tokens"]
    return {"name": f"dynamic_{len(order)}x{steps}", "kind": "dynamic", "seed": seed,
            "buckets": list(buckets), "segments": segments}  # fmt: skip


def schedule(trace: dict[str, Any], variant: int, vocab: int):
    """(prompts, tokens) per step of one pass: prompts [(sequence, length, seed)] before the step.
    Variant v > 0 shifts every token and prompt seed (the same lengths, repeats and buckets)."""
    for segment in trace["segments"]:
        prompts = [(b, length, seed + variant * 1_000_003)
                   for b, (length, seed) in enumerate(zip(segment["lengths"], segment["prompt_seeds"], strict=True))
                   if length is not None]  # fmt: skip
        for tokens in segment["tokens"]:
            yield prompts, [(t + variant * 7919) % vocab for t in tokens]
            prompts = []


# ----------------------------------------------------------------------------------------------
# the driver


def walk(ref, states, trace: dict[str, Any], variant: int):
    """The steps of one pass over `states` (the candidate's State, then the truth's): each
    step's prompts prefilled into every State, then (index, tokens) yielded, then every State
    advanced (the harness's part of the step) when the caller asks for the next one. The one
    loop of the dev objective (_one_pass) and of step_profile.py."""
    for index, (prompts, toks) in enumerate(schedule(trace, variant, states[-1].config.vocab)):
        for b, length, seed in prompts:
            for s in states:
                ref.prefill(s, b, length, seed)
        yield index, toks
        for s in states:
            ref.advance(s)


def reset_state(state) -> None:
    state.kv_cache.zero_()
    state.lengths.zero_()
    state.host_lengths = [0] * len(state.host_lengths)


def poison_stale(torch, state, lengths: list[int]) -> None:
    cache = state.kv_cache
    seq = torch.arange(cache.shape[4], device=cache.device)[None, :]
    stale = seq >= torch.tensor(lengths, device=cache.device)[:, None]
    mask = stale[None, :, None, :, None]  # [layers, batch, kv_heads, max_seq, head_dim]
    cache[:, 0].masked_fill_(mask, 0.0)
    cache[:, 1].masked_fill_(mask, POISON)


def valid_slots(torch, cache, lengths: list[int]):
    """[slots, layers, 2, kv_heads, head_dim]: every sequence's context slots."""
    seq = torch.arange(cache.shape[4], device=cache.device)[None, :]
    valid = seq < torch.tensor(lengths, device=cache.device)[:, None]
    return cache.permute(2, 4, 0, 1, 3, 5)[valid]


class _Clock:
    """One step's timing: latency (events around the step, the device idle at the start), the
    host's time to return from the call, and with `sleep_cycles` the stream primed first."""

    def __init__(self, torch, device: str) -> None:
        self.torch, self.cuda = torch, device == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)

    def time(self, call, args: tuple, sleep_cycles: int = 0) -> tuple[Any, float, float]:
        torch = self.torch
        if not self.cuda:
            t0 = time.perf_counter()
            out = call(*args)
            us = (time.perf_counter() - t0) * 1e6
            return out, us, us
        torch.cuda.synchronize()
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        t0 = time.perf_counter()
        self.start.record()
        out = call(*args)
        host_us = (time.perf_counter() - t0) * 1e6
        torch.cuda.synchronize()
        self.end.record()
        self.end.synchronize()
        return out, self.start.elapsed_time(self.end) * 1e3, host_us


def _one_pass(torch, ref, step, states, trace, variant: int, *, kind: str, tol, clock: _Clock,
              sleep_cycles: int, failures: list[dict[str, Any]], observe=None
              ) -> list[dict[str, Any]]:  # fmt: skip
    """One pass over the trace; returns per-step records and appends to `failures`.
    `observe(step_index, out, want)` sees every step's logits and the reference's."""
    state, truth = states
    config, device = truth.config, truth.kv_cache.device
    cache_ptr = state.kv_cache.data_ptr()
    for s in states:
        reset_state(s)
    records: list[dict[str, Any]] = []  # per step: its bucket, and its times once it returned

    def fail(what: str, reason: str) -> None:
        at = records[-1] if records and what != "kv_cache" else {}
        failures.append({"pass": kind, "step": at.get("step"), "bucket": at.get("bucket"),
                         "what": what, "reason": reason})  # fmt: skip

    for index, toks in walk(ref, states, trace, variant):
        expected = list(truth.host_lengths)
        records.append({"step": index, "bucket": bucket_of(max(expected) + 1, trace["buckets"])})
        if kind == "check":
            poison_stale(torch, state, expected)
        tokens = torch.tensor(toks, dtype=torch.long, device=device)
        try:
            out, latency_us, host_us = clock.time(step, (state, tokens), sleep_cycles)
        except Exception as exc:  # the candidate's failure, reported as its step's verdict
            if failures_mod.caused_by(exc, failures_mod.CaseTimeout) is not None:
                raise  # the trace's deadline: the whole trace timed out
            fail("step", f"step raised {failures_mod.one_line(exc)}")
            return records
        records[-1].update(latency_us=latency_us, host_us=host_us)
        # The reference's own tokens: the step may have rewritten the ones it was given.
        want = ref.reference_step(truth, torch.tensor(toks, dtype=torch.long, device=device))
        ok, reason, _ = correctness.compare(
            torch, out, want, tol, want.shape, config.torch_dtype, (tokens,)
        )
        if observe is not None:
            observe(index, out, want)
        if not ok:
            fail("logits", reason)
        if state.host_lengths != expected or state.lengths.tolist() != expected:
            fail("lengths", "the step changed the lengths (the harness advances them)")
            return records
    if state.kv_cache.data_ptr() != cache_ptr:
        fail("kv_cache", "the step replaced state.kv_cache (write into the harness's cache)")
        return records
    want = valid_slots(torch, truth.kv_cache, truth.host_lengths).float()
    got = valid_slots(torch, state.kv_cache, truth.host_lengths)
    ok, reason, _ = correctness.compare(torch, got, want, tol, want.shape, config.torch_dtype, ())
    if not ok:
        fail("kv_cache", f"after the trace: {reason}")
    return records


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), q in [0, 100]."""
    xs = sorted(values)
    at = (len(xs) - 1) * q / 100.0
    lo = int(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)


def _row(name, checked: list[dict[str, Any]], bad: set[int], latency: list[dict[str, Any]],
         device: list[dict[str, Any]], batch: int) -> dict[str, Any]:  # fmt: skip
    """One row of the table: the checked pass's steps and how many failed, then the timed
    passes' percentiles (None where no timed pass ran: a wrong step's timings mean nothing)."""
    lat = [r["latency_us"] for r in latency if "latency_us" in r]
    row: dict[str, Any] = {
        "bucket": name,
        "checked_steps": len(checked),
        "failed_steps": len({r["step"] for r in checked} & bad),
        "steps": len(lat),
        "p50_us": None,
        "p95_us": None,
        "p99_us": None,
        "host_p50_us": None,
        "tokens_per_s": None,
        "device_p50_us": None,
        "device_p95_us": None,
        "launch_overhead_us": None,
    }
    if lat:
        row.update(p50_us=percentile(lat, 50), p95_us=percentile(lat, 95),
                   p99_us=percentile(lat, 99),
                   host_p50_us=percentile([r["host_us"] for r in latency if "host_us" in r], 50),
                   tokens_per_s=batch * len(lat) / (sum(lat) * 1e-6) if sum(lat) > 0 else None)  # fmt: skip
    dev = [r["latency_us"] for r in device if "latency_us" in r]
    if dev and lat:
        row.update(device_p50_us=percentile(dev, 50), device_p95_us=percentile(dev, 95),
                   launch_overhead_us=max(0.0, row["p50_us"] - percentile(dev, 50)))  # fmt: skip
    return row


def run_trace(torch, ref, step, config, trace: dict[str, Any], *, device: str = "cpu",
              weight_seed: int = 0, tolerance: dict[str, float] | None = None,
              check_only: bool = False, observe=None) -> dict[str, Any]:  # fmt: skip
    """Run `step` over `trace` (passes in the module docstring); the per-bucket latency table
    and the correctness verdict. `ref` is the task's reference module (or a view of it that
    edits the states it makes: step_probe.py), `config` its Config. `check_only`: the check
    pass alone (nothing timed; numerical_probe), `observe` handed to every pass."""
    threads = torch.get_num_threads()
    if device == "cpu":  # tiny tensors: a loaded 2-core machine ran a 64-step trace in 107 s
        torch.set_num_threads(1)  # with torch's default threads, in 3 s with one
    kinds = (
        ["check"] if check_only else ["check", "latency"] + (["device"] if device == "cuda" else [])
    )
    try:
        return _run(torch, ref, step, config, trace, device, weight_seed,
                    tolerance or ref.TOLERANCES[config.dtype], kinds, observe)  # fmt: skip
    finally:
        torch.set_num_threads(threads)


def _run(torch, ref, step, config, trace, device, weight_seed, tol, kinds, observe
         ) -> dict[str, Any]:  # fmt: skip
    states = (ref.new_state(config, seed=weight_seed, device=device),
              ref.new_state(config, seed=weight_seed, device=device))  # fmt: skip
    clock = _Clock(torch, device)
    failures: list[dict[str, Any]] = []
    passes: dict[str, list[dict[str, Any]]] = {}
    for variant, kind in enumerate(kinds):
        sleep_cycles = 0
        if kind == "device":  # cover the host's enqueue of a whole step: ~2 GHz SM clock
            host = max((r.get("host_us", 0.0) for r in passes["latency"]), default=0.0)
            sleep_cycles = int(min(max(3 * host + 50, 100), 20000) * 2000)
        before = len(failures)
        passes[kind] = _one_pass(torch, ref, step, states, trace, variant, kind=kind, tol=tol,
                                 clock=clock, sleep_cycles=sleep_cycles, failures=failures,
                                 observe=observe)  # fmt: skip
        if len(failures) > before and kind == "check":
            break  # a wrong step's timings mean nothing
    check, latency, dev = (passes.get(k, []) for k in ("check", "latency", "device"))
    bad = {f["step"] for f in failures if f["pass"] == "check" and f["step"] is not None}
    buckets = []
    for bound in trace["buckets"]:
        mine = [r for r in check if r["bucket"] == bound]
        if mine:
            buckets.append(_row(bound, mine, bad, [r for r in latency if r["bucket"] == bound],
                                [r for r in dev if r["bucket"] == bound], config.batch))  # fmt: skip
    return {
        "trace": trace["name"],
        "kind": trace["kind"],
        "steps": sum(len(s["tokens"]) for s in trace["segments"]),
        "batch": config.batch,
        "dtype": config.dtype,
        "meaningful": device == "cuda",
        "correct": not failures,
        "failures": failures[:MAX_FAILURES],
        "buckets": buckets,
        "total": _row("all", check, bad, latency, dev, config.batch),
    }


# ----------------------------------------------------------------------------------------------
# the runner's step mode


def build(config, params: dict[str, Any]) -> dict[str, Any]:
    """The trace a task.toml `[[step.traces]]` entry names (tools/task/step.py), at `config`."""
    if params["kind"] == "fixed":
        return fixed_trace(config, length=params["length"], steps=params["steps"],
                           seed=params["seed"], buckets=params.get("buckets") or None)  # fmt: skip
    return dynamic_trace(config, buckets=params["buckets"], seed=params["seed"],
                         steps_per_segment=params["steps_per_segment"],
                         segments_per_bucket=params["segments_per_bucket"])  # fmt: skip


def sized(ref, spec: dict[str, Any], entry: dict[str, Any], interpret: bool):
    """(Config, trace) of one `[[step.traces]]` entry of a `[step]` table `spec`: the model's
    sizes on a GPU, the interpreter's (and the entry's interpreter overrides) on the CPU."""
    sizes = spec["interpreter" if interpret else "model"]
    params = {**entry, **(entry.get("interpreter") or {})} if interpret else entry
    config = ref.Config(**sizes, dtype=entry["dtype"])
    return config, build(config, params)


def failure_reason(failure: dict[str, Any]) -> str:
    where = "after the pass" if failure["step"] is None else f"step {failure['step']}"
    return f"{failure['what']} at {where} of the {failure['pass']} pass: {failure['reason']}"


def objective(torch, ref, step, req: dict[str, Any], *, interpret: bool, device: str,
              emit, candidate_dir: str = "") -> dict[str, Any]:  # fmt: skip
    """The runner's step mode: every dev trace of req["step"] (task/step.py's request: both
    sizes, the traces with their interpreter overrides) run with `step`, one "case" event per
    trace (its per-bucket table in `buckets`), then the summary: a trace passes when every step
    of every pass was right, and the score is the sum of the traces' p50 step latency."""
    spec, seed = req["step"], int(req.get("seed", 0))
    rows = []
    for i, t in enumerate(spec["traces"]):
        row: dict[str, Any] = {"name": t["name"], "dtype": t["dtype"], "passed": False,
                               "status": "failed", "reason": ""}  # fmt: skip
        try:
            with failures.deadline(float(req.get("case_timeout_s", 120))):
                config, trace = sized(ref, spec, t, interpret)
                out = run_trace(torch, ref, step, config, trace, device=device,
                                weight_seed=(seed * 1_000_003 + i) % (1 << 31),
                                tolerance=req["tolerances"][t["dtype"]])  # fmt: skip
        except Exception as exc:
            late = failures.caused_by(exc, failures.CaseTimeout) is not None
            row.update(status="timeout" if late else "error",
                       reason=failures.one_line(exc, candidate_dir))  # fmt: skip
        else:
            total = out["total"]
            row.update(passed=out["correct"], status="passed" if out["correct"] else "failed",
                       reason=failure_reason(out["failures"][0]) if out["failures"] else "",
                       median_us=total["p50_us"], host_us=total["host_p50_us"],
                       launch_overhead_us=total["launch_overhead_us"],
                       buckets=[*out["buckets"], total])  # fmt: skip
        emit({"event": "case", **row})
        rows.append(row)
    passed = bool(rows) and all(r["passed"] for r in rows)
    failed = [r for r in rows if not r["passed"]]
    return {
        "status": "passed" if passed else "failed",
        "score_us": scores.score_of([r.get("median_us") for r in rows], passed),
        "cases": rows,
        "reason": f"{failed[0]['name']}: {failed[0]['reason']}" if failed else "",
    }


__all__ = [
    "POISON",
    "bucket_of",
    "build",
    "dynamic_trace",
    "failure_reason",
    "fixed_trace",
    "objective",
    "percentile",
    "poison_stale",
    "reset_state",
    "run_trace",
    "schedule",
    "sized",
    "valid_slots",
    "walk",
]
