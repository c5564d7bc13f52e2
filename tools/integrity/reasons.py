"""The guarded verify's vocabulary: reason codes with the harness's own sentence for each, and
what a verdict certifies. A public verdict's reason is one of these sentences, never text or a
number the candidate's run produced (tools/integrity/verdict_view.py).

Side of the trust boundary: trusted (harness-written text only).
"""

from __future__ import annotations

REASONS: dict[str, str] = {
    "runner_failed": "the guarded runner produced no result (crash, kill, timeout)",
    "harness_tampered": "the candidate's process answered something that is not the protocol",
    "forged_result": "the result does not echo this verification's nonce",
    "import_failed": "kernel.py could not be imported in the candidate process",
    "candidate_crashed": "the candidate process died or raised during a call",
    "sandbox_failed": "the sandbox did not start (the host's fault, before the candidate ran): "
    "verify again",
    "timeout": "the candidate process did not answer in time",
    "resource_limit": "the candidate's sandbox hit a limit (memory, pids, cpu, file_size, scratch)",
    "candidate_error": "the entry function raised",
    "wrong_output": "an output is outside tolerance, NaN/Inf, or not fully written",
    "wrong_output_timed": "a call inside a timed sample produced a wrong output",
    "wrong_shape": "output shape, dtype or device differs from the reference's",
    "wrong_kv_cache": "step task: the KV cache's valid slots after a pass differ from the "
    "reference's (an append missing or wrong, or context overwritten)",
    "lengths_modified": "step task: the step changed the sequence lengths (the harness advances "
    "them)",
    "precision": "wide-range inputs fail: math not in fp32 (e.g. fp16 accumulation)",
    "not_plain_tensor": "the output is not a plain torch.Tensor (a subclass, or not a tensor)",
    "output_aliases_input": "the output shares storage with an input",
    "output_reused": "the output is an earlier call's storage (stale-buffer reuse)",
    "inputs_modified": "the call changed its inputs",
    "no_triton_launch": "no @triton.jit function of kernel.py ran during the call",
    "foreign_kernel": "kernels not defined in kernel.py ran (aten/cuBLAS/other Triton code)",
    "torch_compute": "aten compute ops ran outside the Triton kernels",
    "host_compute": "tensor data went to the host (numpy, tolist, HtoD/DtoH copies)",
    "side_stream": "kernels ran on more than one stream",
    "background_thread": "threads started by the candidate were alive after a call",
    "monkey_patch": "timers, synchronize, launch hooks or library classes were replaced",
    "introspection": "frame, gc or ctypes tricks, or dunder access",
    "dynamic_code": "exec/eval/compile/__import__ or computed attribute names",
    "subprocess": "the candidate started or signalled processes",
    "reads_verifier_files": "the candidate opened the verifier's files or state",
    "exfiltration": "the candidate wrote files outside its folder or opened a connection",
    "reads_outside_workspace": "static: a file read outside the candidate's own folder",
    "env_probe": "static: reads HARNESSLAB/VERIFY/BENCH-like environment variables",
    "mode_sniffing": "static: branches on verify/benchmark/final-like strings",
    "forbidden_call": "static: calls the reference's math in torch (task.toml [integrity])",
    "private_api": "static: private torch/triton internals (torch._C, triton.runtime.jit, ...)",
    "stream_creation": "static: creates or switches CUDA streams / graphs",
    "concurrency": "static: threading, multiprocessing, asyncio, fork",
    "harness_access": "static: imports the runner, guard or harnesslab",
    "host_extension": "static: builds or loads native code outside the harness's CUDA launcher "
    "(torch cpp_extension, jiterator, cupy, numba, cuda-python); CUDA goes through harnesslab_cuda",
    "cuda_include": "static: a .cu includes a header outside the allowlist, computes an include "
    "or probes files",
    "cuda_timer": "static: a .cu reads a timer or hardware identity (clock64, %globaltimer, %smid)",
    "device_state": "static: a .cu keeps state that outlives a launch (__device__ variables, "
    "function statics, the device heap)",
    "cuda_host_code": "static: a .cu holds host code, printf, runtime API calls or device-side "
    "launches",
    "implausible_speed": "faster than its minimal bytes over the measured copy bandwidth",
    "timing_mismatch": "the parent's wall clock disagrees with the child's device time",
    "null_control": "a null output (zeros / input copy) passed the checker: case is void",
    "unreplayable": "the wrapper does work the replay cannot reproduce (torch copies or casts, "
    "memory from before the call, launches outside Triton or harnesslab_cuda)",
    "forged_recording": "the candidate's process sent a recording that breaks the schema",
    "sandbox_unavailable": "no sandbox can be applied on the GPU host (no Landlock): refused",
}

# The host's own refusal text (no candidate ran): shown as it is, since it says what to do.
SANDBOX_REFUSED = (
    "no sandbox (Landlock) can be applied on the GPU host, so agent-written code would run "
    "unconfined: refused. Run on a Linux kernel with Landlock, or set "
    "HARNESSLAB_ALLOW_UNSANDBOXED=1 to verify anyway"
)

# What a passed verdict certifies (`Verdict.certifies`), per path.
CERTIFIES: dict[str, str] = {
    "correctness_and_speed": "GPU: the outputs on every hidden case came from replaying the "
    "candidate's recorded Triton launches in a process with no agent Python (no torch math, no "
    "host code), were checked by the trusted parent, and the timing is the replay's",
    "outputs": "Triton CPU interpreter: the outputs on every hidden case and check were correct, "
    "compared by the trusted parent; who computed them (a Triton kernel or torch) is NOT "
    "certified, nor is any timing: the candidate's own process reports its launches there, and "
    "can forge that report",
    "step_outputs": "step task: outputs correct on hidden traces: every step's logits and the "
    "KV cache's valid slots after each pass (two checked passes and a timed one), computed by the "
    "candidate's step in a sandboxed process of its own over a state the trusted parent owns "
    "(prompts written and stale slots poisoned by it), were compared by the parent with the "
    "reference it computed itself; the score is the sum over traces of the timed pass's p50 step "
    "latency as the parent's own clock sees a step through the sandbox's boundary (request to "
    "reply, a fixed IPC round trip of the same cost for every candidate included; meaningful on "
    "a GPU only). Who computed the outputs (which kernels, whether a graph replay did the work) "
    "is NOT certified: the timed steps are the candidate's own, not a replay of recorded ones "
    "(step.replay off, or the interpreter); nor that a step did all its "
    "work inside its timed request (the candidate's process holds the device state and keeps "
    "running between segments, while the trusted parent prefills and poisons)",
    "step_replayed": "step task: every step of the last checked pass was recorded in the "
    "candidate's sandboxed process (every ATen operator call and every Triton or harnesslab_cuda "
    "launch, gpu/verify/step_record.py), checked (step_schema.py) and handed to a replay process "
    "with no agent Python (step_replay.py); the timed pass is that replay on new tokens and "
    "prompts (on a GPU each recorded step captured as a CUDA graph of the replay's own), and "
    "every replayed step's logits and the KV cache after the pass, like every step of the two "
    "checked passes, were compared by the trusted parent with the reference it computed "
    "itself; the score is the sum over traces of the timed pass's p50 step latency as the "
    "parent's clock sees a replayed step (request to reply: a fixed IPC round trip included; "
    "meaningful on a GPU only). So the timed work is the recorded kernels and library calls, "
    "nothing the candidate's Python does at the time (its process is stopped meanwhile)",
    "nothing": "the verdict did not pass",
}

# What a verdict leaves unverified (`Verdict.unverified`): claims whose only evidence is the
# candidate's own process. Their codes still reject (a candidate can only hurt itself by
# reporting them); their absence proves nothing.
UNVERIFIED: dict[str, str] = {
    "triton_did_the_work": "that Triton kernels of kernel.py, not torch or host code, computed "
    "the outputs (the CPU interpreter's launch counts come from the candidate's process)",
    "process_policy": "the candidate process's reports about itself: torch_compute, "
    "host_compute, foreign_kernel, background_thread, monkey_patch, introspection, subprocess, "
    "dynamic_code, exfiltration, harness_access",
    "speed": "the timing (the interpreter's wall clock of Python says nothing of a GPU)",
    "step_work": "which kernels computed a step's outputs (the candidate's own, a library's, "
    "torch's) and that its graph replays do the work: a step's launches are not recorded or "
    "replayed (step.replay off, or the interpreter); its timing is the step's latency as the "
    "trusted parent observes it, not a replay's",
    "step_idle": "that the GPU is free of the candidate's own work while the replay is timed: "
    "its processes (the candidate's, and the incumbent's) are stopped (SIGSTOP) for the timed "
    "pass, but device work one of them queued before (a long kernel on a stream of its own) "
    "keeps running, and would slow the replay it is compared with as much as its own",
}
CPU_UNVERIFIED = ["triton_did_the_work", "process_policy", "speed"]
GPU_UNVERIFIED = ["process_policy"]


def step_unverified(replayed: bool, meaningful: bool) -> list[str]:
    """What a passed step verdict leaves unverified: its timed steps the candidate's own
    ("step_work") or replayed ("step_idle"), and on the interpreter its timing."""
    first = "step_idle" if replayed else "step_work"
    return [first] if meaningful else [first, "speed"]


__all__ = [
    "CERTIFIES",
    "CPU_UNVERIFIED",
    "GPU_UNVERIFIED",
    "REASONS",
    "SANDBOX_REFUSED",
    "UNVERIFIED",
    "step_unverified",
]
